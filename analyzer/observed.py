"""Observed backend facts: what really ran, each with the counts and times that prove it.

Every fact is read from GPU/runtime rows inside the analyzed step windows, never from a config:
a `moe_token_dispatcher_type=flex` dump proves nothing if DeepEP kernels never ran.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import polars as pl
from moetune.analyzer.classify import KernelClasses, with_pg_role
from moetune.analyzer.frames import GPU_KINDS, require
from moetune.analyzer.intervals import END, START, clip, locate, sweep, total, union
from moetune.analyzer.walls import OFFLOAD_CLASSES, offload_round_trips

NS = 1e-9


def in_windows(events: pl.DataFrame, steps: pl.DataFrame) -> pl.DataFrame:
    """GPU rows starting inside an analyzed step window (with their step)."""
    win = steps.select("rank", "step", "win_start_ns", "win_end_ns")
    gpu = events.filter(pl.col("kind").is_in(GPU_KINDS))
    return locate(gpu, win, on=["rank"], at="ts_ns", keep=["step"])


def _stat(df: pl.DataFrame) -> dict[str, Any]:
    return {"count": df.height, "time_s": round(float(df.get_column("dur_ns").sum() or 0) * NS, 9)}


def cuda_graph_replay(events: pl.DataFrame, gpu: pl.DataFrame) -> tuple[bool, dict[str, Any]]:
    """Kernels correlated to a graph launch, carrying a graph node id, or nsys graph-replay rows."""
    gl = events.filter(pl.col("rclass") == "graph_launch").select("rank", "correlation").unique()
    by_launch = gpu.join(gl, on=["rank", "correlation"], how="semi")
    by_node = gpu.filter(pl.col("graph_node_id").fill_null(0) != 0)
    graph_rows = gpu.filter(pl.col("kind") == "graph")
    launches = events.filter(pl.col("rclass") == "graph_launch").height
    kernels = pl.concat([by_launch, by_node]).unique().height
    ev = {
        "graph_launches": launches,
        "graph_kernels": kernels,
        "graph_replay_rows": graph_rows.height,
    }
    return bool(kernels or graph_rows.height), ev


def grouped_gemm(gpu: pl.DataFrame, *, main_stream: dict[int, int]) -> tuple[bool, dict[str, Any]]:
    """One CUTLASS grouped kernel, or expert GEMMs fanned out over ≥2 side streams (TE multi-stream
    cuBLAS). Serialized per-expert GEMMs on one stream are not grouped. Fan-out, not measured
    concurrency, is the proof: on a launch-bound run small GEMMs on 4 streams rarely overlap
    (fixtures/traces/gpu_experts_multistream: 36 side-stream GEMMs, never two at once)."""
    cutlass = gpu.filter(pl.col("kclass") == "compute.gemm.grouped_cutlass")
    gemms = gpu.filter(pl.col("kclass").str.starts_with("compute.gemm.")).with_columns(
        pl.col("rank").replace_strict(main_stream, default=None).alias("_main")
    )
    side = gemms.filter(pl.col("stream") != pl.col("_main"))
    concurrent_ns = 0
    max_streams = 0
    if side.height:
        layers = {
            f"s{s}": side.filter(pl.col("stream") == s).select(
                "rank", pl.col("ts_ns").alias(START), (pl.col("ts_ns") + pl.col("dur_ns")).alias(END)
            )
            for s in sorted(set(side.get_column("stream").drop_nulls().to_list()))
        }
        seg = sweep(layers, by=["rank"]).with_columns(
            pl.sum_horizontal([pl.col(n).cast(pl.Int32) for n in layers]).alias("_n")
        )
        max_streams = int(seg.get_column("_n").max() or 0)
        conc = seg.filter(pl.col("_n") >= 2)
        concurrent_ns = int(conc.select((pl.col(END) - pl.col(START)).sum()).item() or 0)
    side_streams = side.select(pl.struct("rank", "stream").n_unique()).item() if side.height else 0
    ev = {
        "cutlass_grouped_kernels": cutlass.height,
        "side_stream_gemms": side.height,
        "side_streams": int(side_streams),
        "max_concurrent_side_streams": max_streams,
        "concurrent_side_gemm_s": round(concurrent_ns * NS, 9),
    }
    return bool(cutlass.height or max_streams >= 2 or side_streams >= 2), ev


def dispatcher_backend(
    gpu: pl.DataFrame, events: pl.DataFrame, comms: pl.DataFrame, comm: pl.DataFrame, *,
    hint: str | None = None
) -> tuple[str, dict[str, Any]]:
    """deepep | hybridep | nccl_alltoall | nccl_allgather | none | unknown, by kernel evidence.
    `comm`: the communication kernels with their process-group role (`with_pg_role`)."""
    k = gpu.get_column("kclass")
    n = {c: int((k.str.starts_with(c)).sum()) for c in (
        "comm.deepep.", "comm.hybridep.", "comm.nccl.sendrecv", "comm.nccl.allgather", "comm.")}
    # Megatron names its groups: a collective on the expert-parallel group is token dispatch
    ep = comm.filter(pl.col("pg_role") == "ep_dispatch").get_column("kclass")
    ep_sendrecv = int(ep.str.starts_with("comm.nccl.sendrecv").sum())
    ep_allgather = int(ep.str.starts_with("comm.nccl.allgather").sum())
    # the names of host rows alone are filtered (not every column), then matched
    host_names = pl.col("name").filter(pl.col("kind").is_in(["annotation", "cpu_op"]))
    a2a_ann = int(events.select(host_names.str.contains(r"(?i)all_?to_?all").sum()).item())
    a2a_meta = comms.filter(pl.col("collective").str.contains(r"(?i)all_?to_?all")).height if comms.height else 0
    ev = {
        "deepep_kernels": n["comm.deepep."],
        "hybridep_kernels": n["comm.hybridep."],
        "nccl_sendrecv_kernels": n["comm.nccl.sendrecv"],
        "nccl_allgather_kernels": n["comm.nccl.allgather"],
        "alltoall_host_calls": a2a_ann + a2a_meta,
        "comm_kernels": n["comm."],
        "ep_group_sendrecv_kernels": ep_sendrecv,
        "ep_group_allgather_kernels": ep_allgather,
    }
    if n["comm.hybridep."]:
        return "hybridep", ev
    if n["comm.deepep."]:
        return "deepep", ev
    if n["comm.nccl.sendrecv"] and (a2a_ann or a2a_meta or ep_sendrecv):
        return "nccl_alltoall", ev
    if (hint == "allgather" and n["comm.nccl.allgather"]) or (ep_allgather and not ep_sendrecv):
        return "nccl_allgather", ev
    if n["comm.nccl.sendrecv"]:
        # SendRecv without all-to-all calls may be EP dispatch, PP P2P or a CP ring: ambiguous
        return "unknown", ev
    # no EP-dispatch signature (any other comm is DP/TP collectives)
    return "none", ev


@dataclass(frozen=True, slots=True)
class Facts:
    """What ran, read from the GPU rows alone: everything `observe` reports except the two
    shares of step time, which need the walls (so the two can be computed side by side)."""

    observed: dict[str, Any]
    evidence: dict[str, Any]
    offload_ns: int  # offload copies in flight, clipped to the step windows
    pageable_ns: int = 0  # large copies through pageable host memory in flight, likewise


def gpu_facts(
    events: pl.DataFrame,
    steps: pl.DataFrame,
    *,
    comms: pl.DataFrame | None = None,
    dispatcher_hint: str | None = None,
    classes: KernelClasses | None = None,
    gpu: pl.DataFrame | None = None,
) -> Facts:
    """Backend facts of the analyzed steps. `events` must be classified; `gpu`, when the caller
    has it already, is `in_windows(events, steps)`."""
    require(events, ("kclass", "wall", "rclass"), what="classified events")
    comms = comms if comms is not None else pl.DataFrame()
    gpu = gpu if gpu is not None else in_windows(events, steps)
    comm = with_pg_role(gpu.filter(pl.col("wall") == "communication"), comms, classes)
    main_stream = _main_streams(gpu)
    graphs, g_ev = cuda_graph_replay(events, gpu)
    fp8 = gpu.filter(pl.col("kclass") == "compute.gemm.fp8")
    grouped, gg_ev = grouped_gemm(gpu, main_stream=main_stream)
    backend, d_ev = dispatcher_backend(gpu, events, comms, comm, hint=dispatcher_hint)
    large = gpu.filter(pl.col("kclass").is_in(OFFLOAD_CLASSES))
    off = offload_round_trips(gpu)
    one_way = large.height - off.height
    off_ns = _in_flight_ns(off, steps) if off.height else 0
    pageable = large.filter(pl.col("kclass") == "memory.pageable")
    pageable_ns = _in_flight_ns(pageable, steps) if pageable.height else 0
    observed = {
        "cuda_graph_replay": graphs,
        "fp8_gemm": fp8.height > 0,
        "grouped_gemm": grouped,
        "dispatcher_backend": backend,
    }
    evidence = {
        **g_ev,
        "fp8_gemm": _stat(fp8),
        "grouped_gemm": gg_ev,
        "dispatcher": d_ev,
        "offload": {**_stat(off), "in_flight_s": round(off_ns * NS, 9), "one_way_large_copies": one_way,
                    "pageable": _stat(off.filter(pl.col("kclass") == "memory.pageable"))},
        "pageable_copies": {**_stat(pageable), "in_flight_s": round(pageable_ns * NS, 9)},
        "copies": copy_table(gpu),
        "main_stream": {str(r): s for r, s in sorted(main_stream.items())},
        "comm_groups": comm_groups(comm),
    }
    return Facts(observed, evidence, off_ns, pageable_ns)


def observe(facts: Facts, per_step: pl.DataFrame, *, recompute: Mapping[str, int] | None = None
            ) -> tuple[dict[str, Any], dict[str, Any]]:
    """(observed, evidence) for the analyzed steps: the backend facts (`gpu_facts`) plus the
    recompute and offload shares of the walls (`per_step`: walls.attribute_walls output);
    `recompute`, the host-op counts behind the recompute share (walls.recompute_evidence)."""
    rc_ns = int(per_step.get_column("recompute_busy_ns").sum())
    compute_busy = int(per_step.get_column("compute_exposed_ns").sum()) + rc_ns
    wall_ns = int(per_step.get_column("wall_ns").sum())
    observed = {
        **facts.observed,
        # share of GPU compute busy time spent re-running forward work
        "recompute_fraction": _frac(rc_ns, compute_busy),
        # share of step wall time with an offload copy (large DtoH/HtoD both ways) in flight
        "offload_copy_fraction": _frac(facts.offload_ns, wall_ns),
        # ... with a large copy through pageable host memory in flight (either way)
        "pageable_copy_fraction": _frac(facts.pageable_ns, wall_ns),
    }
    evidence = {
        **facts.evidence,
        "recompute": {"busy_s": round(rc_ns * NS, 9), "compute_busy_s": round(compute_busy * NS, 9),
                      **(recompute or {})},
    }
    return observed, evidence


def copy_table(gpu: pl.DataFrame) -> dict[str, Any]:
    """Copies of the analysed steps by direction and memory kind (frames.COPY_MEMS; `unknown`
    where the trace does not say): count, bytes, time. Totals over the analysed window, like
    `evidence.classes`."""
    cp = gpu.filter(pl.col("kind") == "memcpy")
    out: dict[str, Any] = {}
    by = (cp.group_by(pl.col("copy_kind").cast(pl.String).fill_null("other"),
                      pl.col("copy_mem").cast(pl.String).fill_null("unknown"))
          .agg(pl.len().alias("n"), pl.col("bytes").sum().alias("b"), pl.col("dur_ns").sum().alias("t"))
          .sort("copy_kind", "copy_mem"))
    for kind, mem, n, b, t in by.iter_rows():
        out.setdefault(kind, {})[mem] = {"count": int(n), "bytes": int(b or 0), "time_s": round(t * NS, 9)}
    return out


def comm_groups(comm: pl.DataFrame) -> dict[str, Any]:
    """Communication kernels (with `pg_role`, `with_pg_role`) by the role of the process group
    they ran on (kernel_classes.yaml `process_groups`): EP dispatch vs gradient reduction vs TP,
    which kernel names alone cannot tell apart (an all-gather is the allgather dispatcher, a
    distributed optimizer or TP).
    `named` is false when the trace names no Megatron group; kernels on a group of no known role,
    or not linked to their collective, are `other`. Times are totals over the analyzed window,
    like `evidence.classes`."""
    named = bool(comm.get_column("pg_role").is_not_null().any())
    by = (comm.with_columns(pl.col("pg_role").fill_null("other"))
          .group_by("pg_role", "kclass").agg(pl.len().alias("n"), pl.col("dur_ns").sum().alias("t"))
          .sort("pg_role", "kclass"))
    # with named groups, no traffic of a class on a role is a measured zero, not an unknown
    zero = dict.fromkeys(sorted(set(by.get_column("kclass"))), 0.0) if named else {}
    roles: dict[str, Any] = {r: {"count": 0, "time_s": 0.0, "classes": dict(zero)}
                             for r in (("ep_dispatch", "grad_reduce", "tp") if named else ())}
    for role, kclass, n, t in by.iter_rows():
        r = roles.setdefault(role, {"count": 0, "time_s": 0.0, "classes": dict(zero)})
        r["count"] += int(n)
        r["time_s"] = round(r["time_s"] + t * NS, 9)
        r["classes"][kclass] = round(t * NS, 9)
    return {"named": named, "by_role": roles}


def summary_lines(doc: Mapping[str, Any]) -> list[str]:
    """The terminal's lines for `evidence.comm_groups` (where groups are named) and, where large
    host copies ran, `evidence.copies`, per step and rank."""
    return _group_lines(doc) + _copy_lines(doc)


def _per_step_rank(doc: Mapping[str, Any]) -> int:
    return max(len(doc.get("steps") or []) * len(doc.get("ranks_analyzed") or []), 1)


def _group_lines(doc: Mapping[str, Any]) -> list[str]:
    groups = (doc.get("evidence") or {}).get("comm_groups") or {}
    if not groups.get("named"):
        return []
    n = _per_step_rank(doc)
    parts = [f"{role.replace('_', ' ')} " + (f"{r['time_s'] / n * 1e3:,.1f} ms" if r["time_s"] else "—")
             for role, r in sorted(groups["by_role"].items(), key=lambda kv: -kv[1]["time_s"])
             if r["count"]]
    return ["communication kernels by process group (per step and rank): " + " · ".join(parts)]


def _copy_lines(doc: Mapping[str, Any]) -> list[str]:
    ev = doc.get("evidence") or {}
    large = ((ev.get("offload") or {}).get("count") or 0) + ((ev.get("pageable_copies") or {}).get("count") or 0)
    if not large:
        return []
    n = _per_step_rank(doc)
    rows = sorted(((k, m, c["time_s"]) for k, by in (ev.get("copies") or {}).items() for m, c in by.items()
                   if c["time_s"] > 0), key=lambda r: (-r[2], r[0], r[1]))
    parts = [f"{k} {m} {t / n * 1e3:,.1f} ms" for k, m, t in rows[:5]]
    out = ["copies by direction and memory (per step and rank): " + " · ".join(parts)]
    if (ev.get("pageable_copies") or {}).get("count"):
        out.append("  pageable: the driver stages each copy through its own pinned buffer and the host "
                   "waits for it, so it cannot overlap compute")
    return out


def _in_flight_ns(ops: pl.DataFrame, steps: pl.DataFrame) -> int:
    """Time with at least one of `ops` running, clipped to the step windows."""
    win = steps.select("rank", "step", "win_start_ns", "win_end_ns")
    iv = ops.select("rank", pl.col("ts_ns").alias(START), (pl.col("ts_ns") + pl.col("dur_ns")).alias(END))
    clipped = clip(union(iv, by=["rank"]), win, on=["rank"], window_cols=["step"])
    return int(total(clipped, by=["rank", "step"]).get_column("len_ns").sum() or 0)


def _main_streams(gpu: pl.DataFrame) -> dict[int, int]:
    """Per rank, the stream with the most compute kernel time (the default compute stream)."""
    c = gpu.filter((pl.col("wall") == "compute") & pl.col("stream").is_not_null())
    if c.height == 0:
        return {}
    t = c.group_by(["rank", "stream"]).agg(pl.col("dur_ns").sum()).sort(
        ["rank", "dur_ns", "stream"], descending=[False, True, False]
    )
    top = t.group_by("rank", maintain_order=True).first()
    return {int(r): int(s) for r, s in zip(top["rank"], top["stream"], strict=True)}


def _frac(num: int, den: int) -> float:
    if den <= 0:
        return 0.0
    return min(1.0, max(0.0, num / den))
