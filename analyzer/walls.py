"""Wall attribution: where each step's wall time goes, from interval unions across all streams.

Per (rank, step) window, by priority (never summed kernel time):
  compute exposed       = ∪compute                        (recompute kernels excluded, see below)
  recompute exposed     = ∪recompute − ∪compute            → charged to the memory wall
  communication exposed = ∪comm − ∪(compute ∪ recompute)
  memory exposed        = ∪memory − ∪(compute ∪ recompute ∪ comm)  (+ recompute exposed)
  offload exposed       = ∪offload − ∪(compute ∪ recompute ∪ comm)  (a part of memory exposed;
                          also for the offload copies through pageable memory alone)
  host                  = window − ∪all GPU work            (the GPU is idle)
hidden = busy − exposed. Recompute (forward kernels re-run in backward) exists only to save
memory, so its time is a memory-wall cost; so are offload round trips (large host copies both ways,
`offload_round_trips`), pinned or pageable.

Host idle is split by cause, in this order: sync_blocked (a host thread is inside a blocking sync or
copy while the GPU idles), launch_starved (the launch call of the GPU op that ends the gap had not
returned yet), other.
"""

from __future__ import annotations

import sys
from typing import Any

import numpy as np
import polars as pl
from moetune.analyzer.classify import KernelClasses, load_classes, match_expr
from moetune.analyzer.frames import GPU_KINDS, corr_key, lookup, min_by_key, require
from moetune.analyzer.intervals import (
    END,
    LAYER,
    START,
    clip,
    disjoint,
    locate,
    sort_grouped,
    sweep,
    sweep_stacked,
    union,
)
from moetune.analyzer.recompute import rerun_regions

from moetune.vocabulary import WALLS

BY = ["rank", "step"]

SUM_TOLERANCE = 0.01


def _iv(df: pl.DataFrame) -> pl.DataFrame:
    return df.select("rank", pl.col("ts_ns").alias(START), (pl.col("ts_ns") + pl.col("dur_ns")).alias(END))


def recompute_ops(events: pl.DataFrame, *, classes: KernelClasses | None = None) -> pl.DataFrame:
    """The host ops recompute is read from (kernel_classes.yaml `recompute`), one row each: rank,
    tid, ts_ns, dur_ns and the flags `scope` (a checkpoint scope: `regions`), `backward` (a
    backward op that is no scope), `forward` (a forward-only op) and `in_backward` (a forward op
    that starts inside a backward op or scope of its thread: forward work re-run in backward)."""
    return _recompute_ops(events, classes or load_classes())


def _recompute_ops(events: pl.DataFrame, cl: KernelClasses) -> pl.DataFrame:
    host = events.lazy().filter(pl.col("kind").is_in(["cpu_op", "annotation"])).select(
        "rank", "tid", "name", "ts_ns", "dur_ns")
    # the patterns run on the distinct names, not on every host row
    names = host.select(pl.col("name").unique()).with_columns(
        (match_expr(cl.recompute_regions) if cl.recompute_regions else pl.lit(False)).alias("scope"),
        (match_expr(cl.backward_ops) if cl.backward_ops else pl.lit(False)).alias("_bwd_any"),
        (match_expr(cl.forward_ops) if cl.forward_ops else pl.lit(False)).alias("forward"),
    ).filter(pl.col("scope") | pl.col("_bwd_any") | pl.col("forward"))
    by = ["rank", "tid"]
    ops = host.join(names, on="name", how="inner").drop("name").sort(*by, "ts_ns").with_columns(
        (pl.col("_bwd_any") & ~pl.col("scope")).alias("backward")).collect().with_row_index("_i")
    inside = _starts_inside(ops.filter(pl.col("forward")), _iv_by(ops.filter(pl.col("_bwd_any")), by), by)
    return ops.with_columns(pl.col("_i").is_in(inside.get_column("_i").implode()).alias("in_backward")
                            ).drop("_i", "_bwd_any")


