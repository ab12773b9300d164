"""Timeline dependency graph, built once per analysis and shared by every analysis on it.

Nodes are integer event ids: row indices into `trace.events`. Everything about a node (times,
stream, wall) lives in the `TimelineGraph.nodes` frame (sorted by id: a node's position in it
indexes the arrays). Edges are parallel arrays (source and target positions, kind code, `via`) in
insertion order, with a CSR of in-edges by target that keeps that order (walks break ties by it);
`to_networkx()` exports a DiGraph for users who want one. Edges are typed:

| kind        | from → to | meaning |
|-------------|-----------|---------|
| launch      | runtime call → GPU op (same rank and correlation; a `cudaGraphLaunch` fans out to every replayed op) | the op could not start before it was launched |
| stream      | GPU op → next GPU op on the same (rank, device, stream) | in-order execution |
| host        | runtime call → next runtime call on the same (rank, pid, tid); after a silence > `HANDOFF_GAP_NS` on its thread, also from the latest call that ended on another thread of the process | program order; thread hand-off |
| sync        | waited GPU op → blocking host call (stream sync → last op launched on that stream before the call; event sync → the op recorded by the event; context sync, an event sync whose event is not resolved, or a sync call with no sync record → last op launched before the call on every stream of the device, among those that ended before the call returned; a blocking copy call, see `_blocking_copy_edges` → its own copy, whose launch edge then starts at the call before it) | the host was blocked until the op ended |
| event_wait  | recorded op on the waited stream → first op launched on the waiting stream after the `cudaStreamWaitEvent` (edge attribute `via` = the sync row) | cross-stream dependency |
| collective  | latest-arriving member of the k-th collective of a group → every other member (cross-rank) | nobody finishes before the last rank arrives |

"Last op launched before" is decided by correlation id (CUPTI numbers calls monotonically per
process), which is robust to host/GPU clock drift; rows without a correlation are not linked
(counted in `unlinked`). Flow events are not used: sampled traces have none.
Traces that called `cudaStreamWaitEvent` but recorded no usable wait rows get inferred `event_wait`
edges (see `_inferred_waits`; counted as `unlinked["event_wait_inferred"]`).

Each edge has a *release* point on its source and a *constraint* point on its target (see
`RELEASE`): launch releases at the call's start (an op may start inside its launch call; the
critical-path walk then takes min(call end, op start)); the others at the source's end
(collective: the source's start, i.e. its arrival). `sync` and
`collective` constrain the target's end, the rest its start. Because a sync edge constrains the
call's end, the critical-path walk splits a blocking call: the part before the awaited op's end
belongs to that op (and whatever held it), only the tail after it is host time. An edge whose
release lies after its constraint (beyond `TOLERANCE_NS`; `SYNC_TOLERANCE_NS` for sync edges,
which cross from the GPU clock to the host's) is impossible in a real timeline: it is dropped and
counted (`unlinked["time_inconsistent"]`). Cycles that survive (malformed correlation data) are broken
inside each strongly connected component by dropping edges against (ts, id) order, so the graph
is always a DAG and every analysis on it is linear in its size. The graph holds only the nodes of
the window it was built for (events outside it are never copied), and building keeps no frame
beyond `nodes` and `members`.

Limits (bounded work): above `MAX_NODES` nodes, runs of consecutive small kernels on one stream
(each < `SMALL_KERNEL_NS`, gaps < `RUN_GAP_NS`, same wall, not communication, none touched by a
sync or event wait)
become one node, keyed by the first kernel's id (`members` maps every event id to its node); the
launch calls of the absorbed kernels are dropped from the host chain (their time stays host time
in the gaps). Collective matching needs every member rank to hold the same number of collectives
of a group; otherwise that group is left unlinked and counted. Above
`critical_path.GRAPH_MAX_EVENTS` GPU ops + host calls, `diagnose` asks for one step's window only.
"""

from __future__ import annotations

import gc
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np
import polars as pl
from moetune.analyzer.classify import classify
from moetune.analyzer.clocks import align_clocks
from moetune.analyzer.collectives import collective_instances, match_collectives
from moetune.analyzer.event_walls import wall_of
from moetune.analyzer.frames import GPU_KINDS, Trace, require

if TYPE_CHECKING:  # networkx is imported by the export only
    import networkx as nx

try:  # Kahn's check compiled (setup.py); `_acyclic` is the same check in Python
    from moetune.analyzer._graph_loops import acyclic as _acyclic_c
except ImportError:  # pragma: no cover - built at install; a machine without a compiler
    _acyclic_c = None

EDGE_KINDS: tuple[str, ...] = ("launch", "stream", "host", "sync", "event_wait", "collective")
# Where an edge's source releases its target: "start" or "end" of the source event.
RELEASE: dict[str, str] = {
    "launch": "start",
    "stream": "end",
    "host": "end",
    "sync": "end",
    "event_wait": "end",
    "collective": "start",
}
# Which point of the target an edge constrains.
CONSTRAINS: dict[str, str] = {
    "launch": "start",
    "stream": "start",
    "host": "start",
    "sync": "end",
    "event_wait": "start",
    "collective": "end",
}

TOLERANCE_NS = 2_000  # clock rounding: Kineto µs traces, writer's −1/+2 ns annotation shifts
# A sync edge compares a GPU end with a host end: CPU/GPU clock skew adds to rounding. nsys 2026.2
# (corpus nsysai_2gpu_training_before, one device) records stream syncs returning 4.4–6.7 µs
# before the op they waited on ended.
SYNC_TOLERANCE_NS = 10_000
MAX_NODES = 400_000
SMALL_KERNEL_NS = 10_000
RUN_GAP_NS = 2_000
HANDOFF_GAP_NS = 1_000_000
INFER_GAP_NS = 50_000
# A blocked copy call returns this soon after its copy ends (a synchronous pinned copy: a few
# µs; HTA's pageable DtoH: 9 µs). Later returns are not explained by the copy.
BLOCKED_RETURN_NS = 10_000
# Shorter waits are within API overhead (async copy calls last 4–65 µs on gpu_mcore_hostbound).
BLOCKED_MIN_NS = 10_000

# The event columns building the graph reads (edges, nodes, collective groups).
_GRAPH_COLUMNS = (
    "node", "rank", "kind", "name", "ts_ns", "dur_ns", "pid", "tid", "device", "stream",
    "correlation", "external_id", "wall", "rclass", "sync_kind", "wait_stream",
    "wait_correlation",
)
NODE_COLUMNS = (
    "node", "rank", "kind", "name", "ts_ns", "end_ns", "pid", "tid", "device", "stream",
    "correlation", "wall", "is_gpu", "n_members",
)


