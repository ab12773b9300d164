"""Wall attribution: hand-computed cases, recompute, properties, and the HTA / TraceLens oracles."""

from __future__ import annotations

import polars as pl
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from moetune.analyzer.classify import classify
from moetune.analyzer.intervals import total_ns
from moetune.analyzer.steps import find_steps
from moetune.analyzer.walls import attribute_walls, fractions, median_step, recompute_launches

from tests.diagnose_synthetic import GEMM, NCCL, ev, frame, launch, three_steps


def walls_of(rows):
    events = classify(frame(rows))
    steps = find_steps(events)
    return attribute_walls(events, steps.table), events


def test_hand_computed_three_steps() -> None:
    ps, _ = walls_of(three_steps())
    s1, s2 = ps.to_dicts()
    assert (s1["step"], s1["win_start_ns"], s1["wall_ns"]) == (1, 100, 1000)
    assert s1["compute_exposed_ns"] == 300
    assert (s1["comm_busy_ns"], s1["comm_exposed_ns"]) == (300, 200)
    assert (s1["mem_busy_ns"], s1["mem_exposed_ns"]) == (100, 50)
    assert s1["idle_ns"] == 450
    assert (s1["launch_starved_ns"], s1["sync_blocked_ns"], s1["other_idle_ns"]) == (260, 100, 90)
    assert fractions(s1) == {"compute": 0.3, "communication": 0.2, "memory": 0.05, "host": 0.45}
    assert (s2["step"], s2["wall_ns"], s2["compute_exposed_ns"], s2["idle_ns"]) == (2, 1000, 100, 900)
    assert (s2["launch_starved_ns"], s2["other_idle_ns"]) == (820, 80)
    # equal walls: the lower median by (wall, step) is step 1
    assert median_step(ps)["step"].to_list() == [1]


def recompute_rows():
    rows = three_steps()
    rows += [
        ev("cpu_op", "autograd::engine::evaluate_function: CheckpointFunctionBackward", 1300, 300, tid=2),
        launch(10, 1310, tid=2),
        ev("kernel", GEMM, 1400, 50, correlation=10),  # forward re-run: recompute
        ev("cpu_op", "autograd::engine::evaluate_function: MmBackward0", 1500, 90, tid=2),
        launch(11, 1510, tid=2),
        ev("kernel", GEMM, 1600, 50, correlation=11),  # the checkpoint's own backward
    ]
    return rows


def test_recompute_moves_exposed_time_to_memory() -> None:
    events = classify(frame(recompute_rows()))
    rc = recompute_launches(events)
    assert rc["correlation"].to_list() == [10]
    ps = attribute_walls(events, find_steps(events).table, recompute=rc)
    s2 = ps.filter(pl.col("step") == 2).row(0, named=True)
    assert (s2["compute_exposed_ns"], s2["recompute_ns"], s2["mem_exposed_ns"]) == (150, 50, 50)
    assert sum(fractions(s2).values()) == pytest.approx(1.0)


def offload_rows(dtoh: str, htod: str | None) -> list:
    """Step 1 [0, 1000): GEMM [100, 300); 2 MiB DtoH [250, 450) (50 under the GEMM); a 4-byte
    DtoH [500, 510) (a `.item()`); 2 MiB HtoD [600, 700) when `htod`. Step 2 anchors the window."""
    mib2 = 2 << 20
    rows = [ev("annotation", "ProfilerStep#1", 0, 1000), ev("annotation", "ProfilerStep#2", 1000, 1000),
            launch(1, 10), ev("kernel", GEMM, 100, 200, correlation=1),
            launch(2, 200, name="cudaMemcpyAsync"),
            ev("memcpy", f"Memcpy DtoH ({dtoh})", 250, 200, correlation=2, copy_kind="DtoH", bytes=mib2),
            launch(3, 480, name="cudaMemcpyAsync"),
            ev("memcpy", "Memcpy DtoH (Device -> Pageable)", 500, 10, correlation=3, copy_kind="DtoH", bytes=4),
            launch(5, 1010), ev("kernel", GEMM, 1100, 100, correlation=5)]
    if htod:
        rows += [launch(4, 590, name="cudaMemcpyAsync"),
                 ev("memcpy", f"Memcpy HtoD ({htod})", 600, 100, correlation=4, copy_kind="HtoD", bytes=mib2)]
    return rows