def _iv_by(df: pl.DataFrame, by: list[str]) -> pl.DataFrame:
    return df.select(*by, pl.col("ts_ns").alias(START), (pl.col("ts_ns") + pl.col("dur_ns")).alias(END))


def _starts_inside(points: pl.DataFrame, ranges: pl.DataFrame, by: list[str]) -> pl.DataFrame:
    """Rows of `points` whose ts_ns lies inside the union of `ranges` (START/END) of their `by`."""
    if points.height == 0 or ranges.height == 0:
        return points.clear()
    return (
        points.sort("ts_ns")
        .join_asof(union(ranges, by=by).sort(START), left_on="ts_ns", right_on=START, by=by,
                   strategy="backward", check_sortedness=False)
        .filter(pl.col(END).is_not_null() & (pl.col("ts_ns") < pl.col(END)))
        .drop(START, END)
    )


def recompute_launches(events: pl.DataFrame, *, classes: KernelClasses | None = None,
                       ops: pl.DataFrame | None = None) -> pl.DataFrame:
    """(rank, correlation) of launches that re-run forward work inside a recompute region.

    Regions are checkpoint scopes (`CheckpointFunctionBackward`, `recompute`, …) and, for
    non-reentrant checkpointing, each backward node that re-runs forward-only ops, from its start
    to the re-run's end (`moetune.analyzer.recompute`), see `recompute_ops` (`ops`, when the
    caller has them). Launches under a backward op that itself starts inside a region, after it
    began, are the checkpoint's own backward pass, not recompute.
    """
    out_schema = {"rank": pl.Int32, "correlation": pl.Int64}
    cl = classes or load_classes()
    ops = ops if ops is not None else recompute_ops(events, classes=cl)
    by = ["rank", "tid"]
    reg_iv = _iv_by(ops.filter(pl.col("scope") | pl.col("in_backward")), by)
    if reg_iv.height == 0:
        return pl.DataFrame(schema=out_schema)
    # a node that re-runs the forward: from its start to the re-run's end (analyzer/recompute.py)
    reg_iv = pl.concat([reg_iv, rerun_regions(events, ops, cl).select(reg_iv.columns)
                        .cast(reg_iv.schema)])
    reg_u = union(reg_iv, by=by)
    bwd = _iv_by(ops.filter(pl.col("backward")), by)
    # only backward ops that start inside a region, after it began (the region's own backward),
    # not enclosing ones nor the node a re-run region starts with
    bwd_in = (
        bwd.sort(START)
        .join_asof(
            reg_u.rename({START: "r_start", END: "r_end"}).sort("r_start"),
            left_on=START, right_on="r_start", by=by, strategy="backward", check_sortedness=False,
        )
        .filter(pl.col("r_end").is_not_null() & (pl.col(START) < pl.col("r_end"))
                & (pl.col(START) > pl.col("r_start")))
        .select(*by, START, END)
    )
    seg = sweep({"reg": reg_iv, "bwd": bwd_in}, by=by)
    fwd_time = union(seg.filter(pl.col("reg") & ~pl.col("bwd")).select(*by, START, END), by=by)
    launches = events.lazy().filter(
        (pl.col("kind") == "runtime") & pl.col("correlation").is_not_null()
    ).select(*by, "correlation", "ts_ns").collect()
    hit = (
        launches.sort("ts_ns")
        .join_asof(
            fwd_time.sort(START), left_on="ts_ns", right_on=START, by=by, strategy="backward",
            check_sortedness=False,
        )
        .filter(pl.col(END).is_not_null() & (pl.col("ts_ns") < pl.col(END)))
    )
    return hit.select(pl.col("rank").cast(pl.Int32), pl.col("correlation").cast(pl.Int64)).unique()


