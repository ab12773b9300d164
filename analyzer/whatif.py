"""What-if estimates: predict a knob change's step time by transforming the median step's timeline
graph and replaying it (the approach of Daydream, USENIX ATC 2020, and Lumos, MLSys 2025).

The median step of the first analysed rank is cut out of the timeline graph (analyzer/graph.py) and
replayed in topological order with its measured durations and gaps:

- a GPU op starts when its launch has happened (launch call start + the op's own launch latency,
  capped at the typical one) and its stream and event-wait predecessors have ended;
- a host call starts after its program-order predecessor ended plus the CPU time measured between
  the two (Python and framework work that has no node of its own); a blocking call ends after the
  op it waited on ended plus its measured tail.

Replaying the untouched step reproduces the measured step up to the replay's own error (reported
as `fidelity`); a transform edits durations and gaps (the primitives of Daydream: remove, scale,
merge), and the prediction is the measured step time × replay(transformed) / replay(untouched),
so the replay's bias cancels. Each transform is declared as data in `whatif.yaml` (which knob
change it models, its parameters and their plausible ranges); the code has one small function per
transform kind. A range parameter gives the predicted range: the low and high ends of the speedup
come from replays at the two ends of the parameter's range.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from functools import cache
from typing import Any

import numpy as np
import polars as pl
from moetune.analyzer.frames import Trace
from moetune.analyzer.graph import EDGE_KINDS, TimelineGraph, build_graph
from moetune.analyzer.walls import recompute_launches

from moetune.errors import UserError
from moetune.resources import data, schema
from moetune.schema_check import first_error
from moetune.yamlio import line_of, read_yaml

try:  # the compiled replay (setup.py); `_replay_py` is the same loop in Python
    from moetune.analyzer._graph_loops import replay as _replay_c
except ImportError:  # pragma: no cover - built at install; a machine without a compiler
    _replay_c = None

WHATIF_PATH = data("moetune.analyzer", "whatif.yaml")
_US = 1_000
# Relative error of a replayed gain when a transform states none: Daydream reports most
# predictions within 10-15 % of measured, Lumos 3 %; ours are cruder (no module names).
UNCERTAINTY = 0.25
# Non-GEMM ops between two GEMMs of one expert loop: Megatron-Core's SequentialMLP runs up to ~9
# (token slicing, activation and its backward, bias and probability products) per expert.
MAX_BETWEEN = 12


SHIPPED_PATH = WHATIF_PATH


@cache
def transforms() -> dict[str, dict[str, Any]]:
    """The transform catalog (whatif.yaml), validated at every load (moetune.schema_check: no
    jsonschema import on the diagnosis path)."""
    doc, lines = read_yaml(WHATIF_PATH)
    validate_transforms(doc, WHATIF_PATH, lines)
    return dict(doc["transforms"])


def validate_transforms(doc: Any, path: Any, lines: Mapping[tuple, int] | None = None) -> None:
    """UserError naming the first place where `doc` breaks schemas/whatif.schema.json, whose
    `kind` enum tests/test_extension_points.py holds equal to `KIND_FUNCS`."""
    err = first_error(doc, json.loads(schema("whatif").read_text()))
    for tid, spec in doc["transforms"].items() if err is None else ():
        if spec["kind"] not in KIND_FUNCS:  # the schema's enum ran ahead of the registry
            err = (("transforms", tid, "kind"),
                   f"{spec['kind']!r} has no function in KIND_FUNCS (analyzer/whatif.py)")
            break
    if err:
        at, message = err
        line = line_of(lines or {}, at)
        raise UserError(f"{'/'.join(map(str, at))}: {message}",
                        path=f"{path}:{line}" if line else path)


# --------------------------------------------------------------------------- the step's graph


@dataclass(frozen=True)
class Episode:
    """One step of one rank as arrays, in a topological order of its dependency graph."""

    start_ns: int
    measured_ns: int
    ids: np.ndarray        # event ids (graph nodes), topological order
    is_gpu: np.ndarray
    ts: np.ndarray         # original start/end, ns
    te: np.ndarray
    kclass: list[str]      # GPU: kernel class; host: rclass of the call
    names: list[str]       # event names (kernel names for GPU ops)
    opt: np.ndarray        # belongs to the optimizer (its kernels and their launch calls)
    recompute: np.ndarray  # re-runs forward work inside backward (kernels and launch calls)
    preds: list[list[tuple[int, str]]]  # per position: (pred position, edge kind)
    lat_typ: int           # typical launch latency of a launch-bound op
    pred_ptr: np.ndarray   # the same predecessors as CSR arrays, for the compiled replay:
    pred_src: np.ndarray   #   positions pred_src[pred_ptr[i]:pred_ptr[i + 1]] of position i,
    pred_kind: np.ndarray  #   their kinds as int8 indices into graph.EDGE_KINDS


def episode(trace: Any, events: pl.DataFrame, rank: int, start_ns: int, end_ns: int,
            recompute_corr: pl.DataFrame | None = None, graph: TimelineGraph | None = None
            ) -> Episode | None:
    """The step [start_ns, end_ns) of `rank` as an Episode; None when it has no GPU op.
    `graph`: one already built on `events` that covers the window (any ranks, any span), whose
    nodes of `rank` in the window are taken instead of building the window's own."""
    if graph is None:
        tr = Trace(events=events, comms=trace.comms, flows=trace.flows, ranks=trace.ranks,
                   warnings=trace.warnings)
        graph = build_graph(tr, window=(start_ns, end_ns), rank=rank)
        nodes = graph.nodes
    else:
        nodes = graph.nodes.filter((pl.col("rank") == rank) & (pl.col("ts_ns") < end_ns)
                                   & (pl.col("end_ns") > start_ns))
    if nodes.height == 0 or not nodes["is_gpu"].any():
        return None
    # node ids are row numbers of `events`: the window's classes by gather, not a join over all
    cls = events.select("kclass", "rclass")[nodes["node"].to_numpy()].select(
        pl.coalesce(pl.col("kclass").cast(pl.String),
                    pl.col("rclass").cast(pl.String)).fill_null("").alias("cls"))
    nodes = nodes.with_columns(cls.to_series())
    # host calls inside the window only (launch calls of earlier steps were kept by the graph)
    nodes = nodes.filter(pl.col("is_gpu") | (pl.col("ts_ns") >= start_ns)
                         & (pl.col("ts_ns") < end_ns))
    # graph positions of the kept nodes (graph.ids is sorted, so a position orders as its id)
    kept = np.searchsorted(graph.ids, nodes["node"].to_numpy())
    order_pos = _topo(graph, kept)
    order = graph.ids[order_pos].tolist()
    nodes = nodes.join(pl.DataFrame({"node": order, "_pos": range(len(order))},
                                    schema={"node": pl.Int64, "_pos": pl.Int64}), on="node"
                       ).sort("_pos")
    corr = nodes["correlation"].to_list()
    names = nodes["name"].cast(pl.String).fill_null("").to_list()
    is_gpu = nodes["is_gpu"].to_numpy()
    kcls = nodes["cls"].to_list()
    opt_corr = {c for c, k, gp in zip(corr, kcls, is_gpu, strict=True)
                if gp and c is not None and k == "compute.optimizer"}
    opt = np.array([c is not None and c in opt_corr for c in corr], dtype=bool)
    rec = np.zeros(len(order), dtype=bool)
    if recompute_corr is not None and recompute_corr.height:
        rc = set(recompute_corr.filter(pl.col("rank") == rank)["correlation"].to_list())
        rec = np.array([c is not None and c in rc for c in corr], dtype=bool)
    at = np.full(graph.n_nodes, -1, dtype=np.int64)  # graph position → episode position
    at[order_pos] = np.arange(len(order_pos))
    # in-edges of each kept node, in episode order, as CSR: the graph's in-edge ranges of the
    # order's positions laid end to end, then those from outside the episode dropped
    lo, hi = graph.in_ptr[order_pos], graph.in_ptr[order_pos + 1]
    counts = hi - lo
    owner = np.repeat(np.arange(len(order_pos)), counts)
    j = np.repeat(lo - np.cumsum(counts) + counts, counts) + np.arange(int(counts.sum()))
    edge = graph.in_edge[j]
    src_at = at[graph.src[edge]]
    inside = src_at >= 0
    pred_src = src_at[inside].astype(np.int64)
    pred_kind = graph.kind[edge][inside].astype(np.int8)
    pred_ptr = np.zeros(len(order) + 1, dtype=np.int64)
    np.cumsum(np.bincount(owner[inside], minlength=len(order)), out=pred_ptr[1:])
    ptr_l, src_l, kind_l = pred_ptr.tolist(), pred_src.tolist(), pred_kind.tolist()
    preds: list[list[tuple[int, str]]] = [
        [(src_l[k], EDGE_KINDS[kind_l[k]]) for k in range(ptr_l[i], ptr_l[i + 1])]
        for i in range(len(order))]
    ts = nodes["ts_ns"].to_numpy().astype(np.int64)
    te = nodes["end_ns"].to_numpy().astype(np.int64)
    lat = [ts[i] - ts[p] for i in range(len(order)) if is_gpu[i]
           for p, k in preds[i] if k == "launch" and ts[i] >= ts[p]
           and not any(k2 == "stream" and te[p2] > ts[p] for p2, k2 in preds[i])]
    lat_typ = int(np.median(lat)) if lat else 5 * _US
    return Episode(start_ns, end_ns - start_ns, np.array(order), is_gpu, ts, te, kcls, names, opt,
                   rec, preds, max(lat_typ, 1 * _US), pred_ptr, pred_src, pred_kind)


