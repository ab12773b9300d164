"""The audit's probes: measurements the signatures (rules/signatures.yaml) declare beyond the
diagnosis' own facts, taken over the same classified events and steady-step windows — kernels by
class or name, comm/compute overlap, host ops, micro-batches per step, graph-capture scope — and
the example kernels shown beside a verdict (`moetune.analyzer.audit`)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import polars as pl
from moetune.analyzer.classify import KernelClasses, match_expr, with_pg_role
from moetune.analyzer.intervals import END, START, intersect, total_ns, union

NS = 1e-9


def _iv(df: pl.DataFrame) -> pl.DataFrame:
    return df.select("rank", pl.col("ts_ns").alias(START), (pl.col("ts_ns") + pl.col("dur_ns")).alias(END))


def _stat(df: pl.DataFrame) -> dict[str, Any]:
    return {"count": df.height, "time_s": round(float(df.get_column("dur_ns").sum() or 0) * NS, 9)}


def class_expr(classes: Sequence[str]) -> pl.Expr:
    """kclass in `classes`; an entry ending in `.*` is a family (`comm.deepep.*`)."""
    exact = [c for c in classes if not c.endswith(".*")]
    cond = pl.col("kclass").is_in(exact)
    for fam in (c[:-1] for c in classes if c.endswith(".*")):
        cond = cond | pl.col("kclass").str.starts_with(fam)
    return cond


def known_class(name: str, known: frozenset[str]) -> bool:
    if name.endswith(".*"):
        return any(k.startswith(name[:-1]) for k in known)
    return name in known


def kernels_probe(gpu: pl.DataFrame, spec: Mapping[str, Any]) -> dict[str, Any]:
    cond = pl.lit(False)
    if spec.get("classes"):
        cond = cond | class_expr(spec["classes"])
    if spec.get("regex"):
        cond = cond | ((pl.col("kind") == "kernel") & match_expr({"regex": list(spec["regex"])}))
    hit = gpu.filter(cond)
    return {**_stat(hit), **_stream_spread(hit), "examples": examples(hit)}


def _stream_spread(df: pl.DataFrame) -> dict[str, Any]:
    """How the kernels spread over streams: distinct streams (most on one rank), and the share of
    time-consecutive kernels that switch stream — round-robin dispatch onto side streams switches
    often even when host-bound launches leave the kernels no chance to overlap."""
    if df.height < 2:
        return {"streams": int(df.get_column("stream").n_unique()) if df.height else 0, "stream_switch_fraction": 0.0}
    d = df.sort("rank", "ts_ns").with_columns(
        (pl.col("stream") != pl.col("stream").shift(1).over("rank")).alias("_sw")
    )
    pairs = d.filter(pl.col("_sw").is_not_null())
    streams = d.group_by("rank").agg(pl.col("stream").n_unique()).get_column("stream").max()
    return {
        "streams": int(streams or 0),
        "stream_switch_fraction": round(pairs.get_column("_sw").mean() or 0.0, 4) if pairs.height else 0.0,
    }


def overlap_probe(gpu: pl.DataFrame, spec: Mapping[str, Any], comms: pl.DataFrame,
                   classes: KernelClasses) -> dict[str, Any]:
    comm = gpu.filter(class_expr(spec["classes"]) & (pl.col("dur_ns") > 0))
    by_group = False
    if spec.get("groups"):
        # only collectives on these process-group roles (e.g. gradient reduction, not the
        # allgather dispatcher's reduce-scatter), where the trace names the groups at all
        named = with_pg_role(comm, comms, classes)
        by_group = bool(named.get_column("pg_role").is_not_null().any())
        if by_group:  # collectives on groups of no known role stay
            keep = pl.col("pg_role").is_null() | pl.col("pg_role").is_in(list(spec["groups"]))
            comm = named.filter(keep).drop("pg_role")
    comp = gpu.filter((pl.col("wall") == "compute") & (pl.col("kind") == "kernel") & (pl.col("dur_ns") > 0))
    comm_u = union(_iv(comm), by=["rank"])
    both = intersect(comm_u, union(_iv(comp), by=["rank"]), by=["rank"])
    busy, over = total_ns(comm_u), total_ns(both)
    out = {
        **_stat(comm),
        "busy_s": round(busy * NS, 9),
        "overlapped_s": round(over * NS, 9),
        "fraction": round(over / busy, 4) if busy else 0.0,
    }
    if spec.get("groups"):
        out["by_group"] = by_group
    if spec.get("issued_before_last"):
        # On a launch-bound GPU an overlapped reduce runs beside idle time, not beside kernels: when
        # it starts (before the step's last backward GEMM, or only after it) is the evidence then.
        last = (gpu.filter(class_expr(spec["issued_before_last"]))
                .group_by("rank", "step").agg((pl.col("ts_ns") + pl.col("dur_ns")).max().alias("_last")))
        early = comm.join(last, on=["rank", "step"], how="inner").filter(pl.col("ts_ns") < pl.col("_last"))
        out["issued_before"] = early.height
        out["issued_before_fraction"] = round(early.height / comm.height, 4) if comm.height else 0.0
    return out


# Embedding lookups per micro-batch forward, by Megatron's position embedding type: the word
# embedding, plus the position embedding's own for learned absolute positions.
LOOKUPS_PER_MICRO_BATCH = {"learned_absolute": 2, "rope": 1, "mrope": 1, "yarn": 1, "none": 1,
                           "relative": 1}


def micro_batch_probe(host: pl.DataFrame, spec: Mapping[str, Any], claims: Mapping[str, Any]
                       ) -> dict[str, Any]:
    """How many forward passes each step ran (ops that run once per micro-batch, counted per rank
    and step, median), against what the claimed micro-batch size gives: GBS / (MBS × DP) micro-
    batches. With PP > 1 only the first stage embeds, so nothing is expected."""
    hit = host.filter(pl.col("kind") == "cpu_op").filter(match_expr({"regex": list(spec["regex"])}))
    per = hit.group_by("rank", "step").len().get_column("len") if hit.height else pl.Series([0])
    per_step = float(per.median() or 0)
    per_step = int(per_step) if per_step.is_integer() else per_step

    def num(name: str) -> int | None:
        v = claims.get(name)
        return v if isinstance(v, int) and not isinstance(v, bool) and v > 0 else None

    gbs, mbs, dp = num("global_batch_size"), num("micro_batch_size"), num("data_parallel_size")
    k = LOOKUPS_PER_MICRO_BATCH.get(str(claims.get("position_embedding_type")))
    pp = num("pipeline_model_parallel_size") or 1
    expected = None
    if gbs and mbs and dp and k and pp == 1 and gbs % (mbs * dp) == 0:
        expected = gbs // (mbs * dp) * k
    # the evidence says micro-batches; the lookups they are counted by stand beside them
    per_micro = (per_step / k if k else None)
    return {"count": hit.height, "lookups_per_step": per_step, "lookups_expected": expected,
            "lookups_per_micro_batch": k,
            "micro_batches_per_step": (int(per_micro) if per_micro is not None
                                       and float(per_micro).is_integer() else per_micro),
            "micro_batches_expected": expected // k if expected is not None and k else None,
            "matches": None if expected is None or not hit.height else per_step == expected}


def host_probe(host: pl.DataFrame, spec: Mapping[str, Any], classes: KernelClasses) -> dict[str, Any]:
    cond = pl.lit(False)
    if spec.get("regex"):
        cond = cond | match_expr({"regex": list(spec["regex"])})
    if spec.get("classes_recompute") and classes.recompute_regions:
        cond = cond | match_expr(classes.recompute_regions)
    return {"count": host.filter(cond).height}


def graph_scope_probe(
    events: pl.DataFrame, gpu: pl.DataFrame, spec: Mapping[str, Any], modules: Sequence[str]
) -> dict[str, Any]:
    """Kernels launched eagerly (not by a graph launch, no graph node id) inside host annotation /
    NVTX / Python-module ranges, or on-stream GPU annotations, named for each claimed module."""
    graph_corr = events.filter(pl.col("rclass") == "graph_launch").select("rank", "correlation").unique()
    eager = gpu.filter(
        (pl.col("kind") == "kernel") & (pl.col("graph_node_id").fill_null(0) == 0)
    ).join(graph_corr, on=["rank", "correlation"], how="anti")
    launches = events.filter((pl.col("rclass") == "launch") & pl.col("correlation").is_not_null())
    by_module: dict[str, int] = {}
    ranges_seen = 0
    for module in modules:
        patterns = spec["modules"].get(module)
        if not patterns:
            continue
        named = events.filter(match_expr({"regex": list(patterns)}))
        # host ranges: annotations / NVTX, and Kineto with_stack `nn.Module: <Class>_N` frames
        host = named.filter(pl.col("kind").is_in(["annotation", "python"]))
        dev = named.filter(pl.col("kind") == "gpu_annotation")
        ranges_seen += host.height + dev.height
        hits: list[pl.DataFrame] = []
        if host.height and launches.height:
            inside = _inside(launches.select("rank", "tid", "ts_ns", "correlation"), host, ["rank", "tid"])
            hits.append(eager.join(inside.select("rank", "correlation").unique(), on=["rank", "correlation"], how="semi"))
        if dev.height:
            ranges = dev.with_columns(pl.col("tid").alias("stream"))
            hits.append(_inside(eager, ranges, ["rank", "stream"]))
        n = pl.concat([h.select("rank", "ts_ns", "stream", "name") for h in hits]).unique().height if hits else 0
        by_module[module] = n
    return {"ranges": ranges_seen, "eager_kernels": sum(by_module.values()), "eager_by_module": by_module}


def _inside(points: pl.DataFrame, ranges: pl.DataFrame, by: list[str]) -> pl.DataFrame:
    """Rows of `points` whose ts_ns lies inside the union of `ranges` sharing the `by` keys."""
    iv = union(
        ranges.select(*by, pl.col("ts_ns").alias(START), (pl.col("ts_ns") + pl.col("dur_ns")).alias(END)),
        by=by,
    )
    if iv.height == 0 or points.height == 0:
        return points.clear()
    cast = {k: iv.schema[k] for k in by}
    pts = points.with_columns([pl.col(k).cast(t) for k, t in cast.items()]).sort("ts_ns")
    return (
        pts.join_asof(iv.sort(START), left_on="ts_ns", right_on=START, by=by, strategy="backward",
                      check_sortedness=False)
        .filter(pl.col(END).is_not_null() & (pl.col("ts_ns") < pl.col(END)))
        .drop(START, END)
    )


def host_in_steps(events: pl.DataFrame, steps: pl.DataFrame) -> pl.DataFrame:
    """Host annotations and CPU ops starting inside an analyzed step's host range, with its
    `step`."""
    host = events.filter(pl.col("kind").is_in(["annotation", "cpu_op"]))
    win = steps.select("rank", "step", "start_ns", "end_ns").unique()
    return (
        host.with_row_index("_i")
        .join(win, on="rank", how="inner")
        .filter((pl.col("ts_ns") >= pl.col("start_ns")) & (pl.col("ts_ns") < pl.col("end_ns")))
        .unique("_i", keep="first", maintain_order=True)
        .drop("_i", "start_ns", "end_ns")
    )


def examples(df: pl.DataFrame, limit: int = 3) -> list[dict[str, Any]]:
    if df.height == 0:
        return []
    top = (
        df.group_by("name")
        .agg(pl.len().alias("count"), pl.col("dur_ns").sum().alias("t"), pl.col("kclass").first())
        .sort(["t", "name"], descending=[True, False])
        .head(limit)
    )
    return [
        {"name": _short(r["name"]), "kclass": r["kclass"] or "", "count": int(r["count"]),
         "time_s": round(r["t"] * NS, 9)}
        for r in top.to_dicts()
    ]


def _short(name: str, limit: int = 160) -> str:
    return name if len(name) <= limit else name[: limit - 1] + "…"
