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
    ARG_LINES,
    COMMAND_LINE,
    DUMP,
    ECHOED,
    contract_from_args,
    contract_from_log,
    normalize_args,
    parse_args_dump,
    parse_startup,
    parse_value,
    parse_world_size,
    read_log,
    strip_prefix,
)
from moetune.analyzer.megatron_flags import command_line_args, echoed_args, parse_flags

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
    assert "no Megatron-LM arguments found" in r.stderr and "Traceback" not in r.stderr


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


# --------------------------------------------------------------- every source of a real log
# Real public logs (fixtures/logs/README.md names each source): what each states, read back.

REAL_STATED = {
    "real_lumi_mi300_gpt_tp4.log": {  # full dump + set -x command line + echoed GPT_ARGS
        "model.num_layers": 28, "model.padded_vocab_size": 50688, "shape.global_batch_size": 512,
        "parallelism.tp": 4, "parallelism.world_size": 4, "precision.params": "bf16",
        "label": "training-equivalent"},
    "real_ms_swift_qwen2_0_5b.log": {  # world-size line with no comma before the TP size
        "model.hidden_size": 896, "parallelism.dp": 2, "parallelism.world_size": 2,
        "precision.params": "bf16"},
    "real_seunghyunseo_moe_ep4.log": {  # header-less argument lines + echoed *_ARGS, one wrapped
        "model.num_experts": 64, "model.moe_router_topk": 1, "model.ffn_hidden_size": 1792,
        "shape.micro_batch_size": 8, "shape.global_batch_size": 64, "parallelism.ep": 4,
        "parallelism.dp": 8, "precision.params": "bf16", "training.train_iters": 40000},
    "real_seunghyunseo_moe_2gpu_vars.log": {  # echoed variables only; --mock-data
        "model.num_experts": 8, "parallelism.ep": 2, "parallelism.sequence_parallel": True,
        "shape.global_batch_size": 128, "precision.params": "bf16", "label": "benchmark-only"},
    "real_gnosia93_slurm_gpt70b.log": {  # a job script's srun torchrun … pretrain_gpt.py \ lines
        "parallelism.tp": 4, "parallelism.pp": 4, "model.vocab_size": 32000,
        "training.recompute_granularity": "full", "label": "benchmark-only"},
}


def _at(doc: dict, path: str) -> object:
    for part in path.split("."):
        doc = doc[part]
    return doc


@pytest.mark.parametrize("name", sorted(REAL_STATED))
def test_real_logs_every_source_reads_what_they_state(name: str) -> None:
    doc = contract_from_log((LOGS / name).read_text())
    assert {p: _at(doc, p) for p in REAL_STATED[name]} == REAL_STATED[name]
    assert [p for p in check_contract(doc) if p.severity == "error"] == []


def test_fragments_state_dtype_not_fp32_and_no_label() -> None:
    """Argument lines without the dump's header (no bf16 line among them): params_dtype says
    bf16; whatever the lines leave out is unknown, so there is no training-equivalent label."""
    text = "\n".join([line("params_dtype", "torch.bfloat16"), line("num_experts", 8)]) + "\n"
    found = read_log(text)
    assert found.contract["precision"] == {"params": "bf16"} and "label" not in found.contract
    assert found.sources == {"num_experts": ARG_LINES, "params_dtype": ARG_LINES}
    bare = read_log(line("num_experts", 8) + "\n").contract  # nothing about precision: unknown
    assert "precision" not in bare and "label" not in bare


def test_precedence_dump_over_command_line_over_echo_and_iterations_fill_only() -> None:
    text = ("MOE_ARGS: --num-experts 4 --moe-router-topk 2 --expert-model-parallel-size 2\n"
            "+ torchrun --nproc_per_node 8 pretrain_gpt.py --num-experts 8 --seq-length 2048 "
            "--micro-batch-size 2\n"
            + dump(line("num_experts", 16), line("micro_batch_size", 2)))
    found = read_log(text, observed={"global_batch_size": 64, "micro_batch_size": 1})
    margs = found.contract["megatron_args"]
    assert (margs["num_experts"], margs["seq_length"], margs["moe_router_topk"]) == (16, 2048, 2)
    assert margs["global_batch_size"] == 64 and margs["micro_batch_size"] == 2
    assert found.sources["num_experts"] == DUMP and found.sources["seq_length"] == COMMAND_LINE
    assert found.sources["moe_router_topk"] == ECHOED
    assert found.sources["global_batch_size"] == "iteration lines"
    assert "nproc_per_node" not in margs and "world_size" not in margs  # torchrun's own flags
    overruled = {(c["arg"], c["overruled"]["source"]) for c in found.conflicts}
    assert overruled == {("num_experts", COMMAND_LINE), ("num_experts", ECHOED),
                         ("micro_batch_size", "iteration lines")}