def recompute_evidence(ops: pl.DataFrame, steps: pl.DataFrame) -> dict[str, int]:
    """Counts of `recompute_ops` starting in the analysed steps' host ranges: what the recompute
    verdict rests on. `forward_ops` (outside backward) shows the forward is visible by op names, so
    none of them in backward is evidence that no forward work re-ran there."""
    win = steps.select("rank", "step", "start_ns", "end_ns")
    o = locate(ops.with_row_index("_i"), win, on=["rank"], at="ts_ns", keep=["step"],
               start="start_ns", end="end_ns").unique("_i")  # once, were host ranges to overlap
    n = lambda e: int(o.select(e.sum()).item() or 0)  # noqa: E731
    return {
        "checkpoint_regions": n(pl.col("scope")),
        "backward_ops": n(pl.col("backward")),
        "forward_ops": n(pl.col("forward") & ~pl.col("in_backward")),
        "forward_ops_in_backward": n(pl.col("in_backward")),
    }


# Large host<->device copies (kernel_classes.yaml), through pinned or pageable host memory
OFFLOAD_CLASSES: tuple[str, ...] = ("memory.offload", "memory.pageable")


def offload_round_trips(gpu: pl.DataFrame) -> pl.DataFrame:
    """The rows of `gpu` (classified GPU rows) that are offload: large host copies of a rank that
    moves data both ways. One-way HtoD is input or weight loading, one-way DtoH a checkpoint or a
    log, not activations or optimizer state taken off the GPU and brought back."""
    off = gpu.filter(pl.col("kclass").is_in(OFFLOAD_CLASSES))
    both = off.group_by("rank").agg(pl.col("copy_kind").n_unique().alias("_k")).filter(pl.col("_k") >= 2)
    return off.join(both.select("rank"), on="rank", how="semi")


def gpu_layers(events: pl.DataFrame, recompute: pl.DataFrame) -> dict[str, pl.DataFrame]:
    """Per-rank GPU intervals by wall; compute kernels launched for recompute go to `rc`, offload
    round trips (a part of the memory wall's copies) also to `off`."""
    require(events, ("kind", "wall", "kclass", "copy_kind", "correlation"), what="classified events")
    gpu = events.select("rank", "correlation", "kind", "wall", "kclass", "copy_kind", "ts_ns",
                        "dur_ns").filter(pl.col("kind").is_in(GPU_KINDS) & (pl.col("dur_ns") > 0))
    if recompute.height:
        rc = recompute.with_columns(pl.lit(True).alias("_rc"))
        gpu = gpu.join(rc, on=["rank", "correlation"], how="left").with_columns(
            (pl.col("_rc").fill_null(False) & (pl.col("wall") == "compute")).alias("_rc")
        )
    else:
        gpu = gpu.with_columns(_rc=pl.lit(False))
    w = pl.col("wall")
    return {
        "c": _iv(gpu.filter((w == "compute") & ~pl.col("_rc"))),
        "rc": _iv(gpu.filter(pl.col("_rc"))),
        "comm": _iv(gpu.filter(w == "communication")),
        "mem": _iv(gpu.filter(w == "memory")),
        "off": _iv(off := offload_round_trips(gpu)),
        "offpg": _iv(off.filter(pl.col("kclass") == "memory.pageable")),
    }


def recompute_as_memory(events: pl.DataFrame, recompute: pl.DataFrame) -> pl.DataFrame:
    """`events` (classified) with the compute GPU ops launched for recompute (`recompute`:
    `recompute_launches`) on the memory wall, as `attribute_walls` charges them: for the
    analyses that read the `wall` column alone (the critical path, its gain ceilings)."""
    rc = recompute.select(pl.col("rank").cast(events.schema["rank"]),
                          pl.col("correlation").cast(events.schema["correlation"]),
                          _rc=pl.lit(True))
    hit = (events.select("rank", "correlation").join(rc, on=["rank", "correlation"], how="left",
                                                     maintain_order="left")
           .get_column("_rc").fill_null(False))
    moved = (hit & events.get_column("kind").is_in(list(GPU_KINDS))
             & (events.get_column("wall").cast(pl.String) == "compute"))
    wall = events.get_column("wall")
    return events.with_columns(
        pl.when(moved).then(pl.lit("memory")).otherwise(wall.cast(pl.String))
        .cast(wall.dtype).alias("wall"))


