"""Megatron-LM start-up output -> typed `megatron_args` and a measurement contract.

Megatron prints, on rank 0, `using world size: …` and then its arguments between
`---- arguments ----` and `---- end of arguments ----` banners, one per line as
`'  {} {} {}'.format(name, '.' * (48 - len(name)), value)` (megatron/training/arguments.py
`_print_args`). Real logs wrap that in launcher prefixes (`[default0]: `, `[host:3]: `, `3: `),
interleave other ranks' lines, cut lines short and elide parts; the parser keeps what it can read.
Megatron-Bridge prints no such dump (it has a "Configuration Summary" instead).

`read_log` takes every source a log holds, in this precedence (a value a stronger source states is
never replaced): the argument dump (or, without its header, argument lines in the dump's exact
format), Megatron's other start-up lines (`using world size`, `using torch.bfloat16 for
parameters`, `padded vocab (… new size: N)`), the launcher's command line, echoed flag variables,
and last values the caller observed (iteration lines) for what nothing stated.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from moetune.analyzer.contract import SCHEMA_ID, arg_mirrors, benchmark_only_reasons, check_contract
from moetune.analyzer.log_hardware import FILL, hardware_from_log
from moetune.analyzer.megatron_flags import command_line_args, echoed_args
from moetune.analyzer.megatron_text import parse_value, strip_prefix

from moetune.arg_names import normalize_args

__all__ = ["parse_value", "strip_prefix"]  # the dump's readers, re-exported for its callers

_HEADER = re.compile(r"-{3,}\s*arguments\s*-{3,}")
_FOOTER = re.compile(r"-{3,}\s*end of arguments\s*-{3,}")
# `  name ....... value` (name < 48 chars) or `  name  value` (48+ chars, no dots).
_ARG = re.compile(r"^\s{1,2}([A-Za-z_][A-Za-z0-9_]*) (?:(\.+)(?: (.*))?$| (.*)$)")
NAME_WIDTH = 48  # dots pad every name to this width
_WORLD = re.compile(
    r"using world size: (?P<world_size>\d+), data-parallel size: (?P<dp>\d+)"
    r"(?:, context-parallel size: (?P<cp>\d+))?"
    r"(?:, hierarchical context-parallel sizes: (?P<hcp>.*?),?\s*(?=tensor-model-parallel))?"
    r",? ?tensor-model-parallel size: (?P<tp>\d+)"  # mid-2024 releases print no comma before it
    r"(?:, encoder-tensor-model-parallel size: \d+)?"
    r", pipeline-model-parallel size: (?P<pp>\d+)"
)
# Megatron-Core warns at import when Transformer Engine is missing (optimizer, DDP, clip_grads):
# the log's own evidence that TE-only knobs cannot work in that run.
_NO_TE = re.compile(r"Transformer Engine (?:and Apex )?(?:is|are) not installed")
_PARAMS_DTYPE = re.compile(r"using (torch\.\w+) for parameters")
_PADDED_VOCAB = re.compile(r"padded vocab \(size: (\d+)\) with \d+ dummy tokens \(new size: (\d+)\)")
_DTYPE_WORD = {"torch.bfloat16": "bf16", "torch.float16": "fp16", "torch.half": "fp16",
               "torch.float32": "fp32", "torch.float": "fp32"}
# the bundled workload names the grouped-GEMM backend its environment offers without TE
# `> Megatron-Core version .......... 0.20.0` (pretrain_gpt.py at start-up); TE
# prints 0.0.0 when it is not installed
_VERSION_LINE = re.compile(r"> (PyTorch|Megatron-Core|Transformer Engine) version \.+ (\S+)")
_VERSION_KEY = {"PyTorch": "pytorch", "Megatron-Core": "megatron_core",
                "Transformer Engine": "transformer_engine"}
_GROUPED_BACKEND = re.compile(r"grouped GEMM backend = (\S+)|experts=TorchGroupedMLP\((\S+?)\)")
def parse_args_dump(text: str) -> dict[str, object]:
    """Arguments from the `arguments` block(s) of a Megatron log, typed, names as printed.

    Only lines from the stream (launcher prefix) that printed the header count, so other ranks'
    interleaved output is ignored; a block cut off before its footer still yields what it has; a
    hard-wrapped list value is re-joined. Several dumps (restarts): later values win. Deprecated
    names are kept as printed; `normalize_args` (moetune.arg_names: the catalog's `deprecated`
    spellings) maps them to current names.
    """
    args: dict[str, object] = {}
    active: str | None = None  # prefix of the stream inside a block
    last: str | None = None
    raw_last = ""
    for line in text.splitlines():
        prefix, rest = strip_prefix(line.rstrip("\r\n"))
        if _HEADER.search(rest) and not _FOOTER.search(rest):
            active, last = prefix, None
            continue
        if active is None or prefix != active:
            continue
        if _FOOTER.search(rest):
            active, last = None, None
            continue
        m = _ARG.match(rest)
        if m:
            name, dots, value, wide = m.groups()
            if dots is not None and len(dots) != NAME_WIDTH - len(name):
                last = None  # a line cut inside its dots: the value is lost
                continue
            raw = value if dots is not None else wide
            args[name], last, raw_last = parse_value(raw or ""), name, (raw or "").strip()
        elif last is not None and raw_last[:1] == "[" and not raw_last.endswith("]") and rest.strip():
            raw_last += rest.strip()  # terminal hard-wrap inside a list value
            args[last] = parse_value(raw_last)
    return args


def has_args_header(text: str) -> bool:
    """Whether the log holds an argument dump's header (`---- arguments ----`)."""
    return any(_HEADER.search(strip_prefix(line)[1]) and not _FOOTER.search(line)
               for line in text.splitlines() if "arguments" in line)


