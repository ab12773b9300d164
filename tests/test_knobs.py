"""rules/knobs.yaml through moetune.knobs: every §5 knob of moe-tuning-knowledge.md by its Megatron
argument name, current flags plus structured deprecated spellings, constraints, training
equivalence; and one vocabulary: every layer spells through moetune.knobs, renders through
moetune.knob_flags and normalizes through moetune.arg_names."""

from __future__ import annotations

import re
import shlex
from pathlib import Path
from typing import Any

import pytest
from moetune.analyzer import megatron_args
from moetune.analyzer.planner import plan
from moetune.executor import candidate
from moetune.rules import docgen, engine
from moetune.rules.engine import _Inputs, audit_verdicts, facts, legality
from moetune.rules.load import CATALOG as CATALOG_DIR
from moetune.rules.load import Rule, load_catalog

from moetune import arg_names, knob_flags, knobs
from moetune import conditions as expr
from moetune.errors import UserError
from moetune.knob_flags import render_bridge, render_flags
from moetune.knobs import Knob

ROOT = Path(__file__).resolve().parents[1]
KNOWLEDGE = ROOT.parent / "shared" / "docs" / "moe-tuning-knowledge.md"
CAT = load_catalog()
# Arguments newer than the argument list analyzer/contract.py knows (MLM main @ d98e8a6).
# knob arguments Megatron-LM's parser at the pinned commit (analyzer/megatron_arguments.json) has no
# flag for: a value it derives, or an older version's name
NOT_IN_PARSER = {"virtual_pipeline_model_parallel_size", "cpu_offloading"}


def all_flags() -> dict[str, str]:
    out: dict[str, str] = {}
    for k in CAT.knobs.values():
        for f in [k.flag, k.negative_flag, *(d.flag for d in k.deprecated)]:
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


def test_deprecated_spellings_are_structured() -> None:
    """Each old spelling says what it means in current arguments: a rename of its knob, or a
    switch that sets arguments (the old free-text `means` is gone)."""
    renames = {"--cuda-graph-scope": "cuda_graph_modules",
               "--moe-deepep-num-sms": "moe_flex_dispatcher_num_sms",
               "--moe-hybridep-num-sms": "moe_flex_dispatcher_num_sms",
               "--moe-router-padding-for-fp8": "moe_router_padding_for_quantization",
               "--fake-init-process-group": "fake_process_group",
               "--offload-optimizer-states": "optimizer_cpu_offload"}
    switches = {
        "--enable-cuda-graph": {"cuda_graph_impl": "local"},
        "--external-cuda-graph": {"cuda_graph_impl": "transformer_engine"},
        "--moe-enable-deepep": {"moe_token_dispatcher_type": "flex",
                                "moe_flex_dispatcher_backend": "deepep"},
        "--moe-layer-recompute": {"recompute_granularity": "selective", "recompute_modules": ["moe"]},
    }
    got = {d.flag: d for d in CAT.deprecated.values()}
    assert set(got) == set(renames) | set(switches)
    for flag, name in renames.items():
        d = got[flag]
        assert d.renamed_to == name == d.knob and not d.sets
        assert all_flags()[flag] == name and CAT.by_flag[flag] is CAT.knobs[name]
        assert d.takes_value == (CAT.knobs[name].type != "bool")
    for flag, sets in switches.items():
        d = got[flag]
        assert dict(d.sets) == sets and d.renamed_to is None and not d.takes_value
        assert d.knob in sets  # listed under the knob whose flag replaces it
    assert got["--cuda-graph-scope"].values["full_iteration"]["cuda_graph_impl"] == "full_iteration"
    assert got["--moe-enable-deepep"].forces == ("moe_token_dispatcher_type",)
    assert "means" not in (ROOT / "rules" / "knobs.yaml").read_text(encoding="utf-8")


def test_catalog_cites_only_public_sources() -> None:
    text = (ROOT / "rules" / "knobs.yaml").read_text(encoding="utf-8")
    assert "§" not in text and "moe-tuning-knowledge" not in text and "/work/" not in text
    assert all("section" not in k.spec for k in CAT.knobs.values())
    cited = [s for k in CAT.knobs.values() for s in k.sources]
    assert cited and all(s.strip() for s in cited)
    for k in CAT.knobs.values():
        for c in k.requires:
            assert "§" not in c.reason, (k.name, c.reason)


def test_megatron_argument_names() -> None:
    from moetune.analyzer.contract import known_megatron_args, megatron_arguments

    args = {k.name for k in CAT.knobs.values() if k.kind == "arg"}
    assert args <= known_megatron_args()
    assert args - set(megatron_arguments()["arguments"]) == NOT_IN_PARSER
    assert "fp8" in args and "fp8_format" not in args  # --fp8-format's dest is `fp8`
    assert CAT.knobs["fp8"].flag == "--fp8-format"