def host_layers(events: pl.DataFrame) -> dict[str, pl.DataFrame]:
    """Per-rank host causes of GPU idleness: blocking sync/copy calls, launch-starved gaps."""
    require(events, ("kind", "rclass", "blocking"), what="classified events")
    return {"sync": sync_layer(events), "starved": starved_layer(events)}


def sync_layer(events: pl.DataFrame) -> pl.DataFrame:
    """Per-rank intervals of blocking host calls (classified events)."""
    return _iv(events.filter(pl.col("blocking") & (pl.col("dur_ns") > 0)))


def starved_layer(events: pl.DataFrame) -> pl.DataFrame:
    """Per-rank launch-starved gaps: GPU idle until the launch call of the op that ends the gap
    returned. Kinds and times only, no class: it can be built while the events are classified."""
    gpu = events.lazy().filter(pl.col("kind").is_in(GPU_KINDS) & (pl.col("dur_ns") > 0)).select(
        "rank", "correlation", pl.col("ts_ns").alias(START),
        (pl.col("ts_ns") + pl.col("dur_ns")).alias(END)).collect()
    # One pass in (rank, start) order finds the GPU idle gaps and the op(s) that end each: a gap
    # ends where an op starts past every earlier end of its rank (ops tied at that start end it
    # too); gap_start = that running max. The first run of a rank has no gap before it.
    d = sort_grouped(gpu, ["rank"], START)
    reach = pl.col(END).cum_max().shift(1).over("rank")
    d = d.with_columns(_reach=reach).with_columns(
        _run=pl.when(pl.col(START) > pl.col("_reach")).then(pl.col(START)),
        gap_start=pl.when(pl.col(START) > pl.col("_reach")).then(pl.col("_reach")),
    ).with_columns(pl.col("_run", "gap_start").forward_fill().over("rank"))
    ops = d.filter(pl.col(START) == pl.col("_run")).select("rank", "correlation", START, "gap_start")
    # when their launch call returned (only ops that end a gap are looked up)
    calls = events.lazy().filter(
        (pl.col("kind") == "runtime") & pl.col("correlation").is_not_null()
    ).select("rank", "correlation", "ts_ns", "dur_ns").collect()
    key = corr_key(calls, ops)
    return _starved_joined(calls, ops) if key is None else _starved_searched(calls, ops, key)


def _starved_searched(calls: pl.DataFrame, ops: pl.DataFrame, key: pl.Expr) -> pl.DataFrame:
    """`_starved_joined` for packed (rank, correlation) keys, in O(n log n) without hash joins or
    a group-by per gap: the launch ends sorted by key and looked up by binary search, the ops
    kept in their (rank, start) order (on a 1 GB nsys export, 5.7 M gap-ending ops: 8 s → 1 s)."""
    keys, ends = min_by_key(calls, key, pl.col("ts_ns") + pl.col("dur_ns"))
    launch_end = lookup(keys, ends, ops.select(key).to_series())
    d = ops.with_columns(launch_end.alias("launch_end"))
    # ops tied at one start end the same gap (same gap_start): the earliest launch end decides
    first = (pl.col(START).ne_missing(pl.col(START).shift(1))
             | pl.col("rank").ne_missing(pl.col("rank").shift(1)))
    tie = d.select((~first).any()).item()
    if tie:
        d = d.with_columns(first.cum_sum().alias("_g").set_sorted()).group_by(
            "_g", maintain_order=True).agg(pl.col("rank", START, "gap_start").first(),
                                           pl.col("launch_end").min()).drop("_g")
    return d.filter(pl.col("launch_end") > pl.col("gap_start")).select(
        "rank",
        pl.col("gap_start").alias(START),
        pl.min_horizontal("launch_end", START).alias(END),
    )


