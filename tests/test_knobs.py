"""rules/knobs.yaml: every §5 knob of moe-tuning-knowledge.md by its Megatron argument name,
current flags plus §10 aliases, §6 constraints and training equivalence."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
from moetune.rules.engine import (
    _Inputs,
    audit_verdicts,
    facts,
    legality,
    megatron_args,
    render_flags,
)
from moetune.rules.load import CATALOG as CATALOG_DIR
from moetune.rules.load import Rule, load_catalog

from moetune import conditions as expr

ROOT = Path(__file__).resolve().parents[1]
KNOWLEDGE = ROOT.parent / "shared" / "docs" / "moe-tuning-knowledge.md"
CAT = load_catalog()
# Arguments newer than the argument list analyzer/contract.py knows (MLM main @ d98e8a6 per §5).
NEWER_ARGS = {
    "ep_overlap_early_attn_memory_release", "moe_hybridep_num_blocks_permute",
    "moe_hybridep_num_blocks_unpermute", "moe_hybridep_num_sms_preprocessing",
    "moe_permute_fusion_into_hybridep", "moe_use_grouped_tensor", "optimizer_cuda_graph",
    "use_nccl_ub", "moe_paged_stash_buffer_size_factor_cuda", "moe_paged_stash_buffer_size_factor_cpu",
    "delta_offload_bytes_across_pp_ranks", "fine_grained_offloading_max_inflight_offloads",
}


def all_flags() -> dict[str, str]:
    out: dict[str, str] = {}
    for k in CAT.knobs.values():
        sp = k.spec
        for f in [sp.get("flag"), sp.get("negative_flag")] + [d["flag"] for d in sp.get("deprecated_flags", [])]:
            if f:
                assert f not in out, f"{f} in both {out[f]} and {k.name}"
                out[f] = k.name
    return out


def section(doc: str, start: str, end: str) -> str:
    return doc[doc.index(start):doc.index(end)]


@pytest.fixture(scope="module")
def knowledge() -> str:
    if not KNOWLEDGE.exists():
        pytest.skip(f"knowledge doc not found at {KNOWLEDGE}")
    return KNOWLEDGE.read_text(encoding="utf-8")


def test_every_section5_flag_is_a_knob(knowledge: str) -> None:
    s5 = section(knowledge, "## 5. Knob catalog", "## 6. Hard constraints")
    # "--moe-hybridep-num-blocks-{permute,unpermute}"-style brace groups leave a trailing dash
    flags = {f for f in re.findall(r"--[a-z0-9][a-z0-9-]*[a-z0-9]", s5) if f != "--moe"}
    flags -= {"--moe-hybridep-num-blocks", "--moe-paged-stash-buffer-size-factor"}
    missing = flags - set(all_flags())
    assert not missing, sorted(missing)


def test_every_section5_env_is_a_knob(knowledge: str) -> None:
    s5 = section(knowledge, "## 5. Knob catalog", "## 6. Hard constraints")
    envs = set(re.findall(r"`([A-Z][A-Z0-9_]{5,}[A-Z0-9])`", s5)) | {
        "PYTORCH_CUDA_ALLOC_CONF", "CUDA_DEVICE_MAX_CONNECTIONS"}
    envs -= {"NVTE_NORM_"}
    missing = {e for e in envs if e not in CAT.knobs}
    assert not missing, sorted(missing)
    assert all(CAT.knobs[e].kind == "env" for e in envs)


def test_flag_drift_section10(knowledge: str) -> None:
    s10 = section(knowledge, "## 10. Flag-name drift", "## 11. Starting rules")
    flags = all_flags()
    for old in re.findall(r"--[a-z0-9][a-z0-9-]*[a-z0-9]", s10):
        assert old in flags, old
    expect = {
        "--cuda-graph-scope": "cuda_graph_modules", "--enable-cuda-graph": "cuda_graph_impl",
        "--external-cuda-graph": "cuda_graph_impl", "--moe-enable-deepep": "moe_token_dispatcher_type",
        "--moe-deepep-num-sms": "moe_flex_dispatcher_num_sms",
        "--moe-hybridep-num-sms": "moe_flex_dispatcher_num_sms",
        "--moe-router-padding-for-fp8": "moe_router_padding_for_quantization",
        "--moe-layer-recompute": "recompute_modules", "--fake-init-process-group": "fake_process_group",
        "--offload-optimizer-states": "optimizer_cpu_offload",
    }
    for old, knob in expect.items():
        assert flags[old] == knob
        assert old in {d["flag"] for d in CAT.knobs[knob].spec["deprecated_flags"]}


def test_megatron_argument_names() -> None:
    from moetune.analyzer.contract import known_megatron_args

    args = {k.name for k in CAT.knobs.values() if k.kind == "arg"}
    assert args - known_megatron_args() <= NEWER_ARGS
    assert "fp8" in args and "fp8_format" not in args  # --fp8-format's dest is `fp8`
    assert CAT.knobs["fp8"].spec["flag"] == "--fp8-format"


def test_training_equivalence() -> None:
    for name in ("fp8", "fp4", "moe_expert_capacity_factor", "moe_pad_expert_input_to_capacity",
                 "moe_router_force_load_balancing", "moe_expert_rank_capacity_factor"):
        spec = CAT.knobs[name].spec
        assert spec["training_equivalent"] is False and spec.get("equivalence_note"), name
    assert CAT.knobs["overlap_moe_expert_parallel_comm"].spec["training_equivalent"] is True


def test_flag_rendering() -> None:
    k = CAT.knobs
    assert render_flags(k["moe_grouped_gemm"], True) == (["--moe-grouped-gemm"], [])
    assert render_flags(k["moe_grouped_gemm"], False) == ([], ["--moe-grouped-gemm"])
    assert render_flags(k["check_for_nan_in_loss_and_grad"], False) == (
        ["--no-check-for-nan-in-loss-and-grad"], [])
    assert render_flags(k["cuda_graph_modules"], ["attn", "moe_router"]) == (
        ["--cuda-graph-modules attn moe_router"], [])
    assert render_flags(k["CUDA_DEVICE_MAX_CONNECTIONS"], 32) == (["CUDA_DEVICE_MAX_CONNECTIONS=32"], [])


def test_rules_spell_only_current_flags() -> None:
    # knobs.yaml is the only home of flag spellings: rule prose may quote flags, never stale ones.
    flags = all_flags()
    current = {f for f, n in flags.items()
               if f in (CAT.knobs[n].spec.get("flag"), CAT.knobs[n].spec.get("negative_flag"))}
    for path in CATALOG_DIR.rglob("*.yaml"):
        for f in re.findall(r"--[a-z0-9][a-z0-9-]*[a-z0-9]", path.read_text(encoding="utf-8")):
            assert f in current, f"{path.name}: {f}"


def blocked(knob: str, to: Any, args: dict[str, Any], **contract: Any) -> list[str]:
    doc = {"label": "benchmark-only",
           "hardware": {"gpu_model": "H100", "gpus_per_node": 8, "nodes": 2},
           "versions": {"transformer_engine": "2.8.0", "pytorch": "2.8.0", "deepep": "1.2.1"},
           "shape": {"static": True}, "env": {"CUDA_DEVICE_MAX_CONNECTIONS": "32"},
           "megatron_args": {"bf16": True, "expert_model_parallel_size": 16,
                             "moe_token_dispatcher_type": "alltoall", **args}, **contract}
    rule = Rule("x.y", {"change": {"knob": knob, "to": to}},
                expr.parse({"metric": "walls.host", "op": ">", "value": 0}), ROOT / "x.yaml")
    inp = _Inputs({}, doc, megatron_args(doc), audit_verdicts(None), facts(doc, CAT), CAT)
    return legality(rule, inp)[0]


def test_section6_constraints() -> None:
    assert blocked("overlap_moe_expert_parallel_comm", True, {}) == []
    assert blocked("overlap_moe_expert_parallel_comm", True, {"moe_shared_expert_overlap": True})
    assert blocked("overlap_moe_expert_parallel_comm", True, {"pipeline_model_parallel_size": 2})
    assert not blocked("overlap_moe_expert_parallel_comm", True,
                       {"pipeline_model_parallel_size": 2, "virtual_pipeline_model_parallel_size": 4})
    assert blocked("overlap_moe_expert_parallel_comm", True, {}, env={"CUDA_DEVICE_MAX_CONNECTIONS": "1"})
    # CUDA-graph `moe` scope ⇔ drop-and-pad
    assert blocked("cuda_graph_modules", ["moe"], {"cuda_graph_impl": "transformer_engine"})
    assert not blocked("cuda_graph_modules", ["moe"], {
        "cuda_graph_impl": "transformer_engine", "moe_expert_capacity_factor": 1.0,
        "moe_pad_expert_input_to_capacity": True})
    assert blocked("cuda_graph_modules", ["moe_preprocess"], {})  # ⇒ moe_router
    assert blocked("moe_token_dispatcher_type", "flex", {"fake_process_group": True})
    assert blocked("tp_comm_overlap", True, {"tensor_model_parallel_size": 2, "sequence_parallel": True}) == []
    assert blocked("tp_comm_overlap", True, {"tensor_model_parallel_size": 1, "sequence_parallel": True})
    assert blocked("overlap_param_gather", True, {"use_distributed_optimizer": False})
    assert blocked("moe_router_fusion", True, {}, versions={"transformer_engine": "2.6.0"})
    assert blocked("recompute_modules", ["moe_act"], {"moe_grouped_gemm": False})
    assert blocked("PYTORCH_CUDA_ALLOC_CONF", "expandable_segments:True", {"use_nccl_ub": True})
    assert blocked("moe_flex_dispatcher_backend", "deepep",
                   {"moe_token_dispatcher_type": "flex", "moe_flex_dispatcher_backend": "hybridep"},
                   hardware={"gpu_model": "GB200", "nvlink_domain_size": 72})
