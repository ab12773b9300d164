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

KEY = ["phase", "layer", "direction", "source"]
TAIL = "idle"  # GPU idle at the step's end: waiting on no work of this step
_LEVEL = {"communication": 2, "memory": 3}  # compute (and anything else) 0, recompute 1
# the busy unions' groupings: name → the key columns it groups by
_BUSY = {"phase": ["phase"], "layer": ["phase", "layer"], "direction": ["phase", "direction"]}
_ADD_SCHEMA = {"rank": pl.Int32, "phase": pl.String, "layer": pl.Int32, "direction": pl.String,
               "source": pl.String, "exposed_ns": pl.Int64, "idle_ns": pl.Int64,
               "kernels": pl.Int64, "launches": pl.Int64, "host_ns": pl.Int64}
_BUSY_SCHEMA = {"rank": pl.Int32, "by": pl.String, "phase": pl.String, "layer": pl.Int32,
                "direction": pl.String, "busy_ns": pl.Int64}


def phase_times(items: pl.DataFrame, win: pl.DataFrame) -> tuple[pl.DataFrame, pl.DataFrame]:
    """(additive times per rank × KEY, busy unions per rank × grouping).

    The first frame: rank, phase, layer, direction, source, exposed_ns, idle_ns, kernels,
    launches, host_ns. The second: rank, by (`phase`, `layer` or `direction`: the grouping),
    phase, layer, direction, busy_ns.

    One polars pass gives every item its numbers and its key codes (a dense code per KEY and per
    busy grouping); the rest is numpy per rank, summed by code: the rows are few, and a polars
    group-by or join per rank would cost more in fixed overhead than the work."""
    if items.height == 0 or win.height == 0:
        return pl.DataFrame(schema=_ADD_SCHEMA), pl.DataFrame(schema=_BUSY_SCHEMA)
    level = (pl.when(pl.col("wall") == "communication").then(2)
             .when(pl.col("wall") == "memory").then(3)
             .when(pl.col("direction") == "recompute").then(1).otherwise(0))
    code = lambda by: pl.struct(by).rank("dense").cast(pl.Int64) - 1  # noqa: E731
    f = items.select(
        "rank", code(KEY).alias("_k"),
        (pl.col("item") == "gpu").alias("_gpu"), (pl.col("item") == "marker").alias("_mk"),
        "ts_ns", "end_ns", level.alias("_lv"), (pl.col("kind") == "kernel").alias("_kern"),
        pl.col("launch_ts").is_not_null().alias("_has_launch"), pl.col("launch_ts").fill_null(0),
        (pl.col("launch_end").is_not_null() & pl.col("tid").is_not_null()).alias("_call"),
        pl.col("launch_end").fill_null(0), pl.col("correlation").is_null().alias("_no_corr"),
        pl.col("correlation").fill_null(0))
    a = {c: f.get_column(c).to_numpy() for c in f.columns}
    key_rows = _first_rows(items, a["_k"], KEY)
    # a busy grouping's code is a function of the KEY code: coded on the few key rows
    by_key = key_rows.select(*(code(by).alias(n) for n, by in _BUSY.items()))
    a.update({f"_b_{n}": by_key.get_column(n).to_numpy()[a["_k"]] for n in _BUSY})
    adds, busies = [], []
    for w in win.sort("rank").iter_rows(named=True):
        mine = a["rank"] == w["rank"]
        adds.append(_rank_times(a, mine, w))
        busies.append(_rank_busy(items, a, mine, w))
    add = pl.concat([_add_frame(key_rows, adds), *_tails(adds)], how="vertical_relaxed")
    busy = pl.concat([b for b in busies if b.height] or [pl.DataFrame(schema=_BUSY_SCHEMA)],
                     how="vertical_relaxed")
    return add, busy


def _first_rows(items: pl.DataFrame, codes: np.ndarray, cols: list[str]) -> pl.DataFrame:
    """The `cols` values of each code (row i: code i), from the first item carrying it."""
    _, first = np.unique(codes, return_index=True)
    return items.select(pl.col(cols).gather(pl.Series(first, dtype=pl.Int64)))