def _topo(graph: TimelineGraph, keep: np.ndarray) -> np.ndarray:
    """Kahn's order of the kept graph positions, ties by id (ids follow the trace's time order;
    positions order as ids)."""
    import heapq

    inside = np.zeros(graph.n_nodes, dtype=bool)
    inside[keep] = True
    sub = inside[graph.src] & inside[graph.dst]
    src, dst = graph.src[sub], graph.dst[sub]
    o = np.argsort(src, kind="stable")
    succ_ptr = np.zeros(graph.n_nodes + 1, dtype=np.int64)
    np.cumsum(np.bincount(src, minlength=graph.n_nodes), out=succ_ptr[1:])
    ptr, succ = succ_ptr.tolist(), dst[o].tolist()
    indeg = np.bincount(dst, minlength=graph.n_nodes).tolist()
    ready = [n for n in np.unique(keep).tolist() if indeg[n] == 0]
    heapq.heapify(ready)
    out: list[int] = []
    while ready:
        n = heapq.heappop(ready)
        out.append(n)
        for s in succ[ptr[n]:ptr[n + 1]]:
            indeg[s] -= 1
            if indeg[s] == 0:
                heapq.heappush(ready, s)
    return np.array(out, dtype=np.int64)


# --------------------------------------------------------------------------- replay