def test_knob_flags_are_megatron_lms_own() -> None:
    """Every flag a change renders is one the pinned Megatron-LM parses: the argument's own flag,
    or, for a switch on by default that has only a `--no-` flag there, its absence."""
    from moetune.analyzer.contract import megatron_arguments

    own = megatron_arguments()["arguments"]
    for k in CAT.knobs.values():
        if k.kind != "arg" or k.name not in own:
            continue
        flags = set(own[k.name]["flags"])
        for value in ([True, False] if k.type == "bool" else []):
            assert set(knob_flags.flag_tokens(k, value)) <= flags, (k.name, value)
        if k.type != "bool":
            assert k.flag in flags, (k.name, k.flag, flags)


def test_training_equivalence() -> None:
    for name in ("fp8", "fp4", "moe_expert_capacity_factor", "moe_pad_expert_input_to_capacity",
                 "moe_router_force_load_balancing", "moe_expert_rank_capacity_factor"):
        k = CAT.knobs[name]
        assert k.training_equivalent is False and k.equivalence_note, name
    assert CAT.knobs["overlap_moe_expert_parallel_comm"].training_equivalent is True


def test_typed_records_and_legacy_view_agree() -> None:
    k = CAT.knobs["cuda_graph_impl"]
    assert (k.kind, k.type, k.flag, k.default, k.bridge, k.contract_path, k.wall) == (
        "arg", "enum", "--cuda-graph-impl", "none", "model.cuda_graph_impl", "cuda_graphs.impl",
        "host")
    assert k.scope == ("cuda_graph_modules", "cuda_graph_warmup_steps")
    assert all(isinstance(c, knobs.Constraint) for c in k.requires) and k.requires
    assert k.spec["contract_path"] == "cuda_graphs.impl" and k.spec["training_equivalent"] is True
    assert CAT.knobs["check_for_nan_in_loss_and_grad"].negative_flag == \
        "--no-check-for-nan-in-loss-and-grad"
    assert CAT.knobs["moe_flex_dispatcher_num_sms"].minimum == 1
    assert knobs.load() is knobs.load(), "loaded once"
    with pytest.raises(AttributeError):
        k.flag = "--x"  # type: ignore[misc]


def test_flag_rendering() -> None:
    k = CAT.knobs
    assert render_flags(k["moe_grouped_gemm"], True) == (["--moe-grouped-gemm"], [])
    assert render_flags(k["moe_grouped_gemm"], False) == ([], ["--moe-grouped-gemm"])
    assert render_flags(k["check_for_nan_in_loss_and_grad"], False) == (
        ["--no-check-for-nan-in-loss-and-grad"], [])
    assert render_flags(k["cuda_graph_modules"], ["attn", "moe_router"]) == (
        ["--cuda-graph-modules attn moe_router"], [])
    assert render_flags(k["CUDA_DEVICE_MAX_CONNECTIONS"], 32) == (["CUDA_DEVICE_MAX_CONNECTIONS=32"], [])
    assert render_flags(k["CUDA_DEVICE_MAX_CONNECTIONS"], None) == ([], ["unset CUDA_DEVICE_MAX_CONNECTIONS"])
    assert render_flags(k["moe_expert_capacity_factor"], None) == ([], ["--moe-expert-capacity-factor"])
    # the planner's number and quoting rules, now everyone's
    assert render_flags(k["optimizer_offload_fraction"], 0.5) == (["--optimizer-offload-fraction 0.5"], [])
    assert render_flags(k["moe_expert_capacity_factor"], 1.0) == (["--moe-expert-capacity-factor 1"], [])
    assert render_flags(k["moe_router_bias_update_rate"], 0.001) == (
        ["--moe-router-bias-update-rate 0.001"], [])
    assert knob_flags.value_text(0.1234567891) == "0.1234567891"  # %g only where it is exact
    assert render_flags(k["pipeline_model_parallel_layout"], "Et*3|(tt|)*29m|L") == (
        ["--pipeline-model-parallel-layout 'Et*3|(tt|)*29m|L'"], [])
    assert render_bridge(k["moe_grouped_gemm"], True) == "model.moe_grouped_gemm=true"
    assert render_bridge(k["cuda_graph_modules"], ["attn"]) == "model.cuda_graph_scope=[attn]"
    assert render_bridge(k["fake_process_group"], True) is None
    assert knobs.flag_spelling("account_for_loss_in_pipeline_split") == \
        "--account-for-loss-in-pipeline-split"
    assert knobs.flag_spelling("virtual_pipeline_model_parallel_size") == \
        "--num-virtual-stages-per-pipeline-rank"


def sample_values(k: Knob) -> list[Any]:
    """Values to render for a knob: unset, its default, each legal value, a typical one."""
    out: list[Any] = [None, k.default]
    if k.type == "bool":
        out += [True, False]
    elif k.type == "list":
        out += [list(k.values[:2]) or ["4", "4"], list(k.values[-1:]) or ["1"]]
    elif k.type in ("enum", "str"):
        out += list(k.values) or ["x y", "Et*3|(tt|)*29m|L"]
    elif k.type == "int":
        out += [int(k.minimum or 0) + 2]
    else:
        out += [0.25, 1.0, 1e-05]
    return out


