"""Measurement contract: schema, label validation, strictness, loading, and the `contract` CLI."""

from __future__ import annotations

import copy
import json
import subprocess
import sys
from pathlib import Path

import jsonschema
import pytest
import yaml
from moetune.analyzer.contract import (
    SCHEMA_PATH,
    check_contract,
    contract_from_doc,
    contract_schema,
    effective_args,
    load_contract,
)

from moetune.errors import UserError

ROOT = Path(__file__).resolve().parents[1]
QWEN = ROOT / "fixtures" / "contracts" / "qwen3_30b_h100.yaml"
EXAMPLES = sorted((ROOT / "fixtures" / "contracts").glob("*.yaml"))


def errors(doc: dict, *, strict: bool = False) -> list[str]:
    return [str(p) for p in check_contract(doc, strict=strict) if p.severity == "error"]


def cli(*argv: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "moetune", *argv], cwd=ROOT, capture_output=True, text=True
    )


def test_schema_is_valid_draft_2020_12_with_versioned_id() -> None:
    schema = json.loads(SCHEMA_PATH.read_text())
    jsonschema.Draft202012Validator.check_schema(schema)
    assert schema["$id"] == "https://moetune.dev/schemas/contract/1"
    assert schema["properties"]["schema"]["const"] == "moetune.contract/1"
    typed = [k for k, v in schema["properties"].items() if v.get("properties") and k != "megatron_args"]
    assert len(typed) == 11
    assert "additionalProperties" not in schema["properties"]["megatron_args"]  # free-form
    assert all(schema["properties"][k]["additionalProperties"] is False for k in typed)


COMPLETE = ["qwen3_30b_h100.yaml", "dsv3_h100_1024_fp8_deepep.yaml", "mcore_h200_hostbound.yaml"]


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: p.name)
def test_every_example_contract_is_valid(path: Path) -> None:
    assert errors(yaml.safe_load(path.read_text())) == []


@pytest.mark.parametrize("name", COMPLETE)
def test_complete_examples_pass_strict_without_warnings(name: str) -> None:
    doc = yaml.safe_load((ROOT / "fixtures" / "contracts" / name).read_text())
    assert check_contract(doc, strict=True) == []


def test_type_error_names_the_field_path() -> None:
    assert errors({"parallelism": {"ep": "8x"}}) == ['parallelism.ep: expected integer, got "8x"']
    assert errors({"versions": {"cuda": 12.9}}) == ["versions.cuda: expected string, got 12.9"]
    assert errors({"parallelism": {"vpp": "two"}}) == [
        'parallelism.vpp: expected integer or null, got "two"'
    ]


def test_unknown_field_in_typed_section_is_an_error_but_megatron_args_only_warn() -> None:
    assert errors({"shape": {"seq_len": 4096}})[0].startswith("shape.seq_len: unknown field")
    problems = check_contract({"megatron_args": {"moe_grouped_gemm": True, "moe_frobnicate": 1}})
    assert [(p.severity, p.path) for p in problems] == [("warning", "megatron_args.moe_frobnicate")]


def test_enum_and_const_messages() -> None:
    assert errors({"label": "prod"}) == [
        'label: expected one of "training-equivalent", "benchmark-only", got "prod"'
    ]
    assert errors({"schema": "moetune.contract/2"}) == [
        'schema: expected "moetune.contract/1", got "moetune.contract/2"'
    ]


def test_partial_contract_of_only_megatron_args_is_valid() -> None:
    assert check_contract({"megatron_args": {"moe_token_dispatcher_type": "alltoall"}}) == []


def test_megatron_args_moetune_reads_are_type_checked() -> None:
    assert errors({"megatron_args": {"moe_grouped_gemm": "yes", "expert_model_parallel_size": "8x",
                                     "fp8": None, "some_new_arg": {"x": 1}}}) == [
        'megatron_args.expert_model_parallel_size: expected integer, got "8x"',
        'megatron_args.moe_grouped_gemm: expected boolean, got "yes"',
    ]