def _starved_joined(calls: pl.DataFrame, ops: pl.DataFrame) -> pl.DataFrame:
    """Launch-starved gaps: from each gap's start to the earliest return of the launch call of an
    op that ends it (`ops`: rank, correlation, start, gap_start), when that is later."""
    on = ["rank", "correlation"]
    launches = (
        calls.join(ops.select(on), on=on, how="semi")
        .group_by(on)
        .agg((pl.col("ts_ns") + pl.col("dur_ns")).min().alias("launch_end"))
    )
    return (
        ops.join(launches, on=on, how="inner")
        .group_by(["rank", START])
        .agg(pl.col("launch_end").min(), pl.col("gap_start").first())
        .filter(pl.col("launch_end") > pl.col("gap_start"))
        .sort("rank", START)
        .select(
            "rank",
            pl.col("gap_start").alias(START),
            pl.min_horizontal("launch_end", START).alias(END),
        )
    )


def wall_layers(events: pl.DataFrame, *, recompute: pl.DataFrame | None = None,
                classes: KernelClasses | None = None) -> dict[str, pl.DataFrame]:
    """Every per-rank layer the attribution sweeps (GPU work by wall, host causes). They do not
    depend on the steps, so they can be built while the steps are found."""
    rc = recompute if recompute is not None else recompute_launches(events, classes=classes)
    return gpu_layers(events, rc) | host_layers(events)


def union_layers(layers: dict[str, pl.DataFrame]) -> tuple[list[str], pl.DataFrame]:
    """(layer names, their intervals unioned per rank): the part of `attribute_walls` that needs
    no steps, so that a caller can run it while the steps are found. All layers stacked (a
    `_layer` column, the name's index, keeps them apart) and unioned in one pass: each polars
    call has a fixed cost, and per-layer calls made up a third of a small trace's diagnosis."""
    stacked = pl.concat([
        v.select("rank", START, END, pl.lit(i, dtype=pl.UInt8).alias(LAYER))
        for i, v in enumerate(layers.values())
    ])
    return list(layers), union(stacked, by=["rank", LAYER])


