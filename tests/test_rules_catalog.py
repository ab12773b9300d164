"""Every built-in rule against its own fixtures (Semgrep style): it fires on `fires`, stays quiet
on `quiet`, is blocked (condition true, change illegal) on `blocked`. Fixture documents live in
fixtures/diagnoses/ and are checked against the diagnosis and contract schemas first."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import jsonschema
import pytest
from moetune.rules.docgen import render as render_docs
from moetune.rules.engine import Options, recommend
from moetune.rules.load import CATALOG, load_catalog, load_rules

from fixtures.diagnoses import load, names

ROOT = Path(__file__).resolve().parents[1]
RULES = load_rules()
CATALOG_KNOBS = load_catalog()
FROZEN_IDS = {
    "communication.alltoall-dispatcher", "communication.dp-grad-reduce-overlap",
    "communication.dp-param-gather-overlap", "communication.ep-overlap",
    "communication.expert-bias-balancing", "communication.flex-deepep",
    "communication.flex-dispatcher-sms", "communication.flex-hybridep",
    "communication.tp-comm-overlap", "compute.fp8-blockwise", "compute.fp8-mxfp8",
    "compute.grouped-gemm", "compute.grouped-gemm-ignored", "host.cuda-graphs", "host.cuda-graphs-attn", "host.larger-micro-batch",
    "host.manual-gc", "host.permute-fusion", "host.router-fusion", "memory.expandable-segments",
    "memory.fine-grained-offload", "memory.selective-recompute",
}
_RESULTS: dict[str, dict[str, Any]] = {}


def result(name: str) -> dict[str, Any]:
    if name not in _RESULTS:
        s = load(name)
        _RESULTS[name] = recommend(RULES, s["diagnosis"], s["contract"], s["audit"],
                                   options=Options(show_quiet=True), catalog=CATALOG_KNOBS)
    return _RESULTS[name]


def ids(doc: dict[str, Any], key: str) -> set[str]:
    return {r["rule"] for r in doc.get(key, [])}


CASES = [
    (rid, kind, name)
    for rid, rule in RULES.items()
    for kind in ("fires", "quiet", "blocked")
    for name in rule.spec["fixtures"].get(kind, [])
]


@pytest.mark.parametrize(("rid", "kind", "name"), CASES, ids=[f"{r}-{k}-{n}" for r, k, n in CASES])
def test_rule_fixture(rid: str, kind: str, name: str) -> None:
    doc = result(name)
    if kind == "fires":
        assert rid in ids(doc, "recommendations"), doc["blocked"]
    elif kind == "quiet":
        assert rid in ids(doc, "quiet")
        quiet = next(q for q in doc["quiet"] if q["rule"] == rid)
        assert quiet["quiet"] == RULES[rid].spec["quiet"]
    else:  # blocked by the rules, or only by the environment (a prerequisite)
        assert rid in ids(doc, "blocked") | ids(doc, "prerequisites")
        assert rid not in ids(doc, "recommendations")


def test_every_rule_has_fire_quiet_and_existing_fixtures() -> None:
    available = set(names())
    for rule in RULES.values():
        fx = rule.spec["fixtures"]
        assert fx["fires"] and fx["quiet"], rule.id
        missing = {n for k in ("fires", "quiet", "blocked") for n in fx.get(k, [])} - available
        assert not missing, (rule.id, missing)


def test_frozen_rule_ids() -> None:
    # Ids are public (CLI, JSON, ledger): renaming one must be deliberate.
    assert set(RULES) >= FROZEN_IDS
    assert len(RULES) >= 22


def test_starting_rules_covered() -> None:
    # the published starting rules (Megatron-Bridge perf skills) each map to at least one rule's knob.
    knobs = {r.knob for r in RULES.values()}
    assert {
        "moe_token_dispatcher_type", "overlap_moe_expert_parallel_comm", "cuda_graph_impl",
        "moe_router_fusion", "moe_permute_fusion", "moe_grouped_gemm", "fp8",
        "overlap_grad_reduce", "overlap_param_gather", "tp_comm_overlap",
        "PYTORCH_CUDA_ALLOC_CONF", "recompute_granularity", "fine_grained_activation_offloading",
        "moe_flex_dispatcher_num_sms", "moe_router_enable_expert_bias", "manual_gc",
        "micro_batch_size", "cuda_graph_modules", "transformer_impl",
    } <= knobs


@pytest.mark.parametrize("name", names())
def test_fixture_documents_are_valid(name: str) -> None:
    from moetune.analyzer.contract import check_contract

    s = load(name)
    schema = json.loads((ROOT / "schemas" / "diagnosis.schema.json").read_text())
    jsonschema.validate(s["diagnosis"], schema)
    errors = [p for p in check_contract(s["contract"]) if p.severity == "error"]
    assert not errors, [str(p) for p in errors]


def test_healthy_fires_nothing() -> None:
    doc = result("healthy")
    assert doc["recommendations"] == [] and doc["blocked"] == []
    assert doc["quiet_count"] == len(RULES)


def test_memory_ladder_in_order() -> None:
    """The memory ladder (Megatron-Bridge memory-tuning skill): expandable segments, then selective recompute, then offload — applying each
    recommendation to the contract unlocks the next, never the other way round."""
    s = load("full_recompute_memory")
    contract, diagnosis = s["contract"], s["diagnosis"]
    seen = []
    for _ in range(3):
        doc = recommend(RULES, diagnosis, contract, s["audit"])
        mem = [r for r in doc["recommendations"] if r["wall"] == "memory"]
        assert len(mem) == 1, [r["rule"] for r in mem]
        rec = mem[0]
        seen.append(rec["rule"])
        ch = rec["change"]
        if ch["knob"] == "PYTORCH_CUDA_ALLOC_CONF":
            contract = {**contract, "env": {**contract["env"], ch["knob"]: ch["to"]}}
        else:
            args = {**contract["megatron_args"], ch["knob"]: ch["to"], **ch.get("with", {})}
            contract = {**contract, "megatron_args": args}
        # the next A/B still recomputes 15% of the time (selective)
        diagnosis = {**diagnosis, "observed": {**diagnosis["observed"], "recompute_fraction": 0.15}}
    assert seen == ["memory.expandable-segments", "memory.selective-recompute",
                    "memory.fine-grained-offload"]


def test_dispatcher_bring_up_starts_with_alltoall() -> None:
    # allgather → alltoall first; the flex backends only apply from alltoall.
    doc = result("allgather_ep_comm")
    rules = ids(doc, "recommendations")
    assert "communication.alltoall-dispatcher" in rules
    assert not rules & {"communication.flex-deepep", "communication.flex-hybridep"}


def test_docs_generated_from_yaml_are_current() -> None:
    text = (ROOT / "docs" / "rules.md").read_text(encoding="utf-8")
    assert text == render_docs(RULES, CATALOG_KNOBS), "run: python -m moetune.rules.docgen"


def test_catalog_folder_layout() -> None:
    for rule in RULES.values():
        assert rule.path == CATALOG / rule.wall / f"{rule.id}.yaml"


def test_verify_names_an_audited_argument() -> None:
    from moetune.analyzer.audit import load_signatures

    audited = load_signatures().keys()
    for rule in RULES.values():
        v = rule.spec["verify"]
        assert "audit" not in v or v["audit"] in audited, (rule.id, v.get("audit"))
        assert v.get("audit") or v.get("signature"), rule.id


def test_memory_expensive_changes_carry_their_verdict_and_expandable_first_when_tight() -> None:
    """Every memory-costly change carries the memory verdict; one that fits asks nothing, a tight
    one says so and names expandable segments first (they are off in this run)."""
    recs = {r["rule"]: r for r in result("eager_launch_bound")["recommendations"]}
    graphs, mbs = recs["host.cuda-graphs"], recs["host.larger-micro-batch"]
    assert graphs["memory"]["verdict"] == "fits" and not any("memory" in c for c in graphs["caveats"])
    assert mbs["memory"]["verdict"] == "tight"
    assert any(c.startswith("memory tight: predicted reserved") and
               "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True" in c for c in mbs["caveats"])


def test_environment_blocked_change_is_a_prerequisite_with_its_gain() -> None:
    """A change only a missing package blocks is listed apart, with what it needs and unlocks."""
    doc = result("a2a_comm_bound_no_deepep")
    pre = {p["rule"]: p for p in doc["prerequisites"]}
    assert "communication.flex-deepep" in pre, doc["blocked"]
    p = pre["communication.flex-deepep"]
    assert any("deep_ep" in n for n in p["needs"]) and p["gain"]["speedup"]["mid"] > 0
    assert "communication.flex-deepep" not in ids(doc, "blocked")


def test_no_recommendation_says_why() -> None:
    doc = result("healthy")
    assert doc["recommendations"] == []
    assert doc["none_because"].startswith("the step is 72% compute")


def test_none_because_names_the_fact_that_kept_each_rule_quiet() -> None:
    """Nothing applies to an elementwise-heavy step whose loss is fused already: none_because says
    which measured value or setting kept each of the dominant wall's rules quiet."""
    doc = result("elementwise_heavy_ce_fused")
    assert doc["recommendations"] == []
    why = doc["none_because"]
    assert why.startswith("the step is 74% compute; its rules do not apply: ")
    assert "compute.cross-entropy-fusion: cross_entropy_loss_fusion is True, needs == False" in why
    assert "condition not met" not in why


