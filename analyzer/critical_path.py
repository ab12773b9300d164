"""Critical path per step on the shared timeline graph: the walk and its segments.

With measured timestamps every complete dependency chain through a step telescopes to the same
span, so "the longest path" is decided by which dependency *bound* each event: the critical path
is the chain of binding dependencies. We find it by walking back from the step's last GPU op,
each time to the predecessor whose release (see `moetune.analyzer.graph.RELEASE`) came last. That is
the longest path in the DAG weighted by the time each edge actually held its target back, and it
costs O(edges touched): no search, no recursion, bounded by the number of nodes. The walk runs
over the graph's arrays in compiled code (`analyzer/_graph_loops.c`; `_walk_py` is the same loop
in Python, used when the extension is not built, and gives equal records).

The walk cuts the step window [win_start_ns, win_end_ns) (analyzer/steps.py; the GPU windows tile
the timeline) into segments, so segment lengths sum exactly to the step time T:

| segment | wall |
|---|---|
| a GPU op on the path | its wall (compute / communication / memory) |
| a host call on the path, or GPU waiting on a launch / a host thread / a sync | host |
| a blocking call entered through its sync edge: only its tail after the awaited op ended (the
  wait before it is the op's, and whatever held the op) | host |
| GPU waiting after its stream or event dependency was met (scheduling gap), or more than
  `LAUNCH_LATENCY_NS` after its launch returned with nothing known to explain it | other |
| step tail after the last op (host preparing the next step) | host |

The step's figures from its path (walls on the path, communication split, gain ceilings, the
document's sections and the terminal's lines) are `moetune.analyzer.path_summary`'s; the graph's
scope (every step, or one step id above GRAPH_MAX_EVENTS) is `graph_scope` here.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import NamedTuple

import numpy as np
import polars as pl
from moetune.analyzer.frames import GPU_KINDS, Trace
from moetune.analyzer.graph import EDGE_KINDS, TimelineGraph
from moetune.analyzer.steps import find_steps

from moetune.vocabulary import WALLS

DEP_KINDS = ("event_wait", "stream", "sync")
_ENDS_AT_OP_END = frozenset({"sync", "collective"})  # edges held until the op's end, not start
# Equal releases: prefer the stronger dependency.
_PRIORITY = {"sync": 0, "event_wait": 1, "collective": 2, "stream": 3, "launch": 4, "host": 5}
GAP_WALL = {"launch": "host", "host": "host", "sync": "host", "collective": "communication",
            "stream": "other", "event_wait": "other"}
_GAP_WHAT = {k: f"{k}_gap" for k in GAP_WALL}
TOP_SEGMENTS = 20
LAUNCH_LATENCY_NS = 50_000  # longer launch→start gaps are not launch latency
TOP_EDGES = 20
CEILING_TEXT_MAX = 10.0  # gain ceilings above +1000 % print as ">10×"
# Above this many GPU ops + host calls in the steps' span, the graph covers one step id on every
# rank (the one of median mean length) instead of all: the graph's memory and time grow with its
# nodes, and the headline numbers describe median steps anyway.
GRAPH_MAX_EVENTS = 1_500_000


class Segment(NamedTuple):
    """One piece of a step's critical path. A named tuple, not a frozen dataclass: a walk makes
    one per op on the path, and a frozen dataclass costs 1.2 µs to build against 0.3 µs."""

    rank: int
    step: int
    start_ns: int
    end_ns: int
    wall: str  # compute | communication | memory | host | other
    what: str  # "op" for an event on the path, else "<edge kind>_gap", "step_start", "step_tail"
    node: int | None
    blocking: bool = False
    waiter: int | None = None  # for blocking comm: the node that waited
    edge: str | None = None  # kind of the edge to the path successor
    via: int | None = None

    @property
    def dur_ns(self) -> int:
        return self.end_ns - self.start_ns


def step_windows(trace: Trace, steps: pl.DataFrame | None = None) -> pl.DataFrame:
    """rank, step, win_start_ns, win_end_ns: the colleague's steps (analyzer/steps.py) when
    given, else found here with `find_steps`."""
    if steps is None:
        steps = find_steps(trace.events).table
    if "win_start_ns" not in steps.columns:
        steps = steps.with_columns(win_start_ns=pl.col("start_ns"), win_end_ns=pl.col("end_ns"))
    return steps.select("rank", "step", "win_start_ns", "win_end_ns").sort("rank", "step")


try:  # the compiled walk (setup.py); `_walk_py` is the same loop in Python
    from moetune.analyzer._graph_loops import walk as _walk_c
except ImportError:  # pragma: no cover - built at install; a machine without a compiler
    _walk_c = None
try:  # the same walk writing its records to one array (an older build may lack it)
    from moetune.analyzer._graph_loops import walk_into as _walk_into_c
except ImportError:  # pragma: no cover - built at install; a machine without a compiler
    _walk_into_c = None

_NO_RANK = -(2**63)  # rank of a node without one: matches no rank a walk runs on


@dataclass(frozen=True, slots=True)
class _WalkArrays:
    """The graph's columns by node position, built once per graph and walked by every step:
    contiguous arrays for the compiled walk and the column paths, Python lists for the
    pure-Python walk and `ids` / `wall` (on demand: ~30 MB of objects at 333 k nodes that the
    compiled path never reads)."""

    ts: np.ndarray  # int64
    en: np.ndarray
    rank: np.ndarray  # int64, _NO_RANK for null
    in_ptr: np.ndarray  # int64, n + 1
    in_src: np.ndarray  # int64 source position per in-edge (graph.in_edge order)
    in_kind: np.ndarray  # int8 index into EDGE_KINDS
    in_via: np.ndarray  # int64 node id, -1 for none
    wall_code: np.ndarray  # int8 index into wall_names per node position
    wall_names: tuple[str | None, ...]
    ids_arr: np.ndarray  # int64 node ids, ascending
    lists: dict[str, list] = field(default_factory=dict)

    @property
    def ids(self) -> list[int]:
        if "ids" not in self.lists:
            self.lists["ids"] = self.ids_arr.tolist()
        return self.lists["ids"]

    @property
    def wall(self) -> list[str | None]:
        if "wall" not in self.lists:
            names = self.wall_names
            self.lists["wall"] = [names[c] for c in self.wall_code.tolist()]
        return self.lists["wall"]

    def as_lists(self) -> dict[str, list]:
        if "ts" not in self.lists:
            for k in ("ts", "en", "rank", "in_ptr", "in_src", "in_kind", "in_via"):
                self.lists[k] = getattr(self, k).tolist()
        return self.lists


def _walk_arrays(graph: TimelineGraph) -> _WalkArrays:
    n = graph.nodes
    e = graph.in_edge
    i64 = lambda c: np.ascontiguousarray(n[c].to_numpy(), dtype=np.int64)  # noqa: E731
    # walls as small codes: the segments of every step are built and summed as arrays
    wall = n["wall"].cast(pl.String)
    names: tuple[str | None, ...] = (*_WALL_NAMES, *sorted(
        {w for w in wall.unique().to_list() if w not in _WALL_CODE},
        key=lambda w: (w is None, w or "")))
    code = {w: i for i, w in enumerate(names)}
    wall_code = (wall.replace_strict(
        [w for w in names if w is not None], [code[w] for w in names if w is not None],
        default=None, return_dtype=pl.Int8).fill_null(code.get(None, -1)).to_numpy())
    return _WalkArrays(
        i64("ts_ns"), i64("end_ns"),
        np.ascontiguousarray(n["rank"].cast(pl.Int64).fill_null(_NO_RANK).to_numpy(),
                             dtype=np.int64),
        np.ascontiguousarray(graph.in_ptr, dtype=np.int64),
        np.ascontiguousarray(graph.src[e], dtype=np.int64),
        np.ascontiguousarray(graph.kind[e], dtype=np.int8),
        np.ascontiguousarray(graph.via[e], dtype=np.int64),
        np.ascontiguousarray(wall_code, dtype=np.int8), names,
        np.ascontiguousarray(graph.ids, dtype=np.int64))


_PRIORITY_BY_CODE = [_PRIORITY[k] for k in EDGE_KINDS]
_COLLECTIVE, _LAUNCH = EDGE_KINDS.index("collective"), EDGE_KINDS.index("launch")
_END_CODES = frozenset(EDGE_KINDS.index(k) for k in _ENDS_AT_OP_END)
Walk = tuple[list[tuple[int, int, int, int, int, int, int]], int, int]


def _walk_py(a: _WalkArrays, sink: int, rank: int, start_ns: int, end_ns: int) -> Walk:
    """The walk back from `sink` (a node position), as `_graph_loops.walk` does it: records
    (v, lo_v, hi, best, best_rel, best_kind, best_via) per op on the path (best -1: none), the
    path's lower end and whether the loop stopped on its own condition (1) or at a source (0)."""
    L = a.as_lists()
    ts, en, rk = L["ts"], L["en"], L["rank"]
    in_ptr, in_src, in_kind, in_via = L["in_ptr"], L["in_src"], L["in_kind"], L["in_via"]
    pri_of, end_codes = _PRIORITY_BY_CODE, _END_CODES
    records = []
    hi = min(en[sink], end_ns)
    v = sink
    seen: set[int] = set()
    while v >= 0 and hi > start_ns and v not in seen:
        seen.add(v)
        best, best_rel, best_kind, best_via, best_pri = -1, 0, -1, -1, 0
        ts_v, en_v = ts[v], en[v]
        for j in range(in_ptr[v], in_ptr[v + 1]):
            u = in_src[j]
            if rk[u] != rank:  # another rank: its wait shows as this op's own time
                continue
            # release (graph.RELEASE), written out: this loop runs once per edge into the path
            k = in_kind[j]
            if k == _COLLECTIVE:
                rel = ts[u]
            else:
                rel = en[u]
                if k == _LAUNCH and rel > ts_v:  # an op may start inside its launch call
                    rel = ts_v if ts_v > ts[u] else ts[u]
            con = en_v if k in end_codes else ts_v
            # clipped to the constraint and to the path so far (the graph holds no edge whose
            # release lies past its constraint: build_graph drops those)
            if rel > con:
                rel = con
            if rel > hi:
                rel = hi
            pri = pri_of[k]
            if best < 0 or rel > best_rel or (rel == best_rel and pri < best_pri):
                best, best_rel, best_kind, best_via, best_pri = u, rel, k, in_via[j], pri
        lo_v = max(ts_v, best_rel if best >= 0 else ts_v, start_ns)
        lo_v = min(lo_v, hi)
        records.append((v, lo_v, hi, best, best_rel, best_kind, best_via))
        if best < 0:
            return records, hi, 0
        hi = min(best_rel, lo_v)
        v = best
    return records, hi, 1


