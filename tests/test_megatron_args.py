"""Megatron-LM argument dump parser, alias normalization and `contract from-log`, on log fixtures
written in the exact `_print_args` format (fixtures/logs/)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from moetune.analyzer import megatron_args as margs_mod
from moetune.analyzer.contract import check_contract
from moetune.analyzer.megatron_args import (
    contract_from_args,
    contract_from_log,
    normalize_args,
    parse_args_dump,
    parse_value,
    parse_world_size,
    strip_prefix,
)

from moetune import knobs

ROOT = Path(__file__).resolve().parents[1]
LOGS = ROOT / "fixtures" / "logs"
QWEN = (LOGS / "qwen3_30b_a3b_torchrun.log").read_text()
MIXTRAL = (LOGS / "mixtral_8x7b_legacy_srun.log").read_text()
KILLED = (LOGS / "small_moe_mock_killed.log").read_text()


def line(name: str, value: object) -> str:
    """One argument line exactly as Megatron-LM's `_print_args` writes it."""
    return "  {} {} {}".format(name, "." * (48 - len(name)), value)


def dump(*lines: str) -> str:
    head = "------------------------ arguments ------------------------"
    foot = "-------------------- end of arguments ---------------------"
    return "\n".join([head, *lines, foot]) + "\n"


@pytest.mark.parametrize(
    ("text", "value"),
    [("None", None), ("True", True), ("False", False), ("8", 8), ("-1", -1), ("1e-05", 1e-05),
     ("0.2", 0.2), ("['p2p']", ["p2p"]), ("[]", []), ("AttnBackend.auto", "auto"),
     ("torch.bfloat16", "torch.bfloat16"), ("", ""), ("949,50,1", "949,50,1"),
     ("transformer_engine", "transformer_engine"), ("(1, 2)", [1, 2]), ("[unbalanced", "[unbalanced")],
)
def test_parse_value(text: str, value: object) -> None:
    assert parse_value(text) == value
    assert type(parse_value(text)) is type(value)


@pytest.mark.parametrize(
    ("raw", "prefix", "rest"),
    [("[default7]:  lr ... 1", "[default7]:", " lr ... 1"),
     ("[lrdn3321:3]:   lr ... 1", "[lrdn3321:3]:", "  lr ... 1"),
     ("3:   lr ... 1", "3:", "  lr ... 1"),
     ("  lr ... 1", "", "  lr ... 1"),
     ("[default0]:[rank0]: x", "[default0]:[rank0]:", "x")],
)
def test_strip_prefix(raw: str, prefix: str, rest: str) -> None:
    assert strip_prefix(raw) == (prefix, rest)


def test_exact_format_incl_48_char_names_and_empty_values() -> None:
    long = "inference_dynamic_batching_buffer_guaranteed_fraction"  # 53 chars: no dots, two spaces
    text = dump(line("bf16", True), line("config_logger_dir", ""), line(long, 0.2),
                line("cp_comm_type", ["p2p"]), line("params_dtype", "torch.bfloat16"),
                line("attention_backend", "AttnBackend.auto"), line("moe_router_topk", 8))
    assert line(long, 0.2) == f"  {long}  0.2"
    assert line("config_logger_dir", "").endswith(" ")
    assert parse_args_dump(text) == {
        "bf16": True, "config_logger_dir": "", long: 0.2, "cp_comm_type": ["p2p"],
        "params_dtype": "torch.bfloat16", "attention_backend": "auto", "moe_router_topk": 8,
    }
    # log collectors strip trailing spaces: an empty value still parses
    assert parse_args_dump(text.replace(" \n", "\n"))["config_logger_dir"] == ""


def test_torchrun_fixture_with_interleaved_ranks() -> None:
    args = parse_args_dump(QWEN)
    assert len(args) == 144
    # rank 5's stray echo of a different value inside rank 0's block is ignored
    assert args["moe_token_dispatcher_type"] == "alltoall"
    assert args["cuda_graph_modules"] == ["attn", "moe_router", "moe_preprocess"]
    assert args["num_experts"] == 128 and args["moe_ffn_hidden_size"] == 768
    assert args["data_path"] == ["/lustre/data/fineweb-edu/fineweb_edu_text_document"]
    assert "setting number of microbatches" not in str(args)
    assert parse_world_size(QWEN) == {"world_size": 16, "dp": 16, "cp": 1, "tp": 1, "pp": 1}