def attribute_walls(
    events: pl.DataFrame,
    steps: pl.DataFrame,
    *,
    recompute: pl.DataFrame | None = None,
    layers: dict[str, pl.DataFrame] | None = None,
    unioned: tuple[list[str], pl.DataFrame] | None = None,
    counts: pl.DataFrame | None = None,
) -> pl.DataFrame:
    """One row per (rank, step): window and the ns of every wall component (see module doc).

    `events` must be classified (classify.classify); `steps` is Steps.table. What the caller has
    computed already: `layers`, `wall_layers(events, recompute=…)`; `unioned`, `union_layers` of
    them; `counts`, `step_counts(events, steps)`.
    """
    require(steps, ("rank", "step", "win_start_ns", "win_end_ns"), what="steps")
    if unioned is None:
        layers = layers if layers is not None else wall_layers(events, recompute=recompute)
        unioned = union_layers(layers)
    names, unioned_iv = unioned[0] + ["win"], unioned[1]
    del unioned
    win = steps.select("rank", "step", "win_start_ns", "win_end_ns")
    wid = win.with_columns(pl.struct(BY).rank("dense").cast(pl.Int64).alias("_wid"))
    c, r, m, k = pl.col("c"), pl.col("rc"), pl.col("comm"), pl.col("mem")
    off, offpg = pl.col("off"), pl.col("offpg")
    busy = c | r | m | k
    idle = pl.col("win") & ~busy
    parts: dict[str, pl.Expr] = {
        "compute_exposed_ns": c,
        "recompute_ns": r & ~c,
        "recompute_busy_ns": r,
        "comm_busy_ns": m,
        "comm_exposed_ns": m & ~c & ~r,
        "mem_busy_ns": k,
        "mem_copy_exposed_ns": k & ~c & ~r & ~m,
        "offload_busy_ns": off,
        "offload_exposed_ns": off & ~c & ~r & ~m,
        "offload_pageable_exposed_ns": offpg & ~c & ~r & ~m,
        "busy_ns": busy,
        "idle_ns": idle,
        "sync_blocked_ns": idle & pl.col("sync"),
        "launch_starved_ns": idle & ~pl.col("sync") & pl.col("starved"),
    }
    cover = _coverage(unioned_iv, wid, names=names)
    if cover is not None:  # (window, set of layers) → time: the parts are sums over a small table
        length = pl.col("len_ns")
        seg = cover
    else:
        length = pl.col(END) - pl.col(START)
        seg = _segments(unioned_iv, wid, names=names)
    del unioned_iv
    agg = seg.group_by("_wid").agg([(length * e.cast(pl.Int64)).sum().alias(n) for n, e in parts.items()])
    del seg
    agg = wid.select(*BY, "_wid").unique().join(agg, on="_wid", how="inner").drop("_wid")
    out = win.with_columns((pl.col("win_end_ns") - pl.col("win_start_ns")).alias("wall_ns")).join(
        agg, on=BY, how="left"
    )
    out = out.with_columns([pl.col(n).fill_null(0) for n in parts])
    out = out.with_columns(
        (pl.col("idle_ns") - pl.col("sync_blocked_ns") - pl.col("launch_starved_ns")).alias("other_idle_ns"),
        (pl.col("mem_copy_exposed_ns") + pl.col("recompute_ns")).alias("mem_exposed_ns"),
    )
    counts = counts if counts is not None else step_counts(events, steps)
    out = out.join(counts, on=BY, how="left").with_columns(
        pl.col("kernels").fill_null(0), pl.col("launches").fill_null(0)
    )
    check_sums(out)
    return out.sort(BY)


def _coverage(unioned: pl.DataFrame, wid: pl.DataFrame, *, names: list[str]) -> pl.DataFrame | None:
    """`_segments` summed: one row per window `_wid` and set of layers covering some of its time,
    with that time (`len_ns`) and one coverage flag per name (`win` always true); None when the
    windows overlap or the times do not pack (then `_segments`).

    Every boundary becomes one Int64 key that sorts like (rank, t) and carries its layer and
    whether it opens or closes (`_pack_points`): one sort of one column, no row gather. Each
    layer is a union per rank and the windows are disjoint, so at the last of the points at one
    instant the running sum of ±2**layer is exactly the set of layers covering the time up to the
    next point; summed by (window, set) that leaves a few thousand rows instead of one per
    elementary segment (14 M on a 1 GB nsys export, where `_segments` took 7 s and 2.5 GB)."""
    windows = wid.select("rank", pl.col("win_start_ns").alias(START), pl.col("win_end_ns").alias(END),
                         "_wid", pl.lit(len(names) - 1, dtype=pl.UInt8).alias(LAYER))
    if (windows.height == 0 or len(names) > 30 or (windows.height << len(names)) >= 1 << 62
            or not disjoint(wid, on=["rank"], start="win_start_ns", end="win_end_ns")):
        return None
    pts = pl.concat([unioned.select("rank", START, END, LAYER), windows.select("rank", START, END, LAYER)])
    packed = _pack_points(pts, n_layers=len(names))
    del pts
    if packed is None:
        return None
    key, lbits = packed
    key.sort()  # (rank, t) order; the points of one instant in any order
    win_layer = len(names) - 1
    # the low byte (a strided view: no int64 temporaries) holds layer · 2 + opens (lbits ≤ 7)
    tag_mask = (1 << (lbits + 1)) - 1
    low = key.view(np.uint8)[:: key.itemsize] if sys.byteorder == "little" else key.astype(np.uint8)
    low = low & np.uint8(tag_mask)
    key &= ~np.int64(tag_mask)  # (rank, t) left: within a rank, differences are times
    span = np.diff(key)
    del key
    span >>= lbits + 1
    opens = (low & 1).astype(bool)
    low >>= 1  # the layer
    # each window opens once: counting the openings numbers them in (rank, start) order
    ordinal = np.cumsum(opens & (low == win_layer), dtype=np.int32)
    step = np.left_shift(np.int32(1), low, dtype=np.int32)
    del low
    np.negative(step, out=step, where=~opens)
    del opens
    state = np.cumsum(step, out=step)  # the layers covering the time after each point, as bits
    state, ordinal = state[:-1], ordinal[:-1]
    # the last point of a rank closes all of its intervals: its span into the next rank is empty
    win_bit = 1 << win_layer
    keep = (span > 0) & ((state & win_bit) != 0)
    code = (ordinal[keep].astype(np.int64) - 1) * (win_bit << 1) + state[keep]
    span = span[keep]
    del state, ordinal, keep
    totals = pl.DataFrame({"_code": code, "len_ns": span}).group_by("_code").agg(pl.col("len_ns").sum())
    del code, span
    ords = windows.sort("rank", START).select(pl.int_range(pl.len(), dtype=pl.Int64).alias("_o"), "_wid")
    bits = pl.col("_code") % (win_bit << 1)
    return totals.with_columns(pl.col("_code").floordiv(win_bit << 1).alias("_o")).join(
        ords, on="_o", how="inner").select(
        "_wid", "len_ns", *[((bits.floordiv(1 << i) % 2) == 1).alias(n) for i, n in enumerate(names)])


