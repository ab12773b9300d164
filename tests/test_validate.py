"""executor/validate.py and analyzer/flops.py: run metrics (drift), health checks, FLOPs formula;
the sequential A/B's enabler rule (executor/ab.py)."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
from moetune.analyzer.flops import num_floating_point_operations, tflops_per_gpu
from moetune.executor.ab import judge, run_noise
from moetune.executor.launchers.base import RunResult
from moetune.executor.logparse import parse_file, parse_text
from moetune.executor.validate import Policy, Window, loss_health, run_metrics
from moetune.executor.workloads import megatron_log as mlog

LOGS = Path(__file__).resolve().parents[1] / "fixtures" / "logs"
OK = RunResult(0, False, 1.0, Path("x.log"))


def test_flops_dense_gpt_matches_hand_count() -> None:
    # 1 layer, h=4, s=2, a=1, ffn=16, V=8, batch 1 — Megatron's formula by hand:
    # attn 12·1·16·(1 + 1 + 2/4/2) = 432; mlp 12·1·4·16 = 768; logits 6·4·8 = 192; ×(b·s=2)
    args = {"num_layers": 1, "hidden_size": 4, "seq_length": 2, "num_attention_heads": 1,
            "ffn_hidden_size": 16, "padded_vocab_size": 8}
    assert num_floating_point_operations(args, 1) == 2 * (432 + 768 + 192)


def test_flops_moe_counts_active_and_shared_experts() -> None:
    dense = {"num_layers": 2, "hidden_size": 64, "seq_length": 32, "num_attention_heads": 4,
             "ffn_hidden_size": 256, "padded_vocab_size": 256}
    moe = {**dense, "num_experts": 8, "moe_router_topk": 2, "moe_ffn_hidden_size": 128,
           "moe_shared_expert_intermediate_size": 64}
    # MLP term per token: 12·L·h·(topk·moe_ffn + shared) vs 12·L·h·ffn
    delta = 12 * 2 * 64 * ((2 * 128 + 64) - 256) * 32 * 3
    assert num_floating_point_operations(moe, 3) - num_floating_point_operations(dense, 3) == delta
    swiglu = {**moe, "swiglu": True}
    assert num_floating_point_operations(swiglu, 1) > num_floating_point_operations(moe, 1)
    assert tflops_per_gpu(moe, 4, 0.5, 2) == pytest.approx(
        num_floating_point_operations(moe, 4) / (0.5 * 1e12 * 2))


def _metrics(losses: dict[int, float], step: float = 10.0) -> dict:
    return {"lm_loss": {str(k): v for k, v in losses.items()}, "step_ms": step, "window": "2-3",
            "cause": None}


def test_loss_health() -> None:
    base = _metrics({2: 5.0, 3: 4.8})
    assert loss_health(base, _metrics({2: 5.01, 3: 4.79}), 0.05)[0]
    ok, why, rel = loss_health(base, _metrics({2: 6.0, 3: 5.9}), 0.05)
    assert not ok and "diverged" in why and rel == pytest.approx(1.05 / 4.9)
    assert loss_health(base, _metrics({2: float("nan"), 3: 4.8}), 0.05)[1] == "nan"


def test_an_enabler_is_kept_when_not_measurably_slower() -> None:
    """Recompute off measured +8.1 % on the H200 (bench/grid/tune): one pair cannot call it a
    win at 10 % run noise, but it is kept when it unlocks local CUDA graphs; a clear loss never
    is."""
    pol = Policy()
    sigma = run_noise([], pol)
    plus8 = [{"log_ratio": math.log(1.081)}]
    assert judge(plus8, sigma, pol)["state"] == "undecided"
    assert judge(plus8, sigma, pol, enabler=True)["state"] == "kept"
    minus10 = [{"log_ratio": math.log(0.9)}]
    assert judge(minus10, sigma, pol, enabler=True)["state"] == "kept"  # inside the noise
    assert judge([{"log_ratio": math.log(0.6)}], sigma, pol, enabler=True)["state"] == "slower"


def test_run_metrics_causes() -> None:
    oom = parse_file(LOGS / "megatron_oom.log")
    assert run_metrics(oom, RunResult(1, False, 2.0, Path("l")), Window(2, 5))["cause"] == "oom"
    good = parse_file(LOGS / "megatron_lm_torchrun_moe.log")
    m = run_metrics(good, OK, Window(10, 30), expected_iters=30)
    assert m["cause"] is None and m["step_ms"] == 1649.5  # median of 1650.2 1648.9 1651.3 1647.0 1649.5
    assert not m["drifting"] and abs(m["drift"]) < 0.01
    assert m["peak_memory_mb"] == pytest.approx(70555.10)
    assert m["tflops_per_gpu"] == pytest.approx(
        num_floating_point_operations(good.args, 256) / (1.6495 * 1e12 * 8))
    assert run_metrics(good, RunResult(None, True, 9.0, Path("l")), Window(2, 3))["cause"] == "hang"
    assert run_metrics(good, OK, Window(10, 30), expected_iters=50)["cause"] == "incomplete"
    lines = [mlog.iteration_line(iteration=i, train_iters=3, consumed_samples=i, elapsed_ms=5.0,
                                 tflops=None, lr=1e-3, global_batch_size=1,
                                 losses={} if i == 2 else {"lm loss": 1.0}, loss_scale=1.0,
                                 grad_norm=None if i == 2 else 1.0, skipped=int(i == 2),
                                 nan=int(i == 2)) for i in (1, 2, 3)]
    nan = parse_text("\n".join(lines))
    assert run_metrics(nan, OK, Window(2, 3))["cause"] == "nan"


def test_drift_inside_a_run_is_measured_not_averaged() -> None:
    """A host-bound run that slows down inside its window (1.1 s → 1.5 s, as Megatron-LM's did on
    the H200): the halves' medians differ by more than DRIFT_LIMIT, and the run says so."""
    lines = [mlog.iteration_line(iteration=i, train_iters=12, consumed_samples=i,
                                 elapsed_ms=1100.0 if i <= 6 else 1500.0, tflops=None, lr=1e-3,
                                 global_batch_size=1, losses={"lm loss": 1.0}, loss_scale=1.0,
                                 grad_norm=1.0, skipped=0, nan=0) for i in range(1, 13)]
    m = run_metrics(parse_text("\n".join(lines)), OK, Window(3, 10))
    assert m["drift"] == pytest.approx(1500 / 1100 - 1) and m["drifting"]
    # its step time is the later half's, the window's median kept beside it
    assert (m["step_ms"], m["window_median_ms"]) == (1500.0, 1300.0)