@dataclass(frozen=True, slots=True)
class _RankView:
    """One rank's GPU nodes, plus the graph's walk arrays: built once, walked by every step."""

    gpu: pl.DataFrame  # GPU nodes sorted by ts_ns, with their position `pos`
    max_dur: int
    rank: int
    arrays: _WalkArrays
    cols: tuple[np.ndarray, ...] = ()  # gpu's ts_ns, end_ns, node, pos as int64 arrays

    def gpu_in(self, lo: int, hi: int) -> pl.DataFrame:
        """GPU nodes overlapping [lo, hi): a sorted slice, then the exact test."""
        t = self.gpu.get_column("ts_ns")
        a = t.search_sorted(lo - self.max_dur, side="left")
        b = t.search_sorted(hi, side="left")
        return self.gpu.slice(a, b - a).filter(pl.col("end_ns") > lo)

    def sink(self, lo: int, hi: int) -> int | None:
        """Position of the GPU op that ends last inside [lo, hi) (ties: the later-starting one,
        then the higher id), None when no op overlaps it: `gpu_in` and a sort, on arrays (a
        polars query per step costs more than the search)."""
        ts, en, node, pos = self.cols
        a = int(np.searchsorted(ts, lo - self.max_dur, side="left"))
        b = int(np.searchsorted(ts, hi, side="left"))
        m = np.flatnonzero(en[a:b] > lo) + a
        if not len(m):
            return None
        i = np.lexsort((node[m], ts[m], np.minimum(en[m], hi)))[-1]
        return int(pos[m[i]])


