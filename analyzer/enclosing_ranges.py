"""The innermost enclosing range of each point, on its thread: which host range (NVTX range,
scope, op, frame) a GPU launch was made inside (analyzer/phases_sequence.py reads the labels of
those ranges).

Ranges nest on a thread (profilers and NVTX push and pop), so the innermost range containing a
point is found by nesting depth, vectorised (`innermost`); thread and time are packed into one
Int64 (`pack`) so that one sorted search serves every thread.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import polars as pl


@dataclass(frozen=True, slots=True)
class Packed:
    """Ranges and points with (thread, time) packed into one Int64 each (see `innermost`)."""

    s: np.ndarray   # range starts, packed
    e: np.ndarray   # range ends, packed
    pt: np.ndarray  # points, packed (only the points that have a thread and a time)
    pi: np.ndarray  # their row numbers among the points
    span: int


def pack(points: pl.DataFrame, ranges: pl.DataFrame, at: str) -> Packed | None:
    # threads numbered in (rank, tid) order: ranges sorted by (rank, tid, start) pack sorted
    thr = pl.concat([ranges.select("rank", "tid"), points.select("rank", "tid")]).unique()
    thr = thr.drop_nulls().sort("rank", "tid").with_row_index("_th").with_columns(pl.col("_th").cast(pl.Int64))
    ts = [x for x in (ranges.get_column("start").min(), points.get_column(at).min()) if x is not None]
    te = [x for x in (ranges.get_column("end").max(), points.get_column(at).max()) if x is not None]
    t0, t1 = int(min(ts)), int(max(te))
    span = 1 << max((t1 - t0 + 2).bit_length(), 1)
    if span * (thr.height + 1) >= 1 << 62:
        return None
    r = ranges.select("rank", "tid", "start", "end").join(thr, on=["rank", "tid"], how="left",
                                                          maintain_order="left")
    base = r.get_column("_th").to_numpy() * span - t0
    p = points.select("rank", "tid", pl.col(at).alias("_t")).with_row_index("_pi").join(
        thr, on=["rank", "tid"], how="left", maintain_order="left").filter(
        pl.col("_t").is_not_null() & pl.col("_th").is_not_null())
    return Packed(base + r.get_column("start").to_numpy(), base + r.get_column("end").to_numpy(),
                   p.get_column("_th").to_numpy() * span - t0 + p.get_column("_t").to_numpy(),
                   p.get_column("_pi").to_numpy(), span)


def innermost(points: pl.DataFrame, ranges: pl.DataFrame, *, at: str = "launch_ts",
              mask: np.ndarray | None = None, packed: Packed | None = None) -> np.ndarray:
    """For each row of `points` (rank, tid, `at`), the row index in `ranges` (rank, tid, start,
    end) of the innermost range containing the point (start ≤ t < end), −1 when none does;
    `mask`: only those ranges count. Ranges nest on a thread (profilers and NVTX push and pop).

    Vectorised through nesting depth: a range's depth is the number of earlier ranges of its
    thread still open where it starts; the ranges open at t number opened − closed by t; the
    innermost one containing t is the latest-starting range at depth (open − 1) that started by
    t. Thread and time are packed into one Int64 so that one sorted search serves all threads."""
    n = points.height
    out = np.full(n, -1, dtype=np.int64)
    if n == 0 or ranges.height == 0:
        return out
    pk = packed if packed is not None else pack(points, ranges, at)
    if pk is None:
        return _innermost_slow(points, ranges if mask is None else ranges.filter(mask), at=at,
                               rows=np.flatnonzero(mask) if mask is not None else None)
    rows = np.flatnonzero(mask) if mask is not None else np.arange(len(pk.s))
    if len(rows) == 0 or len(pk.pt) == 0:
        return out
    s, e, span = pk.s[rows], pk.e[rows], pk.span
    # (thread, start) packed in s; outer first on ties (`_host_ranges` gives them in this order)
    in_order = len(s) < 2 or bool(np.all((s[1:] > s[:-1]) | ((s[1:] == s[:-1]) & (e[1:] <= e[:-1]))))
    order = np.arange(len(s)) if in_order else np.lexsort((-e, s))
    s_sorted = s[order]
    ends = np.sort(e)
    lo_r = (s_sorted // span) * span
    # depth: earlier ranges of the thread still open where this one starts
    first = np.searchsorted(s_sorted, lo_r, side="left")
    closed = np.searchsorted(ends, s_sorted, side="right") - np.searchsorted(ends, lo_r, side="left")
    depth = (np.arange(len(s_sorted)) - first) - closed
    pt = pk.pt
    lo = (pt // span) * span
    opened = np.searchsorted(s_sorted, pt, side="right") - np.searchsorted(s_sorted, lo, side="left")
    closed_p = np.searchsorted(ends, pt, side="right") - np.searchsorted(ends, lo, side="left")
    want = opened - closed_p - 1
    res = np.full(len(pt), -1, dtype=np.int64)
    ok = want >= 0
    if ok.any():
        # the latest range started by t at the wanted depth: ranges ordered by (depth, start)
        by_depth = np.argsort(depth, kind="stable")  # s_sorted ascending: ties stay by start
        dk, sk = depth[by_depth], s_sorted[by_depth]
        wanted, tt = want[ok], pt[ok]
        found = np.full(len(wanted), -1, dtype=np.int64)
        for d in np.unique(wanted):
            m = wanted == d
            a, b = np.searchsorted(dk, d, side="left"), np.searchsorted(dk, d, side="right")
            j = np.searchsorted(sk[a:b], tt[m], side="right") - 1
            found[m] = np.where(j >= 0, a + j, -1)
        good = found >= 0
        cand = np.where(good, order[by_depth[np.where(good, found, 0)]], -1)
        inside = good & (e[np.where(good, cand, 0)] > tt) & (s[np.where(good, cand, 0)] <= tt)
        res[ok] = np.where(inside, rows[np.where(inside, cand, 0)], -1)
    out[pk.pi] = res
    return out


def _innermost_slow(points: pl.DataFrame, ranges: pl.DataFrame, *, at: str,
                    rows: np.ndarray | None = None) -> np.ndarray:
    """`innermost` for times that do not pack: per point, the containing range of smallest span
    (`rows`: the row numbers these ranges have in the caller's frame)."""
    out = np.full(points.height, -1, dtype=np.int64)
    r = ranges.select("rank", "tid", "start", "end").with_row_index("_ri")
    for i, (rank, tid, t) in enumerate(points.select("rank", "tid", at).iter_rows()):
        if t is None:
            continue
        c = r.filter((pl.col("rank") == rank) & (pl.col("tid") == tid) & (pl.col("start") <= t)
                     & (pl.col("end") > t)).sort(pl.col("end") - pl.col("start"))
        if c.height:
            k = int(c.get_column("_ri")[0])
            out[i] = k if rows is None else int(rows[k])
    return out