@dataclass(frozen=True, slots=True)
class TimelineGraph:
    """The DAG as arrays plus its node frame. Position i is the i-th node of `nodes` (sorted by
    node id, `ids[i]`); edges are parallel arrays in insertion order (the order walks break ties
    by), `in_ptr`/`in_edge` index them by target (CSR). networkx only on export (`to_networkx`)."""

    nodes: pl.DataFrame  # NODE_COLUMNS, one row per graph node, sorted by node
    members: pl.DataFrame  # event_id → node, only for aggregated nodes (empty otherwise)
    ranks: tuple[int, ...]
    window: tuple[int, int] | None
    ids: np.ndarray  # int64 node ids, ascending (= nodes["node"])
    src: np.ndarray  # int64 positions of edge sources
    dst: np.ndarray  # int64 positions of edge targets
    kind: np.ndarray  # int8 index into EDGE_KINDS
    via: np.ndarray  # int64 node id the edge went through, -1 for none
    in_ptr: np.ndarray  # edges into position i: in_edge[in_ptr[i]:in_ptr[i + 1]], insertion order
    in_edge: np.ndarray
    unlinked: dict[str, int] = field(default_factory=dict)
    aggregated: bool = False

    @property
    def n_nodes(self) -> int:
        return len(self.ids)

    @property
    def n_edges(self) -> int:
        return len(self.src)

    @property
    def g(self) -> nx.DiGraph:
        """The networkx export (built on each access: keep it if you use it more than once)."""
        return self.to_networkx()

    def edge_counts(self) -> dict[str, int]:
        n = np.bincount(self.kind, minlength=len(EDGE_KINDS))
        return {k: int(n[i]) for i, k in enumerate(EDGE_KINDS)}

    def edges_frame(self) -> pl.DataFrame:
        """src, dst (node ids), kind, via; in networkx's edge order (by source node, then
        insertion)."""
        o = np.argsort(self.src, kind="stable")
        via = self.via[o]
        return pl.DataFrame({
            "src": self.ids[self.src[o]], "dst": self.ids[self.dst[o]],
            "kind": pl.Series(EDGE_KINDS_ARRAY[self.kind[o]], dtype=pl.String),
            "via": pl.Series(via, dtype=pl.Int64).set(pl.Series(via < 0), None),
        }, schema={"src": pl.Int64, "dst": pl.Int64, "kind": pl.String, "via": pl.Int64})

    def to_networkx(self) -> nx.DiGraph:
        """A DiGraph with the same nodes (ids) and typed edges (`kind`, `via` when set), inserted
        in the same order, for users who want networkx's algorithms."""
        import networkx as nx

        g = nx.DiGraph()
        g.add_nodes_from(self.ids.tolist())
        ids = self.ids
        g.add_edges_from(
            (u, v, {"kind": EDGE_KINDS[k]} if w < 0 else {"kind": EDGE_KINDS[k], "via": w})
            for u, v, k, w in zip(ids[self.src].tolist(), ids[self.dst].tolist(),
                                  self.kind.tolist(), self.via.tolist(), strict=True))
        return g


EDGE_KINDS_ARRAY = np.array(EDGE_KINDS, dtype=object)
_KIND_CODE = {k: i for i, k in enumerate(EDGE_KINDS)}
_START_RELEASE = np.array([_KIND_CODE[k] for k, v in RELEASE.items() if v == "start"], dtype=np.int8)
_END_CONSTRAINT = np.array([_KIND_CODE[k] for k, v in CONSTRAINS.items() if v == "end"],
                           dtype=np.int8)