def _view(graph: TimelineGraph, rank: int, arrays: _WalkArrays | None = None) -> _RankView:
    n = graph.nodes.with_row_index("pos").filter(pl.col("rank") == rank)
    gpu = n.filter(pl.col("is_gpu")).sort("ts_ns", "node")
    max_dur = int((gpu["end_ns"] - gpu["ts_ns"]).max() or 0) if gpu.height else 0
    cols = tuple(np.ascontiguousarray(gpu[c].to_numpy(), dtype=np.int64)
                 for c in ("ts_ns", "end_ns", "node", "pos"))
    return _RankView(gpu, max_dur, rank, arrays or _walk_arrays(graph), cols)


# Segments as columns: walls and `what` as codes. A step's path is a few thousand segments and a
# diagnosis walks every step: sums, the longest segments and the frames of the communication
# split are taken on the arrays; `Segment` tuples are made only for the API and the document's
# top lists.
_WALL_NAMES: tuple[str, ...] = (*WALLS, "other")
_WALL_CODE = {w: i for i, w in enumerate(_WALL_NAMES)}
_W_HOST, _W_OTHER, _W_COMM = _WALL_CODE["host"], _WALL_CODE["other"], _WALL_CODE["communication"]
_WHAT_NAMES: tuple[str, ...] = ("op", "step_tail", "step_start", "unexplained_gap",
                                *(_GAP_WHAT[k] for k in EDGE_KINDS))