@dataclass
class Edit:
    """Per-node changes a transform makes: new GPU durations, host time factors, launch-free ops."""

    dur: np.ndarray          # new duration of every node (GPU op or host call)
    gap: np.ndarray          # factor on the CPU time before a host call (after its predecessor)
    no_launch: np.ndarray    # GPU op no longer waits for its launch (graph replay)


def untouched(ep: Episode) -> Edit:
    n = len(ep.ids)
    return Edit((ep.te - ep.ts).astype(np.float64), np.ones(n), np.zeros(n, dtype=bool))


def replay(ep: Episode, edit: Edit, host_scale: float = 1.0) -> float:
    """The step's length (ns) when its graph runs with the edited durations and gaps; host call
    durations and the CPU time between calls are further scaled by `host_scale`. Compiled
    (`_graph_loops.replay`) where built, else `_replay_py`: the same loop, equal floats."""
    if _replay_c is None:
        return _replay_py(ep, edit, host_scale)
    return _replay_c(ep.ts, ep.te, ep.is_gpu.astype(np.uint8), edit.dur.astype(np.float64),
                     edit.gap.astype(np.float64), edit.no_launch.astype(np.uint8), ep.pred_ptr,
                     ep.pred_src, ep.pred_kind, int(ep.start_ns), int(ep.lat_typ),
                     float(host_scale))