def build_graph(
    trace: Trace,
    *,
    window: tuple[int, int] | None = None,
    rank: int | Sequence[int] | None = None,
    offsets_ns: dict[int, int] | None = None,
    max_nodes: int = MAX_NODES,
) -> TimelineGraph:
    """Build the timeline DAG of `rank` (one, several, or None = all) within `window` (ns).

    `window` keeps events overlapping [start, end). `offsets_ns` (rank → ns added to ts) puts
    ranks on one clock for collective edges; default: `trace.ranks.clock_offset_ns`.
    """
    ev = trace.events
    require(ev, ("rank", "kind", "name", "ts_ns", "dur_ns", "pid", "tid", "stream",
                 "correlation"), what="events")
    ev = ev.with_row_index("node").with_columns(pl.col("node").cast(pl.Int64))
    if "rclass" not in ev.columns and {"copy_kind", "bytes", "sync_kind"} <= set(ev.columns):
        ev = classify(ev)
    # One lazy pass picks the rows: a window is often a small part of a multi-GB trace, and an
    # eager filter would copy every column of every row first.
    lf = ev.lazy()
    if rank is not None:
        wanted = [rank] if isinstance(rank, int) else list(rank)
        lf = lf.filter(pl.col("rank").is_in(wanted))
    kind = pl.col("kind")
    # Only GPU ops, runtime calls and sync rows become nodes or edge ends: the other rows (CPU
    # ops, annotations: ~70 % of a PyTorch trace) are never copied.
    lf = lf.filter(kind.is_in([*GPU_KINDS, "runtime", "sync"]) & pl.col("ts_ns").is_not_null()
                   & pl.col("dur_ns").is_not_null()).with_columns(
        end_ns=pl.col("ts_ns") + pl.col("dur_ns").clip(lower_bound=0),
        is_gpu=kind.is_in(list(GPU_KINDS)),
    )
    if window is not None:
        inside = (pl.col("ts_ns") < window[1]) & (pl.col("end_ns") > window[0])
        # Launch calls of ops inside the window are kept though they ran before it.
        launched = (lf.filter(inside & pl.col("is_gpu")).select("rank", "correlation")
                    .drop_nulls().unique().collect())
        extra = lf.filter(~inside & ~pl.col("is_gpu")).join(
            launched.lazy(), on=["rank", "correlation"], how="semi", nulls_equal=False
        ).select("node").collect().get_column("node")
        # one filter keeps the rows in node order: no concatenated copy to sort (that doubled
        # the peak memory of the pass)
        lf = lf.filter(inside | pl.col("node").is_in(extra.implode()))
    if "wall" in ev.columns or not {"copy_kind", "bytes", "sync_kind"} <= set(ev.columns):
        # only the columns the edges and nodes read (wall_of needs the classifier's inputs only
        # when the wall is missing): every frame cut from the rows below copies what it keeps
        lf = lf.select([c for c in (*_GRAPH_COLUMNS, "end_ns", "is_gpu") if c in ev.columns
                        or c in ("end_ns", "is_gpu")])
    ev = lf.collect()
    # per-row columns once the rows are chosen (a window is often a small part of the trace)
    ev = ev.with_columns(wall=wall_of(ev))
    if "rclass" not in ev.columns:
        ev = ev.with_columns(rclass=pl.lit(None, dtype=pl.String))
    for c in ("device", "sync_kind", "wait_stream", "wait_correlation"):
        if c not in ev.columns:
            ev = ev.with_columns(pl.lit(None).alias(c))

    gpu = ev.filter(pl.col("is_gpu"))
    runtime = ev.filter(kind == "runtime")
    syncs = ev.filter(kind == "sync")
    unlinked: dict[str, int] = {}

    launch = _launch_edges(runtime, gpu, unlinked)
    stream = _chain(gpu, ["rank", "device", "stream"], "stream")
    sync, event_wait = _sync_edges(_with_sync_calls(syncs, runtime), runtime, gpu, unlinked)
    blocking_copy = _blocking_copy_edges(runtime, gpu, stream)

    members = pl.DataFrame(schema={"event_id": pl.Int64, "node": pl.Int64})
    aggregated = False
    touched = pl.concat([sync.get_column("src"), event_wait.get_column("src"),
                         event_wait.get_column("dst"), blocking_copy.get_column("src")])
    host_rows = runtime
    if gpu.height + runtime.height > max_nodes:
        gpu, members, stream, launch, absorbed = _aggregate(gpu, stream, launch, touched)
        host_rows = runtime.filter(~pl.col("node").is_in(absorbed.implode()))
        aggregated = True
    host = _chain(host_rows, ["rank", "pid", "tid"], "host")
    handoff = _handoff_edges(host_rows, host)
    if aggregated:
        keep = set(host_rows.get_column("node").to_list())
        blocking_copy = blocking_copy.filter(pl.col("dst").is_in(list(keep)))
    # A blocking copy's call both issued and awaited it: issue edge from the call before it,
    # wait edge copy → call (end constraint), so the pair never forms a cycle.
    flipped = launch.select(pl.col("dst").alias("src"), pl.col("src").alias("dst"))
    own = blocking_copy.join(flipped, on=["src", "dst"], how="semi")
    launch = launch.join(own.select(pl.col("dst").alias("src"), pl.col("src").alias("dst")),
                         on=["src", "dst"], how="anti")
    launch = pl.concat([launch, _prev_host_call(own, host)], how="vertical_relaxed")

    inferred = _inferred_waits(gpu, launch, stream, runtime, syncs, ev, unlinked)
    offsets = _offsets(trace, offsets_ns)
    collective = _collective_edges(gpu, trace.comms, offsets, unlinked)

    edges = pl.concat([launch, stream, host, handoff, sync, event_wait, inferred, blocking_copy,
                       collective], how="vertical_relaxed")
    # Sync rows are nodes only where no host call stands for them (an edge ends on the row).
    sync_nodes = syncs.filter(pl.col("node").is_in(edges.get_column("dst").implode()))
    node_ids = pl.concat([gpu.get_column("node"), host_rows.get_column("node"),
                          sync_nodes.get_column("node")]).unique()
    nodes = (
        ev.filter(pl.col("node").is_in(node_ids.implode()))
        .join(_member_counts(members), on="node", how="left")
        .with_columns(pl.col("n_members").fill_null(1))
    )
    if aggregated:  # an aggregated node spans its whole run
        run_end = members.join(ev.select("node", "end_ns"), left_on="event_id", right_on="node")
        run_end = run_end.group_by("node").agg(run_end_ns=pl.col("end_ns").max())
        nodes = nodes.join(run_end, on="node", how="left").with_columns(
            end_ns=pl.max_horizontal("end_ns", "run_end_ns")
        ).drop("run_end_ns")
    nodes = nodes.with_columns(pl.col("kind")).select(NODE_COLUMNS).sort("node")
    return _checked_arrays(nodes, members, edges, window, unlinked, aggregated)


def _checked_arrays(nodes: pl.DataFrame, members: pl.DataFrame, edges: pl.DataFrame,
                    window: tuple[int, int] | None, unlinked: dict[str, int], aggregated: bool
                    ) -> TimelineGraph:
    """Edges impossible in time (`release_constraint` beyond `tolerance_ns`) and self loops
    dropped, one edge per (src, dst) kept (the last written wins, as repeated add_edge would),
    on arrays by node position: no join of ~1 M edges to the nodes."""
    ids = nodes.get_column("node").to_numpy().astype(np.int64)
    n = len(ids)
    e_src = edges.get_column("src").to_numpy().astype(np.int64)
    e_dst = edges.get_column("dst").to_numpy().astype(np.int64)
    kind = edges.get_column("kind").replace_strict(_KIND_CODE, return_dtype=pl.Int8).to_numpy()
    via = edges.get_column("via").fill_null(-1).to_numpy().astype(np.int64)
    src = np.searchsorted(ids, e_src)
    dst = np.searchsorted(ids, e_dst)
    if len(e_src):
        # the inner join on node ids: an edge whose end is not a node drops out
        ok = (src < n) & (dst < n)
        ok[ok] &= (ids[src[ok]] == e_src[ok]) & (ids[dst[ok]] == e_dst[ok])
        idx = np.flatnonzero(ok)
        s, d, k = src[idx], dst[idx], kind[idx]
        ts = nodes.get_column("ts_ns").to_numpy()
        en = nodes.get_column("end_ns").to_numpy()
        release = np.where(np.isin(k, _START_RELEASE), ts[s], en[s])
        constraint = np.where(np.isin(k, _END_CONSTRAINT), en[d], ts[d])
        tol = np.where(k == _KIND_CODE["sync"], SYNC_TOLERANCE_NS, TOLERANCE_NS)
        # collective edges compare aligned clocks; their time check happened in matching.
        good = (release <= constraint + tol) | (k == _KIND_CODE["collective"])
        unlinked["time_inconsistent"] = int(len(good) - np.count_nonzero(good))
        idx = idx[good]
        src, dst, kind, via = src[idx], dst[idx], kind[idx], via[idx]
    loops = src == dst
    if loops.any():
        unlinked["self_loops"] = int(np.count_nonzero(loops))
        src, dst, kind, via = src[~loops], dst[~loops], kind[~loops], via[~loops]
    if len(src):
        key = src * max(n, 1) + dst
        _, first_from_end = np.unique(key[::-1], return_index=True)
        last = np.sort(len(key) - 1 - first_from_end)
        if len(last) < len(key):
            src, dst, kind, via = src[last], dst[last], kind[last], via[last]
    return _graph_arrays(nodes, members, ids, src, dst, kind, via, window, unlinked, aggregated)


