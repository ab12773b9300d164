"""Planner knowledge as data: planner.yaml validated by schemas/planner.schema.json, the fit
ladder built from it, and user overrides (`moetune fit --planner-config`) that move numbers."""

from __future__ import annotations

import json
import subprocess
import sys
from dataclasses import replace
from functools import cache
from pathlib import Path

import jsonschema
import pytest
import yaml
from moetune.analyzer.planner.config import BUILTIN_PATH, SCHEMA_PATH, load_planner_config, merge
from moetune.analyzer.planner.layouts import pipeline_split
from moetune.analyzer.planner.memory import (
    GIB,
    FitOptions,
    Layout,
    Workload,
    estimate_memory,
    model_spec,
)
from moetune.analyzer.planner.plan import fit_ladder, plan_fit, read_contract, request_from_contract

from moetune.errors import UserError

ROOT = Path(__file__).resolve().parents[1]
CONTRACTS = ROOT / "fixtures" / "contracts"
QWEN30 = CONTRACTS / "fit_qwen3_30b_h100.yaml"


@cache
def doc(name: str):
    return read_contract(CONTRACTS / name)


def write(tmp_path: Path, text: str, name: str = "planner.yaml") -> Path:
    p = tmp_path / name
    p.write_text(text)
    return p


def ladder(name: str, *, dense: bool = False, distributed_optimizer: bool = True, cfg=None):
    m = dict(doc(name)["model"])
    if dense:
        m.update(num_experts=0, ffn_hidden_size=m.get("ffn_hidden_size") or 4096)
    return [(r.name, r.cost) for r in fit_ladder(model_spec(m), cfg=cfg,
                                                 distributed_optimizer=distributed_optimizer)]


def test_builtin_file_is_valid_and_every_entry_says_why_and_where_from():
    schema = json.loads(SCHEMA_PATH.read_text())
    data = yaml.safe_load(BUILTIN_PATH.read_text())
    jsonschema.Draft202012Validator.check_schema(schema)
    assert not list(jsonschema.Draft202012Validator(schema).iter_errors(data))
    cfg = load_planner_config()
    assert load_planner_config() is cfg  # loaded once
    # the values the planner had as Python constants before they moved (commit fe6714d)
    assert cfg.cuda_context_bytes == 1.5 * GIB
    assert (cfg.fragmentation(True), cfg.fragmentation(False)) == (0.03, 0.10)
    assert (cfg.vocab_divisible_by, cfg.moe_imbalance_natural, cfg.headroom_wanted) == (128, 1.25, 0.15)
    assert (cfg.param_bytes_for("bf16"), cfg.param_bytes_for("fp32"), cfg.main_grad_bytes_for(None),
            cfg.main_grad_bytes_for("bf16")) == (2, 4, 4, 2)
    assert cfg.max_vpp == 8


def test_ladders_from_yaml_keep_the_order_and_costs():
    # MoE: costs add up per option; full recompute replaces the selective modules (0.33 + 0.01)
    offload = [("optimizer_offload:0.25", 0.34 + 0.9), ("optimizer_offload:0.5", 0.34 + 1.8),
               ("optimizer_offload:1.0", 0.34 + 3.2)]
    assert ladder("fit_qwen3_30b_h100.yaml") == [
        ("expandable_segments", 0.0), ("recompute:moe_act", 0.02),
        ("recompute:moe_act+layernorm", 0.04), ("precision_aware_optimizer", 0.05),
        ("recompute:full", 0.34), *offload]
    # MLA adds mla_up_proj (+0.05); no distributed optimizer in the contract adds its rung
    names = [n for n, _ in ladder("fit_deepseek_v3_h100.yaml", distributed_optimizer=False)]
    assert names[:5] == ["expandable_segments", "distributed_optimizer", "recompute:moe_act",
                         "recompute:moe_act+layernorm", "recompute:moe_act+layernorm+mla_up_proj"]
    assert dict(ladder("fit_deepseek_v3_h100.yaml"))["precision_aware_optimizer"] == \
        pytest.approx(0.10)
    # a dense model recomputes its MLP only
    assert [n for n, _ in ladder("fit_qwen3_30b_h100.yaml", dense=True)][:3] == [
        "expandable_segments", "recompute:mlp", "precision_aware_optimizer"]