def _replay_py(ep: Episode, edit: Edit, host_scale: float = 1.0) -> float:
    """`replay`'s loop in Python (the compiled one mirrors it, operation for operation)."""
    n = len(ep.ids)
    start = [0.0] * n
    end = [0.0] * n
    ts, te, is_gpu = ep.ts.tolist(), ep.te.tolist(), ep.is_gpu.tolist()
    dur, gapf, free = edit.dur.tolist(), edit.gap.tolist(), edit.no_launch.tolist()
    lat = ep.lat_typ
    for i in range(n):
        preds = ep.preds[i]
        ready = float(ts[i] - ep.start_ns) if not preds else 0.0
        if is_gpu[i]:
            for p, k in preds:
                if k == "launch":
                    if free[i]:
                        continue
                    r = start[p] + min(max(ts[i] - ts[p], 0), lat)
                else:  # stream, event_wait, collective: after the predecessor ended
                    r = end[p]
                if r > ready:
                    ready = r
            start[i] = ready
            end[i] = ready + dur[i]
            continue
        waited = 0.0
        blocked_until = ts[i]
        # Of several host predecessors (program order and a hand-off from another thread), the
        # one that ended last released the call: only its gap is CPU work, the others' gaps
        # were waiting for it.
        binding, last = -1, -1
        for p, k in preds:
            if k == "host" and te[p] > last:
                binding, last = p, te[p]
        for p, k in preds:
            if k == "sync":
                waited = max(waited, end[p])
                blocked_until = max(blocked_until, te[p])
            else:
                gap = max(ts[i] - te[p], 0) * gapf[i] * host_scale if p == binding else 0.0
                ready = max(ready, end[p] + gap)
        start[i] = ready
        own = dur[i] * host_scale
        if blocked_until > ts[i]:  # it blocked: own time is the tail after the awaited op ended
            tail = max(te[i] - blocked_until, 0) * (own / max(te[i] - ts[i], 1))
            end[i] = max(ready, waited) + tail
        else:
            end[i] = max(ready + own, waited)
    return max(end) if n else 0.0


def host_scale_for(ep: Episode, reference_ns: float, base_ns: float) -> float:
    """The factor on host time that makes the untouched replay last `reference_ns`: a profiled
    step is slower than the run's unprofiled one, and the profiler's cost is host time (per-op
    bookkeeping), so the host work is scaled to the step time the run's log measured."""
    if not reference_ns or reference_ns >= base_ns:
        return 1.0
    lo, hi = 0.05, 1.0
    e = untouched(ep)
    for _ in range(12):  # bisection: the replay grows monotonically with host time
        mid = (lo + hi) / 2
        if replay(ep, e, mid) > reference_ns:
            hi = mid
        else:
            lo = mid
        if hi - lo < 0.01:
            break
    return (lo + hi) / 2


# --------------------------------------------------------------------------- transforms


def drop_recompute(ep: Episode, _params: Mapping[str, float], _ctx: Mapping[str, Any]) -> Edit | None:
    """Recompute off: the forward work re-run inside backward, its launches and its CPU time go."""
    if not ep.recompute.any():
        return None
    e = untouched(ep)
    e.dur[ep.recompute] = 0.0
    e.gap[ep.recompute & ~ep.is_gpu] = 0.0
    return e


def _affine(dur: np.ndarray, fixed_ns: float, k: float) -> np.ndarray:
    """Each op's share of a k× larger op: its fixed part is paid once for k of them."""
    fixed = np.minimum(dur, fixed_ns)
    return fixed / k + (dur - fixed)


def _fold(ep: Episode, mask: np.ndarray, k: float, fixed_us: float) -> Edit:
    """k repetitions of the masked work become one k× larger: host calls and the CPU time before
    them ÷ k, each GPU op a k-th of a k× larger op."""
    e = untouched(ep)
    host = mask & ~ep.is_gpu
    e.dur[host] /= k
    e.gap[host] /= k
    gpu = mask & ep.is_gpu
    e.dur[gpu] = _affine(e.dur[gpu], fixed_us * _US, k)
    return e


def fold_micro_batches(ep: Episode, params: Mapping[str, float], ctx: Mapping[str, Any]
                       ) -> Edit | None:
    """Micro-batch × k at the same global batch: k× fewer micro-batches, each k× larger. Outside
    the optimizer, host calls and the CPU time between them shrink k×, and every GPU op becomes a
    k-th of a k× larger op (its fixed cost, e.g. launch and tail effects, amortised over k)."""
    k = float(ctx.get("factor") or params.get("factor") or 2)
    if k <= 1:
        return None
    tail = ctx.get("per_step_tail")
    body = ~ep.opt if tail is None else ~ep.opt & ~tail
    return _fold(ep, body, k, params["fixed_us"])