def test_command_line_spellings_and_unexpanded_variables() -> None:
    f = parse_flags(["--fp8-format", "hybrid", "--no-gradient-accumulation-fusion",
                     "--no-load-optim", "--recompute-modules", "core_attn", "moe_act",
                     "--num-layers", "$LAYERS", "--lr=1e-4", "--nnodes", "2"])
    assert f.args == {"fp8": "hybrid", "gradient_accumulation_fusion": False,
                      "no_load_optim": True, "recompute_modules": ["core_attn", "moe_act"],
                      "lr": 1e-4}
    assert f.unread == ("--num-layers",) and not f.complete
    cmd = command_line_args("torchrun pretrain_gpt.py $GPT_ARGS --bf16 2>&1 | tee x.log\n")
    assert cmd is not None and cmd.args == {"bf16": True} and not cmd.complete
    assert command_line_args("python train.py --num-layers 2\n") is None  # not Megatron's script


def test_echo_is_joined_only_across_a_terminal_wrap() -> None:
    real = echoed_args((LOGS / "real_seunghyunseo_moe_ep4.log").read_text())
    assert real["ffn_hidden_size"] == 1792 and "ffn_hidden_siz" not in real
    text = "MOE_ARGS: --num-experts 8\nusing world size: 8, data-parallel size: 8\n"
    assert echoed_args(text) == {"num_experts": 8}


def test_world_line_without_comma_before_tp() -> None:
    line_ = ("using world size: 2, data-parallel size: 2, context-parallel size: 1 "
             "tensor-model-parallel size: 1, pipeline-model-parallel size: 1")
    assert parse_world_size(line_) == {"world_size": 2, "dp": 2, "cp": 1, "tp": 1, "pp": 1}


def test_startup_lines_padded_vocab_and_params_dtype() -> None:
    text = ("using torch.float16 for parameters ...\n"
            " > padded vocab (size: 50257) with 431 dummy tokens (new size: 50688)\n")
    assert parse_startup(text) == {"params_dtype": "torch.float16", "padded_vocab_size": 50688}
    doc = read_log(text).contract
    assert doc["model"] == {"padded_vocab_size": 50688} and doc["precision"] == {"params": "fp16"}


def _from_log_validator():
    import json

    import jsonschema
    from referencing import Registry, Resource

    schemas = ROOT / "schemas"
    contract = json.loads((schemas / "contract.schema.json").read_text())
    doc_schema = json.loads((schemas / "contract_from_log.schema.json").read_text())
    registry = Registry().with_resources(
        [(s["$id"], Resource.from_contents(s)) for s in (contract, doc_schema)])
    return jsonschema.Draft202012Validator(doc_schema, registry=registry)


@pytest.mark.parametrize("name", ["real_seunghyunseo_moe_ep4.log", "real_gnosia93_slurm_gpt70b.log",
                                  "qwen3_30b_a3b_torchrun.log", "megatron_lm_torchrun_moe.log"])
def test_cli_from_log_json_is_schema_valid_and_names_sources(name: str) -> None:
    import json

    r = subprocess.run([sys.executable, "-m", "moetune", "contract", "from-log", str(LOGS / name),
                        "--json"], cwd=ROOT, capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    errors = sorted(_from_log_validator().iter_errors(doc), key=str)
    assert errors == [], errors[0].message if errors else ""
    assert sum(doc["source_counts"].values()) == len(doc["sources"]) > 0
    memory = doc["evidence"]["theoretical_memory"]
    if name == "real_gnosia93_slurm_gpt70b.log":
        assert memory == {"rank": None, "weight_and_optimizer_mb": 35695.42,
                          "activation_mb": 86554.12, "total_mb": 122249.54}
        assert doc["sources"]["tensor_model_parallel_size"] == COMMAND_LINE
    if name == "megatron_lm_torchrun_moe.log":
        assert memory["weight_and_optimizer_mb"] == 71234.56 and memory["rank"] == 0


def test_cli_yaml_header_says_where_values_came_from() -> None:
    r = subprocess.run([sys.executable, "-m", "moetune", "contract", "from-log",
                        str(LOGS / "real_seunghyunseo_moe_ep4.log")], cwd=ROOT, capture_output=True,
                       text=True)
    assert r.returncode == 0, r.stderr
    head = [ln for ln in r.stdout.splitlines() if ln.startswith("#")]
    assert any(ln.startswith("# from the echoed flags:") for ln in head)
    assert any("world_size" in ln and ln.startswith("# from the start-up lines:") for ln in head)
    assert any("no label" in ln for ln in head)


def test_cli_refusal_names_bridge_only_for_a_bridge_log(tmp_path: Path) -> None:
    plain = tmp_path / "plain.log"
    plain.write_text("[default0]: hello\n[default0]: iteration-less output\n")
    for path, bridge in ((plain, False), (LOGS / "megatron_bridge_srun_killed.log", True)):
        r = subprocess.run([sys.executable, "-m", "moetune", "contract", "from-log", str(path)],
                           cwd=ROOT, capture_output=True, text=True)
        assert r.returncode == 2 and "Traceback" not in r.stderr
        assert path.name in r.stderr and "no Megatron-LM arguments found" in r.stderr
        assert ("Megatron-Bridge" in r.stderr) is bridge
