"""One step of one rank as the arrays the replay runs on (`Episode`): the step cut out of the
timeline graph (analyzer/graph.py), its nodes in a topological order, each with its measured times,
its class, whether it belongs to the optimizer or to recompute, and its in-edges (as lists and as
CSR arrays for the compiled replay). The what-if estimates (analyzer/whatif.py) and the walls'
gain ceilings (analyzer/ceilings.py) both replay it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import polars as pl
from moetune.analyzer.frames import Trace
from moetune.analyzer.graph import EDGE_KINDS, TimelineGraph, build_graph

_US = 1_000


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