def parse_arg_lines(text: str) -> dict[str, object]:
    """Argument lines in `_print_args`' exact format (dots to column 48) found anywhere: what is
    left of a dump whose header was cut away (an excerpt pasted into notes, say). Names of 48+
    characters (no dots) are too plain to tell from other output and are skipped."""
    args: dict[str, object] = {}
    for line in text.splitlines():
        m = _ARG.match(strip_prefix(line.rstrip("\r\n"))[1])
        if m and m.group(2) is not None and len(m.group(2)) == NAME_WIDTH - len(m.group(1)):
            args[m.group(1)] = parse_value(m.group(3) or "")
    return args


def parse_startup(text: str) -> dict[str, object]:
    """Arguments Megatron's other start-up lines state: the parallel sizes of `using world size`,
    `params_dtype` (`using torch.bfloat16 for parameters ...`) and `padded_vocab_size` (`padded
    vocab (size: …) with … dummy tokens (new size: N)`); the last of each wins."""
    out: dict[str, object] = {}
    for short, arg in (("tp", "tensor_model_parallel_size"), ("pp", "pipeline_model_parallel_size"),
                       ("cp", "context_parallel_size"), ("dp", "data_parallel_size"),
                       ("world_size", "world_size")):
        if (v := parse_world_size(text).get(short)) is not None:
            out[arg] = v
    for line in text.splitlines():
        if m := _PARAMS_DTYPE.search(line):
            out["params_dtype"] = m.group(1)
        elif m := _PADDED_VOCAB.search(line):
            out["padded_vocab_size"] = int(m.group(2))
    return out


def parse_world_size(text: str) -> dict[str, int]:
    """Parallel sizes from the last `using world size: …` line (world_size, dp, cp, tp, pp)."""
    found: dict[str, int] = {}
    for line in text.splitlines():
        _, rest = strip_prefix(line)
        m = _WORLD.search(rest)
        if m:
            found = {k: int(v) for k, v in m.groupdict().items() if k != "hcp" and v is not None}
    return found


def _as_modules(value: Any) -> list[str]:
    if value in (None, "", "full", "full_iteration"):  # old scopes without modules
        return []
    if isinstance(value, str):
        return [v for v in re.split(r"[\s,]+", value) if v]
    return list(value)


def _unused_by(margs: Mapping[str, Any]) -> frozenset[str]:
    """Arguments the dump prints that this run's model does not use, so no section field mirrors
    them: without `group_query_attention` Megatron-LM passes `num_query_groups=None` (one KV head
    per attention head; megatron/training/argument_utils.py, `core_transformer_config_from_args`),
    whatever `num_query_groups` prints."""
    return frozenset({"num_query_groups"}) if margs.get("group_query_attention") is False \
        else frozenset()