def _graph_arrays(nodes: pl.DataFrame, members: pl.DataFrame, ids: np.ndarray, src: np.ndarray,
                  dst: np.ndarray, kind: np.ndarray, via: np.ndarray,
                  window: tuple[int, int] | None, unlinked: dict[str, int], aggregated: bool
                  ) -> TimelineGraph:
    """The graph from edge arrays (positions of distinct (src, dst) pairs), cycles broken."""
    keep = _break_cycles(ids, src, dst, nodes, unlinked,
                         maybe_cyclic=_cycle_span_arrays(ids, nodes.get_column("ts_ns").to_numpy(),
                                                         src, dst))
    if keep is not None:
        src, dst, kind, via = src[keep], dst[keep], kind[keep], via[keep]
    in_edge = np.argsort(dst, kind="stable")  # stable: a node's in-edges keep insertion order
    in_ptr = np.zeros(len(ids) + 1, dtype=np.int64)
    np.cumsum(np.bincount(dst, minlength=len(ids)), out=in_ptr[1:])
    ranks = tuple(nodes.get_column("rank").drop_nulls().unique().sort().to_list())
    return TimelineGraph(nodes=nodes, members=members, ranks=ranks, window=window, ids=ids,
                         src=src.astype(np.int64), dst=dst.astype(np.int64),
                         kind=np.asarray(kind, dtype=np.int8), via=via, in_ptr=in_ptr,
                         in_edge=in_edge.astype(np.int64),
                         unlinked=dict(sorted(unlinked.items())), aggregated=aggregated)


@contextmanager
def _no_gc() -> Iterator[None]:
    """Millions of new small objects (path segments, their rows) trigger the cyclic GC over and
    over (each pass scans the whole growing heap): off while making them, on again after (they
    hold no cycles)."""
    was = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was:
            gc.enable()


# ---------------------------------------------------------------- edges, one function per kind

def _empty_edges() -> pl.DataFrame:
    return pl.DataFrame(schema={"src": pl.Int64, "dst": pl.Int64, "kind": pl.String,
                                "via": pl.Int64})


def _edges(df: pl.DataFrame, src: str, dst: str, k: str, via: str | None = None) -> pl.DataFrame:
    return df.select(
        pl.col(src).cast(pl.Int64).alias("src"),
        pl.col(dst).cast(pl.Int64).alias("dst"),
        pl.lit(k).alias("kind"),
        (pl.col(via) if via else pl.lit(None)).cast(pl.Int64).alias("via"),
    ).drop_nulls(["src", "dst"])


def _launch_edges(runtime: pl.DataFrame, gpu: pl.DataFrame, unlinked: dict[str, int]) -> pl.DataFrame:
    r = runtime.filter(pl.col("correlation").is_not_null()).select(
        "rank", "correlation", src="node")
    gg = gpu.select("rank", "correlation", dst="node")
    e = gg.join(r, on=["rank", "correlation"], how="inner")
    unlinked["gpu_without_launch"] = gpu.height - e.get_column("dst").n_unique() if e.height else gpu.height
    dup = r.group_by("rank", "correlation").len().filter(pl.col("len") > 1).height
    if dup:
        unlinked["duplicate_launch_correlation"] = dup
    return _edges(e, "src", "dst", "launch")


def _chain(rows: pl.DataFrame, by: list[str], k: str) -> pl.DataFrame:
    """Edges between consecutive rows (by ts, then id) within each group."""
    if rows.height == 0:
        return _empty_edges()
    # only the keys sorted (not every column of the rows); the next row is in the same group
    # when its keys are equal (nulls equal, as `over` groups them)
    s = rows.select(*by, "ts_ns", "node").sort([*by, "ts_ns", "node"])
    same = pl.all_horizontal([pl.col(c).eq_missing(pl.col(c).shift(-1)) for c in by])
    s = s.select(*by, "node", nxt=pl.when(same).then(pl.col("node").shift(-1)))
    return _edges(s, "node", "nxt", k)


def _last_op_before(
    queries: pl.DataFrame, gpu: pl.DataFrame, *, stream_col: str, corr_col: str,
    cache: dict[bool, pl.DataFrame] | None = None,
) -> pl.DataFrame:
    """For each query row, the GPU op on (rank, stream_col) launched last with correlation
    < corr_col (the op that ends latest among ops sharing that correlation). Adds `waited`."""
    return _op_by_correlation(queries, gpu, stream_col=stream_col, corr_col=corr_col, after=False,
                              cache=cache)


def _first_op_after(
    queries: pl.DataFrame, gpu: pl.DataFrame, *, stream_col: str, corr_col: str,
    cache: dict[bool, pl.DataFrame] | None = None,
) -> pl.DataFrame:
    """For each query row, the first GPU op launched on (rank, stream_col) with correlation
    > corr_col (the earliest-starting one among ops sharing it). Adds `waiter`."""
    return _op_by_correlation(queries, gpu, stream_col=stream_col, corr_col=corr_col, after=True,
                              cache=cache)


def _ops_by_correlation(gpu: pl.DataFrame, after: bool, cache: dict[bool, pl.DataFrame] | None
                        ) -> pl.DataFrame:
    """Per (rank, stream, correlation) the representative op (`waiter`: earliest-starting,
    `waited`: latest-ending), sorted by correlation; kept in `cache` by direction."""
    if cache is not None and after in cache:
        return cache[after]
    out_col, time_col = ("waiter", "ts_ns") if after else ("waited", "end_ns")
    pick = pl.col("node").first() if after else pl.col("node").last()
    ops = (
        gpu.filter(pl.col("correlation").is_not_null() & pl.col("stream").is_not_null())
        .sort("rank", "stream", "correlation", time_col, "node")
        .group_by("rank", "stream", "correlation", maintain_order=True)
        .agg(pick.alias(out_col))
        .sort("correlation")
    )
    if cache is not None:
        cache[after] = ops
    return ops