def _pack_points(pts: pl.DataFrame, *, n_layers: int) -> tuple[np.ndarray, int] | None:
    """One Int64 per interval boundary, ((rank − min) · 2**tbits + (t − tmin)) · 2**(lbits+1) +
    layer · 2 + (1 opening, 0 closing), as a numpy array (starts, then ends); None when that does
    not fit in 63 bits or a value is missing. Also returns lbits."""
    b = pts.select(pl.col("rank").min().alias("r0"), pl.col("rank").max().alias("r1"),
                   pl.col(START).min().alias("t0"), pl.col(END).max().alias("t1"),
                   pl.sum_horizontal(pl.all().null_count()).alias("nulls"),
                   (pl.col(END) <= pl.col(START)).any().alias("empty")).row(0, named=True)
    if b["nulls"] or b["empty"] or b["r0"] is None:
        return None
    t0, t1 = b["t0"], b["t1"]
    lbits = max(1, (n_layers - 1).bit_length())  # ≤ 5: n_layers ≤ 30
    tbits = (t1 - t0).bit_length()
    rbits = (b["r1"] - b["r0"]).bit_length()
    if rbits + tbits + lbits + 1 > 62:
        return None
    hi = (pl.col("rank").cast(pl.Int64) - b["r0"]) * (1 << tbits)
    tag = pl.col(LAYER).cast(pl.Int64) * 2
    keys = pts.select(
        ((hi + (pl.col(START) - t0)) * (1 << (lbits + 1)) + tag + 1).alias("s"),
        ((hi + (pl.col(END) - t0)) * (1 << (lbits + 1)) + tag).alias("e"),
    )
    out = np.concatenate([keys.get_column("s").to_numpy(), keys.get_column("e").to_numpy()])
    return out, lbits


