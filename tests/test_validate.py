"""executor/validate.py and executor/flops.py: decision rule, health checks, FLOPs formula."""

from __future__ import annotations

from pathlib import Path

import pytest
from moetune.executor.flops import num_floating_point_operations, tflops_per_gpu
from moetune.executor.launchers.base import RunResult
from moetune.executor.logparse import parse_file, parse_text
from moetune.executor.validate import (
    Policy,
    Window,
    decide,
    loss_health,
    run_metrics,
    screen_stats,
    screen_verdict,
)
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


def test_screen_rule_keeps_only_gains_above_noise() -> None:
    pol = Policy()
    clear = screen_stats([100, 102, 101], [80, 81, 79])
    assert clear["gain"] == pytest.approx(101 / 80 - 1)
    assert clear["noise"] == pytest.approx(max(2 / 101, 2 / 80))
    assert screen_verdict(clear, pol) == (True, None)
    noisy = screen_stats([100, 140, 90], [85, 120, 95])  # 18.8 % gain, 50 % spread
    ok, why = screen_verdict(noisy, pol)
    assert not ok and "within noise" in why
    tiny = screen_stats([100, 100.1, 100], [99.5, 99.6, 99.5])
    assert screen_verdict(tiny, pol)[1].startswith("no gain")


def _metrics(losses: dict[int, float], step: float = 10.0) -> dict:
    return {"lm_loss": {str(k): v for k, v in losses.items()}, "step_ms": step, "window": "2-3",
            "cause": None}


def test_loss_health() -> None:
    base = _metrics({2: 5.0, 3: 4.8})
    assert loss_health(base, _metrics({2: 5.01, 3: 4.79}), 0.05)[0]
    ok, why, rel = loss_health(base, _metrics({2: 6.0, 3: 5.9}), 0.05)
    assert not ok and "diverged" in why and rel == pytest.approx(1.05 / 4.9)
    assert loss_health(base, _metrics({2: float("nan"), 3: 4.8}), 0.05)[1] == "nan"


def test_decide_paths() -> None:
    pol = Policy()
    stats = screen_stats([100, 101, 100], [70, 71, 70])
    base, cand = _metrics({2: 5.0, 3: 4.9}, 100.0), _metrics({2: 5.0, 3: 4.9}, 70.0)
    acc = decide(screen=stats, confirm_base=base, confirm_cand=cand,
                 audit={"verdict": "unobservable"}, policy=pol)
    assert acc["verdict"] == "accepted" and acc["measured_gain"] == pytest.approx(100 / 70 - 1)
    assert acc["proof"] == "unobservable (not counted as proof)"
    rej = decide(screen=stats, confirm_base=base, confirm_cand=cand,
                 audit={"verdict": "contradicted"}, policy=pol)
    assert rej["verdict"] == "rejected" and rej["cause"].startswith("audit")
    slow = decide(screen=stats, confirm_base=base, confirm_cand=_metrics({2: 5.0, 3: 4.9}, 99.9),
                  audit=None, policy=pol)
    assert slow["verdict"] == "rejected" and "within noise" in slow["cause"]
    crashed = decide(screen=stats, confirm_base=base, confirm_cand={**cand, "cause": "oom"},
                     audit=None, policy=pol)
    assert crashed["cause"] == "confirm candidate: oom"


def test_an_enabler_is_kept_when_not_measurably_slower() -> None:
    """Recompute off measured +8.1 % against a 10 % noise band on the H200 (bench/grid/tune):
    rejected on its own, kept when it unlocks local CUDA graphs; a measured loss is never kept."""
    pol = Policy()
    screen = screen_stats([100, 104, 96], [92, 95, 96])  # +5 %, noise band 8 %
    base = _metrics({2: 5.0, 3: 4.9}, 46.8)
    cand = _metrics({2: 5.0, 3: 4.9}, 45.0)  # +4 %: inside the band
    alone = decide(screen=screen, confirm_base=base, confirm_cand=cand, audit=None, policy=pol)
    assert alone["verdict"] == "rejected" and "within noise" in alone["cause"]
    kept = decide(screen=screen, confirm_base=base, confirm_cand=cand, audit=None, policy=pol,
                  unlocks=["host.cuda-graphs-local"])
    assert kept["verdict"] == "accepted" and kept["enables"] == ["host.cuda-graphs-local"]
    assert kept["proof"].startswith("enabler")
    slower = decide(screen=screen, confirm_base=base, confirm_cand=_metrics({2: 5.0, 3: 4.9}, 52.0),
                    audit=None, policy=pol, unlocks=["host.cuda-graphs-local"])
    assert slower["verdict"] == "rejected"  # −10 %: measurably slower than the baseline
    loss = screen_stats([100, 101, 100], [120, 121, 119])
    assert decide(screen=loss, confirm_base=None, confirm_cand=None, audit=None, policy=pol,
                  unlocks=["x"])["verdict"] == "rejected"  # the screen alone decides a loss
    ran_not = decide(screen=screen, confirm_base=base, confirm_cand=cand, policy=pol,
                     audit={"verdict": "contradicted"}, unlocks=["x"])
    assert ran_not["verdict"] == "rejected"


def test_run_metrics_causes() -> None:
    oom = parse_file(LOGS / "megatron_oom.log")
    assert run_metrics(oom, RunResult(1, False, 2.0, Path("l")), Window(2, 5))["cause"] == "oom"
    good = parse_file(LOGS / "megatron_lm_torchrun_moe.log")
    m = run_metrics(good, OK, Window(10, 30), expected_iters=30)
    assert m["cause"] is None and m["step_ms"] == 1649.5  # median of 1650.2 1648.9 1651.3 1647.0 1649.5
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