def _op_by_correlation(
    queries: pl.DataFrame, gpu: pl.DataFrame, *, stream_col: str, corr_col: str, after: bool,
    cache: dict[bool, pl.DataFrame] | None = None,
) -> pl.DataFrame:
    """The nearest launch on the same (rank, stream) strictly before (`waited`) or after
    (`waiter`) each query's correlation; a graph replay's ops share one correlation, so the
    representative is the latest-ending op (before) or the earliest-starting one (after)."""
    out_col, shift = ("waiter", 1) if after else ("waited", -1)
    q = queries.with_columns(
        pl.col(stream_col).cast(pl.Int64).alias("_stream"),
        (pl.col(corr_col).cast(pl.Int64) + shift).alias("_corr"),
    ).filter(pl.col("_stream").is_not_null() & pl.col("_corr").is_not_null())
    # the ops index sorts every GPU op: built only when a query needs it, once per direction
    ops = _ops_by_correlation(gpu, after, cache) if q.height else None
    if ops is None or ops.height == 0:
        return q.with_columns(pl.lit(None, dtype=pl.Int64).alias(out_col)).drop("_stream", "_corr")
    out = q.sort("_corr").join_asof(
        ops.rename({"stream": "_stream", "correlation": "_corr"}),
        on="_corr", by=["rank", "_stream"], strategy="forward" if after else "backward",
        check_sortedness=False,
    )
    return out.drop("_stream", "_corr")


def _sync_edges(
    syncs: pl.DataFrame, runtime: pl.DataFrame, gpu: pl.DataFrame, unlinked: dict[str, int]
) -> tuple[pl.DataFrame, pl.DataFrame]:
    if syncs.height == 0:
        return _empty_edges(), _empty_edges()
    sk = pl.col("sync_kind")
    # The host call that blocked: the runtime row sharing the sync row's correlation.
    call = runtime.filter(pl.col("correlation").is_not_null()).sort("node").group_by(
        "rank", "correlation").agg(call=pl.col("node").first(), call_end=pl.col("end_ns").first(),
                                   call_name=pl.col("name").first())
    s = syncs.join(call, on=["rank", "correlation"], how="left").with_columns(
        target=pl.coalesce("call", "node"),
        target_end=pl.coalesce("call_end", "end_ns"),
        # Older Kineto lacks the record's correlation: the event was recorded before the wait
        # call itself, so the wait's correlation is a sound (later) bound.
        record_corr=pl.coalesce("wait_correlation", "correlation"),
    )
    unlinked["event_record_unknown"] = s.filter(
        sk.is_in(["stream_wait_event", "event_sync"]) & pl.col("wait_correlation").is_null()
    ).height

    ops: dict[bool, pl.DataFrame] = {}  # the GPU ops index, shared by the five look-ups
    stream_sync = _last_op_before(s.filter(sk == "stream_sync"), gpu,
                                  stream_col="stream", corr_col="correlation", cache=ops)
    known_event = (sk == "event_sync") & pl.col("wait_stream").is_not_null()
    event_sync = _last_op_before(s.filter(known_event), gpu,
                                 stream_col="wait_stream", corr_col="record_corr", cache=ops)
    # Context sync, and event syncs whose event nobody resolved (nsys without CUDA_EVENT rows,
    # Kineto without the record's stream): every stream of the device is a candidate ...
    ctx = s.filter((sk == "context_sync") | ((sk == "event_sync") & ~known_event))
    streams = gpu.select("rank", "device", pl.col("stream").alias("_s")).unique(maintain_order=True).drop_nulls()
    ctx_q = ctx.join(streams, on="rank", how="inner", suffix="_gpu").filter(
        pl.col("device").is_null() | pl.col("device_gpu").is_null()
        | (pl.col("device") == pl.col("device_gpu"))
    )
    ctx_sync = _last_op_before(ctx_q, gpu, stream_col="_s", corr_col="correlation", cache=ops)
    # ... but a stream whose last op was still running when the call returned was not waited on.
    ends = gpu.select(pl.col("node").alias("waited"), pl.col("end_ns").alias("_w_end"))
    ctx_sync = ctx_sync.join(ends, on="waited", how="left").filter(
        pl.col("waited").is_null() | (pl.col("_w_end") <= pl.col("target_end") + SYNC_TOLERANCE_NS)
    ).drop("_w_end")
    host_syncs = pl.concat(
        [f.select("node", "target", "waited") for f in (stream_sync, event_sync, ctx_sync)],
        how="vertical_relaxed",
    )
    # A poll (cudaEventQuery: nsys and Kineto write sync rows for it) on work still running
    # waited on nothing: not unresolved.
    host_rows = s.filter(sk.is_in(["stream_sync", "event_sync", "context_sync"]))
    polls = host_rows.filter(pl.col("call_name").str.contains("Query").fill_null(False))
    resolved = host_syncs.drop_nulls("waited").get_column("node").unique()
    unlinked["sync_unresolved"] = host_rows.height - resolved.len() - polls.filter(
        ~pl.col("node").is_in(resolved.implode())).height
    sync = _edges(host_syncs, "waited", "target", "sync", via="node")

    sw = s.filter(sk == "stream_wait_event")
    rec = _last_op_before(sw, gpu, stream_col="wait_stream", corr_col="record_corr", cache=ops)
    both = _first_op_after(rec, gpu, stream_col="stream", corr_col="correlation", cache=ops)
    unlinked["event_wait_no_recorded_op"] = sw.height - rec.drop_nulls("waited").height
    unlinked["event_wait_no_waiter"] = (
        rec.drop_nulls("waited").height - both.drop_nulls(["waited", "waiter"]).height)
    event_wait = _edges(both, "waited", "waiter", "event_wait", via="node")
    return sync, event_wait


def _with_sync_calls(syncs: pl.DataFrame, runtime: pl.DataFrame) -> pl.DataFrame:
    """Sync calls with no sync row (old Kineto, CUPTI sync records off): the call itself, with
    device-sync semantics (it waited on whichever op it waited on, i.e. the latest launched
    before it on some stream; the critical-path walk picks the one that ended last)."""
    calls = runtime.filter(pl.col("rclass") == "sync")
    if calls.height == 0:
        return syncs
    covered = syncs.select("rank", "correlation").drop_nulls()
    extra = calls.join(covered, on=["rank", "correlation"], how="anti").with_columns(
        sync_kind=pl.lit("context_sync").cast(syncs.schema["sync_kind"]),
        device=pl.lit(None, dtype=syncs.schema["device"]),
    )
    return pl.concat([syncs, extra.select(syncs.columns)], how="vertical_relaxed")