_OP, _TAIL, _START, _UNEXPLAINED = 0, 1, 2, 3
_GAP_WHAT_CODE = np.arange(4, 4 + len(EDGE_KINDS), dtype=np.int8)  # by edge kind code
_GAP_WALL_CODE = np.array([_WALL_CODE[GAP_WALL[k]] for k in EDGE_KINDS], dtype=np.int8)
_DEP_CODES = np.array([EDGE_KINDS.index(k) for k in DEP_KINDS], dtype=np.int8)


class _Path(NamedTuple):
    """One step's critical path as columns in time order (what `critical_path` returns as
    `Segment`s): -1 stands for None in node, waiter, edge (an EDGE_KINDS code) and via."""

    rank: int
    step: int
    start: np.ndarray  # int64
    end: np.ndarray
    wall: np.ndarray  # int8 index into the walk arrays' wall_names
    what: np.ndarray  # int8 index into _WHAT_NAMES
    node: np.ndarray  # int64
    waiter: np.ndarray
    edge: np.ndarray  # int8
    via: np.ndarray
    blocking: np.ndarray  # bool


def _records(a: _WalkArrays, sink: int, rank: int, start_ns: int, end_ns: int,
             compiled: bool) -> tuple[np.ndarray, int, int]:
    """The walk's records as a (count, 7) int64 array (`_walk_py` for the columns), with the
    path's lower end and the cut flag."""
    if compiled and _walk_into_c is not None:
        out = np.empty((len(a.ts), 7), dtype=np.int64)  # untouched rows cost no memory
        count, last_hi, cut = _walk_into_c(a.ts, a.en, a.rank, a.in_ptr, a.in_src, a.in_kind,
                                           a.in_via, sink, rank, start_ns, end_ns, out)
        return out[:count], last_hi, cut
    if compiled and _walk_c is not None:
        records, last_hi, cut = _walk_c(a.ts, a.en, a.rank, a.in_ptr, a.in_src, a.in_kind,
                                        a.in_via, sink, rank, start_ns, end_ns)
    else:
        records, last_hi, cut = _walk_py(a, sink, rank, start_ns, end_ns)
    return np.array(records, dtype=np.int64).reshape(-1, 7), last_hi, cut


def _one(rank: int, step: int, start: int, end: int, wall: int, what: int) -> _Path:
    i64 = lambda x: np.array([x], dtype=np.int64)  # noqa: E731
    return _Path(rank, step, i64(start), i64(end), np.array([wall], dtype=np.int8),
                 np.array([what], dtype=np.int8), i64(-1), i64(-1),
                 np.array([-1], dtype=np.int8), i64(-1), np.zeros(1, dtype=bool))


