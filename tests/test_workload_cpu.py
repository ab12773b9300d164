"""The MoE GPT workload on the CPU (pure-PyTorch path): it really trains, prints Megatron's log
formats, rejects unknown flags like Megatron, and writes a Kineto trace of the declared window."""

from __future__ import annotations

import math
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("torch")

from moetune.analyzer.flops import num_floating_point_operations
from moetune.analyzer.readers import load_trace
from moetune.executor.logparse import parse_text

ROOT = Path(__file__).resolve().parents[1]
TINY = ["--num-layers", "1", "--hidden-size", "32", "--num-attention-heads", "2",
        "--num-experts", "4", "--moe-router-topk", "2", "--seq-length", "16", "--vocab-size", "64"]


def workload(*args: str, cwd: Path = ROOT) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "moetune.executor.workloads.moe_gpt", *TINY, *args],
                          capture_output=True, text=True, cwd=cwd, timeout=300)


@pytest.fixture(scope="module")
def trained() -> subprocess.CompletedProcess[str]:
    return workload("--train-iters", "12", "--lr", "3e-3", "--micro-batch-size", "2",
                    "--global-batch-size", "4", "--seed", "7", "--data-pool", "16")


def test_trains_and_loss_falls(trained: subprocess.CompletedProcess[str]) -> None:
    assert trained.returncode == 0, trained.stderr
    p = parse_text(trained.stdout)
    losses = p.iterations.get_column("lm_loss").to_list()
    assert len(losses) == 12 and all(math.isfinite(x) for x in losses)
    # random tokens from a fixed 16-sequence pool: the model memorises, the loss must fall
    assert sum(losses[-3:]) / 3 < sum(losses[:3]) / 3 - 0.1
    assert losses[0] == pytest.approx(math.log(64), rel=0.1)  # uniform start over 64 tokens
    assert p.iterations.get_column("load_balancing_loss").min() > 0.9  # E·Σ f·P ≥ 1 at balance
    assert p.completed and p.failure is None
    assert p.implementation and p.implementation.startswith("pure-PyTorch MoE GPT")


def test_log_is_megatron_format(trained: subprocess.CompletedProcess[str]) -> None:
    p = parse_text(trained.stdout)
    assert p.args["num_experts"] == 4 and p.args["global_batch_size"] == 4
    assert p.iterations.get_column("consumed_samples").to_list() == [4 * i for i in range(1, 13)]
    assert p.iterations.get_column("complete").all()
    assert p.memory.get_column("iteration").to_list() == [1, 12]  # first log and the end
    row = p.iterations.row(5, named=True)
    flops = num_floating_point_operations(p.args, 4)
    # the logged throughput is Megatron's formula over the logged step time (both rounded)
    assert row["tflops_per_gpu"] == pytest.approx(flops / (row["elapsed_ms"] / 1e3) / 1e12, abs=0.06)
    assert "------------------------ arguments ------------------------" in trained.stdout


def test_unknown_flag_exits_2_naming_it() -> None:
    r = workload("--moe-bogus-knob", "1")
    assert r.returncode == 2 and "unrecognized arguments: --moe-bogus-knob 1" in r.stderr
    bad = workload("--num-experts", "3", "--expert-model-parallel-size", "2")
    assert bad.returncode == 2 and "world size 1 is not divisible" in bad.stderr


def test_same_data_whatever_the_micro_batch(trained: subprocess.CompletedProcess[str]) -> None:
    b = parse_text(workload("--train-iters", "3", "--lr", "3e-3", "--micro-batch-size", "4",
                            "--global-batch-size", "4", "--seed", "7", "--data-pool", "16").stdout)
    la = parse_text(trained.stdout).iterations.get_column("lm_loss").to_list()[:3]
    lb = b.iterations.get_column("lm_loss").to_list()
    assert la == pytest.approx(lb, rel=1e-4)  # matched screens: same samples per global batch


def test_nan_iteration_is_skipped_and_counted() -> None:
    p = parse_text(workload("--train-iters", "4", "--debug-nan-at", "3").stdout)
    it = p.iterations
    assert it.get_column("nan_iterations").to_list() == [0, 0, 1, 0]
    assert it.get_column("skipped_iterations").to_list() == [0, 0, 1, 0]
    assert it.filter(it["iteration"] == 3).item(0, "grad_norm") is None  # Megatron omits it


def test_profile_writes_kineto_trace_of_window(tmp_path: Path) -> None:
    r = workload("--train-iters", "6", "--profile", "--profile-step-start", "2",
                 "--profile-step-end", "5", "--profile-dir", str(tmp_path), "--nvtx-ranges")
    assert r.returncode == 0, r.stderr
    trace = load_trace([tmp_path])
    names = trace.events.get_column("name")
    steps = sorted(n for n in names.unique().to_list() if n.startswith("ProfilerStep#"))
    assert steps == ["ProfilerStep#2", "ProfilerStep#3", "ProfilerStep#4"]  # [start, end)
    # NVTX/record_function ranges: the iteration of each profiled step, forward and backward
    assert {"iteration 3", "iteration 4", "iteration 5"} <= set(names.to_list())
    assert (names == "forward").sum() == 3 and (names == "backward").sum() == 3
    assert trace.ranks.get_column("rank").to_list() == [0]


def test_local_cuda_graphs_refused_in_one_line_where_megatron_core_cannot_run_them() -> None:
    """megatron-core 0.19.2 without TE (H200 grid, bench/grid/README.md): whole-layer graphs of a
    dropless MoE layer fail in capture, full recompute is asserted off, `attn` alone graphs nothing
    in a MoE layer. The workload says so before it starts: exit 2, one line, no traceback."""
    cases = [
        (["--recompute-granularity", "full"], "does not run with --recompute-granularity full"),
        ([], "captures whole MoE layers"),
        (["--cuda-graph-modules", "moe"], "captures whole MoE layers"),
        (["--cuda-graph-modules", "attn"], "builds no CUDA graph in MoE layers"),
    ]
    for extra, text in cases:
        r = workload("--cuda-graph-impl", "local", *extra)
        assert r.returncode == 2, (extra, r.stderr)
        assert len(r.stderr.strip().splitlines()) == 1 and "Traceback" not in r.stderr
        assert r.stderr.startswith("moe_gpt: error: ") and text in r.stderr, r.stderr


def test_local_cuda_graph_configurations_that_run_pass() -> None:
    from moetune.executor.workloads.moe_gpt import build_parser, cuda_graph_refusal

    ok = [
        ["--cuda-graph-modules", "moe_router", "moe_preprocess"],  # partial: router graphs
        ["--moe-expert-capacity-factor", "1.0", "--moe-pad-expert-input-to-capacity"],  # whole
        ["--cuda-graph-modules", "moe_router", "--recompute-granularity", "selective"],
    ]
    for extra in ok:
        args = build_parser().parse_args([*TINY, "--cuda-graph-impl", "local", *extra])
        assert cuda_graph_refusal(args) is None, extra
    assert cuda_graph_refusal(build_parser().parse_args(TINY)) is None  # eager: never refused


def test_token_dropping_needs_megatron_core() -> None:
    r = workload("--moe-expert-capacity-factor", "1.0", "--workload-impl", "torch")
    assert r.returncode == 2 and "needs the Megatron-Core implementation" in r.stderr
    bad = workload("--moe-pad-expert-input-to-capacity")
    assert bad.returncode == 2 and "needs --moe-expert-capacity-factor" in bad.stderr
