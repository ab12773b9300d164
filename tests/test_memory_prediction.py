"""Memory as given (analyzer/planner/predict.py): a configuration is priced with its own recompute,
micro-batch and attention, a change by the model's delta on a measured peak, and `fits` against the
GPU less the allocator's overhead. Checked against real H200 peaks: the fixture traces' allocator
events, fixtures/planner/measured.json and the "mem" shape of bench/grid_spec.py."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import pytest
from moetune.analyzer.planner.config import GIB, builtin
from moetune.analyzer.planner.layouts import pipeline_split
from moetune.analyzer.planner.memory import (
    UNFUSED_SCORE_BUFFER,
    UNFUSED_SCORE_PEAK,
    FitOptions,
    Layout,
    Workload,
    estimate_memory,
    model_spec,
)
from moetune.analyzer.planner.plan import read_contract
from moetune.analyzer.planner.predict import (
    attention_path,
    config_peak,
    measured_from_diagnosis,
    predict_peak,
)

ROOT = Path(__file__).resolve().parents[1]
TRACES = ROOT / "fixtures" / "traces"
MEASURED = ROOT / "fixtures" / "planner" / "measured.json"
GRID = ROOT / "bench" / "grid" / "grid_h200.json"
MIB = 2**20

# bench/grid_spec.py's "mem" shape as the workload (executor/workloads/moe_gpt.py) runs it:
# megatron-core 0.19.2 local spec, no Transformer Engine, fp32 grads, Megatron's mixed-precision
# Adam, no distributed optimizer, one H200.
MEM: dict[str, Any] = {
    "schema": "moetune.contract/1",
    "model": {"num_layers": 8, "hidden_size": 1536, "ffn_hidden_size": 6144,
              "num_attention_heads": 24, "num_query_groups": 24, "num_experts": 16,
              "moe_router_topk": 2, "moe_ffn_hidden_size": 3072, "moe_layer_freq": 1,
              "vocab_size": 32000, "padded_vocab_size": 32000, "swiglu": False},
    "hardware": {"gpu_model": "H200", "gpu_memory_gb": 139.8, "gpus_per_node": 1, "nodes": 1},
    "routing": {"force_balancing": False},
    "precision": {"params": "bf16"},
    "shape": {"seq_length": 4096, "micro_batch_size": 1, "global_batch_size": 1},
    "parallelism": {"tp": 1, "pp": 1, "cp": 1, "ep": 1, "dp": 1, "world_size": 1},
    "training": {"distributed_optimizer": False, "recompute_granularity": None,
                 "recompute_modules": None},
    "versions": {"transformer_engine": None},
    "megatron_args": {"micro_batch_size": 1, "global_batch_size": 1,
                      "recompute_granularity": None, "recompute_modules": None,
                      "use_distributed_optimizer": False, "moe_token_dispatcher_type": "alltoall"},
}


def contract(**megatron_args: Any) -> dict[str, Any]:
    """MEM with Megatron arguments set where the contract keeps them."""
    doc = copy.deepcopy(MEM)
    for arg, value in megatron_args.items():
        doc["megatron_args"][arg] = value
        for section, field in (("shape", arg), ("training", arg)):
            if field in doc[section]:
                doc[section][field] = value
    return doc


def with_te(doc: dict[str, Any]) -> dict[str, Any]:
    doc = copy.deepcopy(doc)
    doc["versions"]["transformer_engine"] = "2.8.0"
    doc["megatron_args"]["transformer_impl"] = "transformer_engine"
    return doc


def scores(doc: dict[str, Any], mbs: int) -> float:
    """Attention scores of one layer: b·a·s²."""
    m, s = doc["model"], doc["shape"]["seq_length"]
    return mbs * m["num_attention_heads"] * s * s


# ---------------------------------------------------------------------------------- as given


def test_recompute_is_priced_as_given_not_replanned():
    # fit used to re-plan the rung: MBS 4 with and without full recompute read the same figure
    none = config_peak(contract(micro_batch_size=4))
    full = config_peak(contract(micro_batch_size=4, recompute_granularity="full",
                                recompute_method="uniform", recompute_num_layers=1))
    selective = config_peak(contract(micro_batch_size=4, recompute_granularity="selective"))
    assert full.options.recompute == "full" and none.options.recompute == "none"
    assert selective.options.recompute_modules == ("core_attn",)  # megatron-core's default
    assert full.allocated_bytes < selective.allocated_bytes < none.allocated_bytes
    # without recompute 8 layers keep 6 B per score; full recompute keeps layer inputs only
    assert none.allocated_bytes - full.allocated_bytes > 8 * 6 * scores(MEM, 4) * 0.7


def test_recompute_method_and_layer_count_are_read():
    def act(**kw: Any) -> float:
        return config_peak(contract(micro_batch_size=2, recompute_granularity="full", **kw)
                           ).breakdown["activations"]

    def peak(**kw: Any) -> float:
        return config_peak(contract(micro_batch_size=2, recompute_granularity="full", **kw)
                           ).allocated_bytes

    uniform1 = peak(recompute_method="uniform", recompute_num_layers=1)
    # groups of 2 layers: half the checkpoints, two layers rebuilt at once
    assert act(recompute_method="uniform", recompute_num_layers=2) < \
        act(recompute_method="uniform", recompute_num_layers=1)
    assert peak(recompute_method="uniform", recompute_num_layers=2) > uniform1
    # block of all 8 layers = uniform 1; block 4 keeps the other 4 layers whole
    assert peak(recompute_method="block", recompute_num_layers=8) == pytest.approx(uniform1)
    block4 = config_peak(contract(micro_batch_size=2, recompute_granularity="full",
                                  recompute_method="block", recompute_num_layers=4))
    none = config_peak(contract(micro_batch_size=2))
    assert uniform1 < block4.allocated_bytes < none.allocated_bytes


# ------------------------------------------------------------------------- unfused attention


def test_attention_path_follows_te_the_spec_and_the_backend():
    assert attention_path(MEM)[0] is False  # versions.transformer_engine: null
    assert attention_path(with_te(MEM))[0] is True
    te_unfused = with_te(MEM)
    te_unfused["megatron_args"]["attention_backend"] = "unfused"
    assert attention_path(te_unfused)[0] is False
    local = with_te(MEM)
    local["megatron_args"]["transformer_impl"] = "local"
    assert attention_path(local)[0] is False
    silent = copy.deepcopy(MEM)
    del silent["versions"]
    assert attention_path(silent) == (True, attention_path(silent)[1])
    assert "assumed" in attention_path(silent)[1]


@pytest.mark.parametrize("mbs", [1, 2])
def test_unfused_scores_are_priced_without_te_and_not_with_it(mbs):
    doc = contract(micro_batch_size=mbs)
    unfused, fused = config_peak(doc), config_peak(with_te(doc))
    assert unfused.work.fused_attention is False and fused.work.fused_attention is True
    saved = builtin().unfused_attention_per_score  # fp32 softmax + bf16 probabilities
    # every layer keeps its scores; one bf16 score buffer persists (dot_product_attention.py)
    expected = (8 * saved + UNFUSED_SCORE_BUFFER) * scores(doc, mbs)
    assert unfused.breakdown["activations"] - fused.breakdown["activations"] == \
        pytest.approx(expected, rel=1e-9)
    # one layer's softmax backward holds 16 B per score: it shows in the transient unless the
    # logits are larger
    extra = (UNFUSED_SCORE_PEAK - saved) * scores(doc, mbs)
    assert unfused.breakdown["transient"] == pytest.approx(
        max(0.0, extra - unfused.breakdown["logits"]), rel=1e-9)
    # fused attention keeps nothing quadratic: doubling seq doubles its activations at most
    long = copy.deepcopy(with_te(doc))
    long["shape"]["seq_length"] = 8192
    assert config_peak(long).breakdown["activations"] <= 2.01 * fused.breakdown["activations"]


def test_attention_dropout_keeps_a_mask_byte_per_score():
    plain, dropout = config_peak(MEM), config_peak(contract(attention_dropout=0.1))
    assert dropout.breakdown["activations"] - plain.breakdown["activations"] == \
        pytest.approx(8 * 1 * scores(MEM, 1), rel=1e-9)


def test_selective_core_attn_removes_the_saved_scores():
    none = config_peak(contract(micro_batch_size=2))
    core = config_peak(contract(micro_batch_size=2, recompute_granularity="selective",
                                recompute_modules=["core_attn"]))
    saved = builtin().unfused_attention_per_score
    assert none.breakdown["activations"] - core.breakdown["activations"] == \
        pytest.approx(8 * saved * scores(MEM, 2), rel=1e-9)
    # the recomputed layer still reaches the softmax-backward peak
    assert core.breakdown["transient"] >= UNFUSED_SCORE_PEAK * scores(MEM, 2) - \
        core.breakdown["logits"]
    # with TE's fused attention core_attn saves nothing: the same memory either way
    te_none = config_peak(with_te(contract(micro_batch_size=2)))
    te_core = config_peak(with_te(contract(micro_batch_size=2, recompute_granularity="selective",
                                           recompute_modules=["core_attn"])))
    assert te_core.allocated_bytes == pytest.approx(te_none.allocated_bytes)


# ---------------------------------------------------------------------------------- predict


def test_measured_peak_anchors_the_prediction():
    measured = int(61.8 * GIB)
    p = predict_peak(MEM, {"micro_batch_size": 2}, measured_peak_bytes=measured,
                     gpu_memory_bytes=None)
    current, changed = config_peak(MEM), config_peak(contract(micro_batch_size=2))
    assert p.current.allocated_bytes == pytest.approx(current.allocated_bytes)
    assert p.delta_bytes == pytest.approx(changed.allocated_bytes - current.allocated_bytes)
    assert p.peak_bytes == pytest.approx(measured + p.delta_bytes)
    assert p.basis.startswith("measured peak 61.8 GiB + model delta +")
    assert "micro_batch_size 1→2" in p.basis
    alone = predict_peak(MEM, {"micro_batch_size": 2}, measured_peak_bytes=None,
                         gpu_memory_bytes=None)
    assert alone.peak_bytes == pytest.approx(changed.allocated_bytes)
    assert alone.basis.startswith("model only")
    # the contract's hardware.gpu_memory_gb (139.8) when no capacity is given
    assert alone.capacity_bytes == pytest.approx(139.8 * GIB)


def test_fits_is_false_past_the_gpu_and_unknown_without_one():
    ok = predict_peak(MEM, {"micro_batch_size": 2}, measured_peak_bytes=None,
                      gpu_memory_bytes=int(139.8 * GIB))
    too_big = predict_peak(MEM, {"micro_batch_size": 8}, measured_peak_bytes=None,
                           gpu_memory_bytes=int(139.8 * GIB))
    assert ok.fits is True and ok.headroom_bytes > 0
    assert too_big.fits is False and too_big.headroom_bytes < 0
    c = builtin()
    assert too_big.margin_bytes == pytest.approx(
        c.cuda_context_bytes + c.fragmentation(False) * too_big.changed.dynamic_bytes)
    # the same change fits or not by where the anchor puts it
    edge = ok.peak_bytes + ok.margin_bytes
    assert predict_peak(MEM, {"micro_batch_size": 2}, measured_peak_bytes=None,
                        gpu_memory_bytes=edge * 0.99).fits is False
    unknown = copy.deepcopy(MEM)
    del unknown["hardware"]
    p = predict_peak(unknown, {"micro_batch_size": 8}, measured_peak_bytes=None,
                     gpu_memory_bytes=None)
    assert p.fits is None and p.headroom_bytes is None


# ------------------------------------------------------------------- against measured peaks

# `memory.peak_allocated_gib` of the golden diagnoses (allocator events of the profiled steps):
# model error 2026-12-01: −1.1 %, −5.5 %, +0.1 %, −6.7 %
FIXTURE_ERRORS = {"gpu_ep2_allgather": -0.011, "gpu_ep2_alltoall_nooverlap": -0.055,
                  "gpu_ep2_alltoall_overlap": 0.001, "gpu_tune_mbs2_round1": -0.066}


@pytest.mark.parametrize("name", sorted(FIXTURE_ERRORS))
def test_fixture_traces_peak_allocated(name):
    folder = TRACES / name
    doc = read_contract(folder / "golden" / "contract.yaml")
    diagnosis = json.loads((folder / "golden" / "diagnose.json").read_text())["document"]
    measured, device = measured_from_diagnosis(diagnosis)
    assert measured and device
    est = config_peak(doc)
    assert est.work.fused_attention is False  # the log said: no Transformer Engine
    error = est.allocated_bytes / measured - 1
    assert error == pytest.approx(FIXTURE_ERRORS[name], abs=0.01)
    assert abs(error) < 0.08
    # anchored on its own peak, no change predicts the peak itself, and it fits the H200
    p = predict_peak(doc, {}, measured_peak_bytes=measured, gpu_memory_bytes=device)
    assert p.peak_bytes == measured and p.fits is True


def test_measured_json_rows_counting_the_score_buffer_the_harness_held():
    """fixtures/gpu/measure_memory.py ran its configs in one process: the bf16 score buffer of the
    earlier configs (parallel_state's global memory buffer) sits in its baseline, so a row shows
    only the part of the buffer it grew. Errors (cross entropy at 6 B per logit element): −3.5, −2.6,
    +0.8, −1.2, −0.8 %."""
    runs = json.loads(MEASURED.read_text())["runs"]
    held = 0
    errors = {}
    for r in runs:
        m = model_spec({k: r[k] for k in ("num_layers", "hidden_size", "num_attention_heads",
                                          "ffn_hidden_size", "num_experts", "moe_router_topk",
                                          "moe_ffn_hidden_size", "vocab_size")}
                       | {"swiglu": False, "normalization": "LayerNorm"})
        stages, _, _ = pipeline_split(m.num_layers, 1, None, 0)
        lay = Layout(tp=1, cp=1, dp=1, pp=1, vpp=None, ep=1, etp=1, edp=1, stages=stages)
        w = Workload(seq_length=r["seq_length"], micro_batch_size=r["micro_batch_size"],
                     fused_attention=False, score_buffer=True)
        o = FitOptions(distributed_optimizer=False, recompute=r["recompute_granularity"] or "none")
        b = estimate_memory(m, lay, w, o).breakdown
        need = r["micro_batch_size"] * m.num_attention_heads * r["seq_length"] ** 2
        in_base = UNFUSED_SCORE_BUFFER * min(held, need)
        held = max(held, need)
        allocated = sum(v for k, v in b.items() if k != "overhead") - in_base
        errors[r["name"]] = allocated / r["peak_allocated_bytes"] - 1
    assert errors["seq4k_e8"] == pytest.approx(-0.008, abs=0.01)  # the s²-heavy row
    assert all(abs(e) < 0.08 for e in errors.values()), errors


# bench/grid_spec.py's "mem" shape on one H200 (2026-12-01, this module's author, through the
# device tool): `python -m moetune.executor.workloads.moe_gpt <mem flags> --bf16 --train-iters 3
# --moe-token-dispatcher-type alltoall --micro-batch-size B --global-batch-size B
# [--recompute-granularity G]`, Megatron's `max allocated` (MB) after iteration 3, one process
# each. All ran (139.8 GiB device). Model error: −0.5 −0.5 −0.5 −0.1 +0.2 +0.4 +0.6 −1.0 −1.1 %.
H200_MEM_SHAPE = {
    (1, None): 48985.50, (2, None): 74118.72, (4, None): 124391.06,
    (1, "full"): 30982.44, (2, "full"): 38147.64, (4, "full"): 52479.92, (8, "full"): 81144.48,
    (1, "selective"): 32943.54, (2, "selective"): 41979.04,
}


@pytest.mark.parametrize(("mbs", "recompute"), sorted(H200_MEM_SHAPE, key=str))
def test_h200_mem_shape_max_allocated(mbs, recompute):
    measured = H200_MEM_SHAPE[(mbs, recompute)] * MIB
    changes = {"micro_batch_size": mbs, "global_batch_size": mbs,
               "recompute_granularity": recompute}
    est = config_peak(MEM, changes=changes)
    assert est.allocated_bytes / measured - 1 == pytest.approx(0, abs=0.02)
    # anchored on MBS 1 without recompute, the model's delta lands within 1 %
    p = predict_peak(MEM, changes, measured_peak_bytes=H200_MEM_SHAPE[(1, None)] * MIB,
                     gpu_memory_bytes=139.8 * GIB)
    assert p.peak_bytes / measured - 1 == pytest.approx(0, abs=0.012)
    assert p.fits is True  # every one of them ran


# bench/grid/grid_h200.json (the H200 grid, GBS 8, 12 iterations): model error per point that ran.
# "mem" (s² attention dominates): within 0.5 %. "host" (3 layers, hidden 512, 48 experts, seq
# 1024): the cross entropy's 6 B per logit element dominates at MBS 8 (−2 … −3 %); at MBS 1–2 with
# full or selective recompute the peak is the optimizer's step (torch's foreach Adam, the fallback
# without TE and Apex, holds an fp32 copy of the second moments: planner.yaml
# `torch_adam_step_temporary`; −12.5 % before it was priced, −3 % … +2.7 % now); local CUDA
# graphs' static buffers are not priced (−14 %) nor drop-and-pad's capacity (+15 %: the
# whole-layer graphs' run, two changes at once).
GRID_ERRORS = {
    ("mem", "mbs4_seq_rcnone_a2a_eager"): -0.005, ("mem", "mbs4_seq_rcfull_a2a_eager"): 0.004,
    ("mem", "mbs2_seq_rcfull_a2a_eager"): 0.002, ("mem", "mbs1_seq_rcfull_a2a_eager"): -0.001,
    ("host", "mbs8_grp_rcnone_a2a_local"): -0.139, ("host", "mbs8_grp_rcnone_a2a_eager"): -0.03,
    ("host", "mbs8_grp_rcfull_a2a_eager"): -0.02, ("host", "mbs8_seq_rcfull_a2a_eager"): -0.02,
    ("host", "mbs4_seq_rcfull_a2a_eager"): -0.024, ("host", "mbs1_grp_rcfull_a2a_eager"): 0.027,
    ("host", "mbs2_seq_rcfull_a2a_eager"): -0.035, ("host", "mbs1_seq_rcnone_a2a_eager"): -0.033,
    ("host", "mbs1_seq_rcselective_a2a_eager"): -0.03,
    ("host", "mbs1_seq_rcfull_ag_eager"): -0.03, ("host", "mbs1_seq_rcfull_a2a_eager"): -0.03,
    # the fourth grid call: drop-and-pad graphs (capacity padding the model does not price) and
    # the points that judge the advisor's recommendations
    ("host", "mbs8_grp_rcnone_a2a_local_droppad"): 0.152, ("host", "mbs4_grp_rcfull_a2a_eager"): -0.028,
    ("host", "mbs2_grp_rcfull_a2a_eager"): -0.015, ("host", "mbs1_grp_rcnone_a2a_eager"): -0.033,
    ("mem", "mbs4_grp_rcnone_a2a_eager"): -0.005, ("mem", "mbs2_seq_rcnone_a2a_eager"): -0.005,
    # the fifth grid call's new point, and the tenth's
    ("host", "mbs8_seq_rcnone_a2a_eager"): -0.03, ("mem", "mbs2_grp_rcnone_a2a_eager"): -0.005,
}


def test_h200_grid_max_allocated():
    if not GRID.exists():
        pytest.skip("no bench/grid/grid_h200.json")
    grid = json.loads(GRID.read_text())
    seen = set()
    for shape, spec in grid["shapes"].items():
        flags = spec["flags"]
        given = {flags[i].lstrip("-").replace("-", "_"): int(flags[i + 1])
                 for i in range(0, len(flags), 2)}
        doc = copy.deepcopy(MEM)
        for k in ("num_layers", "hidden_size", "ffn_hidden_size", "num_attention_heads",
                  "num_experts", "moe_router_topk", "moe_ffn_hidden_size", "vocab_size"):
            doc["model"][k] = given[k]
        doc["model"]["num_query_groups"] = given["num_attention_heads"]
        doc["model"]["padded_vocab_size"] = given["vocab_size"]
        doc["shape"]["seq_length"] = given["seq_length"]
        for point in spec["points"]:
            knobs = point["knobs"]
            changes = {
                "micro_batch_size": knobs["mbs"], "global_batch_size": given["global_batch_size"],
                "recompute_granularity": None if knobs["recompute"] == "none" else knobs["recompute"],
                "moe_grouped_gemm": knobs["grouped"],
                "moe_token_dispatcher_type": knobs["dispatcher"]}
            if point["status"] == "oom":  # each must be predicted not to fit
                assert predict_peak(doc, changes, measured_peak_bytes=None,
                                    gpu_memory_bytes=139.8 * GIB).fits is False, point["id"]
            if point["status"] != "ok":
                continue
            est = config_peak(doc, changes=changes)
            error = est.allocated_bytes / (point["max_alloc_gib"] * GIB) - 1
            assert error == pytest.approx(GRID_ERRORS[(shape, point["id"])], abs=0.01), point["id"]
            seen.add((shape, point["id"]))
    assert seen == set(GRID_ERRORS)



# ------------------------------------------------------- Megatron-LM itself (issue #28 item 18)

# The runs of NVIDIA Megatron-LM's pretrain_gpt.py on one H200 without Transformer Engine
# (local spec, unfused attention, bf16, Adam with fp32 main params), with Megatron-LM's defaults
# where the issue states nothing: 16 heads at hidden 2048 (32 at 4096), tied embeddings,
# LayerNorm, dropout 0.1, vocab 32768, GBS 8, and the softmax in bf16 (`--attention-softmax-in-fp32`
# is a store_true flag, off by default: megatron/training/arguments.py).
def megatron_lm(layers: int, hidden: int, heads: int, experts: int, ffn: int,
                **args: Any) -> dict[str, Any]:
    return {
        "schema": "moetune.contract/1",
        "model": {"num_layers": layers, "hidden_size": hidden, "ffn_hidden_size": ffn,
                  "num_attention_heads": heads, "num_query_groups": heads, "num_experts": experts,
                  "moe_router_topk": 2, "moe_ffn_hidden_size": ffn, "moe_layer_freq": 1,
                  "vocab_size": 32768, "padded_vocab_size": 32768, "swiglu": True,
                  "untie_embeddings_and_output_weights": False, "normalization": "LayerNorm"},
        "hardware": {"gpu_model": "H200", "gpu_memory_gb": 139.8, "gpus_per_node": 1,
                     "nodes": 1},
        "precision": {"params": "bf16"},
        "shape": {"seq_length": 4096, "micro_batch_size": 1, "global_batch_size": 8},
        "parallelism": {"tp": 1, "pp": 1, "cp": 1, "ep": 1, "dp": 1, "world_size": 1},
        "versions": {"transformer_engine": None},
        "megatron_args": {"transformer_impl": "local", "attention_dropout": 0.1,
                          "attention_softmax_in_fp32": False, "use_distributed_optimizer": False,
                          "micro_batch_size": 1, "global_batch_size": 8, **args},
    }


def test_bf16_softmax_keeps_korthikantis_five_bytes_per_score() -> None:
    from moetune.analyzer.planner.attention import UNFUSED_SCORE_PEAK_BF16

    doc = megatron_lm(6, 2048, 16, 16, 1408)
    est = config_peak(doc)
    assert est.work.softmax_fp32 is False and "softmax in bf16" in est.attention
    fp32 = config_peak({**doc, "megatron_args": {**doc["megatron_args"],
                                                 "attention_softmax_in_fp32": True}})
    scores = 6 * 16 * 4096 ** 2  # per micro-batch, all layers
    # 2 (softmax output) + 1 (dropout mask) + 2 (dropped probabilities) against 6 + 1
    assert fp32.breakdown["activations"] - est.breakdown["activations"] == \
        pytest.approx(2 * scores, rel=1e-9)
    no_dropout = config_peak({**doc, "megatron_args": {**doc["megatron_args"],
                                                       "attention_dropout": 0.0}})
    assert est.breakdown["activations"] - no_dropout.breakdown["activations"] == \
        pytest.approx(3 * scores, rel=1e-9)
    assert UNFUSED_SCORE_PEAK_BF16 == UNFUSED_SCORE_PEAK / 2
    # --apply-query-key-layer-scaling forces the fp32 softmax
    scaled = config_peak({**doc, "megatron_args": {**doc["megatron_args"],
                                                   "apply_query_key_layer_scaling": True}})
    assert scaled.work.softmax_fp32 is True


@pytest.mark.parametrize(("mbs", "measured_gib"), [(1, 21.0), (2, 34.4)])
def test_megatron_lm_six_layer_model_within_15_percent(mbs: int, measured_gib: float) -> None:
    """6 layers, hidden 2048, 16 experts top-2, expert FFN 1408, seq 4096: 21.0 and 34.4 GiB max
    allocated at MBS 1 and 2 (issue #28 item 18). The model alone reads −6.9 % and −13.4 % for the
    peak of a first iteration: torch's Adam (Megatron's optimizer without TE and Apex) builds its
    moments at its first step, after that iteration's forward and backward, so Megatron's line
    after iteration 1 does not hold them (Megatron prints a second line after iteration 2 for
    that reason). With them (a later line) the model reads +28.5 % and +8.3 %: the figures are
    taken as the after-iteration-1 lines, which their own log would settle."""
    est = config_peak(megatron_lm(6, 2048, 16, 16, 1408), changes={"micro_batch_size": mbs})
    first = (est.allocated_bytes - est.moments_bytes) / GIB
    assert first / measured_gib - 1 == pytest.approx(0, abs=0.15)
    assert est.allocated_bytes / GIB > measured_gib  # the steady peak holds the moments too


def test_megatron_lm_eight_layer_mbs8_full_recompute_is_not_predicted_to_fit() -> None:
    """8 layers, hidden 4096, 8 experts top-2, seq 4096, MBS 8 with full recompute ran out of
    memory on the H200 asking for 16 GiB: one fp32 b·a·s² score tensor at MBS 8 × 32 heads × 4096²,
    so that run's softmax was fp32. The expert FFN is not stated: 3030 puts the model's MBS 1 full
    recompute peak (the optimizer step's, with torch's Adam) at the 63.6 GiB its log measured. The
    model alone then puts MBS 8 within 2 % of the GPU: its verdict, the one `recommend` and `fit`
    print, is `tight`, not `fits`; with the log's 63.6 / 73.9 GiB as the anchor it does not fit
    (tests/test_memory_verdict.py)."""
    from moetune.analyzer.planner.verdict import judge, of_estimate

    doc = megatron_lm(8, 4096, 32, 8, 3030, attention_softmax_in_fp32=True,
                      recompute_granularity="full", recompute_method="uniform",
                      recompute_num_layers=1)
    assert config_peak(doc).allocated_bytes / GIB == pytest.approx(63.6, abs=0.5)
    mbs8 = config_peak(doc, changes={"micro_batch_size": 8})
    assert mbs8.peak_bytes / GIB > 0.98 * 139.8
    assert judge(doc, {"micro_batch_size": 8}, {"device_gib": 139.8}).verdict == "tight"
    assert of_estimate(mbs8.allocated_bytes, mbs8.dynamic_bytes, expandable_segments=False,
                       capacity_gib=139.8).verdict == "tight"


@pytest.mark.parametrize(("name", "error"), [("mlm_mem_mbs1_rcfull", -0.008),
                                             ("mlm_host_mbs1_rcfull", -0.031),
                                             ("mlm_host_mbs8_rcnone", 0.004)])
def test_megatron_lm_fixture_runs_max_allocated(name: str, error: float) -> None:
    """NVIDIA Megatron-LM's own pretrain_gpt.py on the H200 (fixtures/traces/mlm_*: no TE, the
    local spec, bf16 softmax), priced from the contract its log gives, against the log's last max
    allocated: the full-recompute runs' peak is the optimizer step's (torch Adam's fp32 temporary);
    the MBS 8 run's is its activations, and its line after iteration 1 lacks Adam's moments (4.67
    against 5.69 GiB later: 1.0 GiB = 8 B × its 0.13 G parameters)."""
    from moetune.analyzer.megatron_args import contract_from_log
    from moetune.executor.logparse import parse_file

    log = TRACES / name / "train.log"
    doc = contract_from_log(log.read_text())
    est = config_peak(doc)
    assert est.work.softmax_fp32 is False and est.work.torch_adam is True
    lines = parse_file(log).memory.sort("iteration")
    measured = lines.get_column("max_allocated_mb")[-1] * MIB
    assert est.allocated_bytes / measured - 1 == pytest.approx(error, abs=0.01)
    if name == "mlm_host_mbs8_rcnone":
        first = lines.get_column("max_allocated_mb")[0] * MIB
        assert (est.allocated_bytes - est.moments_bytes) / first - 1 == pytest.approx(0, abs=0.02)


def test_an_iteration_one_anchor_takes_the_optimizer_moments() -> None:
    from moetune.analyzer.planner.verdict import judge

    doc = megatron_lm(6, 2048, 16, 16, 1408)
    mem = {"source": "log", "peak_allocated_gib": 21.0, "peak_reserved_gib": 24.0,
           "device_gib": 139.8}
    later = judge(doc, {"micro_batch_size": 2}, {**mem, "iteration": 12})
    first = judge(doc, {"micro_batch_size": 2}, {**mem, "iteration": 1})
    moments = config_peak(doc).moments_bytes / GIB
    assert first.allocated_gib == pytest.approx(later.allocated_gib + moments, abs=0.02)
    assert "after iteration 1 only" in first.basis


MLM_GRID = ROOT / "bench" / "grid_mlm" / "grid.json"


def test_megatron_lm_grid_max_allocated_and_its_oom_point() -> None:
    """bench/grid_mlm/grid.json: NVIDIA Megatron-LM's pretrain_gpt.py on the H200 (no TE), every
    point's max allocated from its log. The model alone, from the contract the shape's fixture log
    gives with the point's knobs: within 3 % of each point that ran, but the memory shape's
    selective recompute at MBS 4 and 8, overpriced by 2.2 and 3.9 %. The point that ran out of
    memory (mem MBS 8 without recompute: 131.3 GiB after two iterations, then out of memory) is
    priced at 132.7 GiB and is never `fits`: `tight` alone or anchored on MBS 4 (87.4 / 89.8
    GiB), `does not fit` anchored on MBS 1 (54.5 / 62.5 GiB, whose allocator kept 8 GiB of slack)."""
    import sys

    from moetune.analyzer.contract import with_args
    from moetune.analyzer.megatron_args import contract_from_log
    from moetune.analyzer.planner.verdict import judge

    if not MLM_GRID.exists():
        pytest.skip("no bench/grid_mlm/grid.json")
    sys.path.insert(0, str(ROOT / "bench"))
    from mlm_spec import parse_id

    grid = json.loads(MLM_GRID.read_text())
    base = {shape: contract_from_log((TRACES / f"mlm_{shape}_mbs1_rcfull" / "train.log").read_text())
            for shape in ("host", "mem")}

    def changes(point: str) -> dict[str, Any]:
        k = parse_id(point)
        full = k["recompute"] == "full"
        out = {"micro_batch_size": k["mbs"], "moe_grouped_gemm": k["grouped"],
               "recompute_granularity": None if k["recompute"] == "none" else k["recompute"],
               "recompute_method": "uniform" if full else None,
               "recompute_num_layers": 1 if full else None}
        return out | ({"cuda_graph_impl": "local"} if k["graphs"] != "eager" else {})

    seen = 0
    for p in grid["points"]:
        run = p["runs"][0]
        est = config_peak(base[p["shape"]], changes=changes(p["point"]))
        if p["status"] == "ok":
            err = est.allocated_bytes / GIB / run["max_alloc_gib"] - 1
            if p["shape"] == "mem" and p["point"].startswith(("mbs4_seq_rcselective",
                                                              "mbs8_seq_rcselective")):
                # selective recompute at seq 4096 is overpriced by 0.34-0.39 GiB a sample
                # (+2.2 % at MBS 4, +3.9 % at MBS 8): over, never under, so it errs toward tight
                assert 0 < err < 0.045, p["point"]
            else:
                assert err == pytest.approx(0, abs=0.03), p["point"]
            seen += 1
        elif p["status"] == "oom":
            doc = base[p["shape"]]
            alone = judge(doc, changes(p["point"]), {"device_gib": 139.8})
            assert alone.verdict == "tight" and alone.allocated_gib == pytest.approx(132.7, abs=0.5)
            for start, verdict in (("mbs4_seq_rcnone_a2a_eager", "tight"),
                                   ("mbs1_seq_rcnone_a2a_eager", "does not fit")):
                s = next(q for q in grid["points"] if q["point"] == start and q["shape"] == "mem")
                r = s["runs"][0]
                at = with_args(doc, changes(start))
                v = judge(at, {"micro_batch_size": 8},
                          {"source": "log", "peak_allocated_gib": r["max_alloc_gib"],
                           "peak_reserved_gib": r["max_reserved_gib"], "device_gib": 139.8,
                           "iteration": 2})
                assert v.verdict == verdict, start
    assert seen == sum(p["status"] == "ok" for p in grid["points"]) >= 11