def _path(view: _RankView, rank: int, step: int, start_ns: int, end_ns: int,
          compiled: bool = True) -> _Path:
    """The critical path of one step window as columns; see `critical_path` for the segments."""
    a = view.arrays
    sink = view.sink(start_ns, end_ns)
    if sink is None:
        return _one(rank, step, start_ns, end_ns, _W_HOST, _TAIL)
    r, last_hi, cut = _records(a, sink, rank, start_ns, end_ns, compiled)
    k = len(r)
    v, lo, hi, best, rel, bk, bv = (r[:, j] for j in range(7))
    wc = a.wall_code[v]
    node = a.ids_arr[v]
    # each op's successor on the path (the record before it): the waiter, its edge and via
    prev = lambda x, fill: np.concatenate(([fill], x[:-1])).astype(x.dtype)  # noqa: E731
    waiter, edge, via = prev(node, -1), prev(bk, -1).astype(np.int8), prev(bv, -1)
    waiter_wall = prev(wc, -1)
    # the gap before each op, down to its binding predecessor's release
    has = best >= 0
    gap_lo = np.maximum(rel, start_ns)
    gap = has & (gap_lo < lo)
    kind = np.where(has, bk, 0)
    gwall, gwhat = _GAP_WALL_CODE[kind], _GAP_WHAT_CODE[kind]
    # launched long before: it waited on something else
    unexplained = (kind == _LAUNCH) & (bv < 0) & (lo - gap_lo > LAUNCH_LATENCY_NS)
    gwall[unexplained], gwhat[unexplained] = _W_OTHER, _UNEXPLAINED
    # time order: for each record from the last: its gap, then the op
    m = 2 * k
    start, end = np.empty(m, dtype=np.int64), np.empty(m, dtype=np.int64)
    start[0::2], start[1::2] = gap_lo[::-1], lo[::-1]
    end[0::2], end[1::2] = lo[::-1], hi[::-1]
    wall, what = np.empty(m, dtype=np.int8), np.empty(m, dtype=np.int8)
    wall[0::2], wall[1::2] = gwall[::-1], wc[::-1]
    what[0::2], what[1::2] = gwhat[::-1], _OP
    nd = np.repeat(node[::-1], 2)
    wt, ed, vi, ww = (np.empty(m, dtype=x.dtype) for x in (waiter, edge, via, waiter_wall))
    for out, x in ((wt, waiter), (ed, edge), (vi, via), (ww, waiter_wall)):
        out[0::2], out[1::2] = -1, x[::-1]
    keep = np.empty(m, dtype=bool)
    keep[0::2], keep[1::2] = gap[::-1], True
    head: list[tuple[int, int, int, int]] = []  # (start, end, wall, what) before the records
    if cut and last_hi > start_ns:  # cut short (cycle guard or reached the window start exactly)
        head.append((start_ns, last_hi, _W_OTHER, _START))
    if k and best[-1] < 0 and lo[-1] > start_ns:
        head.append((start_ns, int(lo[-1]), _W_HOST if wc[-1] == _W_HOST else _W_OTHER, _START))
    hi0 = int(hi[0]) if k else min(int(a.en[sink]), end_ns)
    tail = [(hi0, end_ns, _W_HOST, _TAIL)] if hi0 < end_ns else []
    if head or tail:
        h, t = len(head), len(tail)
        extra = lambda x, fill: np.concatenate(  # noqa: E731
            (np.full(h, fill, dtype=x.dtype), x, np.full(t, fill, dtype=x.dtype)))
        # typed pieces: an empty list would make the concatenation float (ns lost above 2**53)
        side = lambda rows, j, dt: np.array([e[j] for e in rows], dtype=dt)  # noqa: E731
        around = lambda j, x: np.concatenate(  # noqa: E731
            (side(head, j, x.dtype), x, side(tail, j, x.dtype)))
        start, end, wall, what = around(0, start), around(1, end), around(2, wall), around(3, what)
        nd, wt, ed, vi, ww = (extra(x, -1) for x in (nd, wt, ed, vi, ww))
        keep = np.concatenate((np.ones(h, dtype=bool), keep, np.ones(t, dtype=bool)))
    keep &= end > start
    start, end, wall, what, nd, wt, ed, vi, ww = (
        x[keep] for x in (start, end, wall, what, nd, wt, ed, vi, ww))
    return _Path(rank, step, start, end, wall, what, nd, wt, ed, vi,
                 _blocking(wall, what, nd, wt, ed, ww))


def _blocking(wall: np.ndarray, what: np.ndarray, node: np.ndarray, waiter: np.ndarray,
              edge: np.ndarray, waiter_wall: np.ndarray) -> np.ndarray:
    """Comm ops on the path whose successor entered through a dependency edge, walking back so
    a comm op feeding a blocking comm op is blocking too."""
    out = np.zeros(len(wall), dtype=bool)
    cand = np.flatnonzero((what == _OP) & (wall == _W_COMM) & (waiter >= 0)
                          & np.isin(edge, _DEP_CODES))
    if not len(cand):
        return out
    blocking_nodes: set[int] = set()
    for i, nd, w, ww in zip(cand[::-1].tolist(), node[cand[::-1]].tolist(),
                            waiter[cand[::-1]].tolist(), waiter_wall[cand[::-1]].tolist(),
                            strict=True):
        if ww != _W_COMM or w in blocking_nodes:
            blocking_nodes.add(nd)
            out[i] = True
    return out


def _segments(p: _Path, wall_names: Sequence[str | None]) -> list[Segment]:
    """The `Segment` tuples of a path's columns."""
    rank, step = p.rank, p.step
    return [Segment(rank, step, s, e, wall_names[w], _WHAT_NAMES[h], None if n < 0 else n, b,
                    None if wt < 0 else wt, None if ed < 0 else EDGE_KINDS[ed],
                    None if vi < 0 else vi)
            for s, e, w, h, n, b, wt, ed, vi in zip(
                p.start.tolist(), p.end.tolist(), p.wall.tolist(), p.what.tolist(),
                p.node.tolist(), p.blocking.tolist(), p.waiter.tolist(), p.edge.tolist(),
                p.via.tolist(), strict=True)]


