"""Times of the labelled work of each rank's median step, per phase (and layer, direction, source).

Per rank, over the step's GPU window (the walls' window, analyzer/walls.py):

- `busy`: the union of the phase's GPU intervals (its work, overlapped or not);
- `exposed`: the time the phase held the GPU with nothing of a stronger wall running, by the walls'
  priority (compute, then recompute, then communication, then memory); work of one wall running
  side by side shares that time equally, so the exposed times of all phases sum to the GPU's busy
  time and match the walls' exposed times;
- `hidden` = busy − exposed;
- `idle`: GPU idle time that ended when this phase's work started (the step waited for it to be
  issued); idle at the window's end, with no work of the step after it, is the `idle` row;
- `step` = exposed + idle: the phase's share of the step; all rows sum to the window exactly;
- `kernels`, `launches` (launch calls, a graph replay is one) and `host`: on each launching
  thread, the time from the previous launch call's return (or the step's host start) to this
  one's, charged to the phase of the work it launched: the host time spent issuing it.
"""

from __future__ import annotations

import numpy as np
import polars as pl
from moetune.analyzer.intervals import END, START

KEY = ["phase", "layer", "direction", "source"]
TAIL = "idle"  # GPU idle at the step's end: waiting on no work of this step
_LEVEL = {"compute": 0, "communication": 2, "memory": 3}


def phase_times(items: pl.DataFrame, win: pl.DataFrame) -> tuple[pl.DataFrame, pl.DataFrame]:
    """(additive times per rank × KEY, busy unions per rank × grouping).

    The first frame: rank, phase, layer, direction, source, exposed_ns, idle_ns, kernels,
    launches, host_ns. The second: rank, by (`phase`, `layer` or `direction`: the grouping),
    phase, layer, direction, busy_ns."""
    parts, busy = [], []
    for w in win.sort("rank").iter_rows(named=True):
        it = items.filter(pl.col("rank") == w["rank"])
        parts.append(_rank_times(it, w))
        busy.append(_rank_busy(it, w))
    empty = pl.DataFrame(schema={"rank": pl.Int32, "phase": pl.String, "layer": pl.Int32,
                                 "direction": pl.String, "source": pl.String,
                                 "exposed_ns": pl.Int64, "idle_ns": pl.Int64,
                                 "kernels": pl.Int64, "launches": pl.Int64, "host_ns": pl.Int64})
    add = pl.concat([empty, *parts], how="diagonal_relaxed") if parts else empty
    b = pl.concat(busy, how="diagonal_relaxed") if busy else pl.DataFrame(
        schema={"rank": pl.Int32, "by": pl.String, "phase": pl.String, "layer": pl.Int32,
                "direction": pl.String, "busy_ns": pl.Int64})
    return add, b


def _clipped(it: pl.DataFrame, w: dict) -> pl.DataFrame:
    ws, we = w["win_start_ns"], w["win_end_ns"]
    return (it.filter(pl.col("item") == "gpu")
            .with_columns(pl.max_horizontal("ts_ns", pl.lit(ws)).alias(START),
                          pl.min_horizontal("end_ns", pl.lit(we)).alias(END))
            .filter(pl.col(END) > pl.col(START)))


def _rank_times(it: pl.DataFrame, w: dict) -> pl.DataFrame:
    rank, ws, we = w["rank"], w["win_start_ns"], w["win_end_ns"]
    g = _clipped(it, w)
    key_rows = g.select(KEY)
    s, e = g.get_column(START).to_numpy(), g.get_column(END).to_numpy()
    wall = g.get_column("wall").to_list()
    rc = (g.get_column("direction") == "recompute").to_numpy()
    level = np.array([_LEVEL.get(x or "compute", 0) for x in wall], dtype=np.int64)
    level = np.where((level == 0) & rc, 1, level)
    times = np.unique(np.concatenate([s, e, [ws, we]]))
    a, b = np.searchsorted(times, s), np.searchsorted(times, e)
    seg = np.diff(times).astype(np.float64)
    nseg = len(seg)
    cnt = np.zeros((4, nseg + 1), dtype=np.int64)
    for lv in range(4):
        m = level == lv
        np.add.at(cnt[lv], a[m], 1)
        np.add.at(cnt[lv], b[m], -1)
    cnt = np.cumsum(cnt, axis=1)[:, :nseg]
    busy_any = cnt > 0
    top = np.where(busy_any.any(axis=0), np.argmax(busy_any, axis=0), -1)
    exposed = np.zeros(len(s), dtype=np.float64)
    for lv in range(4):
        share = np.where(top == lv, seg / np.maximum(cnt[lv], 1), 0.0)
        f = np.concatenate([[0.0], np.cumsum(share)])
        m = level == lv
        exposed[m] = f[b[m]] - f[a[m]]
    # GPU idle gaps: charged to the work that ends them (the lowest level starting there)
    idle = np.zeros(len(s), dtype=np.float64)
    tail = 0.0
    gaps = np.flatnonzero(top < 0)
    if gaps.size:
        order = np.lexsort((level, a))
        first_at, where = np.unique(a[order], return_index=True)
        owner = np.full(len(times) + 1, -1, dtype=np.int64)
        owner[first_at] = order[where]
        who = owner[gaps + 1]
        np.add.at(idle, who[who >= 0], seg[gaps][who >= 0])
        tail = float(seg[gaps][who < 0].sum())
    kern = (g.get_column("kind") == "kernel").to_numpy()
    df = key_rows.with_columns(pl.Series("exposed_ns", exposed), pl.Series("idle_ns", idle),
                               pl.Series("kernels", kern.astype(np.int64)))
    launches = _launches(g)
    host = _host(it, w)
    out = (df.group_by(KEY).agg(pl.col("exposed_ns").sum(), pl.col("idle_ns").sum(),
                                pl.col("kernels").sum())
           .join(launches, on=KEY, how="full", coalesce=True, nulls_equal=True)
           .join(host, on=KEY, how="full", coalesce=True, nulls_equal=True))
    rows = [out]
    if tail > 0:
        rows.append(pl.DataFrame({"phase": [TAIL], "layer": [None], "direction": [None],
                                  "source": ["gap"], "idle_ns": [tail]},
                                 schema_overrides={"layer": pl.Int32, "direction": pl.String}))
    res = pl.concat(rows, how="diagonal_relaxed").with_columns(pl.lit(rank, pl.Int32).alias("rank"))
    return res.with_columns(
        pl.col("exposed_ns", "idle_ns").fill_null(0.0).round(0).cast(pl.Int64),
        pl.col("kernels", "launches", "host_ns").fill_null(0).cast(pl.Int64))