@pytest.mark.parametrize(("text", "line", "key"), [
    ("rankng:\n  custom_layout: 0.5\n", 1, "rankng"),
    ("ranking:\n  custom_layout: 1\n  tensor_paralel_per_doubling: 0.5\n", 3,
     "ranking.tensor_paralel_per_doubling"),
    ("memory:\n  cuda_context_gib: {value: 2, note: x}\n", 2, "memory.cuda_context_gib.note"),
    ("fit:\n  ladder:\n    - {name: x, set: {expandable_segments: true}, cost: 0, why: w, "
     "source: s, extra: 1}\n", 3, "fit.ladder.0.extra"),
])
def test_unknown_key_is_an_error_naming_file_line_and_key(tmp_path, text, line, key):
    path = write(tmp_path, text)
    with pytest.raises(UserError) as err:
        load_planner_config(path)
    msg = str(err.value)
    assert msg.startswith(f"{path}:{line}: unknown key {key} ")
    assert "\n" not in msg


def test_schema_itself_rejects_an_unknown_key_in_the_builtin_document():
    data = yaml.safe_load(BUILTIN_PATH.read_text())
    data["ranking"]["pipeline_bubble"] = {"value": 1.0, "why": "w", "source": "s"}
    errors = list(jsonschema.Draft202012Validator(json.loads(SCHEMA_PATH.read_text()))
                  .iter_errors(data))
    assert len(errors) == 1 and "'pipeline_bubble' was unexpected" in errors[0].message


@pytest.mark.parametrize(("text", "words"), [
    ("memory:\n  cuda_context_gib: -1\n", "at memory.cuda_context_gib.value"),
    ("ranking:\n  custom_layout: high\n", "at ranking.custom_layout.value"),
    ("bytes_per_element:\n  adam_moments: 7.5\n", "at bytes_per_element.adam_moments.value"),
    ("fit:\n  ladder: []\n", "at fit.ladder"),
    ("fit:\n  ladder:\n    - {recompute_module: attention, cost: 0, why: w, source: s}\n",
     "at fit.ladder.0.recompute_module"),
    ("ranking: [1, 2\n", "invalid YAML"),
    ("ranking:\n  custom_layout: 1\n  custom_layout: 2\n", "duplicate key 'custom_layout'"),
    ("x: !!python/object/apply:os.system [ls]\n", "not allowed (plain YAML only)"),
    ("- 1\n- 2\n", "must be a mapping, got list"),
    ("", "empty YAML document"),
])
def test_bad_override_is_one_line_naming_the_file(tmp_path, text, words):
    path = write(tmp_path, text)
    with pytest.raises(UserError) as err:
        load_planner_config(path)
    assert str(err.value).startswith(f"{path}") and words in str(err.value)
    assert "\n" not in str(err.value)


def test_missing_override_file_is_a_user_error(tmp_path):
    with pytest.raises(UserError, match="cannot read planner config"):
        load_planner_config(tmp_path / "absent.yaml")


def test_merge_replaces_values_and_lists_but_keeps_why_and_source():
    base = yaml.safe_load(BUILTIN_PATH.read_text())
    out = merge(base, {"ranking": {"custom_layout": 0.5}, "fit": {"ladder": [{"x": 1}]}})
    assert out["ranking"]["custom_layout"] == {**base["ranking"]["custom_layout"], "value": 0.5}
    assert out["fit"]["ladder"] == [{"x": 1}]
    assert out["fit"]["headroom_wanted"] == base["fit"]["headroom_wanted"]
    assert base["ranking"]["custom_layout"]["value"] == 0.01  # input untouched