def test_audit_change_proves_a_micro_batch_change_on_the_h200_trace() -> None:
    """The tune loop's proof for an MBS step: the candidate's trace (round 1 of the H200 loop,
    MBS 2 / GBS 8) audited against the run's own claims. Setting the knob keeps the contract's
    mirrored section field in step (shape.micro_batch_size), so the contract stays valid."""
    from moetune.analyzer.contract import check_contract, with_args
    from moetune.analyzer.megatron_args import contract_from_log
    from moetune.executor.validate import audit_change

    folder = Path(__file__).resolve().parents[1] / "fixtures" / "traces" / "gpu_tune_mbs2_round1"
    contract = contract_from_log((folder / "train.log").read_text())
    contract["megatron_args"]["position_embedding_type"] = "rope"  # the workload prints it now
    doc = with_args(contract, {"micro_batch_size": 4})
    assert doc["shape"]["micro_batch_size"] == doc["megatron_args"]["micro_batch_size"] == 4
    assert [p for p in check_contract(doc) if p.severity == "error"] == []
    trace = [str(folder / "trace.json.gz")]
    assert audit_change(trace, "micro_batch_size", 2, contract)["verdict"] == "confirmed"
    assert audit_change(trace, "micro_batch_size", 4, contract)["verdict"] == "contradicted"


def test_audit_change_reads_the_candidates_megatron_log_without_a_contract() -> None:
    """`tune` with no contract on Megatron-LM's pretrain_gpt.py (tune session 6, bench/grid_mlm):
    the MBS claim alone cannot be proven (GBS and DP unstated); the candidate's own log states
    them, so MBS 8 at GBS 8 (one forward pass a step) is confirmed and MBS 4 contradicted."""
    from moetune.executor.validate import audit_change

    folder = (Path(__file__).resolve().parents[1] / "bench" / "grid_mlm" / "profiles"
              / "host_mbs8_seq_rcfull_a2a_eager")
    trace, log = [str(folder / "trace.json.gz")], folder / "train.log"
    assert audit_change(trace, "micro_batch_size", 8)["verdict"] == "unobservable"
    assert audit_change(trace, "micro_batch_size", 8, None, log)["verdict"] == "confirmed"
    assert audit_change(trace, "micro_batch_size", 4, None, log)["verdict"] == "contradicted"
    # a log that states nothing leaves the claim as it was
    assert audit_change(trace, "micro_batch_size", 8, None, folder / "missing.log")[
        "verdict"] == "unobservable"