def contract_from_args(args: Mapping[str, Any], *, world: Mapping[str, int] | None = None,
                       complete: bool = True) -> dict:
    """A contract document from Megatron arguments (normalized here): `megatron_args` plus every
    section field the schema mirrors (`x-megatron-arg`), precision, routing, shape and the label.

    `complete`: the arguments are all the run had (a whole dump, a whole command line), so an
    absent one is at Megatron's default: `precision.params` fp32 without bf16/fp16, the label
    training-equivalent unless a field forces benchmark-only. Otherwise (fragments) what is absent
    is unknown: no fp32 guessed, no training-equivalent label."""
    margs, _ = normalize_args(args)
    world = dict(world or {})
    for short, arg in (("tp", "tensor_model_parallel_size"), ("pp", "pipeline_model_parallel_size"),
                       ("cp", "context_parallel_size"), ("dp", "data_parallel_size"),
                       ("world_size", "world_size")):
        if short in world:
            margs.setdefault(arg, world[short])
    if margs.get("num_experts") is None and margs.get("num_moe_experts") is not None:
        margs["num_experts"] = margs["num_moe_experts"]
    doc: dict[str, Any] = {"schema": SCHEMA_ID}
    for path, arg in arg_mirrors():
        if arg not in margs or arg in _unused_by(margs):
            continue
        value = margs[arg]
        section, field = path.split(".")
        if path == "data.synthetic" and value is not True:
            value = False
        if path == "cuda_graphs.modules":
            value = _as_modules(value)
        doc.setdefault(section, {})[field] = value
    precision = doc.setdefault("precision", {})
    if params := _params_precision(margs, complete=complete):
        precision["params"] = params
    if not precision.get("fp8_format"):
        precision.pop("fp8_recipe", None)  # the recipe default is printed even without FP8
    if not precision:
        doc.pop("precision")
    if "moe_expert_capacity_factor" in margs:
        doc.setdefault("routing", {})["dropless"] = margs["moe_expert_capacity_factor"] is None
    if "variable_seq_lengths" in margs and "shape" in doc:
        doc["shape"]["static"] = not margs["variable_seq_lengths"]
    if "training" in doc and "optimizer" in doc["training"]:
        doc["training"]["optimizer_enabled"] = not margs.get("skip_train", False)
    par = doc.get("parallelism", {})
    if par.get("vpp") is None and isinstance(margs.get("num_virtual_stages_per_pipeline_rank"), int):
        par["vpp"] = margs["num_virtual_stages_per_pipeline_rank"]
    _drop_invalid(doc)
    doc["megatron_args"] = dict(sorted(margs.items()))
    if benchmark_only_reasons(doc):
        doc["label"] = "benchmark-only"
    elif complete:
        doc["label"] = "training-equivalent"
    order = ["schema", "label", "model", "data", "routing", "precision", "shape", "parallelism",
             "cuda_graphs", "training", "megatron_args"]
    return {k: doc[k] for k in order if k in doc}


def _params_precision(margs: Mapping[str, Any], *, complete: bool) -> str | None:
    """bf16 | fp16 | fp32 from the switches, else `params_dtype`; fp32 from silence only when
    the arguments are complete; None: unknown."""
    if margs.get("bf16") is True:
        return "bf16"
    if margs.get("fp16") is True:
        return "fp16"
    if (word := _DTYPE_WORD.get(str(margs.get("params_dtype")))) is not None:
        return word
    if complete or (margs.get("bf16") is False and margs.get("fp16") is False):
        return "fp32"
    return None


def _drop_invalid(doc: dict[str, Any]) -> None:
    """Leave out section fields whose logged value the schema would reject (an older Megatron's
    spelling, say): the value stays in megatron_args, the contract stays valid."""
    for problem in check_contract(doc):
        if problem.severity != "error" or "." not in problem.path:
            continue
        section, field = problem.path.split(".", 1)
        sub = doc.get(section)
        if isinstance(sub, dict):
            sub.pop(field.split(".")[0], None)
            if not sub:
                doc.pop(section)


DUMP = "argument dump"
ARG_LINES = "argument lines"
STARTUP = "start-up lines"
COMMAND_LINE = "command line"
ECHOED = "echoed flags"
SOURCES = (DUMP, ARG_LINES, STARTUP, COMMAND_LINE, ECHOED)  # precedence, strongest first
# set after the argument dump is printed, which shows them as None: a later line's value stands
# (`padded_vocab_size`: megatron/core/tokenizers/utils/build_tokenizer.py, at the tokenizer build)
SET_AFTER_DUMP = frozenset({"padded_vocab_size"})


