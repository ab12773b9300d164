"""Interval algebra over polars frames: union, intersection, difference, clipping, total length.

Intervals are rows with `start_ns` < `end_ns` (half-open) plus grouping columns `by` (e.g. rank,
step). Unions never sum overlapping time: sort → running max of ends → a new group wherever a start
lies past every earlier end. Set operations use one sweep over the boundaries of unioned layers.
All functions return new frames sorted by (*by, start_ns) and never mutate their inputs.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import polars as pl

START, END = "start_ns", "end_ns"
_G = "_grp"


def _keys(by: Sequence[str]) -> list[str]:
    return list(by) if by else [_G]


def _with_key(df: pl.DataFrame, by: Sequence[str]) -> pl.DataFrame:
    return df if by else df.with_columns(pl.lit(0, dtype=pl.Int8).alias(_G))


def _drop_key(df: pl.DataFrame, by: Sequence[str]) -> pl.DataFrame:
    return df if by else df.drop(_G)


def empty_intervals(by: Sequence[str] = (), schema: Mapping[str, pl.DataType] | None = None) -> pl.DataFrame:
    cols: dict[str, pl.DataType] = {k: (schema or {}).get(k, pl.Int64) for k in by}
    cols |= {START: pl.Int64, END: pl.Int64}
    return pl.DataFrame(schema=cols)


def union(df: pl.DataFrame, *, by: Sequence[str] = ()) -> pl.DataFrame:
    """Merge overlapping or touching intervals per group; empty and inverted ones are dropped."""
    keys = _keys(by)
    d = _with_key(df.select([*by, START, END]), by).filter(pl.col(END) > pl.col(START))
    if d.height == 0:
        return _drop_key(d.select([*keys, START, END]), by)
    d = d.sort([*keys, START, END])
    prev_end = pl.col(END).cum_max().shift(1).over(keys)
    brk = (prev_end.is_null() | (pl.col(START) > prev_end)).cast(pl.Int64)
    out = (
        d.with_columns(brk.alias("_brk"))
        .with_columns(pl.col("_brk").cum_sum().over(keys).alias("_run"))
        .group_by([*keys, "_run"], maintain_order=True)
        .agg(pl.col(START).min(), pl.col(END).max())
        .drop("_run")
        .sort([*keys, START])
    )
    return _drop_key(out, by)


def total(df: pl.DataFrame, *, by: Sequence[str] = ()) -> pl.DataFrame:
    """Length of the union per group, column `len_ns` (groups with no time are absent)."""
    u = union(df, by=by)
    length = (pl.col(END) - pl.col(START)).sum().alias("len_ns")
    if not by:
        return u.select(length)
    return u.group_by(list(by)).agg(length).sort(list(by))


def total_ns(df: pl.DataFrame) -> int:
    """Length of the union of all intervals in `df`, ignoring any grouping columns."""
    u = union(df)
    return int(u.select((pl.col(END) - pl.col(START)).sum()).item() or 0)


def sweep(layers: Mapping[str, pl.DataFrame], *, by: Sequence[str] = ()) -> pl.DataFrame:
    """Elementary segments of all layers' boundaries, with one Boolean column per layer telling
    whether that layer covers the segment. Segments covered by no layer are dropped."""
    keys = _keys(by)
    names = list(layers)
    points = []
    for name, df in layers.items():
        u = _with_key(union(df, by=by), by)
        zeros = {n: pl.lit(0, dtype=pl.Int64) for n in names}
        for col, sign in ((START, 1), (END, -1)):
            d = {**zeros, name: pl.lit(sign, dtype=pl.Int64)}
            points.append(u.select([*keys, pl.col(col).alias("t"), *[v.alias(k) for k, v in d.items()]]))
    if not points:
        return _drop_key(empty_intervals(keys), by)
    pts = (
        pl.concat(points, how="vertical_relaxed")
        .group_by([*keys, "t"])
        .agg([pl.col(n).sum() for n in names])
        .sort([*keys, "t"])
    )
    seg = pts.with_columns(
        *[pl.col(n).cum_sum().over(keys) for n in names],
        pl.col("t").shift(-1).over(keys).alias(END),
    ).rename({"t": START})
    seg = seg.filter(pl.col(END).is_not_null() & (pl.col(END) > pl.col(START)))
    seg = seg.with_columns([(pl.col(n) > 0) for n in names])
    seg = seg.filter(pl.any_horizontal([pl.col(n) for n in names]))
    return _drop_key(seg.select([*keys, START, END, *names]), by)


def _select(layers: Mapping[str, pl.DataFrame], cond: pl.Expr, by: Sequence[str]) -> pl.DataFrame:
    seg = sweep(layers, by=by)
    return union(seg.filter(cond).select([*by, START, END]), by=by)


def intersect(a: pl.DataFrame, b: pl.DataFrame, *, by: Sequence[str] = ()) -> pl.DataFrame:
    """Time covered by both `a` and `b` (as a union)."""
    return _select({"a": a, "b": b}, pl.col("a") & pl.col("b"), by)


def subtract(a: pl.DataFrame, b: pl.DataFrame, *, by: Sequence[str] = ()) -> pl.DataFrame:
    """Time covered by `a` but not by `b` (as a union)."""
    return _select({"a": a, "b": b}, pl.col("a") & ~pl.col("b"), by)


def clip(
    df: pl.DataFrame,
    windows: pl.DataFrame,
    *,
    on: Sequence[str],
    window_cols: Sequence[str],
    start: str = "win_start_ns",
    end: str = "win_end_ns",
) -> pl.DataFrame:
    """Cut intervals to each window they overlap. `windows` has `on` (join keys, e.g. rank),
    `window_cols` (kept, e.g. step) and the window bounds; an interval spanning two windows
    yields one piece per window."""
    w = windows.select([*on, *window_cols, start, end])
    j = df.join(w, on=list(on), how="inner")
    j = j.filter((pl.col(START) < pl.col(end)) & (pl.col(END) > pl.col(start)))
    return j.with_columns(
        pl.max_horizontal(START, start).alias(START),
        pl.min_horizontal(END, end).alias(END),
    ).drop([start, end])


def complement(df: pl.DataFrame, windows: pl.DataFrame, *, by: Sequence[str]) -> pl.DataFrame:
    """Gaps: the part of each window (columns by…, win_start_ns, win_end_ns) not covered by `df`."""
    w = windows.select([*by, pl.col("win_start_ns").alias(START), pl.col("win_end_ns").alias(END)])
    return subtract(w, df.select([*by, START, END]), by=by)
