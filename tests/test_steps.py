"""Step detection, incomplete-step dropping, GPU windows, --window and --step-range."""

from __future__ import annotations

import polars as pl
import pytest
from moetune.analyzer.classify import classify
from moetune.analyzer.steps import assign_steps, find_steps, parse_window

from moetune.errors import UserError
from tests.diagnose_synthetic import GEMM, ev, frame, launch, three_steps


def test_profiler_steps_drop_last_and_tile_gpu_windows() -> None:
    st = find_steps(frame(three_steps()))
    assert (st.source, st.found, st.dropped) == ("profiler_step", [1, 2, 3], [3])
    assert st.table.select("step", "win_start_ns", "win_end_ns").rows() == [(1, 100, 1100), (2, 1100, 2100)]


def test_gpu_events_inherit_launch_step() -> None:
    rows = three_steps()
    # launched in step 1 but runs after step 2 began on the host: still step 1
    rows += [launch(50, 900), ev("kernel", GEMM, 1050, 10, correlation=50)]
    g = assign_steps(frame(rows), find_steps(frame(rows)).table)
    assert g.filter(pl.col("correlation") == 50)["step"].to_list() == [1]


def test_window_and_errors() -> None:
    rows = three_steps()
    assert find_steps(frame(rows), window="2:2").ids == [2]
    assert find_steps(frame(rows), window="2").ids == [2]
    with pytest.raises(UserError, match="selects no complete step"):
        find_steps(frame(rows), window="5:9", source_file="t.json")
    with pytest.raises(UserError, match="A:B"):
        parse_window("x")
    assert parse_window("3:") == (3, 2**62)


def test_step_range_and_iteration_annotations() -> None:
    rows = [r for r in three_steps() if not r["name"].startswith("ProfilerStep")]
    named = rows + [ev("annotation", f"train_iter {i}", 1000 * (i - 1), 1000) for i in (1, 2, 3)]
    st = find_steps(frame(named), step_range="train_iter")
    assert (st.source, st.ids, st.dropped) == ("annotation", [1, 2, 3], [])
    megatron = rows + [ev("annotation", f"iteration {i}", 1000 * (i - 1), 1000) for i in (1, 2, 3)]
    st2 = find_steps(frame(megatron))
    assert (st2.source, st2.ids) == ("annotation", [1, 2, 3])
    with pytest.raises(UserError, match="no annotation named"):
        find_steps(frame(rows), step_range="nope")


def test_gpu_idle_boundaries() -> None:
    # 4 repetitions of 20 back-to-back 10-unit kernels separated by 5,000,000 ns idle gaps
    rows = []
    c = 0
    for rep in range(4):
        base = rep * 6_000_000
        for k in range(20):
            c += 1
            rows += [launch(c, base + 15 * k), ev("kernel", GEMM, base + 15 * k + 5, 10, correlation=c)]
    st = find_steps(frame(rows))
    assert st.source == "gpu_idle"
    assert st.ids == [0, 1, 2, 3]
    assert st.table["win_start_ns"].to_list()[:2] == [5, 6_000_005]


def test_no_gpu_work_is_a_user_error() -> None:
    rows = [ev("annotation", "ProfilerStep#1", 0, 10), ev("cpu_op", "aten::add", 1, 2)]
    with pytest.raises(UserError, match="no complete training step"):
        find_steps(frame(rows), source_file="cpu.json")


def test_corpus_steps(corpus) -> None:
    from moetune.analyzer.readers import load_trace

    a100 = find_steps(classify(load_trace([corpus / "public/kineto/hta_a100_2rank_nccl.json.gz"]).events))
    # every ProfilerStep is whole (1,258 GPU rows each): none is dropped
    assert (a100.found, a100.dropped, a100.ids) == ([4, 5, 6], [], [4, 5, 6])
    qwen = find_steps(load_trace([corpus / "public/kineto/tracelens_h100_qwen05b_inference.json.gz"]).events)
    # one step: its window is the GPU-side ProfilerStep#6 annotation, 34,892.421 µs (TraceLens total)
    w = qwen.table.row(0, named=True)
    assert (qwen.ids, w["win_end_ns"] - w["win_start_ns"]) == ([6], 34_892_421)
    made = corpus / "made/h200_moe_eager_loop.nsys.sqlite.gz"
    if made.exists():
        nv = find_steps(load_trace([made]).events)
        assert (nv.source, nv.ids) == ("annotation", list(range(8)))


MLM_TWO_STEPS = "fixtures/traces/mlm_host_mbs8_rcnone/trace.json.gz"


def test_megatron_lm_schedule_keeps_every_profiled_step() -> None:
    """Megatron-LM's profiler schedule (`--profile-step-start 10 --profile-step-end 12`) saves the
    trace at the top of iteration 12: both ProfilerSteps are whole and both are analysed."""
    from moetune.analyzer.readers import load_trace

    st = find_steps(classify(load_trace([MLM_TWO_STEPS]).events))
    assert (st.found, st.dropped, st.ids) == ([10, 11], [], [10, 11])
    assert not any("dropped" in w for w in st.warnings)


def test_a_last_step_the_window_cut_is_dropped() -> None:
    """The same real trace with the profiler stopped half-way through step 11: its GPU rows after
    the middle of its host range are gone (never recorded), so the step is dropped and said so."""
    from moetune.analyzer.readers import load_trace

    events = classify(load_trace([MLM_TWO_STEPS]).events)
    s11 = events.filter(pl.col("name") == "ProfilerStep#11").row(0, named=True)
    cut_at = s11["ts_ns"] + s11["dur_ns"] // 3
    gpu = pl.col("kind").is_in(["kernel", "memcpy", "memset"])
    st = find_steps(events.filter(~(gpu & (pl.col("ts_ns") > cut_at))))
    assert (st.found, st.dropped, st.ids) == ([10, 11], [11], [10])
    assert any(w.startswith("dropped incomplete step(s) 11 (the profiler window cut") for w in st.warnings)