def _per_step_tail(ep: Episode, passes_end_ns: int | None) -> np.ndarray:
    """Work after the last micro-batch's backward (gradient sync and norm, the optimizer, the
    training loop's own Python): paid once per step whatever the micro-batch size, so it does not
    fold. Host calls from `passes_end_ns` on, and the GPU ops they launched."""
    tail = np.zeros(len(ep.ids), dtype=bool)
    if passes_end_ns is None:
        return tail
    tail[~ep.is_gpu & (ep.ts >= passes_end_ns)] = True
    for i in np.nonzero(ep.is_gpu)[0]:
        if any(k == "launch" and tail[p] for p, k in ep.preds[i]):
            tail[i] = True
    return tail


def group_expert_gemms(ep: Episode, params: Mapping[str, float], ctx: Mapping[str, Any]
                       ) -> Edit | None:
    """Grouped GEMM: the per-expert GEMM loop becomes one grouped kernel per GEMM. The expert
    loop's ops (the GEMMs of the E experts and the small ops between them on their stream) and
    their launches run once instead of E times: host time ÷ E, each GPU op a share of one E× larger
    op."""
    experts = int(ctx.get("experts") or 0)
    if experts <= 1:
        return None
    gemm = np.array([k.startswith("compute.gemm") and k != "compute.gemm.grouped_cutlass"
                     for k in ep.kclass]) & ep.is_gpu & ~ep.opt
    if gemm.sum() < 2 * experts:
        return None
    passes = int(ctx.get("passes") or 0)
    loop = _per_expert_ops(ep, experts, passes) if passes else _expert_loop(ep, gemm, experts)
    if not loop.any():
        return None
    return _fold(ep, loop, experts, params["fixed_us"])


def _per_expert_ops(ep: Episode, experts: int, passes: int) -> np.ndarray:
    """Ops the expert loop runs once per expert: kernels that occur at least a quarter of the
    experts' times per MoE layer pass (the dense parts of a layer run a few kernels of a kind per
    pass, the loop E of each), plus their launch calls."""
    from collections import Counter

    body = ep.is_gpu & ~ep.opt
    # a GEMM's kernel is picked per shape, and the experts' token counts differ: count GEMMs by
    # class, other kernels by name
    keys = [k if k.startswith("compute.gemm") else n
            for k, n in zip(ep.kclass, ep.names, strict=True)]
    count = Counter(key for key, b in zip(keys, body, strict=True) if b)
    least = max(experts / 4, 2) * passes
    flags = np.array([bool(b) and count[key] >= least for key, b in zip(keys, body, strict=True)])
    return _with_launches(ep, flags)


def _with_launches(ep: Episode, flags: np.ndarray) -> np.ndarray:
    """The flagged GPU ops and the host calls that launched them."""
    out = flags.copy()
    for i in np.nonzero(flags & ep.is_gpu)[0]:
        for p, k in ep.preds[i]:
            if k == "launch":
                out[p] = True
    return out