@pytest.mark.parametrize(("dtoh", "htod", "offload", "pageable"), [
    ("Device -> Pageable", "Pageable -> Device", 250, 250),  # a round trip through pageable memory
    ("Device -> Pinned", "Pinned -> Device", 250, 0),
    ("Device -> Pinned", "Pageable -> Device", 250, 100),
    ("Device -> Pageable", None, 0, 0),                     # one way: a checkpoint or a log, not offload
])
def test_offload_round_trips_are_memory_cost(dtoh, htod, offload, pageable) -> None:
    ps, _ = walls_of(offload_rows(dtoh, htod))
    s1 = ps.filter(pl.col("step") == 1).row(0, named=True)
    # exposed: the copies outside the GEMM (150 of the DtoH, all 100 of the HtoD)
    assert (s1["offload_exposed_ns"], s1["offload_pageable_exposed_ns"]) == (offload, pageable)
    assert s1["mem_copy_exposed_ns"] == 150 + 10 + (100 if htod else 0)
    assert s1["offload_busy_ns"] == (300 if offload else 0)


KINDS = [("kernel", GEMM, None), ("kernel", NCCL, None), ("memcpy", "Memcpy HtoD (Pinned -> Device)", "HtoD")]
gpu_ops = st.lists(
    st.tuples(st.integers(0, 2), st.integers(0, 3000), st.integers(1, 400), st.sampled_from([7, 20, 21])),
    min_size=1,
    max_size=30,
)


def random_rows(ops, shift=0):
    rows = [ev("annotation", f"ProfilerStep#{i}", shift + 1000 * i, 1000) for i in range(4)]
    for corr, (k, ts, dur, stream) in enumerate(ops, start=1):
        kind, name, ck = KINDS[k]
        rows.append(launch(corr, shift + max(0, ts - 50)))
        rows.append(ev(kind, name, shift + ts, dur, correlation=corr, stream=stream, copy_kind=ck, bytes=64))
    rows.append(launch(10_000, shift + 3500))
    rows.append(ev("kernel", GEMM, shift + 3600, 10, correlation=10_000))  # anchors step 3
    return rows


@settings(max_examples=40, deadline=None)
@given(gpu_ops, st.integers(0, 10**12), st.randoms(use_true_random=False))
def test_wall_properties(ops, shift, rnd) -> None:
    rows = random_rows(ops)
    ps, events = walls_of(rows)
    for r in ps.to_dicts():
        f = fractions(r)
        assert sum(f.values()) == pytest.approx(1.0, abs=0.01)
        assert r["comm_exposed_ns"] <= r["comm_busy_ns"]
        assert r["mem_copy_exposed_ns"] <= r["mem_busy_ns"]
        assert r["busy_ns"] + r["idle_ns"] == r["wall_ns"]
        assert r["sync_blocked_ns"] + r["launch_starved_ns"] + r["other_idle_ns"] == r["idle_ns"]
    # union never exceeds summed kernel time
    gpu = events.filter(pl.col("wall").is_not_null())
    busy = total_ns(gpu.select(pl.col("ts_ns").alias("start_ns"), (pl.col("ts_ns") + pl.col("dur_ns")).alias("end_ns")))
    assert busy <= gpu["dur_ns"].sum()
    # invariant under event shuffle and time shift
    cols = ["step", "wall_ns", "compute_exposed_ns", "comm_exposed_ns", "mem_exposed_ns", "idle_ns", "launch_starved_ns"]
    shuffled = rows[:]
    rnd.shuffle(shuffled)
    assert walls_of(shuffled)[0].select(cols).rows() == ps.select(cols).rows()
    assert walls_of(random_rows(ops, shift))[0].select(cols).rows() == ps.select(cols).rows()


@settings(max_examples=30, deadline=None)
@given(gpu_ops)
def test_overlapping_window_path_agrees_with_the_per_rank_sweep(ops) -> None:
    """Disjoint windows take one sweep per rank; the per-window path (for overlapping ones)
    must give the same rows on them."""
    import moetune.analyzer.walls as walls

    events = classify(frame(random_rows(ops)))
    table = find_steps(events).table
    fast = attribute_walls(events, table)
    saved, walls.disjoint = walls.disjoint, lambda *a, **k: False
    try:
        slow = attribute_walls(events, table)
    finally:
        walls.disjoint = saved
    assert slow.equals(fast)


def test_overlapping_windows_each_get_their_share() -> None:
    events = classify(frame([launch(1, 30), ev("kernel", GEMM, 40, 20, correlation=1)]))
    table = pl.DataFrame({"rank": [0, 0], "step": [1, 2], "win_start_ns": [0, 50], "win_end_ns": [100, 150]},
                         schema={"rank": pl.Int32, "step": pl.Int64, "win_start_ns": pl.Int64,
                                 "win_end_ns": pl.Int64})
    table = table.with_columns(start_ns=pl.col("win_start_ns"), end_ns=pl.col("win_end_ns"))
    ps = attribute_walls(events, table)
    assert ps.select("step", "compute_exposed_ns", "idle_ns").rows() == [(1, 20, 80), (2, 10, 90)]