def _segments(unioned: pl.DataFrame, wid: pl.DataFrame, *, names: list[str]) -> pl.DataFrame:
    """Elementary segments inside the step windows, with their window `_wid` and one coverage
    flag per name (the last name, `win`, is the window layer). `unioned`: rank, start, end and
    `_layer` (index into `names`), a union per (rank, layer); `wid`: the windows and `_wid`."""
    windows = wid.select("rank", pl.col("win_start_ns").alias(START), pl.col("win_end_ns").alias(END),
                         "_wid", pl.lit(len(names) - 1, dtype=pl.UInt8).alias(LAYER))
    if disjoint(wid, on=["rank"], start="win_start_ns", end="win_end_ns"):
        # One sweep per rank over the layers and the windows (touching windows stay two layer
        # intervals, so every window boundary is a segment boundary); a segment inside a window
        # belongs to the one that starts last at or before it.
        seg = sweep_stacked(pl.concat([unioned, windows.select(unioned.columns)]), names=names,
                            by=["rank"])
        return seg.filter(pl.col("win")).sort(START).join_asof(
            windows.select("rank", pl.col(START).alias("_ws"), "_wid").sort("_ws"),
            left_on=START, right_on="_ws", by="rank", strategy="backward", check_sortedness=False,
        )
    # Overlapping windows: each layer cut to each window it meets, then swept per window.
    pieces = clip(unioned, wid, on=["rank"], window_cols=["_wid"]).drop("rank")
    seg = sweep_stacked(pl.concat([pieces, windows.drop("rank").select(pieces.columns)]),
                        names=names, by=["_wid"])
    return seg.filter(pl.col("win"))


def step_counts(events: pl.DataFrame, steps: pl.DataFrame) -> pl.DataFrame:
    """Kernels starting in each window, launch calls in each host step, median kernel duration."""
    win = steps.select("rank", "step", "win_start_ns", "win_end_ns", "start_ns", "end_ns")
    kern = events.lazy().filter(pl.col("kind") == "kernel").select("rank", "ts_ns", "dur_ns").collect()
    k = (
        locate(kern, win, on=["rank"], at="ts_ns", keep=["step"])
        .group_by(BY)
        .agg(pl.len().alias("kernels"), pl.col("dur_ns").median().alias("median_kernel_ns"))
    )
    calls = events.lazy().filter(pl.col("rclass").is_in(["launch", "graph_launch"])).select(
        "rank", "ts_ns").collect()
    la = (
        locate(calls, win, on=["rank"], at="ts_ns", keep=["step"],
               start="start_ns", end="end_ns")
        .group_by(BY)
        .agg(pl.len().alias("launches"))
    )
    return win.select(BY).join(k, on=BY, how="left").join(la, on=BY, how="left")


def fractions(row: dict[str, Any]) -> dict[str, float]:
    """Wall fractions of one per-step row (exposed times / window)."""
    w = row["wall_ns"] or 0
    if w <= 0:
        return dict.fromkeys(WALLS, 0.0)
    return {
        "compute": (row["compute_exposed_ns"]) / w,
        "communication": row["comm_exposed_ns"] / w,
        "memory": row["mem_exposed_ns"] / w,
        "host": row["idle_ns"] / w,
    }


def check_sums(per_step: pl.DataFrame) -> None:
    """Exposed components must tile each window: a violation is a bug, not bad input."""
    s = per_step.select(
        (
            pl.col("compute_exposed_ns") + pl.col("comm_exposed_ns") + pl.col("mem_exposed_ns") + pl.col("idle_ns")
        ).alias("s"),
        "wall_ns",
    )
    bad = s.filter(
        (pl.col("wall_ns") > 0) & ((pl.col("s") / pl.col("wall_ns") - 1).abs() > SUM_TOLERANCE)
    )
    assert bad.height == 0, f"wall fractions do not sum to 1: {bad.head(3).to_dicts()}"


def median_step(per_step: pl.DataFrame) -> pl.DataFrame:
    """Per rank, the step whose wall time is the median (lower median for an even count), so the
    reported decomposition is one real step's and its fractions sum to 1 exactly."""
    ranked = per_step.sort(["rank", "wall_ns", "step"]).with_columns(
        pl.int_range(pl.len()).over("rank").alias("_i"), pl.len().over("rank").alias("_n")
    )
    return ranked.filter(pl.col("_i") == (pl.col("_n") - 1) // 2).drop("_i", "_n").sort("rank")
