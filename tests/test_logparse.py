"""executor/logparse.py on Megatron-format logs: prefixes, interleaving, wraps, cut lines."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
from moetune.executor.logparse import iteration_args, parse_file, parse_text, split_prefix, steady
from moetune.executor.workloads import megatron_log as mlog

LOGS = Path(__file__).resolve().parents[1] / "fixtures" / "logs"


def test_torchrun_log_iterations_memory_validation_args() -> None:
    p = parse_file(LOGS / "megatron_lm_torchrun_moe.log")
    it = p.iterations
    assert it.get_column("iteration").to_list() == [1, 5, 10, 15, 20, 25, 30]
    assert set(it.get_column("rank").to_list()) == {7}  # the last rank prints (print_rank_last)
    assert it.get_column("complete").all()
    row15 = it.filter(it["iteration"] == 15).row(0, named=True)  # hard-wrapped over 3 lines
    assert row15["elapsed_ms"] == 1648.9 and row15["lm_loss"] == 7.91
    assert row15["nan_iterations"] == 0 and row15["grad_norm"] == pytest.approx(0.605)
    assert row15["other"] == "expert_token_balance=1.02"  # MoE metric kept, not lost
    assert it.row(0, named=True)["load_balancing_loss"] == pytest.approx(1.0213)
    mem = p.memory
    assert mem.height == 2
    assert mem.row(0, named=True)["allocated_mb"] == pytest.approx(61234.47998046875)  # old float
    assert mem.row(1, named=True)["max_allocated_mb"] == pytest.approx(70555.10)
    assert p.validation.rows() == [("iteration 10", "validation", "lm loss", 8.812345, 6710.123)]
    assert p.args["num_experts"] == 128 and p.args["moe_router_topk"] == 8
    assert p.completed and p.failure is None


def test_bridge_gb_memory_and_cut_last_line() -> None:
    p = parse_file(LOGS / "megatron_bridge_srun_killed.log")
    it = p.iterations
    assert it.get_column("iteration").to_list() == [1, 10, 20, 21]
    last = it.row(3, named=True)
    assert last["complete"] is False and last["elapsed_ms"] is None  # cut mid-field
    assert last["consumed_samples"] == 2688
    assert it.row(0, named=True)["timestamp"] == "2026-08-22 10:15:03"  # Bridge: no µs
    m = p.memory.row(0, named=True)
    assert m["unit"] == "GB" and m["allocated_mb"] == pytest.approx(41.235 * 1024)
    assert m["max_reserved_mb"] == pytest.approx(60.5 * 1024) and m["max_allocated_mb"] is None
    assert p.args == {}  # Bridge prints no arguments dump
    assert p.failure == "killed" and not p.completed


def test_oom_log() -> None:
    p = parse_file(LOGS / "megatron_oom.log")
    assert p.failure == "oom" and "CUDA out of memory" in (p.failure_line or "")
    assert p.iterations.height == 1 and p.memory.row(0, named=True)["max_allocated_mb"] == 139000.25


def test_colleague_fixture_logs_parse() -> None:
    q = parse_file(LOGS / "qwen3_30b_a3b_torchrun.log")
    assert q.iterations.height == 5 and q.iterations.get_column("lm_loss").to_list()[0] == 11.59
    assert len(q.args) > 100
    k = parse_file(LOGS / "small_moe_mock_killed.log")
    assert k.iterations.height == 0 and not k.completed


@pytest.mark.parametrize(
    ("line", "rank", "rest"),
    [
        ("[default7]: [2026-01-01 00:00:00] x", 7, "[2026-01-01 00:00:00] x"),
        ("[lrdn3321:3]: abc", 3, "abc"),
        ("12: abc", 12, "abc"),
        (" [2026-01-01 00:00:00.1] iteration", None, " [2026-01-01 00:00:00.1] iteration"),
        ("[Rank 3] (after 1 iterations)", None, "[Rank 3] (after 1 iterations)"),
    ],
)
def test_split_prefix(line: str, rank: int | None, rest: str) -> None:
    _, r, text = split_prefix(line)
    assert (r, text) == (rank, rest)


def _line(i: int, loss: float = 5.0) -> str:
    return mlog.iteration_line(iteration=i, train_iters=4, consumed_samples=8 * i, elapsed_ms=10.0 * i,
                               tflops=1.5, lr=1e-3, global_batch_size=8, losses={"lm loss": loss},
                               loss_scale=1.0, grad_norm=0.5, skipped=0, nan=0)


def test_interleaved_ranks_and_wrapped_records() -> None:
    a, b = "[default1]:" + _line(1), "[default3]:" + _line(2)
    # rank 1's record is cut by rank 3's complete line, then continues (same prefix)
    text = "\n".join([a[:90], b, "[default1]:" + a[90:], "[default0]:noise line", _line(3)[:70],
                      _line(3)[70:], "[default2]:[Rank 2] (after 3 iterations) memory (MB) | "
                      "allocated: 1.00 | max allocated: 2.00 | reserved: 3.00 | max reserved: 4.00"])
    p = parse_text(text)
    rows = p.iterations.select("iteration", "rank", "elapsed_ms", "complete").rows()
    assert rows == [(1, 1, 10.0, True), (2, 3, 20.0, True), (3, None, 30.0, True)]
    assert p.memory.rows() == [(2, 3, "MB", 1.0, 2.0, 3.0, 4.0)]


def test_nan_values_and_steady_window() -> None:
    text = "\n".join(_line(i, float("nan") if i == 3 else 5.0 - i / 10) for i in range(1, 5))
    it = parse_text(text).iterations
    assert math.isnan(it.filter(it["iteration"] == 3).item(0, "lm_loss"))
    assert steady(it, first=2, last=3).get_column("iteration").to_list() == [2, 3]


def test_theoretical_memory_lines_real_forms() -> None:
    """Megatron-LM's `report_theoretical_memory`: weight and optimizer only (the formula's
    preconditions unmet) and the three-figure form, on real public log excerpts; a log without
    the line has an empty frame, not zeros."""
    full = parse_file(LOGS / "real_gnosia93_slurm_gpt70b.log").theoretical_memory
    assert full.rows() == [(None, 35695.42, 86554.12, 122249.54)]
    short = parse_file(LOGS / "real_seunghyunseo_moe_ep4.log")
    assert short.theoretical_memory.rows() == [(None, 31292.23, None, None)]
    assert short.memory.height == 1  # the memory line right after it is still read
    ranked = parse_text("[default3]:Theoretical memory footprints: weight and optimizer=10.50 MB\n")
    assert ranked.theoretical_memory.rows() == [(3, 10.5, None, None)]
    assert parse_file(LOGS / "megatron_oom.log").theoretical_memory.height == 0


def test_iteration_args_last_line_wins() -> None:
    its = parse_file(LOGS / "real_seunghyunseo_moe_ep4.log").iterations
    assert iteration_args(its) == {"global_batch_size": 64, "train_iters": 40000}
    assert iteration_args(parse_text("no iterations\n").iterations) == {}