@pytest.mark.parametrize(
    ("doc", "field"),
    [
        ({"routing": {"force_balancing": True}}, "routing.force_balancing"),
        ({"megatron_args": {"moe_router_force_load_balancing": True}},
         "megatron_args.moe_router_force_load_balancing"),
        ({"data": {"synthetic": True}}, "data.synthetic"),
        ({"megatron_args": {"mock_data": True}}, "megatron_args.mock_data"),
        ({"training": {"optimizer_enabled": False}}, "training.optimizer_enabled"),
    ],
)
def test_training_equivalent_label_is_validated(doc: dict, field: str) -> None:
    bad = {"label": "training-equivalent", **doc}
    errs = errors(bad)
    assert len(errs) == 1
    assert errs[0].startswith(f"label: training-equivalent, but {field} = ")
    assert errors({**bad, "label": "benchmark-only"}) == []


def test_label_ok_when_the_benchmark_fields_are_off() -> None:
    doc = {"label": "training-equivalent", "routing": {"force_balancing": False},
           "data": {"synthetic": False}, "megatron_args": {"mock_data": False}}
    assert errors(doc) == []


def test_strict_demands_the_complete_set_and_names_what_is_missing() -> None:
    errs = errors({"megatron_args": {"bf16": True}}, strict=True)
    assert "label: missing (required by --strict)" in errs
    assert "parallelism: missing (required by --strict)" in errs
    full = yaml.safe_load(QWEN.read_text())
    del full["parallelism"]["ep"]
    assert errors(full, strict=True) == ["parallelism.ep: missing (required by --strict)"]
    assert errors(full) == []  # not strict: partial is fine


def test_section_and_mirrored_argument_must_agree() -> None:
    doc = {"parallelism": {"ep": 8}, "megatron_args": {"expert_model_parallel_size": 4}}
    assert errors(doc) == ["parallelism.ep: 8 disagrees with megatron_args.expert_model_parallel_size = 4"]


def test_effective_args_merge_sections_under_explicit_args() -> None:
    doc = {"parallelism": {"ep": 8}, "cuda_graphs": {"impl": "local"}, "precision": {"params": "bf16"},
           "megatron_args": {"cuda_graph_impl": "transformer_engine"}}
    eff = effective_args(doc)
    assert eff["expert_model_parallel_size"] == 8
    assert eff["cuda_graph_impl"] == "transformer_engine"
    assert eff["bf16"] is True


def test_load_contract_gives_a_frozen_typed_view(tmp_path: Path) -> None:
    c = load_contract(QWEN)
    assert c.parallelism.ep == 16 and c.parallelism.tp == 1
    assert c.label == "benchmark-only"
    assert c.get("cuda_graphs.modules") == ("moe_router", "moe_preprocess")
    assert c.claims()["moe_flex_dispatcher_backend"] == "hybridep"
    with pytest.raises(TypeError):
        c.raw["label"] = "x"  # type: ignore[index]
    with pytest.raises(AttributeError):
        c.label = "x"  # type: ignore[misc]


def test_load_contract_json_and_errors(tmp_path: Path) -> None:
    good = tmp_path / "c.json"
    good.write_text(json.dumps({"megatron_args": {"fp8": "e4m3"}}))
    assert load_contract(good).claims()["fp8"] == "e4m3"
    bad = tmp_path / "bad.yaml"
    bad.write_text("parallelism: {ep: 8x}\n")
    before = bad.read_text()
    with pytest.raises(UserError, match=r'parallelism\.ep: expected integer, got "8x"'):
        load_contract(bad)
    assert bad.read_text() == before  # never modify a user's file
    for text, msg in [("", "is empty"), ("- a\n- b\n", "expected a mapping"), ("a: [\n", "invalid YAML")]:
        bad.write_text(text)
        with pytest.raises(UserError, match=msg):
            load_contract(bad)
    with pytest.raises(UserError, match="no such file"):
        load_contract(tmp_path / "missing.yaml")


def test_deprecated_names_warn_and_claims_use_current_names() -> None:
    doc = {"megatron_args": {"moe_enable_deepep": True, "cuda_graph_scope": ["attn"]}}
    problems = check_contract(doc)
    assert [(p.severity, str(p)) for p in problems] == [
        ("warning", "megatron_args.cuda_graph_scope: deprecated name; read as cuda_graph_modules"),
        ("warning", "megatron_args.moe_enable_deepep: deprecated switch; read as "
                    "moe_token_dispatcher_type=flex, moe_flex_dispatcher_backend=deepep"),
    ]
    claims = contract_from_doc(doc).claims()
    assert claims["moe_token_dispatcher_type"] == "flex" and claims["cuda_graph_modules"] == ["attn"]
    assert "moe_enable_deepep" not in claims


