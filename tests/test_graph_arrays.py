"""The array-backed timeline graph: CSR in insertion order, networkx export, cycle breaking, and
the compiled critical-path walk against the pure-Python one."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import networkx as nx
import numpy as np
import polars as pl
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from moetune.analyzer import critical_path as cp
from moetune.analyzer import graph as graph_mod
from moetune.analyzer.critical_path import (
    _view,
    _walk_arrays,
    _walk_py,
    critical_path,
    step_windows,
)
from moetune.analyzer.graph import _KIND_CODE, EDGE_KINDS, _graph_arrays, _scc, build_graph
from moetune.analyzer.readers import load_trace

ROOT = Path(__file__).resolve().parents[1]
TRACES = ROOT / "fixtures" / "traces"
CORPUS = ROOT.parent / "shared" / "corpus" / "public"


def _arrays(nodes: pl.DataFrame, members: pl.DataFrame, edges: pl.DataFrame,
            window: tuple[int, int] | None, unlinked: dict[str, int], aggregated: bool):
    """The graph of a node frame and distinct (src, dst) edges as they are (no time check),
    cycles broken: what `build_graph` makes of edges that passed its checks."""
    ids = nodes.get_column("node").to_numpy().astype(np.int64)
    src = np.searchsorted(ids, edges.get_column("src").to_numpy())
    dst = np.searchsorted(ids, edges.get_column("dst").to_numpy())
    kind = edges.get_column("kind").replace_strict(_KIND_CODE, return_dtype=pl.Int8).to_numpy()
    via = edges.get_column("via").fill_null(-1).to_numpy().astype(np.int64)
    return _graph_arrays(nodes, members, ids, src, dst, kind, via, window, unlinked, aggregated)


def _real(name: str):
    return load_trace([TRACES / name / "trace.json.gz"])


@pytest.fixture(scope="module")
def hostbound():
    tr = _real("gpu_mcore_hostbound")
    win = step_windows(tr)
    lo, hi = int(win["win_start_ns"].min()), int(win["win_end_ns"].max())
    return tr, win, build_graph(tr, window=(lo, hi))


def test_in_edges_keep_insertion_order_and_match_the_export(hostbound) -> None:
    _, _, g = hostbound
    assert g.n_nodes == g.nodes.height and np.array_equal(g.ids, g.nodes["node"].to_numpy())
    assert np.all(np.diff(g.ids) > 0)
    assert g.in_ptr[-1] == g.n_edges == len(g.in_edge)
    x = g.to_networkx()
    assert list(x.nodes) == g.ids.tolist()
    assert x.number_of_edges() == g.n_edges
    # networkx's predecessor dicts are in insertion order: the CSR must give the same lists
    # (walks and the replay break ties by that order)
    for p in range(0, g.n_nodes, max(g.n_nodes // 2000, 1)):
        e = g.in_edge[g.in_ptr[p]:g.in_ptr[p + 1]]
        ours = [(int(g.ids[g.src[i]]), EDGE_KINDS[g.kind[i]]) for i in e]
        theirs = [(u, d["kind"]) for u, d in x._pred[int(g.ids[p])].items()]
        assert ours == theirs
    counts = dict.fromkeys(EDGE_KINDS, 0)
    for _, _, k in x.edges(data="kind"):
        counts[k] += 1
    assert g.edge_counts() == counts
    ef = g.edges_frame()
    assert ef.select("src", "dst").rows() == list(x.edges)
    vias = {(u, v): d.get("via") for u, v, d in x.edges(data=True)}
    assert dict(zip(zip(ef["src"], ef["dst"], strict=True), ef["via"], strict=True)) == vias
    assert any(v is not None for v in vias.values())


def test_compiled_walk_equals_the_python_walk_on_a_real_trace(hostbound) -> None:
    if cp._walk_c is None:
        pytest.skip("the compiled walk is not built")
    _, win, g = hostbound
    a = _walk_arrays(g)
    view = _view(g, 0, a)
    n = 0
    for rank, step, lo, hi in win.iter_rows():
        gpu = view.gpu_in(lo, hi)
        for sink in gpu["pos"].to_list()[-200::7]:  # many sinks, not only each step's own
            args = (a.ts, a.en, a.rank, a.in_ptr, a.in_src, a.in_kind, a.in_via)
            assert cp._walk_c(*args, sink, rank, lo, hi) == _walk_py(a, sink, rank, lo, hi)
            n += 1
        assert critical_path(g, rank=rank, step=step, start_ns=lo, end_ns=hi, view=view) == \
            critical_path(g, rank=rank, step=step, start_ns=lo, end_ns=hi, view=view,
                          compiled=False)
    assert n > 50


@st.composite
def dags(draw: st.DrawFn) -> tuple[pl.DataFrame, pl.DataFrame]:
    """Random timelines with typed edges, some against time (the walk clips those), two ranks."""
    n = draw(st.integers(2, 30))
    ts = draw(st.lists(st.integers(0, 100), min_size=n, max_size=n))
    dur = draw(st.lists(st.integers(0, 40), min_size=n, max_size=n))
    rank = draw(st.lists(st.sampled_from([0, 0, 0, 1]), min_size=n, max_size=n))
    pairs = draw(st.lists(st.tuples(st.integers(0, n - 1), st.integers(0, n - 1),
                                    st.sampled_from(EDGE_KINDS), st.integers(-1, 3)),
                          max_size=70))
    seen, rows = set(), []
    for u, v, k, via in pairs:
        if u != v and (u, v) not in seen:
            seen.add((u, v))
            rows.append((u, v, k, None if via < 0 else via))
    nodes = pl.DataFrame({
        "node": list(range(n)), "rank": rank, "ts_ns": ts,
        "end_ns": [t + d for t, d in zip(ts, dur, strict=True)],
        "wall": [["compute", "communication", "host", "memory"][i % 4] for i in range(n)],
    }, schema={"node": pl.Int64, "rank": pl.Int64, "ts_ns": pl.Int64, "end_ns": pl.Int64,
               "wall": pl.String})
    edges = pl.DataFrame(rows, schema={"src": pl.Int64, "dst": pl.Int64, "kind": pl.String,
                                       "via": pl.Int64}, orient="row")
    return nodes, edges


@settings(max_examples=300, deadline=None)
@given(dags(), st.integers(0, 60), st.integers(60, 160))
def test_compiled_walk_equals_the_python_walk(tl, lo: int, hi: int) -> None:
    if cp._walk_c is None:
        pytest.skip("the compiled walk is not built")
    nodes, edges = tl
    g = _arrays(nodes, pl.DataFrame(), edges, None, {}, False)
    a = _walk_arrays(g)
    args = (a.ts, a.en, a.rank, a.in_ptr, a.in_src, a.in_kind, a.in_via)
    for sink in range(g.n_nodes):
        for rank in (0, 1):
            assert cp._walk_c(*args, sink, rank, lo, hi) == _walk_py(a, sink, rank, lo, hi)


@settings(max_examples=300, deadline=None)
@given(dags())
def test_cycle_breaking_drops_what_networkx_sccs_would(tl) -> None:
    nodes, edges = tl
    compiled = graph_mod._acyclic_c
    for impl in {compiled, None}:  # the compiled check and the Python fallback
        graph_mod._acyclic_c = impl
        try:
            _check_cycle_breaking(nodes, edges)
        finally:
            graph_mod._acyclic_c = compiled


def _check_cycle_breaking(nodes: pl.DataFrame, edges: pl.DataFrame) -> None:
    unlinked: dict[str, int] = {}
    g = _arrays(nodes, pl.DataFrame(), edges, None, unlinked, False)
    x = nx.DiGraph()
    x.add_nodes_from(nodes["node"].to_list())
    x.add_edges_from((u, v, {"kind": k}) for u, v, k, _ in edges.iter_rows())
    ts = dict(zip(nodes["node"], nodes["ts_ns"], strict=True))
    bad = [(u, v) for comp in nx.strongly_connected_components(x) if len(comp) > 1
           for u in comp for v in x.successors(u) if v in comp and (ts[u], u) >= (ts[v], v)]
    x.remove_edges_from(bad)
    assert nx.is_directed_acyclic_graph(g.to_networkx())
    assert list(g.to_networkx().edges) == list(x.edges)
    assert unlinked["cycle_edges_dropped"] == len(bad)


@settings(max_examples=300, deadline=None)
@given(st.integers(1, 25).flatmap(lambda n: st.lists(
    st.tuples(st.integers(0, n - 1), st.integers(0, n - 1)), max_size=60).map(lambda e: (n, e))))
def test_scc_equals_networkx(case) -> None:
    n, pairs = case
    succ: dict[int, list[int]] = {i: [] for i in range(n)}
    for u, v in dict.fromkeys(pairs):
        succ[u].append(v)
    comp = _scc(succ)
    x = nx.DiGraph()
    x.add_nodes_from(range(n))
    x.add_edges_from(dict.fromkeys(pairs))
    theirs = {frozenset(c) for c in nx.strongly_connected_components(x)
              if len(c) > 1 or any(u == v for u, v in pairs if u in c)}
    ours: dict[int, set[int]] = {}
    for node, c in comp.items():
        ours.setdefault(c, set()).add(node)
    # a self-loop is a component of one: the graph never holds one (build_graph drops them)
    assert {frozenset(c) for c in ours.values()} == {c for c in theirs if len(c) > 1}


def test_corpus_nsys_graph_export_round_trip() -> None:
    f = CORPUS / "nsys" / "nsysai_2gpu_training_before.sqlite"
    if not f.exists():
        pytest.skip("corpus absent")
    tr = load_trace([f])
    g = build_graph(tr)
    x = g.to_networkx()
    assert nx.is_directed_acyclic_graph(x)
    assert sorted(x.edges) == sorted(g.edges_frame().select("src", "dst").rows())


def test_start_up_imports_neither_networkx_nor_jsonschema_for_the_graph() -> None:
    code = ("import sys, moetune.analyzer.graph, moetune.analyzer.critical_path, "
            "moetune.analyzer.whatif; print('networkx' in sys.modules, "
            "'jsonschema' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True).stdout.split()
    assert out == ["False", "False"]


@settings(max_examples=300, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 2), st.integers(0, 3), st.integers(0, 50),
                          st.integers(0, 8)), max_size=60), st.integers(0, 25))
def test_longest_segments_equal_a_full_sort(rows, k: int) -> None:
    segs = [cp.Segment(r, st_, s, s + d, "host", "op", i) for i, (r, st_, s, d) in enumerate(rows)]
    key = lambda s: (s.start_ns - s.end_ns, s.rank, s.step, s.start_ns)  # noqa: E731
    if not segs:  # no path at all
        return
    one = np.ones(1, dtype=np.int64)
    paths = [cp._Path(s.rank, s.step, one * s.start_ns, one * s.end_ns, one.astype(np.int8) * 0,
                      one.astype(np.int8) * cp._WHAT_NAMES.index("op"), one * s.node, -one,
                      -one.astype(np.int8), -one, np.zeros(1, dtype=bool)) for s in segs]
    cols = cp._concat(paths)
    got = cp._longest_cols(cols, np.ones(len(segs), dtype=bool), k, ["host"])
    assert got == sorted(segs, key=key)[:k]


@settings(max_examples=400, deadline=None)
@given(st.integers(1, 30).flatmap(lambda n: st.lists(
    st.tuples(st.integers(0, n - 1), st.integers(0, n - 1)), max_size=60).map(lambda e: (n, e))))
def test_compiled_cycle_check_equals_the_python_one(case) -> None:
    if graph_mod._acyclic_c is None:
        pytest.skip("the compiled loops are not built")
    n, pairs = case
    pairs = [(u, v) for u, v in dict.fromkeys(pairs) if u != v]
    succ: dict[int, list[int]] = {i: [] for i in range(n)}
    for u, v in pairs:
        succ[u].append(v)
    src = np.array([u for u, _ in pairs], dtype=np.int64)
    dst = np.array([v for _, v in pairs], dtype=np.int64)
    ptr = np.zeros(n + 1, dtype=np.int64)
    np.cumsum(np.bincount(src, minlength=n), out=ptr[1:])
    ours = graph_mod._acyclic_c(ptr, np.ascontiguousarray(dst[np.argsort(src, kind="stable")]))
    assert ours == graph_mod._acyclic(succ, list(range(n)))


def _segments_reference(g, a, view, rank: int, step: int, lo: int, hi: int) -> list:
    """The segments as `critical_path` built them one record at a time before the columns
    (`cp._path`): the reference the column build must equal."""
    from moetune.analyzer.critical_path import _GAP_WHAT, GAP_WALL, LAUNCH_LATENCY_NS, Segment

    gpu = view.gpu_in(lo, hi)
    if gpu.height == 0:
        return [Segment(rank, step, lo, hi, "host", "step_tail", None)]
    sink = int(gpu.with_columns(ce=pl.min_horizontal("end_ns", pl.lit(hi))).sort(
        "ce", "ts_ns", "node").get_column("pos")[-1])
    records, last_hi, cut = _walk_py(a, sink, rank, lo, hi)
    ids, wall = a.ids, a.wall
    out = []
    top = records[0][2] if records else min(int(a.en[sink]), hi)
    if top < hi:
        out.append(Segment(rank, step, top, hi, "host", "step_tail", None))
    succ = None
    for v, lo_v, hi_v, best, best_rel, bk, bv in records:
        waiter, edge, via = succ if succ is not None else (None, None, None)
        node = ids[v]
        out.append(Segment(rank, step, lo_v, hi_v, wall[v], "op", node, False, waiter, edge, via))
        if best < 0:
            if lo_v > lo:
                out.append(Segment(rank, step, lo, lo_v, "host" if wall[v] == "host" else "other",
                                   "step_start", None))
            break
        kind, via_id = EDGE_KINDS[bk], (None if bv < 0 else bv)
        gap_lo = max(best_rel, lo)
        if gap_lo < lo_v:
            gw, what = GAP_WALL[kind], _GAP_WHAT[kind]
            if kind == "launch" and via_id is None and lo_v - gap_lo > LAUNCH_LATENCY_NS:
                gw, what = "other", "unexplained_gap"
            out.append(Segment(rank, step, gap_lo, lo_v, gw, what, node))
        succ = (node, kind, via_id)
    if cut and last_hi > lo:
        out.append(Segment(rank, step, lo, last_hi, "other", "step_start", None))
    out.reverse()
    return _mark_blocking([s for s in out if s.end_ns > s.start_ns], dict(zip(ids, wall,
                                                                                strict=True)))


def _mark_blocking(path: list, wall: dict) -> list:
    """Comm ops on the path whose successor entered through a dependency edge, walking back so
    a comm op feeding a blocking comm op is blocking too (the reference for `cp._blocking`)."""
    out = list(path)
    blocking_nodes: set[int] = set()
    for i in range(len(out) - 1, -1, -1):
        s = out[i]
        if s.what != "op" or s.node is None or s.wall != "communication":  # an op's own wall
            continue
        if s.edge in cp.DEP_KINDS and s.waiter is not None and (
            wall.get(s.waiter) != "communication" or s.waiter in blocking_nodes
        ):
            blocking_nodes.add(s.node)
            out[i] = s._replace(blocking=True)
    return out


@settings(max_examples=300, deadline=None)
@given(dags(), st.integers(0, 60), st.integers(60, 160))
def test_walk_into_and_the_column_path_equal_the_record_walk(tl, lo: int, hi: int) -> None:
    """`walk_into` writes the records `walk` returns; the path built as columns (`_path`, the
    segments of `critical_path`) equals the one built record by record, blocking marks too."""
    nodes, edges = tl
    nodes = nodes.with_columns(is_gpu=pl.col("wall") != "host")
    g = _arrays(nodes, pl.DataFrame(), edges, None, {}, False)
    a = _walk_arrays(g)
    if cp._walk_into_c is not None:
        args = (a.ts, a.en, a.rank, a.in_ptr, a.in_src, a.in_kind, a.in_via)
        for sink in range(g.n_nodes):
            out = np.empty((g.n_nodes, 7), dtype=np.int64)
            count, last_hi, cut = cp._walk_into_c(*args, sink, 0, lo, hi, out)
            records, hi_w, cut_w = cp._walk_c(*args, sink, 0, lo, hi)
            assert (out[:count].tolist(), last_hi, cut) == ([list(r) for r in records], hi_w,
                                                            cut_w)
    for rank in (0, 1):
        view = _view(g, rank, a)
        want = _segments_reference(g, a, view, rank, 7, lo, hi)
        for compiled in (True, False):
            assert critical_path(g, rank=rank, step=7, start_ns=lo, end_ns=hi, view=view,
                                 compiled=compiled) == want
