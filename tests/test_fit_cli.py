"""`moetune fit`: published layouts rate feasible and rank near the top; impossible requests name
their binding constraint; --json validates against schemas/fit.schema.json. Real subprocesses."""

from __future__ import annotations

import json
import subprocess
import sys
from functools import cache
from pathlib import Path

import jsonschema
import pytest
from moetune.analyzer.planner.plan import plan_fit, read_contract, request_from_contract

ROOT = Path(__file__).resolve().parents[1]
CONTRACTS = ROOT / "fixtures" / "contracts"
SCHEMA = json.loads((ROOT / "schemas" / "fit.schema.json").read_text())


@cache
def outcome(name: str):
    return plan_fit(request_from_contract(read_contract(CONTRACTS / name)))


def fit(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "moetune", "fit", *args], cwd=ROOT,
                          capture_output=True, text=True, timeout=120)


# "Near the top": the published layout (TP, CP, PP, VPP, EP, ETP) is among the fitting plans, in
# the best 2 % of them, and its score is within 0.15 of the best plan's (scores are penalties in
# rough step-time fractions). Measured ranks: Qwen3-30B 6/998, Mixtral 11/4239, Qwen3-235B 55/6981,
# DeepSeek-V3 151/11427.
@pytest.mark.parametrize("name", [
    "fit_qwen3_30b_h100.yaml", "fit_mixtral_8x7b_h100.yaml", "fit_qwen3_235b_h100.yaml",
    pytest.param("fit_deepseek_v3_h100.yaml", marks=pytest.mark.slow),
])
def test_published_layouts_are_feasible_and_near_the_top(name):
    out = outcome(name)
    assert out.plans and out.current_rank is not None, "published layout predicted not to fit"
    published = out.plans[out.current_rank - 1]
    assert published.memory.peak_gib <= out.request.gpu_memory_gib
    assert out.current_rank <= 0.02 * len(out.plans)
    assert published.score - out.plans[0].score <= 0.15


@pytest.mark.slow
def test_deepseek_v3_published_layout_gets_mla_up_proj_recompute():
    # the published H100 recipe recomputes `mla_up_proj`; so does the planner's fit ladder
    out = outcome("fit_deepseek_v3_h100.yaml")
    rung = out.plans[out.current_rank - 1].rung.options
    assert rung.recompute == "selective" and "mla_up_proj" in rung.recompute_modules


def test_json_is_valid_and_carries_meshes_memory_flags_and_check():
    r = fit("--contract", str(CONTRACTS / "fit_qwen3_30b_h100.yaml"), "--json", "--top", "3")
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    jsonschema.validate(doc, SCHEMA)
    assert len(doc["plans"]) == 3 and doc["counts"]["fit"] >= 3
    p = doc["plans"][0]
    b = p["memory"]["breakdown_gib"]
    assert p["memory"]["peak_gib"] == pytest.approx(sum(b.values()), abs=0.01)
    assert p["memory"]["headroom_gib"] == pytest.approx(80 - p["memory"]["peak_gib"], abs=0.01)
    assert f"--expert-model-parallel-size {p['moe']['ep']}" in p["flags"]
    assert "--fake-process-group" in p["check"]["command"]
    assert "--moe-token-dispatcher-type alltoall" in p["check"]["command"]  # flex ⊥ fake PG
    assert any("--fake-init-process-group" in n for n in p["check"]["notes"])


def test_human_output_always_prints_both_meshes():
    r = fit("--contract", str(CONTRACTS / "fit_mixtral_8x7b_h100.yaml"), "--top", "2")
    assert r.returncode == 0, r.stderr
    assert r.stdout.count("Attention: TP") == 2 and r.stdout.count("MoE: ETP") == 2


@pytest.mark.parametrize(("args", "binding", "words"), [
    (["--contract", str(CONTRACTS / "fit_impossible_experts.yaml")],
     "experts_divisible_by_ep", "num_experts % EP == 0"),
    (["--contract", str(CONTRACTS / "fit_impossible_memory.yaml")], "memory", "memory binds"),
    (["--contract", str(CONTRACTS / "fit_qwen3_30b_h100.yaml"), "--gpus", "0"],
     "topology", "gpus must be ≥ 1"),
    (["--contract", str(CONTRACTS / "fit_qwen3_30b_h100.yaml"), "--gpus", "4"],
     "topology", "gpus_per_node (8) > gpus (4)"),
])
def test_impossible_requests_name_the_binding_constraint(args, binding, words):
    r = fit(*args, "--json")
    assert r.returncode == 1, r.stderr
    doc = json.loads(r.stdout)
    jsonschema.validate(doc, SCHEMA)
    assert doc["plans"] == [] and binding in doc["no_layout"]["binding"]
    assert words in doc["no_layout"]["explanation"]
    if binding == "memory":  # the human rendering once (each subprocess costs ~1 s)
        human = fit(*args)
        assert human.returncode == 1 and "no legal layout fits: memory binds" in human.stdout


def test_missing_model_dimensions_are_a_one_line_user_error(tmp_path):
    bad = tmp_path / "c.yaml"
    bad.write_text("schema: moetune.contract/1\nmodel: {num_layers: 4, num_experts: 8}\n"
                   "hardware: {gpu_memory_gb: 80, gpus_per_node: 8, nodes: 1}\n"
                   "shape: {seq_length: 4096}\n")
    r = fit("--contract", str(bad))
    assert r.returncode == 2 and r.stdout == ""
    line = r.stderr.strip()
    assert "\n" not in line and "Traceback" not in r.stderr and str(bad) in line
    for field in ("model.hidden_size", "model.num_attention_heads", "model.vocab_size",
                  "model.moe_router_topk"):
        assert field in line


def test_flags_are_spelled_by_the_knob_catalog():
    from moetune.analyzer.planner.plan import megatron_flags, plan_args
    from moetune.rules.load import load_catalog

    catalog = load_catalog().knobs
    out = outcome("fit_qwen3_235b_h100.yaml")
    # arguments rules/knobs.yaml lacks (requested from its owner); rendered as --foo-bar meanwhile
    allowed = {"account_for_embedding_in_pipeline_split", "account_for_loss_in_pipeline_split"}
    seen = set()
    for plan in out.plans[:200]:
        for (arg, _), flag in zip(plan_args(plan), megatron_flags(plan), strict=True):
            seen.add(arg)
            assert arg in catalog or arg in allowed, arg
            if arg in catalog:
                assert flag.split()[0] == catalog[arg].spec["flag"]
    assert {"tensor_model_parallel_size", "expert_model_parallel_size",
            "use_distributed_optimizer"} <= seen
