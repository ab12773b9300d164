"""Interval algebra: exact small cases and hypothesis properties."""

from __future__ import annotations

import polars as pl
from hypothesis import given, settings
from hypothesis import strategies as st

from analyzer.intervals import clip, complement, intersect, subtract, sweep, total, total_ns, union


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