def test_srun_fixture_legacy_names_hard_wrap_and_no_separator_world_line() -> None:
    args = parse_args_dump(MIXTRAL)
    assert len(args) == 131
    assert args["data_path"] == ["1.0", "/lustre/fsw/data/redpajama/arxiv_text_document", "1.0",
                                 "/lustre/fsw/data/redpajama/book_text_document"]
    assert args["moe_enable_deepep"] is True and args["cuda_graph_scope"] == "attn"
    # 'hierarchical context-parallel sizes: Nonetensor-model-parallel size' (2025 releases)
    assert parse_world_size(MIXTRAL) == {"world_size": 64, "dp": 16, "cp": 1, "tp": 1, "pp": 4}


def test_killed_run_without_footer_keeps_complete_lines_only() -> None:
    args = parse_args_dump(KILLED)
    assert args["num_experts"] == 64 and args["mock_data"] is True
    assert "num_layers" not in args  # its line was cut inside the dots
    assert len(args) == 69  # 70 argument lines in the file, the last one cut


def test_no_dump_no_args() -> None:
    assert parse_args_dump("hello\n  lr ........ 1\n") == {}
    assert contract_from_log("nothing here\n") == {}


def test_two_dumps_later_wins() -> None:
    text = dump(line("lr", 0.1), line("seed", 1)) + "restart\n" + dump(line("lr", 0.2))
    assert parse_args_dump(text) == {"lr": 0.2, "seed": 1}


def test_normalize_deprecated_aliases() -> None:
    args, notes = normalize_args({
        "cuda_graph_scope": "attn", "external_cuda_graph": True, "enable_cuda_graph": False,
        "moe_enable_deepep": True, "moe_token_dispatcher_type": "alltoall",
        "moe_deepep_num_sms": 24, "moe_router_padding_for_fp8": True, "moe_layer_recompute": True,
        "recompute_granularity": None,
    })
    assert args == {
        "cuda_graph_modules": ["attn"], "cuda_graph_impl": "transformer_engine",
        "moe_token_dispatcher_type": "flex", "moe_flex_dispatcher_backend": "deepep",
        "moe_flex_dispatcher_num_sms": 24, "moe_router_padding_for_quantization": True,
        "recompute_granularity": "selective", "recompute_modules": ["moe"],
    }
    assert len(notes) == 6


def test_normalize_keeps_current_values_and_old_defaults() -> None:
    args, _ = normalize_args({"enable_cuda_graph": False, "external_cuda_graph": False,
                              "cuda_graph_scope": "full", "moe_enable_deepep": False,
                              "moe_hybridep_num_sms": 16, "moe_flex_dispatcher_num_sms": 32})
    assert args == {"cuda_graph_impl": "none", "cuda_graph_modules": [],
                    "moe_flex_dispatcher_num_sms": 32}
    args, _ = normalize_args({"cuda_graph_scope": "full_iteration"})
    assert args == {"cuda_graph_impl": "full_iteration", "cuda_graph_modules": []}


def test_contract_from_torchrun_log_is_valid_and_benchmark_only() -> None:
    doc = contract_from_log(QWEN)
    assert [p for p in check_contract(doc) if p.severity == "error"] == []
    assert doc["label"] == "benchmark-only"  # moe_router_force_load_balancing True
    assert doc["parallelism"] == {"tp": 1, "pp": 1, "vpp": None, "cp": 1, "ep": 8, "etp": 1,
                                  "dp": 16, "sequence_parallel": False, "world_size": 16}
    assert doc["model"]["num_experts"] == 128 and doc["model"]["moe_router_topk"] == 8
    assert doc["shape"] == {"seq_length": 4096, "micro_batch_size": 1, "global_batch_size": 1024,
                            "static": True}
    assert doc["cuda_graphs"] == {"impl": "transformer_engine",
                                  "modules": ["attn", "moe_router", "moe_preprocess"],
                                  "warmup_steps": 3}
    assert doc["precision"] == {"fp8_format": None, "fp8_param_gather": False, "params": "bf16"}
    assert doc["routing"]["force_balancing"] is True and doc["routing"]["dropless"] is True


def test_contract_from_legacy_log_uses_current_names() -> None:
    doc = contract_from_log(MIXTRAL)
    margs = doc["megatron_args"]
    assert "moe_enable_deepep" not in margs and "cuda_graph_scope" not in margs
    assert margs["moe_token_dispatcher_type"] == "flex"
    assert margs["moe_flex_dispatcher_backend"] == "deepep"
    assert margs["moe_flex_dispatcher_num_sms"] == 24
    assert doc["training"]["recompute_modules"] == ["moe"]
    assert doc["parallelism"]["vpp"] == 8 and doc["parallelism"]["pp"] == 4
    assert doc["precision"]["fp8_format"] == "e4m3"
    assert doc["label"] == "training-equivalent"
    assert [p for p in check_contract(doc) if p.severity == "error"] == []