def critical_path(graph: TimelineGraph, *, rank: int, step: int, start_ns: int,
                  end_ns: int, view: _RankView | None = None, compiled: bool = True
                  ) -> list[Segment]:
    """Segments of the critical path of one step window, in time order. `compiled=False` walks
    in Python (the compiled walk gives the same records)."""
    view = view or _view(graph, rank)
    return _segments(_path(view, rank, step, start_ns, end_ns, compiled),
                     view.arrays.wall_names)


class _Cols(NamedTuple):
    """Every step's segments in one set of columns, in the order of the steps (rank, step)."""

    rank: np.ndarray
    step: np.ndarray
    start: np.ndarray
    end: np.ndarray
    wall: np.ndarray
    blocking: np.ndarray
    paths: list[_Path]
    offsets: np.ndarray  # segments of paths[i]: offsets[i]:offsets[i + 1]


def _concat(paths: list[_Path]) -> _Cols:
    n = np.array([len(p.start) for p in paths], dtype=np.int64)
    off = np.zeros(len(paths) + 1, dtype=np.int64)
    np.cumsum(n, out=off[1:])
    cat = lambda f, dt: (np.concatenate([getattr(p, f) for p in paths])  # noqa: E731
                         if paths else np.empty(0, dtype=dt))
    return _Cols(np.repeat(np.array([p.rank for p in paths], dtype=np.int64), n),
                 np.repeat(np.array([p.step for p in paths], dtype=np.int64), n),
                 cat("start", np.int64), cat("end", np.int64), cat("wall", np.int8),
                 cat("blocking", bool), paths, off)


def _longest_cols(c: _Cols, mask: np.ndarray, k: int, wall_names: Sequence[str | None]
                  ) -> list[Segment]:
    """The k longest of the masked segments of every step, sorted by (−duration, rank, step,
    start), ties in their order: a stable sort of the few at least as long as the k-th."""
    idx = np.flatnonzero(mask)
    if k <= 0 or not len(idx):
        return []
    dur = c.end[idx] - c.start[idx]
    floor = np.partition(dur, len(dur) - k)[len(dur) - k] if len(dur) > k else dur.min()
    cand = idx[dur >= floor]
    d = c.end[cand] - c.start[cand]
    top = cand[np.lexsort((c.start[cand], c.step[cand], c.rank[cand], -d), )[:k]]
    out = []
    for i in top.tolist():  # the path and row of segment i
        p = int(np.searchsorted(c.offsets, i, side="right")) - 1
        path = c.paths[p]
        j = i - int(c.offsets[p])
        one = _Path(path.rank, path.step, *(x[j:j + 1] for x in path[2:]))
        out.extend(_segments(one, wall_names))
    return out


def graph_scope(events: pl.DataFrame, steps: pl.DataFrame, *, limit: int | None = None
                ) -> tuple[pl.DataFrame, dict | None]:
    """The step windows the graph covers: all of them, or, when their span holds more than
    `limit` GPU ops + host calls, one step id on every rank that has it: among the ids present
    on the most ranks, the lower median by mean window length (ties by id). The second value
    says what was left out (None when nothing was)."""
    limit = GRAPH_MAX_EVENTS if limit is None else limit
    win = step_windows(Trace(events=events), steps)
    lo, hi = win["win_start_ns"].min(), win["win_end_ns"].max()
    if lo is None:
        return steps, None
    kind = pl.col("kind")
    n = events.select(((kind.is_in([*GPU_KINDS, "runtime"])) & (pl.col("ts_ns") < hi)
                       & ((pl.col("ts_ns") + pl.col("dur_ns")) > lo)).sum()).item()
    if n <= limit:
        return steps, None
    per = win.group_by("step").agg(
        ranks=pl.len(), mean_ns=(pl.col("win_end_ns") - pl.col("win_start_ns")).mean())
    per = per.filter(pl.col("ranks") == pl.col("ranks").max()).sort("mean_ns", "step")
    pick = int(per["step"][(per.height - 1) // 2])
    return steps.filter(pl.col("step") == pick), {
        "steps": [pick], "steps_in_window": int(win["step"].n_unique()),
        "events_in_span": int(n), "limit": int(limit),
    }

