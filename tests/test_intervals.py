"""Interval algebra: exact small cases and hypothesis properties."""

from __future__ import annotations

import polars as pl
from hypothesis import given, settings
from hypothesis import strategies as st
from moetune.analyzer.intervals import (
    clip,
    complement,
    disjoint,
    intersect,
    subtract,
    sweep,
    total,
    total_ns,
    union,
)


def iv(rows: list[tuple[int, int]], rank: int | None = None) -> pl.DataFrame:
    d = {"start_ns": [a for a, _ in rows], "end_ns": [b for _, b in rows]}
    if rank is not None:
        d = {"rank": [rank] * len(rows), **d}
    return pl.DataFrame(d, schema={**({"rank": pl.Int64} if rank is not None else {}), "start_ns": pl.Int64, "end_ns": pl.Int64})


def test_union_merges_overlaps_and_touching_intervals() -> None:
    u = union(iv([(0, 10), (5, 12), (12, 15), (20, 30), (25, 26)]))
    assert u.rows() == [(0, 15), (20, 30)]


def test_union_drops_empty_and_inverted() -> None:
    assert union(iv([(5, 5), (9, 3)])).height == 0


def test_union_per_group() -> None:
    df = pl.concat([iv([(0, 10), (5, 12)], rank=0), iv([(0, 5)], rank=1)])
    assert total(df, by=["rank"]).rows() == [(0, 12), (1, 5)]


def test_intersect_and_subtract_exact() -> None:
    a = iv([(0, 10), (20, 30)])
    b = iv([(8, 25)])
    assert intersect(a, b).rows() == [(8, 10), (20, 25)]
    assert subtract(a, b).rows() == [(0, 8), (25, 30)]


def test_clip_splits_across_windows_and_complement_gives_gaps() -> None:
    a = iv([(0, 12), (20, 30)], rank=0)
    w = pl.DataFrame({"rank": [0, 0], "step": [1, 2], "win_start_ns": [0, 15], "win_end_ns": [15, 40]})
    c = clip(a, w, on=["rank"], window_cols=["step"])
    assert sorted(c.select("step", "start_ns", "end_ns").rows()) == [(1, 0, 12), (2, 20, 30)]
    gaps = complement(c, w, by=["rank", "step"])
    assert gaps.select("step", "start_ns", "end_ns").rows() == [(1, 12, 15), (2, 15, 20), (2, 30, 40)]


def test_sweep_flags_layers() -> None:
    seg = sweep({"x": iv([(0, 10)]), "y": iv([(5, 15)])})
    assert seg.rows() == [(0, 5, True, False), (5, 10, True, True), (10, 15, False, True)]


intervals = st.lists(
    st.tuples(st.integers(0, 10_000), st.integers(0, 500)).map(lambda t: (t[0], t[0] + t[1])),
    min_size=0,
    max_size=40,
)


@settings(max_examples=150, deadline=None)
@given(intervals, intervals, st.integers(-10**12, 10**12), st.randoms(use_true_random=False))
def test_properties(a_rows, b_rows, shift, rnd) -> None:
    a, b = iv(a_rows), iv(b_rows)
    ua = total_ns(a)
    # union ≤ sum, and union of a union is itself
    assert ua <= sum(e - s for s, e in a_rows)
    assert union(union(a)).rows() == union(a).rows()
    # a = (a ∩ b) ⊔ (a − b)
    assert total_ns(intersect(a, b)) + total_ns(subtract(a, b)) == ua
    # |a ∪ b| = |a| + |b| − |a ∩ b|
    assert total_ns(pl.concat([a, b])) == ua + total_ns(b) - total_ns(intersect(a, b))
    # invariant under shuffle and time shift
    shuffled = a_rows[:]
    rnd.shuffle(shuffled)
    assert union(iv(shuffled)).rows() == union(a).rows()
    moved = iv([(s + shift, e + shift) for s, e in a_rows])
    assert total_ns(moved) == ua
    assert total_ns(intersect(moved, iv([(s + shift, e + shift) for s, e in b_rows]))) == total_ns(intersect(a, b))


def test_disjoint_exact_cases() -> None:
    w = pl.DataFrame({"rank": [0, 0, 1], "a": [0, 10, 5], "b": [10, 20, 30]})
    assert disjoint(w, on=["rank"], start="a", end="b")  # touching windows, another rank overlaps
    assert not disjoint(w.with_columns(pl.Series("b", [11, 20, 30])), on=["rank"], start="a", end="b")
    assert not disjoint(w.with_columns(pl.Series("b", [0, 20, 30])), on=["rank"], start="a", end="b")
    assert not disjoint(w.with_columns(pl.Series("a", [None, 10, 5])), on=["rank"], start="a", end="b")
    assert not disjoint(w.with_columns(pl.Series("rank", [0, None, 1])), on=["rank"], start="a", end="b")
    assert disjoint(w.clear(), on=["rank"], start="a", end="b")


@settings(max_examples=150, deadline=None)
@given(st.lists(st.tuples(st.sampled_from([0, 1, None]), st.one_of(st.none(), st.integers(0, 40)),
                          st.integers(0, 40)), max_size=12))
def test_disjoint_small_path_agrees_with_the_polars_path(rows: list[tuple]) -> None:
    import moetune.analyzer.intervals as ivm

    w = pl.DataFrame(rows, schema={"rank": pl.Int64, "a": pl.Int64, "b": pl.Int64}, orient="row")
    cases = [(w, ["rank"]), (w.drop("rank"), [])]
    small = [disjoint(df, on=on, start="a", end="b") for df, on in cases]
    saved, ivm.SMALL_WINDOWS = ivm.SMALL_WINDOWS, -1  # every frame takes the polars path
    try:
        assert [disjoint(df, on=on, start="a", end="b") for df, on in cases] == small
    finally:
        ivm.SMALL_WINDOWS = saved