def _expert_loop(ep: Episode, gemm: np.ndarray, experts: int) -> np.ndarray:
    """Positions of the per-expert loop: runs of GEMMs (in time order, at most MAX_BETWEEN other
    ops apart) holding at least half the experts' worth of GEMMs, the ops between them and their
    launch calls. Without module names this is the shape the loop leaves: the same few kernels
    once per expert, back to back."""
    order = np.argsort(ep.ts, kind="stable")
    gpu_pos = [i for i in order if ep.is_gpu[i]]
    names = [ep.kclass[i] for i in gpu_pos]
    flags = np.zeros(len(ep.ids), dtype=bool)
    # experts that got no tokens launch nothing: half the experts' GEMMs in a run is a loop; a
    # dense block (attention, router: 2-6 GEMMs per layer and pass) is shorter
    least = max(4, experts // 2)
    # windows of consecutive GPU ops (time order) holding ≥ E GEMMs, at most MAX_BETWEEN other
    # ops apart: the expert loop interleaves its GEMMs with a few small ops
    run: list[int] = []
    since = 0
    n_gemm = 0
    for i, _name in zip(gpu_pos, names, strict=True):
        if gemm[i]:
            run.append(i)
            n_gemm += 1
            since = 0
        elif run:
            since += 1
            run.append(i)
            if since > MAX_BETWEEN:
                if n_gemm >= least:
                    flags[run[:len(run) - since]] = True
                run, n_gemm, since = [], 0, 0
    if run and n_gemm >= least:
        flags[run[:len(run) - since]] = True
    return _with_launches(ep, flags)


def capture_launches(ep: Episode, params: Mapping[str, float], _ctx: Mapping[str, Any]
                     ) -> Edit | None:
    """CUDA graphs: outside the optimizer, ops replay from a graph: no launch waits, their launch
    calls go, and only `host_kept` of the CPU time between calls remains (the Python of the
    captured layers does not run on replay; the rest of the step still does). A scoped capture
    (`captured` < 1, e.g. only the MoE router and token preprocess) graphs that share of the
    launches, spread evenly over the step: a trace names no modules, and the scopes recur in
    every layer and pass."""
    body = ~ep.opt
    share = float(params.get("captured", 1.0))
    gpu = np.nonzero(body & ep.is_gpu)[0]
    if share < 1.0:
        gpu = gpu[np.argsort(ep.ts[gpu], kind="stable")]
        j = np.arange(len(gpu))
        gpu = gpu[np.floor((j + 1) * share) > np.floor(j * share)]
    launched = np.zeros(len(ep.ids), dtype=bool)
    for i in gpu:
        for p, k in ep.preds[i]:
            if k == "launch":
                launched[p] = True
    if not launched.any():
        return None
    e = untouched(ep)
    e.no_launch[gpu] = True
    e.dur[launched] = 0.0
    e.gap[launched] = params["host_kept"]
    return e


# The registry of transform kinds: a whatif.yaml `kind` names one of these functions. The kind enum
# of schemas/whatif.schema.json is checked against it (tests/test_extension_points.py);
# docs/extending.md walks adding one.
KIND_FUNCS = {
    "drop_recompute": drop_recompute,
    "fold_micro_batches": fold_micro_batches,
    "group_expert_gemms": group_expert_gemms,
    "capture_launches": capture_launches,
}


# --------------------------------------------------------------------------- estimates


def _params_at(spec: Mapping[str, Any], end: int) -> dict[str, float]:
    """Parameter values at one end of their ranges (0 = the low-gain end, 1 = the high-gain one)."""
    return {k: (v[end] if isinstance(v, list) else v) for k, v in (spec.get("params") or {}).items()}


def estimate(ep: Episode, tid: str, spec: Mapping[str, Any], ctx: Mapping[str, Any],
             base_ns: float, host_scale: float = 1.0, reference_s: float | None = None
             ) -> dict[str, Any] | None:
    """Predicted speedup range and step time of one transform; the step it starts from is the
    run's unprofiled one when known (`reference_s`), else the profiled one."""
    fn = KIND_FUNCS[spec["kind"]]
    times = []
    for end in (0, 1):
        edit = fn(ep, _params_at(spec, end), ctx)
        if edit is None:
            return None
        times.append(replay(ep, edit, host_scale))
    t = reference_s * 1e9 if reference_s else ep.measured_ns
    new = sorted(t * x / base_ns for x in times)  # [fastest, slowest]
    lo, hi = t / new[1] - 1, t / new[0] - 1
    mid = (lo + hi) / 2
    # the replay's own error: ± `uncertainty` of the replayed gain (calibrated by measured A/Bs)
    u = float(spec.get("uncertainty", UNCERTAINTY))
    lo, hi = lo - u * abs(lo), hi + u * abs(hi)
    return {
        "knob": spec["knob"], "to": ctx.get("to", spec.get("to")),
        "speedup": {"low": round(lo, 4), "mid": round(mid, 4), "high": round(hi, 4)},
        "step_time_s": {"before": round(t / 1e9, 6), "low": round(t / (1 + hi) / 1e9, 6),
                        "high": round(t / (1 + lo) / 1e9, 6)},
        "basis": spec["basis"],
    }


def contract_context(tid: str, spec: Mapping[str, Any], contract: Mapping[str, Any] | None
                     ) -> dict[str, Any] | None:
    """What a transform needs from the contract (e.g. the number of experts); None when it does
    not apply to this run."""
    con = contract or {}
    margs = con.get("megatron_args") or {}
    model = con.get("model") or {}
    shape = con.get("shape") or {}
    kind = spec["kind"]
    if kind == "fold_micro_batches":
        mbs = shape.get("micro_batch_size") or margs.get("micro_batch_size") or 1
        gbs = shape.get("global_batch_size") or margs.get("global_batch_size")
        dp = (con.get("parallelism") or {}).get("dp") or 1
        k = int(spec["params"].get("factor", 2))
        if gbs is not None and (gbs // dp) % (mbs * k):
            return None  # the larger micro-batch no longer divides the global batch per DP rank
        return {"factor": k, "to": mbs * k}
    if kind == "group_expert_gemms":
        experts = model.get("num_experts") or margs.get("num_experts")
        ep_size = (con.get("parallelism") or {}).get("ep") or 1
        if not experts:
            return None
        layers = model.get("num_layers") or margs.get("num_layers")
        mbs = shape.get("micro_batch_size") or margs.get("micro_batch_size")
        gbs = shape.get("global_batch_size") or margs.get("global_batch_size")
        dp = (con.get("parallelism") or {}).get("dp") or 1
        # MoE layer passes of one step (forward and backward of each micro-batch): kernels of the
        # expert loop occur about E times per pass
        passes = layers * max(gbs // (mbs * dp), 1) if layers and mbs and gbs else 0
        return {"experts": int(experts) // int(ep_size), "passes": passes}
    return {}


def _passes_end_ns(events: pl.DataFrame, rank: int, start_ns: int, end_ns: int) -> int | None:
    """End of the step's last autograd backward node (the last micro-batch's backward), None when
    the trace has no such ops (e.g. an nsys export without PyTorch ops)."""
    last = events.filter((pl.col("rank") == rank) & (pl.col("kind") == "cpu_op")
                         & pl.col("name").str.starts_with("autograd::engine::evaluate_function")
                         & (pl.col("ts_ns") >= start_ns) & (pl.col("ts_ns") < end_ns)
                         ).select((pl.col("ts_ns") + pl.col("dur_ns")).max()).item()
    return int(last) if last is not None else None


def whatif_section(trace: Any, steps: Any, ctx: Any) -> dict[str, Any]:
    """`diagnose` section: one estimate per applicable transform on the median step."""


    med = ctx.median.sort("rank")
    if med.height == 0:
        return {}
    row = med.row(0, named=True)
    table = steps.table if hasattr(steps, "table") else steps
    win = table.filter((pl.col("rank") == row["rank"]) & (pl.col("step") == row["step"]))
    if win.height == 0:
        return {}
    cols = win.columns
    lo_col, hi_col = ("win_start_ns", "win_end_ns") if "win_start_ns" in cols else ("start_ns", "end_ns")
    start, end = int(win[lo_col][0]), int(win[hi_col][0])
    ep = episode(trace, ctx.events, int(row["rank"]), start, end,
                 recompute_corr=ctx.recompute if ctx.recompute is not None
                 else recompute_launches(ctx.events))
    if ep is None:
        return {}
    base = replay(ep, untouched(ep))
    fidelity = round(base / ep.measured_ns, 4) if ep.measured_ns else None
    ref = getattr(ctx, "reference_step_s", None)
    scale = 1.0
    if ref:
        scale = host_scale_for(ep, ref * 1e9, base)
        base = replay(ep, untouched(ep), scale)
    out: dict[str, Any] = {}
    # one mask for every micro-batch transform and both ends of its range
    tail = _per_step_tail(ep, _passes_end_ns(ctx.events, int(row["rank"]), start, end))
    for tid, spec in transforms().items():
        c = contract_context(tid, spec, ctx.contract)
        if c is None:
            continue
        if spec["kind"] == "fold_micro_batches":
            c = {**c, "per_step_tail": tail}
        est = estimate(ep, tid, spec, c, base, scale, ref)
        if est is not None:
            out[tid] = est
    return {"whatif": {
        "rank": int(row["rank"]), "step": int(row["step"]),
        "fidelity": fidelity,
        "reference_step_s": ref,
        "host_scale": round(scale, 4),
        "nodes": len(ep.ids),
        "transforms": out,
    }}