def _launches(g: pl.DataFrame) -> pl.DataFrame:
    """Launch calls per key: each launch of work in the window counted once, for the work it
    launched first."""
    la = (g.filter(pl.col("launch_ts").is_not_null()).sort(START)
          .unique(["correlation"], keep="first", maintain_order=True))
    return la.group_by(KEY).agg(pl.len().cast(pl.Int64).alias("launches"))


def _host(it: pl.DataFrame, w: dict) -> pl.DataFrame:
    """Host time issuing each key (module doc). The rank's launch calls (and phase markers) in
    its host step, on every thread, in the order they returned: each is charged the time since
    the one before it returned, so a thread waiting for another (the main thread during the
    autograd thread's backward) is not charged the other's work, and the charges tile the span
    from the step's host start to its last launch."""
    hs, he = w["start_ns"], w["end_ns"]
    calls = (it.filter(pl.col("launch_end").is_not_null() & pl.col("tid").is_not_null())
             .sort("ts_ns").unique(["item", "correlation", "launch_ts"], keep="first")
             .filter((pl.col("launch_end") > hs) & (pl.col("launch_end") <= he))
             .sort("launch_end")
             .with_columns(pl.col("launch_end").shift(1).fill_null(hs).alias("_prev")))
    return calls.group_by(KEY).agg(
        (pl.col("launch_end") - pl.col("_prev")).clip(0).sum().cast(pl.Int64).alias("host_ns"))


def _rank_busy(it: pl.DataFrame, w: dict) -> pl.DataFrame:
    """Union of the GPU intervals per (phase), (phase, layer) and (phase, direction), numpy:
    each grouping's intervals sorted by (group, start), a running max of their ends."""
    g = _clipped(it, w).select("phase", "layer", "direction", START, END)
    s, e = g.get_column(START).to_numpy(), g.get_column(END).to_numpy()
    rows = []
    for name, by in (("phase", ["phase"]), ("layer", ["phase", "layer"]),
                     ("direction", ["phase", "direction"])):
        keys = g.select(by).with_columns(pl.col("layer").fill_null(-1) if "layer" in by else [])
        codes = keys.select(pl.struct(by).rank("dense").cast(pl.Int64)).to_series().to_numpy()
        order = np.lexsort((s, codes))
        c, ss, ee = codes[order], s[order], e[order]
        total = np.zeros(int(c.max()) + 1 if len(c) else 1, dtype=np.int64)
        new_group = np.r_[True, c[1:] != c[:-1]] if len(c) else np.array([], dtype=bool)
        # the ends reached so far in the group, before each interval: what of it is new
        reach = _group_cummax(ee, new_group)
        prev = np.r_[np.int64(0), reach[:-1]] if len(reach) else reach
        start = np.where(new_group, ss, np.maximum(ss, prev))
        np.add.at(total, c, np.maximum(ee - start, 0))
        first = keys.with_columns(pl.Series("_c", codes)).unique("_c").sort("_c")
        for row in first.iter_rows(named=True):
            rows.append({"by": name, "phase": row["phase"],
                         "layer": None if row.get("layer", -1) == -1 else row.get("layer"),
                         "direction": row.get("direction"), "busy_ns": int(total[row["_c"]])})
    return pl.DataFrame(rows, schema={"by": pl.String, "phase": pl.String, "layer": pl.Int32,
                                      "direction": pl.String, "busy_ns": pl.Int64}).with_columns(
        pl.lit(w["rank"], pl.Int32).alias("rank"))


def _group_cummax(x: np.ndarray, new_group: np.ndarray) -> np.ndarray:
    """Running max of `x` that restarts where `new_group` is true (x ≥ 0)."""
    if len(x) == 0:
        return x
    base = int(x.min())
    y = x - base  # window-relative: the lift below stays far from int64's range
    gid = np.cumsum(new_group) - 1
    # lift each group above every earlier one, take one running max, drop the lift
    lift = gid.astype(np.int64) * (int(y.max()) + 1)
    return np.maximum.accumulate(y + lift) - lift + base