ARG_CASES = [(k, v) for k in CAT.knobs.values() if k.kind == "arg" for v in sample_values(k)]


@pytest.mark.parametrize(("k", "value"), ARG_CASES, ids=[f"{k.name}={v!r}" for k, v in ARG_CASES])
def test_planner_candidate_and_engine_render_one_way(k: Knob, value: Any) -> None:
    """For every catalog argument: the engine's and docs' flags, the planner's flag text and the
    command line the executor builds are the same rendering, and it reads back as the value."""
    sets, removes = engine.render_flags(k, value)
    argv = candidate.apply(candidate.Launch(("pretrain_gpt.py", "--bf16")),
                           candidate.Change(k, value)).argv
    added = argv[2:] if k.name != "bf16" else argv[1:]
    if sets:
        assert removes == [] and sets == [shlex.join(added)]
        assert plan.render_flag(k.name, value) == sets[0]
        assert candidate.current_value(candidate.Launch(argv), k) == (
            list(map(knob_flags.value_text, value)) if k.type == "list" else value)
    elif value is True:  # on by default, Megatron-LM has only the `--no-` flag: its absence
        assert removes == [k.negative_flag] and added == ()
        assert k.default is True and candidate.current_value(candidate.Launch(argv), k) is None
    else:
        assert removes == [k.flag] and k.flag not in argv
        assert value in (None, False)


def test_env_knobs_render_one_way() -> None:
    for k in (k for k in CAT.knobs.values() if k.kind == "env"):
        for value in [*k.values, 8, None]:
            sets, removes = render_flags(k, value)
            launch = candidate.apply(candidate.Launch(("x",), {k.name: "old"}),
                                     candidate.Change(k, value))
            if value is None:
                assert (sets, removes, launch.env) == ([], [f"unset {k.name}"], {})
            else:
                assert sets == [f"{k.name}={shlex.quote(launch.env[k.name])}"] and not removes
                assert launch.env[k.name] == str(value)


def test_there_is_one_copy() -> None:
    """The second implementations are gone: every layer uses the knob modules' own functions."""
    assert engine.render_flags is knob_flags.render_flags
    assert engine.render_bridge is knob_flags.render_bridge
    assert docgen.render_flags is knob_flags.render_flags
    assert docgen.render_bridge is knob_flags.render_bridge
    assert plan.render_flag is knob_flags.render_flag and not hasattr(plan, "flag_spelling")
    assert candidate.Knob is knobs.Knob and not hasattr(candidate, "load_knobs")
    assert candidate.set_flag is knob_flags.set_flag
    assert megatron_args.normalize_args is arg_names.normalize_args
    assert not hasattr(megatron_args, "RENAMED") and not hasattr(megatron_args, "SWITCHES")
    assert load_catalog().knobs is knobs.load().knobs


def test_lookup_by_any_spelling() -> None:
    assert knobs.knob("--moe-deepep-num-sms").name == "moe_flex_dispatcher_num_sms"
    assert knobs.knob("--no-overlap-p2p-communication").name == "overlap_p2p_comm"
    assert knobs.knob("--fp8-format").name == "fp8"
    assert knobs.knob("NCCL_ALGO") == Knob("NCCL_ALGO", kind="env")
    assert knobs.knob("train_iters").flag == "--train-iters"
    with pytest.raises(UserError):
        knobs.knob("Bad Name")


def test_rules_spell_only_current_flags() -> None:
    # knobs.yaml is the only home of flag spellings: rule prose may quote flags, never stale ones.
    current = {f for k in CAT.knobs.values() for f in (k.flag, k.negative_flag) if f}
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
    inp = _Inputs({}, doc, engine.megatron_args(doc), audit_verdicts(None), facts(doc, CAT), CAT)
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
    assert blocked("PYTORCH_CUDA_ALLOC_CONF", "expandable_segments:True", {"nccl_ub": True})
    # whole-layer local graphs of a dropless alltoall MoE layer crash at capture (Megatron-LM
    # d98e8a64 on the H200): the router and preprocess scopes, or padding to capacity, run
    moe = {"model": {"num_experts": 48}}
    assert blocked("cuda_graph_impl", "local", {}, **moe)
    assert blocked("cuda_graph_impl", "local", {"cuda_graph_modules": ["moe_router", "moe_preprocess"]},
                   **moe) == []
    assert blocked("cuda_graph_impl", "local", {"moe_expert_capacity_factor": 1.0,
                                                "moe_pad_expert_input_to_capacity": True}, **moe) == []
    assert blocked("cuda_graph_impl", "local", {}) == []  # a dense model has no dispatcher
    assert blocked("moe_flex_dispatcher_backend", "deepep",
                   {"moe_token_dispatcher_type": "flex", "moe_flex_dispatcher_backend": "hybridep"},
                   hardware={"gpu_model": "GB200", "nvlink_domain_size": 72})