def test_override_of_a_ranking_weight_moves_the_ranking(tmp_path):
    """Qwen3-30B on 2×8 H100: the contract's own EP16 layout ranks #6, held back only by the
    cross-node dispatch term 0.15·(1 − 8/16) = 0.075. With that weight at 0 it ranks #1 at score 0,
    and every plan's score drops by exactly its own ep_cross_node term."""
    before = plan_fit(request_from_contract(doc(QWEN30.name)))
    cfg = load_planner_config(write(tmp_path, "ranking:\n  ep_cross_node: 0\n"))
    after = plan_fit(request_from_contract(doc(QWEN30.name), config=cfg))
    assert (before.current_rank, after.current_rank) == (6, 1)
    assert after.plans[0].layout.key() == (1, 1, 16, 1, None, 16, 1) and after.plans[0].score == 0
    old = {p.layout.key(): p for p in before.plans}
    assert len(after.plans) == len(old) == 998  # weights rank, they never change what fits
    moved = 0
    for p in after.plans:
        q = old[p.layout.key()]
        cross = dict((t, v) for t, v, _ in q.reasons).get("ep_cross_node", 0.0)
        group = p.layout.ep * p.layout.etp
        assert cross == pytest.approx(0.15 * max(0.0, 1 - 8 / group), abs=1e-12)
        assert p.score == pytest.approx(q.score - cross, abs=2e-6)  # scores are rounded to 1e-6
        moved += cross > 0
    assert moved > 0
    assert [p.score for p in after.plans] == sorted(p.score for p in after.plans)


def test_override_of_a_memory_constant_shifts_every_estimate_exactly(tmp_path):
    cfg = load_planner_config(write(tmp_path, "memory:\n  cuda_context_gib: 2.5\n"))
    m = model_spec(doc(QWEN30.name)["model"])
    stages, how, text = pipeline_split(m.num_layers, 2, None, 0)
    lay = Layout(tp=1, cp=1, dp=8, pp=2, vpp=None, ep=8, etp=1, edp=2, stages=stages,
                 pp_layout=text, pp_split=how)
    w = Workload(seq_length=4096, global_batch_size=1024)
    for opts in (FitOptions(), FitOptions(expandable_segments=False, recompute="full")):
        a, b = estimate_memory(m, lay, w, opts), estimate_memory(m, lay, w, opts, cfg=cfg)
        assert b.peak_bytes - a.peak_bytes == pytest.approx(GIB)
        assert b.breakdown["overhead"] - a.breakdown["overhead"] == pytest.approx(GIB)


def test_override_of_the_ladder_limits_the_fit_options(tmp_path):
    """A ladder of one rung: only layouts that fit with expandable segments alone remain."""
    text = ("fit:\n  ladder:\n    - {name: expandable_segments, set: {expandable_segments: true},"
            " cost: 0, why: only this, source: test}\n")
    cfg = load_planner_config(write(tmp_path, text))
    before = plan_fit(request_from_contract(doc(QWEN30.name)))
    after = plan_fit(request_from_contract(doc(QWEN30.name), config=cfg))
    assert {p.rung.name for p in after.plans} == {"expandable_segments"}
    kept = {p.layout.key() for p in before.plans if p.rung.name == "expandable_segments"}
    assert {p.layout.key() for p in after.plans} >= kept
    assert 0 < len(after.plans) < len(before.plans)


def _cli_has_flag() -> bool:
    out = subprocess.run([sys.executable, "-m", "moetune", "fit", "--help"], cwd=ROOT,
                         capture_output=True, text=True)
    return "--planner-config" in out.stdout


@pytest.mark.skipif(not _cli_has_flag(), reason="moetune/commands/fit.py lacks --planner-config")
def test_cli_planner_config_merges_and_rejects(tmp_path):
    good = write(tmp_path, "ranking:\n  ep_cross_node: 0\n", "good.yaml")
    bad = write(tmp_path, "ranking:\n  ep_crossnode: 0\n", "bad.yaml")

    def fit(*extra):
        return subprocess.run([sys.executable, "-m", "moetune", "fit", "--contract", str(QWEN30),
                               "--json", *extra], cwd=ROOT, capture_output=True, text=True)

    r = fit("--planner-config", str(good))
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["current_layout_rank"] == 1
    r = fit("--planner-config", str(bad))
    assert r.returncode == 2 and r.stdout == ""
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and str(bad) in lines[0] and "ranking.ep_crossnode" in lines[0]


def test_builtin_file_as_override_changes_nothing(tmp_path):
    copy = write(tmp_path, BUILTIN_PATH.read_text(encoding="utf-8"))
    assert replace(load_planner_config(copy), source="") == replace(load_planner_config(),
                                                                     source="")
