"""The cycle check only looks where cycles can be: same verdict as networkx on any graph."""

from __future__ import annotations

import networkx as nx
import numpy as np
import polars as pl
from hypothesis import given, settings
from hypothesis import strategies as st
from moetune.analyzer.graph import _acyclic, _cycle_span_arrays


def _cycle_span(nodes: pl.DataFrame, edges: pl.DataFrame) -> list[int]:
    """`_cycle_span_arrays` of node and edge frames (node ids 0..n-1, so ids are positions)."""
    ids = nodes.get_column("node").to_numpy().astype(np.int64)
    return _cycle_span_arrays(ids, nodes.get_column("ts_ns").to_numpy(),
                              edges.get_column("src").to_numpy().astype(np.int64),
                              edges.get_column("dst").to_numpy().astype(np.int64))


@st.composite
def timelines(draw: st.DrawFn) -> tuple[pl.DataFrame, pl.DataFrame]:
    n = draw(st.integers(2, 40))
    ts = draw(st.lists(st.integers(0, 30), min_size=n, max_size=n))  # ties on ts are common
    pairs = draw(st.lists(st.tuples(st.integers(0, n - 1), st.integers(0, n - 1)), max_size=80))
    # mostly forward in time, like a real timeline; some backward (sync-like) edges
    edges = {(u, v) for u, v in pairs if u != v}
    nodes = pl.DataFrame({"node": list(range(n)), "ts_ns": ts}, schema={"node": pl.Int64,
                                                                          "ts_ns": pl.Int64})
    e = pl.DataFrame(sorted(edges), schema={"src": pl.Int64, "dst": pl.Int64}, orient="row")
    return nodes, e


@settings(max_examples=400, deadline=None)
@given(timelines())
def test_same_verdict_as_networkx(tl: tuple[pl.DataFrame, pl.DataFrame]) -> None:
    nodes, edges = tl
    g = nx.DiGraph()
    g.add_nodes_from(nodes["node"].to_list())
    g.add_edges_from(edges.iter_rows())
    span = _cycle_span(nodes, edges)
    ours = _acyclic(g._succ, span) if span else True
    assert ours == nx.is_directed_acyclic_graph(g)
    # every cycle lies inside the span
    for cyc in nx.simple_cycles(g):
        assert set(cyc) <= set(span)
        break


def test_forward_only_timeline_needs_no_check() -> None:
    nodes = pl.DataFrame({"node": [0, 1, 2, 3], "ts_ns": [0, 5, 5, 9]})
    edges = pl.DataFrame({"src": [0, 1, 2, 0], "dst": [1, 2, 3, 3]})
    assert _cycle_span(nodes, edges) == []
    back = pl.concat([edges, pl.DataFrame({"src": [3], "dst": [1]})])  # 3 → 1 closes 1→2→3→1
    span = _cycle_span(nodes, back)
    assert span == [1, 2, 3]
    g = nx.DiGraph(list(back.iter_rows()))
    assert not _acyclic(g._succ, span)