def _handoff_edges(host_rows: pl.DataFrame, host: pl.DataFrame) -> pl.DataFrame:
    """Thread hand-off: a call that follows a long silence on its own thread (> HANDOFF_GAP_NS)
    also depends on the latest call that ended before it on another thread of the process
    (autograd's backward thread resumes after the main thread's forward)."""
    if host_rows.height == 0 or host_rows.get_column("tid").n_unique() < 2:
        return _empty_edges()
    by = ["rank", "pid"]
    r = host_rows.select(*by, "tid", "node", "ts_ns", "end_ns")
    prev_end = r.join(host.select(pl.col("dst").alias("node"), pl.col("src").alias("prev")),
                      on="node", how="left").join(
        r.select(pl.col("node").alias("prev"), pl.col("end_ns").alias("prev_end")),
        on="prev", how="left")
    q = prev_end.filter(
        pl.col("prev_end").is_null()
        | (pl.col("ts_ns") - pl.col("prev_end") > HANDOFF_GAP_NS)
    ).select(*by, "tid", "node", "ts_ns", "prev_end").sort("ts_ns")
    other = r.select(*by, pl.col("tid").alias("o_tid"), pl.col("node").alias("o_node"),
                     pl.col("end_ns").alias("o_end")).sort("o_end")
    j = q.join_asof(other, left_on="ts_ns", right_on="o_end", by=by, strategy="backward",
                    check_sortedness=False)
    j = j.filter(
        pl.col("o_node").is_not_null() & (pl.col("o_tid") != pl.col("tid"))
        & (pl.col("prev_end").is_null() | (pl.col("o_end") > pl.col("prev_end")))
    )
    return _edges(j, "o_node", "node", "host")


def _inferred_waits(
    gpu: pl.DataFrame, launch: pl.DataFrame, stream: pl.DataFrame, runtime: pl.DataFrame,
    syncs: pl.DataFrame, ev: pl.DataFrame, unlinked: dict[str, int],
) -> pl.DataFrame:
    """Traces that made `cudaStreamWaitEvent` calls but recorded no wait rows naming the waited
    stream (Kineto before cuda_sync records; nsys exports whose event ids are not resolved): an
    op that started > INFER_GAP_NS after both its launch returned and its stream predecessor
    ended waited on something; when the op launched last before it on another stream of the same
    device ended within INFER_GAP_NS before it started, that is the event wait (`via` = null)."""
    has_calls = runtime.filter(pl.col("rclass") == "stream_wait_event").height
    has_rows = syncs.filter(  # rows that say which stream they waited on
        (pl.col("sync_kind") == "stream_wait_event")
        & pl.col("wait_stream").is_not_null()).height
    if not has_calls or has_rows or gpu.height == 0:
        return _empty_edges()
    t = ev.select("node", "ts_ns", "end_ns")
    known = pl.concat([
        launch.join(t, left_on="src", right_on="node").select("dst", rel="end_ns"),
        stream.join(t, left_on="src", right_on="node").select("dst", rel="end_ns"),
    ]).group_by("dst").agg(pl.col("rel").max())
    late = (
        gpu.select("rank", "device", "stream", "node", "ts_ns", "correlation")
        .join(known, left_on="node", right_on="dst", how="left")
        .filter(pl.col("rel").is_null() | (pl.col("ts_ns") - pl.col("rel") > INFER_GAP_NS))
        .sort("ts_ns")
    )
    if late.height == 0:
        return _empty_edges()
    # The recorded op ran on another stream of the device, was launched before this op (the
    # event was recorded before the wait call, which preceded this launch) and ended before it
    # started. Ops of one stream run in launch order, so both conditions select a prefix of that
    # stream's ops: the recorded op is the last of the shorter prefix.
    dev = pl.col("device").fill_null(-1)
    other = gpu.select("rank", dev.alias("_dev"), pl.col("stream").alias("o_stream")).unique()
    q = (late.filter(pl.col("correlation").is_not_null())
         .with_columns(_dev=dev, _corr=pl.col("correlation") - 1,
                       _lim=pl.col("ts_ns") + TOLERANCE_NS)
         .join(other, on=["rank", "_dev"]).filter(pl.col("o_stream") != pl.col("stream")))
    ops = gpu.filter(pl.col("correlation").is_not_null()).select(
        "rank", _dev=dev, o_stream="stream", _corr="correlation", o_node="node", o_end="end_ns")
    by = ["rank", "_dev", "o_stream"]
    by_corr = (ops.sort(*by, "_corr", "o_end", "o_node")
               .group_by(*by, "_corr", maintain_order=True).last().sort("_corr"))
    j = q.sort("_corr").join_asof(by_corr.rename({"o_node": "c_node", "o_end": "c_end"}),
                                  on="_corr", by=by, strategy="backward",
                                  check_sortedness=False)
    j = j.sort("_lim").join_asof(
        ops.select(*by, e_node="o_node", e_end="o_end").sort("e_end"), left_on="_lim",
        right_on="e_end", by=by, strategy="backward", check_sortedness=False)
    j = j.with_columns(
        o_node=pl.when(pl.col("c_end") <= pl.col("e_end")).then("c_node").otherwise("e_node"),
        o_end=pl.min_horizontal("c_end", "e_end"),
    ).filter(pl.col("c_node").is_not_null() & pl.col("e_node").is_not_null()
             & (pl.col("ts_ns") - pl.col("o_end") <= INFER_GAP_NS))
    # several streams qualify: the one that ended last released the op
    j = j.sort("o_end", "o_node").group_by("node", maintain_order=True).last()
    unlinked["event_wait_inferred"] = j.height
    return _edges(j, "o_node", "node", "event_wait")