def test_none_because_puts_a_contradicted_claim_first() -> None:
    s = load("healthy")
    audit = {"verdicts": {**s["audit"]["verdicts"], "moe_grouped_gemm": "contradicted"}}
    doc = recommend(RULES, s["diagnosis"], s["contract"], audit, catalog=CATALOG_KNOBS)
    assert doc["recommendations"] == []
    assert doc["none_because"].startswith(
        "the step is 72% compute; the audit contradicts the contract's moe_grouped_gemm: fix the "
        "claim (or the launch, so that it runs) first")


def test_compute_coverage_rules_on_real_h200_trace() -> None:
    """fixtures/traces/gpu_mcore_computebound (real H200, local spec): elementwise/reduce kernels
    are 30 % of the window, so a Megatron contract with the loss unfused gets the fusion; its
    GEMMs average 166 µs, so the small-GEMM rule stays quiet."""
    from moetune.analysis import analyze

    trace = ROOT / "fixtures" / "traces" / "gpu_mcore_computebound" / "trace.json.gz"
    if not trace.exists():
        pytest.skip("trace absent")
    from moetune.analyzer.contract import contract_from_doc

    contract = contract_from_doc({"megatron_args": {"cross_entropy_loss_fusion": False}})
    diagnosis = analyze([trace], None, audit=False).diagnosis
    doc = recommend(RULES, diagnosis, contract.raw, None, options=Options(show_quiet=True),
                    catalog=CATALOG_KNOBS)
    assert "compute.cross-entropy-fusion" in ids(doc, "recommendations")
    assert "compute.small-gemm-micro-batch" in ids(doc, "quiet")