def _clip(a: dict[str, np.ndarray], mine: np.ndarray, w: dict
          ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Rows (indices) of the rank's GPU work inside its window, and their clipped start, end."""
    s = np.maximum(a["ts_ns"], w["win_start_ns"])
    e = np.minimum(a["end_ns"], w["win_end_ns"])
    rows = np.flatnonzero(mine & a["_gpu"] & (e > s))
    return rows, s[rows], e[rows]


def _unique_sorted(x: np.ndarray) -> np.ndarray:
    x = np.sort(x)
    return x[np.r_[True, x[1:] != x[:-1]]] if len(x) else x


def _rank_times(a: dict[str, np.ndarray], mine: np.ndarray, w: dict) -> dict:
    """One rank's sums per KEY code (exposed, idle, kernels, launches, host, which codes have a
    row) and its tail idle."""
    n = int(a["_k"].max()) + 1
    rows, s, e = _clip(a, mine, w)
    k = a["_k"][rows]
    level = a["_lv"][rows]
    times = _unique_sorted(np.concatenate([s, e, [w["win_start_ns"], w["win_end_ns"]]]))
    i, j = np.searchsorted(times, s), np.searchsorted(times, e)
    seg = np.diff(times).astype(np.float64)
    nseg = len(seg)
    cnt = np.stack([np.bincount(i[level == lv], minlength=nseg + 1)
                    - np.bincount(j[level == lv], minlength=nseg + 1) for lv in range(4)])
    cnt = np.cumsum(cnt, axis=1)[:, :nseg]
    busy_any = cnt > 0
    top = np.where(busy_any.any(axis=0), np.argmax(busy_any, axis=0), -1)
    exposed = np.zeros(len(s), dtype=np.float64)
    for lv in range(4):
        share = np.where(top == lv, seg / np.maximum(cnt[lv], 1), 0.0)
        f = np.concatenate([[0.0], np.cumsum(share)])
        m = level == lv
        exposed[m] = f[j[m]] - f[i[m]]
    # GPU idle gaps: charged to the work that ends them (the lowest level starting there)
    idle = np.zeros(len(s), dtype=np.float64)
    tail = 0.0
    gaps = np.flatnonzero(top < 0)
    if gaps.size:
        order = np.lexsort((level, i))
        first_at, where = np.unique(i[order], return_index=True)
        owner = np.full(len(times) + 1, -1, dtype=np.int64)
        owner[first_at] = order[where]
        who = owner[gaps + 1]
        idle += np.bincount(who[who >= 0], seg[gaps][who >= 0], len(s))
        tail = float(seg[gaps][who < 0].sum())
    out = {"exposed_ns": np.bincount(k, exposed, n), "idle_ns": np.bincount(k, idle, n),
           "kernels": np.bincount(k, a["_kern"][rows], n).astype(np.int64),
           "rank": w["rank"], "tail": tail}
    launched = _launches(a, rows, s)
    out["launches"] = np.bincount(launched, minlength=n).astype(np.int64)
    calls, charge = _host(a, mine, w)
    out["host_ns"] = np.bincount(calls, charge, n)
    out["present"] = np.bincount(np.concatenate([k, launched, calls]), minlength=n) > 0
    return out


def _launches(a: dict[str, np.ndarray], rows: np.ndarray, s: np.ndarray) -> np.ndarray:
    """KEY codes of the launch calls of the work in the window: each launch counted once, for
    the work it launched first (earliest clipped start)."""
    has = a["_has_launch"][rows]
    r, st = rows[has], s[has]
    order = np.lexsort((st,))  # stable: ties keep row order
    corr = a["correlation"][r][order]
    _, first = np.unique(corr, return_index=True)
    return a["_k"][r[order][first]]


def _host(a: dict[str, np.ndarray], mine: np.ndarray, w: dict) -> tuple[np.ndarray, np.ndarray]:
    """KEY codes and host time of the rank's launch calls (module doc). The rank's launch calls
    (and phase markers) in its host step, on every thread, in the order they returned: each is
    charged the time since the one before it returned, so a thread waiting for another (the main
    thread during the autograd thread's backward) is not charged the other's work, and the
    charges tile the span from the step's host start to its last launch."""
    hs, he = w["start_ns"], w["end_ns"]
    r = np.flatnonzero(mine & a["_call"])
    # one call per (item, correlation, launch): the one of its earliest work
    order = np.lexsort((a["ts_ns"][r], a["launch_ts"][r], a["correlation"][r], a["_no_corr"][r],
                        a["_mk"][r]))
    r = r[order]
    key = np.stack([a[c][r].astype(np.int64) for c in ("_mk", "_no_corr", "correlation",
                                                       "launch_ts")])
    first = np.r_[True, (key[:, 1:] != key[:, :-1]).any(axis=0)] if len(r) else np.zeros(0, bool)
    r = r[first]
    le = a["launch_end"][r]
    inside = (le > hs) & (le <= he)
    r, le = r[inside], le[inside]
    o = np.lexsort((a["ts_ns"][r], le))
    r, le = r[o], le[o]
    prev = np.r_[np.int64(hs), le[:-1]]
    return a["_k"][r], np.maximum(le - prev, 0).astype(np.float64)


def _add_frame(key_rows: pl.DataFrame, adds: list[dict]) -> pl.DataFrame:
    """The additive frame's rows: per rank, the codes that have work, launches or host time."""
    codes = [np.flatnonzero(x["present"]) for x in adds]
    vals = pl.DataFrame({
        "rank": pl.Series(np.concatenate([np.full(len(c), x["rank"], dtype=np.int64)
                                          for c, x in zip(codes, adds, strict=True)]), dtype=pl.Int32),
        **{c: np.concatenate([x[c][k] for k, x in zip(codes, adds, strict=True)])
           for c in ("exposed_ns", "idle_ns", "kernels", "launches", "host_ns")}})
    keys = key_rows.select(pl.all().gather(pl.Series(np.concatenate(codes), dtype=pl.Int64)))
    return pl.concat([vals.select("rank"), keys, vals.drop("rank")], how="horizontal").with_columns(
        pl.col("exposed_ns", "idle_ns").round(0).cast(pl.Int64),
        pl.col("kernels", "launches", "host_ns").cast(pl.Int64))


def _tails(adds: list[dict]) -> list[pl.DataFrame]:
    """The `idle` rows: GPU idle at a rank's window end, after the step's last work."""
    return [pl.DataFrame({"rank": [x["rank"]], "phase": [TAIL], "layer": [None],
                          "direction": [None], "source": ["gap"],
                          "exposed_ns": [0], "idle_ns": [x["tail"]], "kernels": [0],
                          "launches": [0], "host_ns": [0]},
                         schema_overrides={"layer": pl.Int32, "direction": pl.String,
                                           "rank": pl.Int32, "idle_ns": pl.Float64}).with_columns(
        pl.col("idle_ns").round(0).cast(pl.Int64))
        for x in adds if x["tail"] > 0]


def _rank_busy(items: pl.DataFrame, a: dict[str, np.ndarray], mine: np.ndarray, w: dict
               ) -> pl.DataFrame:
    """Union of the GPU intervals per (phase), (phase, layer) and (phase, direction), numpy:
    each grouping's intervals sorted by (group, start), a running max of their ends."""
    rows, s, e = _clip(a, mine, w)
    out = []
    for name, by in _BUSY.items():
        codes = a[f"_b_{name}"][rows]
        order = np.lexsort((s, codes))
        c, ss, ee = codes[order], s[order], e[order]
        new_group = np.r_[True, c[1:] != c[:-1]] if len(c) else np.array([], dtype=bool)
        # the ends reached so far in the group, before each interval: what of it is new
        reach = _group_cummax(ee, new_group)
        prev = np.r_[np.int64(0), reach[:-1]] if len(reach) else reach
        start = np.where(new_group, ss, np.maximum(ss, prev))
        total = np.bincount(c, np.maximum(ee - start, 0), int(a[f"_b_{name}"].max()) + 1)
        present = np.unique(c)
        first = np.flatnonzero(new_group)  # the first row of each present code, in code order
        keys = items.select(pl.col(by).gather(pl.Series(rows[order][first], dtype=pl.Int64)))
        out.append(keys.with_columns(pl.lit(name).alias("by"),
                                     pl.Series("busy_ns", total[present].astype(np.int64))))
    return pl.concat([pl.DataFrame(schema=_BUSY_SCHEMA), *out], how="diagonal_relaxed").with_columns(
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