def _blocking_copy_edges(
    runtime: pl.DataFrame, gpu: pl.DataFrame, stream: pl.DataFrame
) -> pl.DataFrame:
    """Copy calls that waited for the GPU, found from the data (no sync record says so):

    - pageable DtoH / HtoD (name `… Pageable …`, both readers) that ran, or at least started,
      before the call returned: the driver stages them through pinned memory, so a DtoH call
      returns only after its copy ran, and a large HtoD one once the stream reached its copy (the
      last chunk may still be in flight). A small HtoD is staged at once and the call returns
      without waiting (nsysai_2gpu_training_before: 13 µs calls, copies run 8–12 ms later): its
      copy starts after the call returned, so no edge;
    - any other copy (synchronous cudaMemcpy, cuMemcpyDtoH, hipMemcpyWithStream, whatever the
      name) whose call returned 0–`BLOCKED_RETURN_NS` after the copy ended, having waited at least
      `BLOCKED_MIN_NS` for GPU work: from the call's start when the copy was held back by its
      stream predecessor (it started as that op ended, after the call began), else from the copy's
      own start.

    Call duration alone does not tell blocked from async calls: on an idle GPU an async
    cudaMemcpyAsync DtoD of 4–65 µs starts as it is enqueued at the call's end and ends within
    3 µs of the call's return (gpu_mcore_hostbound: 120 such, each copy ≤ 2.6 µs); the wait rule
    leaves them host time.

    Awaited op: the copy when it ended before the call returned; else (pageable HtoD returned with
    its copy in flight, after it started) the op before it on its stream.
    src = awaited op, dst = the call, via = the call."""
    pred = stream.select(pl.col("dst").alias("copy"), pl.col("src").alias("pred")).join(
        gpu.select(pl.col("node").alias("pred"), pl.col("end_ns").alias("pred_end")), on="pred")
    cp = gpu.filter(pl.col("kind") == "memcpy").select(
        "rank", "correlation", copy="node", copy_ts="ts_ns", copy_end="end_ns",
        pageable=pl.col("name").str.contains(r"^Memcpy (DtoH|HtoD).*Pageable"))
    r = runtime.select("rank", "correlation", call="node", call_ts="ts_ns", call_end="end_ns")
    j = cp.join(r, on=["rank", "correlation"], how="inner").join(pred, on="copy", how="left")
    held = ((pl.col("copy_ts") - pl.col("pred_end")).abs() <= TOLERANCE_NS) & (
        pl.col("pred_end") > pl.col("call_ts"))
    waited_from = pl.when(held.fill_null(False)).then("call_ts").otherwise("copy_ts")
    j = j.with_columns(lag=pl.col("call_end") - pl.col("copy_end"),
                       waited=pl.col("copy_end") - pl.max_horizontal(waited_from, "call_ts"))
    # A pageable copy that ran within its call was waited on: only clock skew can put its end
    # after the call's. For the others the return right after the copy is the evidence: tight.
    done = pl.col("lag") >= -SYNC_TOLERANCE_NS
    sync_copy = (pl.col("lag").is_between(-TOLERANCE_NS, BLOCKED_RETURN_NS)
                 & (pl.col("waited") >= BLOCKED_MIN_NS))
    waited_copy = j.filter((done & pl.col("pageable")) | sync_copy)
    in_flight = j.filter(
        pl.col("pageable") & ~done & (pl.col("copy_ts") <= pl.col("call_end") + SYNC_TOLERANCE_NS)
        & (pl.col("pred_end") <= pl.col("call_end") + SYNC_TOLERANCE_NS))
    return pl.concat([_edges(waited_copy, "copy", "call", "sync", via="call"),
                      _edges(in_flight, "pred", "call", "sync", via="call")])


def _prev_host_call(blocking: pl.DataFrame, host: pl.DataFrame) -> pl.DataFrame:
    """Issue edge for a copy its own call waited on: from the call before (`blocking` holds only
    copy → own call edges); `via` = the copy's own call, whose running time the gap before the
    copy is (host time however long, never an unexplained wait)."""
    prev = host.select(pl.col("dst").alias("call"), pl.col("src").alias("prev"))
    j = blocking.select(pl.col("src").alias("copy"), pl.col("dst").alias("call")).join(
        prev, on="call", how="inner")
    return _edges(j, "prev", "copy", "launch", via="call")


def _offsets(trace: Trace, offsets_ns: dict[int, int] | None) -> dict[int, int]:
    if offsets_ns is not None:
        return dict(offsets_ns)
    if trace.events.get_column("rank").n_unique() < 2:
        return {}
    return align_clocks(trace).offsets_ns


def _collective_edges(
    gpu: pl.DataFrame, comms: pl.DataFrame, offsets: dict[int, int], unlinked: dict[str, int]
) -> pl.DataFrame:
    if gpu.get_column("rank").n_unique() < 2:
        return _empty_edges()
    m = match_collectives(collective_instances(gpu, comms), offsets, unlinked)
    if m.height == 0:
        return _empty_edges()
    last = (
        m.sort("group", "k", "ats_ns", "node")
        .group_by("group", "k", maintain_order=True)
        .agg(last=pl.col("node").last())
    )
    e = m.join(last, on=["group", "k"]).filter(pl.col("node") != pl.col("last"))
    return _edges(e, "last", "node", "collective")


# ---------------------------------------------------------------- aggregation, checks

def _aggregate(
    gpu: pl.DataFrame, stream: pl.DataFrame, launch: pl.DataFrame, touched: pl.Series
) -> tuple[pl.DataFrame, pl.DataFrame, pl.DataFrame, pl.DataFrame, pl.Series]:
    by = ["rank", "device", "stream"]
    # Rows sorted by stream: the previous row is in the same stream when its keys are equal
    # (nulls equal, as `over` groups them), so shifts need no window over the groups.
    same = pl.all_horizontal([pl.col(c).eq_missing(pl.col(c).shift(1)) for c in by])
    prev = lambda c: pl.when(same).then(pl.col(c).shift(1))  # noqa: E731
    s = gpu.sort([*by, "ts_ns", "node"]).with_columns(
        small=(pl.col("kind") == "kernel")
        & (pl.col("dur_ns") < SMALL_KERNEL_NS)
        & (pl.col("wall") != "communication")  # collectives stay matchable one by one
        & ~pl.col("node").is_in(touched.implode()),
        gap=pl.col("ts_ns") - prev("end_ns"),
        prev_wall=prev("wall"),
    )
    s = s.with_columns(prev_small=prev("small").fill_null(False))
    joins = (pl.col("small") & pl.col("prev_small") & (pl.col("gap") < RUN_GAP_NS)
             & (pl.col("wall") == pl.col("prev_wall")))
    # a stream's first row never joins, so one running count over all streams cuts each stream
    # into the same runs as counting within it
    s = s.with_columns(run=(~joins).cum_sum())
    s = s.with_columns(rep=pl.col("node").first().over([*by, "run"]))
    members = s.filter(pl.col("node") != pl.col("rep")).select(
        pl.col("node").alias("event_id"), pl.col("rep").alias("node"))
    absorbed_gpu = members.get_column("event_id")
    kept = s.filter(pl.col("node") == pl.col("rep")).drop("small", "gap", "prev_wall",
                                                           "prev_small", "run", "rep")
    new_stream = _chain(kept, by, "stream")
    new_launch = launch.filter(~pl.col("dst").is_in(absorbed_gpu.implode()))
    # Launch calls whose every op was absorbed leave the graph.
    all_launch = launch.group_by("src").agg(pl.col("dst"))
    absorbed_calls = (
        all_launch.filter(
            ~pl.col("src").is_in(new_launch.get_column("src").implode())
        ).get_column("src")
    )
    return kept, members, new_stream, new_launch, absorbed_calls