def test_contract_from_args_drops_values_the_schema_rejects_but_keeps_the_arg() -> None:
    doc = contract_from_args({"fp8": "e5m2", "tensor_model_parallel_size": 2, "mock_data": True})
    assert "fp8_format" not in doc.get("precision", {})
    assert doc["megatron_args"]["fp8"] == "e5m2"
    assert doc["parallelism"] == {"tp": 2}
    assert doc["label"] == "benchmark-only"
    assert [p for p in check_contract(doc) if p.severity == "error"] == []


def test_cli_from_log_prints_yaml_and_writes_file(tmp_path: Path) -> None:
    log = LOGS / "qwen3_30b_a3b_torchrun.log"
    before = log.read_bytes()
    r = subprocess.run([sys.executable, "-m", "moetune", "contract", "from-log", str(log)],
                       cwd=ROOT, capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    doc = yaml.safe_load(r.stdout)
    assert doc["label"] == "benchmark-only" and "&id" not in r.stdout
    out = tmp_path / "c.yaml"
    r = subprocess.run([sys.executable, "-m", "moetune", "contract", "from-log", str(log), "-o",
                        str(out)], cwd=ROOT, capture_output=True, text=True)
    assert r.returncode == 0 and yaml.safe_load(out.read_text()) == doc
    assert log.read_bytes() == before
    r = subprocess.run([sys.executable, "-m", "moetune", "contract", "check", str(out)],
                       cwd=ROOT, capture_output=True, text=True)
    assert r.returncode == 0, r.stdout


def test_cli_from_log_without_dump_is_bad_input(tmp_path: Path) -> None:
    p = tmp_path / "bridge.log"
    p.write_text("=" * 70 + "\nConfiguration Summary (Non-Default Values vs Megatron Core)\n")
    r = subprocess.run([sys.executable, "-m", "moetune", "contract", "from-log", str(p)],
                       cwd=ROOT, capture_output=True, text=True)
    assert r.returncode == 2
    assert "no Megatron-LM argument dump" in r.stderr and "Traceback" not in r.stderr


def test_contract_from_real_h200_log_knows_te_is_absent_and_is_valid() -> None:
    """A captured H200 log: Megatron-Core warns that TE is missing, so the contract says null
    (not installed), and `cuda_graph_modules None` agrees with the section's empty list."""
    doc = contract_from_log((LOGS / "h200_mcore_no_te_profile.log").read_text())
    assert doc["versions"] == {"transformer_engine": None}
    assert doc["megatron_args"]["cuda_graph_modules"] is None
    assert doc["cuda_graphs"]["modules"] == []
    assert [p for p in check_contract(doc) if p.severity == "error"] == []
    assert doc["shape"]["micro_batch_size"] == 1 and doc["shape"]["global_batch_size"] == 8
    # a log without the warnings says nothing about versions: unknown, not absent
    assert "versions" not in contract_from_log(QWEN)


def test_deprecated_names_are_the_knob_catalogs() -> None:
    """Normalization reads the catalog's `deprecated` spellings (no table of its own): every old
    name there is mapped as the catalog says, and only those are."""
    assert not hasattr(margs_mod, "RENAMED") and not hasattr(margs_mod, "SWITCHES")
    cat = knobs.load()
    assert set(cat.deprecated) >= {"cuda_graph_scope", "moe_deepep_num_sms", "moe_hybridep_num_sms",
                                   "moe_router_padding_for_fp8", "enable_cuda_graph",
                                   "external_cuda_graph", "moe_enable_deepep", "moe_layer_recompute"}
    for old in cat.deprecated.values():
        if old.renamed_to:
            k = cat.knobs[old.renamed_to]
            value = {"bool": True, "int": 24, "list": ["attn"]}.get(k.type, "x")
            args, notes = normalize_args({old.arg: value})
            assert args == {old.renamed_to: value} and notes == [f"{old.arg} -> {old.renamed_to}"]
        else:
            args, notes = normalize_args({old.arg: True})
            assert args == dict(old.sets) and len(notes) == 1
            assert normalize_args({old.arg: False})[0] == dict(old.sets_when_false)
    current = {"moe_frobnicate": 1, "cuda_graph_modules": ["attn"], "moe_enable_deepep_x": True}
    assert normalize_args(current) == (current, [])