# --- oracles on real traces -------------------------------------------------------------------


def _hta_window_breakdown(path):
    """HTA temporal breakdown recomputed with our classes and unions on HTA's own event set:
    GPU events correlated to CPU events that start before the last ProfilerStep, µs-rounded like
    HTA does for ns-precision traces (start ceil, end floor)."""
    from moetune.analyzer.readers import load_trace

    ev_ = classify(load_trace([path]).events)
    last = ev_.filter((pl.col("kind") == "annotation") & pl.col("name").str.starts_with("ProfilerStep#"))["ts_ns"].max()
    corr = ev_.filter(pl.col("kind").cast(pl.String).is_in(["runtime", "cpu_op", "annotation"]) & (pl.col("ts_ns") < last))["correlation"].drop_nulls().unique()
    g = ev_.filter(pl.col("wall").is_not_null() & pl.col("correlation").is_in(corr.implode()))
    g = g.select(
        ((pl.col("ts_ns") + 999) // 1000 * 1000).alias("start_ns"),
        ((pl.col("ts_ns") + pl.col("dur_ns")) // 1000 * 1000).alias("end_ns"),
        "wall",
    )
    span = g["end_ns"].max() - g["start_ns"].min()
    busy = total_ns(g.select("start_ns", "end_ns"))
    comp = total_ns(g.filter(pl.col("wall") == "compute").select("start_ns", "end_ns"))
    return span // 1000, (span - busy) // 1000, comp // 1000, (busy - comp) // 1000


HTA_ORACLES = {
    # HTA's get_temporal_breakdown() on these files (µs): kernel_time, idle, compute, non-compute
    "hta_a100_2rank_nccl": (435_586, 338_781, 75_169, 21_636),
    "hta_a100_alltoall_rank3of8": (383_404, 62_119, 234_760, 86_525),
    "hta_sampled_rank0": (600_058, 321_378, 106_252, 172_428),
    "hta_v100_ddp_allreduce_rank1": (1_396_669, 643_612, 496_485, 256_572),
}


@pytest.mark.parametrize("name", sorted(HTA_ORACLES))
def test_hta_temporal_breakdown_oracles(corpus, name) -> None:
    # Same event set and rounding as HTA, our classes and unions → HTA's numbers exactly: union
    # compute = HTA compute, comm+copies = HTA non-compute (NCCL-only traces, where our comm classes
    # and HTA's agree).
    assert _hta_window_breakdown(corpus / f"public/kineto/{name}.json.gz") == HTA_ORACLES[name]


def test_a100_2rank_nccl_steps_vs_hta(corpus) -> None:
    # HTA drops the last ProfilerStep (6, whole here, which we analyse): our windows over HTA's
    # steps (--window 4:5, GPU-tiled) give compute 76,935 µs vs HTA's 75,169: the 2.3 % residual
    # is HTA's µs rounding (start ceil, end floor) of 2,700 short ns-precision kernels, and idle
    # differs because our steps end at step 6's first GPU op, HTA at step 5's last.
    from moetune.analyzer.readers import load_trace

    events = classify(load_trace([corpus / "public/kineto/hta_a100_2rank_nccl.json.gz"]).events)
    ps = attribute_walls(events, find_steps(events, window="4:5").table)
    assert ps["step"].to_list() == [4, 5]
    comp_us = ps["compute_exposed_ns"].sum() / 1000
    assert comp_us == pytest.approx(75_169, rel=0.03)
    assert ps["idle_ns"].sum() / 1000 == pytest.approx(338_781, rel=0.02)


def test_tracelens_oracle_qwen(corpus) -> None:
    # TraceLens gpu_timeline.csv for ProfilerStep#6: total 34.892 ms, busy 31.905, idle 2.987.
    # TraceLens splits busy into computation 31.903 + exposed memcpy 0.002; we count the 168
    # memsets (0.143 ms) as memory, so our compute is 31.760 and memory 0.145 (same busy total).
    from moetune.analyzer.readers import load_trace

    events = classify(load_trace([corpus / "public/kineto/tracelens_h100_qwen05b_inference.json.gz"]).events)
    r = attribute_walls(events, find_steps(events).table).row(0, named=True)
    assert r["wall_ns"] == 34_892_421
    assert round(r["busy_ns"] / 1e6, 3) == 31.905
    assert round(r["idle_ns"] / 1e6, 3) == 2.987
    assert round((r["compute_exposed_ns"] + r["mem_exposed_ns"]) / 1e6, 3) == 31.905
    assert r["comm_busy_ns"] == 0