def _member_counts(members: pl.DataFrame) -> pl.DataFrame:
    return members.group_by("node").len().select(
        "node", n_members=(pl.col("len") + 1).cast(pl.Int64))


def release_constraint(edges: pl.DataFrame, nodes: pl.DataFrame) -> pl.DataFrame:
    """Add release (ns on the source) and constraint (ns on the target) to an edge frame."""
    t = nodes.select("node", "ts_ns", "end_ns")
    e = edges.join(t.rename({"node": "src", "ts_ns": "s_ts", "end_ns": "s_end"}), on="src")
    e = e.join(t.rename({"node": "dst", "ts_ns": "d_ts", "end_ns": "d_end"}), on="dst")
    start_rel = [k for k, v in RELEASE.items() if v == "start"]
    end_con = [k for k, v in CONSTRAINS.items() if v == "end"]
    return e.with_columns(
        release_ns=pl.when(pl.col("kind").is_in(start_rel)).then("s_ts").otherwise("s_end"),
        constraint_ns=pl.when(pl.col("kind").is_in(end_con)).then("d_end").otherwise("d_ts"),
    )


def tolerance_ns(kind: pl.Expr) -> pl.Expr:
    """How far an edge of `kind` may release after its constraint before it is impossible."""
    return pl.when(kind == "sync").then(pl.lit(SYNC_TOLERANCE_NS)).otherwise(pl.lit(TOLERANCE_NS))


def _cycle_span_arrays(ids: np.ndarray, ts: np.ndarray, src: np.ndarray, dst: np.ndarray
                       ) -> list[int]:
    """The node ids any cycle lies within (ids ascending, ts by position, edges as positions).
    Order nodes by (ts, id): a cycle's latest node leaves it by a backward edge and its earliest
    is entered by one, so every cycle sits between the earliest target and the latest source of
    a backward edge. Real timelines have none or a few (sync edges within clock tolerance)."""
    if not len(src):
        return []
    order = np.lexsort((ids, ts))  # (ts, id) order
    at = np.empty(len(ids), dtype=np.int64)
    at[order] = np.arange(len(ids), dtype=np.int64)
    pu, pv = at[src], at[dst]
    back = pv < pu
    if not back.any():
        return []
    lo, hi = int(pv[back].min()), int(pu[back].max())
    return ids[order[lo:hi + 1]].tolist()


def _acyclic(succ: dict, nodes: list[int]) -> bool:
    """Kahn's algorithm on the subgraph induced by `nodes`, over the raw adjacency dicts (a
    networkx subgraph view costs ~3× the whole graph's check)."""
    inside = set(nodes)
    indeg = dict.fromkeys(nodes, 0)
    for u in nodes:
        for v in succ[u]:
            if v in inside:
                indeg[v] += 1
    ready = [u for u in nodes if indeg[u] == 0]
    done = 0
    while ready:
        u = ready.pop()
        done += 1
        for v in succ[u]:
            if v in inside:
                indeg[v] -= 1
                if indeg[v] == 0:
                    ready.append(v)
    return done == len(nodes)


def _break_cycles(ids: np.ndarray, src: np.ndarray, dst: np.ndarray, nodes: pl.DataFrame,
                  unlinked: dict[str, int], maybe_cyclic: list[int]) -> np.ndarray | None:
    """Make the graph acyclic: inside each strongly connected component keep only edges that go
    forward in (ts, id) order. `maybe_cyclic` (see `_cycle_span_arrays`): the node ids any cycle lies
    within, so only their subgraph is checked (an SCC of two or more nodes is a union of cycles,
    so it lies there too). Returns the mask of edges kept, None when all are."""
    unlinked.setdefault("cycle_edges_dropped", 0)
    if not maybe_cyclic:
        return None
    span = np.searchsorted(ids, np.asarray(maybe_cyclic, dtype=np.int64))
    inside = np.zeros(len(ids), dtype=bool)
    inside[span] = True
    sub = np.flatnonzero(inside[src] & inside[dst])  # edges of the induced subgraph
    if _acyclic_c is not None:  # the span is often most of the graph: Kahn's loop compiled
        local = np.full(len(ids), -1, dtype=np.int64)
        local[span] = np.arange(len(span), dtype=np.int64)
        ls, ld = local[src[sub]], local[dst[sub]]
        ptr = np.zeros(len(span) + 1, dtype=np.int64)
        np.cumsum(np.bincount(ls, minlength=len(span)), out=ptr[1:])
        if _acyclic_c(ptr, np.ascontiguousarray(ld[np.argsort(ls, kind="stable")])):
            return None
    succ: dict[int, list[int]] = {int(u): [] for u in span}
    for u, v in zip(src[sub].tolist(), dst[sub].tolist(), strict=True):
        succ[u].append(v)
    if _acyclic_c is None and _acyclic(succ, list(succ)):
        return None
    comp = _scc(succ)
    ts = nodes.get_column("ts_ns").to_numpy()
    cu, cv = comp.get, comp.get
    bad = [e for e, u, v in zip(sub.tolist(), src[sub].tolist(), dst[sub].tolist(), strict=True)
           if cu(u) is not None and cu(u) == cv(v) and (ts[u], ids[u]) >= (ts[v], ids[v])]
    unlinked["cycle_edges_dropped"] = len(bad)
    keep = np.ones(len(src), dtype=bool)
    keep[bad] = False
    return keep


def _scc(succ: dict[int, list[int]]) -> dict[int, int]:
    """Strongly connected components of two or more nodes (Tarjan, iterative): node → component
    number; nodes alone in theirs are left out."""
    index: dict[int, int] = {}
    low: dict[int, int] = {}
    on_stack: set[int] = set()
    stack: list[int] = []
    comp: dict[int, int] = {}
    n_comp = 0
    for root in succ:
        if root in index:
            continue
        work = [(root, iter(succ[root]))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            u, it = work[-1]
            for v in it:
                if v not in index:
                    index[v] = low[v] = len(index)
                    stack.append(v)
                    on_stack.add(v)
                    work.append((v, iter(succ[v])))
                    break
                if v in on_stack:
                    low[u] = min(low[u], index[v])
            else:
                work.pop()
                if work:
                    p = work[-1][0]
                    low[p] = min(low[p], low[u])
                if low[u] == index[u]:
                    members = []
                    while True:
                        w = stack.pop()
                        on_stack.discard(w)
                        members.append(w)
                        if w == u:
                            break
                    if len(members) > 1:
                        for w in members:
                            comp[w] = n_comp
                        n_comp += 1
    return comp