def test_deprecated_warnings_follow_the_knob_catalog() -> None:
    """Every old spelling of rules/knobs.yaml warns, read as the catalog says; other names don't."""
    from moetune import knobs

    cat = knobs.load()
    for old in cat.deprecated.values():
        value = True if not old.renamed_to or cat.knobs[old.renamed_to].type == "bool" else 8
        got = [str(p) for p in check_contract({"megatron_args": {old.arg: value}})
               if "deprecated" in p.message]
        read_as = old.renamed_to or ", ".join(f"{a}={v}" for a, v in old.sets.items())
        assert got == [f"megatron_args.{old.arg}: deprecated "
                       f"{'name' if old.renamed_to else 'switch'}; read as {read_as}"], old.arg
    # a switch printed False states nothing to warn about
    assert not [p for p in check_contract({"megatron_args": {"moe_enable_deepep": False}})
                if "deprecated" in p.message]


def test_contract_reads_deprecated_names_without_importing_megatron_args() -> None:
    """contract.py and megatron_args.py both read deprecated spellings through moetune.arg_names:
    the contract module imports nothing of megatron_args, not even inside a function."""
    import ast

    tree = ast.parse((ROOT / "analyzer" / "contract.py").read_text(encoding="utf-8"))
    imported = {n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)}
    imported |= {a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
    assert "moetune.arg_names" in imported
    assert not any("megatron_args" in m for m in imported if m)


def test_check_does_not_mutate_its_input() -> None:
    doc = yaml.safe_load(QWEN.read_text())
    before = copy.deepcopy(doc)
    check_contract(doc, strict=True)
    assert doc == before


def test_known_argument_list_covers_every_mirrored_argument() -> None:
    from moetune.analyzer.contract import known_megatron_args

    known = known_megatron_args()
    for sec in contract_schema()["properties"].values():
        for spec in sec.get("properties", {}).values():
            if "x-megatron-arg" in spec:
                assert spec["x-megatron-arg"] in known


# --- CLI -----------------------------------------------------------------------------------------


def test_cli_check_ok_strict_and_errors(tmp_path: Path) -> None:
    r = cli("contract", "check", "--strict", str(QWEN))
    assert r.returncode == 0, r.stderr
    bad = tmp_path / "bad.yaml"
    bad.write_text("label: training-equivalent\nparallelism: {ep: '8x'}\ndata: {synthetic: true}\n")
    r = cli("contract", "check", str(bad))
    assert r.returncode == 1
    assert 'error: parallelism.ep: expected integer, got "8x"' in r.stdout
    assert "error: label: training-equivalent, but data.synthetic = true" in r.stdout
    assert "Traceback" not in r.stderr


def test_cli_check_json_and_bad_input(tmp_path: Path) -> None:
    p = tmp_path / "c.yaml"
    p.write_text("megatron_args: {moe_frobnicate: 1}\n")
    r = cli("contract", "check", "--json", str(p))
    assert r.returncode == 0
    out = json.loads(r.stdout)
    assert out["valid"] is True and out["problems"][0]["severity"] == "warning"
    p.write_text("a: [\n")
    r = cli("contract", "check", str(p))
    assert r.returncode == 2
    assert r.stderr.count("\n") == 1 and r.stderr.startswith("moetune: ")


# --------------------------------------------------------------- a contract of only megatron_args


def test_field_value_reads_the_argument_a_section_field_mirrors() -> None:
    from moetune.analyzer.contract import MISSING, field_value

    only_args = {"megatron_args": {"global_batch_size": 64, "data_parallel_size": 2}}
    assert field_value(only_args, "shape.global_batch_size") == 64
    assert field_value(only_args, "parallelism.dp") == 2
    assert field_value(only_args, "shape.seq_length") is MISSING
    both = {"shape": {"global_batch_size": 32}, **only_args}  # the section field wins
    assert field_value(both, "shape.global_batch_size") == 32
    assert field_value({"label": "benchmark-only"}, "label") == "benchmark-only"


def test_micro_batch_bound_from_megatron_args_only_contract() -> None:
    """`host.larger-micro-batch`'s bound (GBS / DP) from `megatron_args` alone: checked, not
    "not in the contract"."""
    from moetune.rules.engine import scaled_target

    change = {"knob": "micro_batch_size", "to": 2, "scale": 2,
              "at_most": {"of": "shape.global_batch_size", "per": "parallelism.dp"}}
    margs = {"megatron_args": {"global_batch_size": 16, "data_parallel_size": 2}}
    assert scaled_target(change, 2, margs) == (4, None, None)
    assert scaled_target(change, 4, margs)[:2] == (8, None)  # 8 divides 16 / 2
    target, why, _ = scaled_target(change, 8, margs)
    assert target is None and "does not fit shape.global_batch_size / parallelism.dp = 8" in why
    assert "(not in the contract)" in scaled_target(change, 2, {})[2]


def test_recommend_text_names_an_unlabelled_contract() -> None:
    from moetune.commands.recommend import render

    doc = {"diagnosis": {"step_time_s": 1.0, "dominant_wall": "host"}, "recommendations": [],
           "contract_label": None, "blocked": [], "quiet_count": 0, "rules_checked": 0}
    head = lambda text: text.splitlines()[0]  # noqa: E731
    assert head(render(doc, contract="runs/c.yaml")).endswith("· contract c.yaml (unlabelled)")
    assert head(render(doc)).endswith("· contract none")
    labelled = {**doc, "contract_label": "benchmark-only"}
    assert head(render(labelled, contract="c.yaml")).endswith("· contract benchmark-only (c.yaml)")


def test_diagnose_next_hint_names_the_contract_given() -> None:
    given = "fixtures/contracts/mcore_h200_hostbound.yaml"  # the default trace's own run
    r = cli("diagnose", "--contract", given)
    assert r.returncode == 0, r.stderr
    hint = next(ln for ln in r.stderr.splitlines() if ln.startswith("next:"))
    assert "--contract FILE" not in hint and hint.count(given) == 2
    r = cli("diagnose")
    assert "--contract FILE" in next(ln for ln in r.stderr.splitlines() if ln.startswith("next:"))


def test_from_log_header_lines_followed_literally(tmp_path: Path) -> None:
    """`contract from-log` on a real Megatron-LM log names three `hardware` keys the log does not
    state, each with a line to add. Added one by one they repeat the `hardware:` key, which YAML
    resolves by keeping the last (gpu_memory_gb lost: `contract check` once said valid and `fit`
    then said the key was missing): the reader refuses the repeat, naming both lines, and the
    header's one-mapping line makes `fit --gpus 64` run."""
    log = ROOT / "fixtures" / "traces" / "mlm_host_mbs1_rcfull" / "train.log"
    r = cli("contract", "from-log", str(log))
    assert r.returncode == 0, r.stderr
    header = [ln.removeprefix("#").strip() for ln in r.stdout.splitlines() if ln.startswith("#")]
    adds = [ln.split("add `", 1)[1].split("`", 1)[0] for ln in header if "add `" in ln]
    one = [a for h, a in zip([h for h in header if "add `" in h], adds, strict=True)
           if h.startswith("all in one `hardware:`")]
    assert len(one) == 1 and len(adds) == 4
    apart = tmp_path / "apart.yaml"
    apart.write_text(r.stdout + "".join(a + "\n" for a in adds if a not in one))
    r2 = cli("contract", "check", str(apart))
    n = len(r.stdout.splitlines())
    assert r2.returncode == 2 and r2.stderr.splitlines() == [
        f"moetune: {apart}: key 'hardware' at line {n + 2} repeats line {n + 1}'s: YAML keeps "
        "only the last; merge them into one"]
    merged = tmp_path / "merged.yaml"
    merged.write_text(r.stdout + one[0] + "\n")
    assert cli("contract", "check", str(merged)).returncode == 0
    r3 = cli("fit", "--contract", str(merged), "--gpus", "64")
    assert r3.returncode == 0, r3.stderr
    assert " 64 GPUs × 139.8 GiB, 8/node" in r3.stdout.splitlines()[0]