@dataclass(frozen=True, slots=True)
class LogContract:
    """A contract read from a log, with where each argument came from."""

    contract: dict[str, Any]
    sources: dict[str, str] = field(default_factory=dict)   # argument -> the source that stated it
    conflicts: list[dict[str, Any]] = field(default_factory=list)  # weaker sources overruled
    unread_flags: tuple[str, ...] = ()   # command-line flags next to an unexpanded variable
    complete: bool = False               # a whole dump or command line: absent = default
    set_aside: dict[str, Any] = field(default_factory=dict)  # printed, but no Megatron argument
    missing: tuple[str, ...] = ()        # keys of log_hardware.FILL the log does not state


def read_log(text: str, *, observed: Mapping[str, Any] | None = None,
             observed_source: str = "iteration lines") -> LogContract:
    """Every source of arguments in a log, merged by precedence (`SOURCES`, then `observed`: values
    the caller read elsewhere in the log, e.g. the iteration lines' global batch size, filling only
    what nothing stated). An empty contract when the log states nothing."""
    header = has_args_header(text)
    cmd = command_line_args(text)
    layers: list[tuple[str, Mapping[str, Any]]] = [
        (DUMP, parse_args_dump(text)) if header else (ARG_LINES, parse_arg_lines(text)),
        (STARTUP, parse_startup(text)),
        (COMMAND_LINE, cmd.args if cmd else {}),
        (ECHOED, echoed_args(text)),
        (observed_source, dict(observed or {})),
    ]
    merged: dict[str, Any] = {}
    sources: dict[str, str] = {}
    conflicts: list[dict[str, Any]] = []
    for name, args in layers:
        for arg, value in args.items():
            if arg not in merged or (arg in SET_AFTER_DUMP and merged[arg] is None):
                merged[arg], sources[arg] = value, name
            elif _differs(merged[arg], value):
                conflicts.append({"arg": arg, "kept": {"source": sources[arg], "value": merged[arg]},
                                  "overruled": {"source": name, "value": value}})
    if not any(args for name, args in layers if name != observed_source):
        return LogContract({})
    complete = header or bool(cmd and cmd.complete)
    doc = contract_from_args(merged, complete=complete)
    versions: dict[str, Any] = {}
    for what, version in _VERSION_LINE.findall(text):
        versions[_VERSION_KEY[what]] = None if version == "0.0.0" else version
    if _NO_TE.search(text):  # null = not installed: knob preconditions block TE-only changes
        versions["transformer_engine"] = None
    if m := _GROUPED_BACKEND.search(text):
        versions["grouped_gemm"] = m.group(1) or m.group(2)
    if versions:
        doc["versions"] = versions
    if hardware := hardware_from_log(text):
        doc["hardware"] = hardware
    aside = _set_aside(doc)
    order = ["schema", "label", "hardware", "versions"]
    doc = {**{k: doc[k] for k in order if k in doc}, **{k: v for k, v in doc.items()
                                                        if k not in order and k != "megatron_args"},
           "megatron_args": doc["megatron_args"]}
    missing = tuple(k for k in FILL if _get(doc, k) is None)
    return LogContract(doc, dict(sorted(sources.items())), conflicts,
                       cmd.unread if cmd else (), complete, aside, missing)


def _get(doc: Mapping[str, Any], dotted: str) -> Any:
    section, key = dotted.split(".")
    return (doc.get(section) or {}).get(key)


def _set_aside(doc: dict[str, Any]) -> dict[str, Any]:
    """Take out of `megatron_args` what `contract check` would warn about, so that a from-log
    contract checks clean: a flag spelling printed beside the argument it sets (the bundled
    workload prints `fp8_format`; normalising already gave `fp8` its value) and names Megatron-LM
    does not know (a launch script's own settings, a fork's or an older release's arguments).
    Returns them: the provenance names them, nothing is lost silently."""
    margs = doc["megatron_args"]
    aside = {}
    for p in check_contract(doc):
        key = p.path.removeprefix("megatron_args.")
        if p.severity == "warning" and key != p.path and key in margs:
            aside[key] = margs.pop(key)
    return dict(sorted(aside.items()))


def _differs(a: Any, b: Any) -> bool:
    """Two sources' values for one argument disagree (`['aux_loss']` printed, `aux_loss` given)."""
    if isinstance(a, bool) or isinstance(b, bool):
        return a is not b
    a, b = (x[0] if isinstance(x, list | tuple) and len(x) == 1 else x for x in (a, b))
    if isinstance(a, list | tuple) and isinstance(b, list | tuple):
        return list(a) != list(b)
    return a != b


def contract_from_log(text: str) -> dict:
    """The contract `read_log` finds in a whole log ({} when it states nothing)."""
    return read_log(text).contract
