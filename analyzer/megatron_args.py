"""Megatron-LM start-up output -> typed `megatron_args` and a measurement contract.

Megatron prints, on rank 0, `using world size: …` and then its arguments between
`---- arguments ----` and `---- end of arguments ----` banners, one per line as
`'  {} {} {}'.format(name, '.' * (48 - len(name)), value)` (megatron/training/arguments.py
`_print_args`). Real logs wrap that in launcher prefixes (`[default0]: `, `[host:3]: `, `3: `),
interleave other ranks' lines, cut lines short and elide parts; the parser keeps what it can read.
Megatron-Bridge prints no such dump (it has a "Configuration Summary" instead).
"""

from __future__ import annotations

import ast
import re
from collections.abc import Mapping
from typing import Any

from moetune.analyzer.contract import SCHEMA_ID, arg_mirrors, benchmark_only_reasons, check_contract

from moetune.knobs import normalize_args

# Launcher prefixes, possibly stacked: torchrun `[default7]: `, srun -l `[lrdn3321:3]: ` or `3: `,
# torch's `[rank0]:`. Stripped before anything else.
_PREFIX = re.compile(r"^(?:\s*\[[\w.:@/-]+\]: ?|\s*\d+: )+")
_HEADER = re.compile(r"-{3,}\s*arguments\s*-{3,}")
_FOOTER = re.compile(r"-{3,}\s*end of arguments\s*-{3,}")
# `  name ....... value` (name < 48 chars) or `  name  value` (48+ chars, no dots).
_ARG = re.compile(r"^\s{1,2}([A-Za-z_][A-Za-z0-9_]*) (?:(\.+)(?: (.*))?$| (.*)$)")
NAME_WIDTH = 48  # dots pad every name to this width
_WORLD = re.compile(
    r"using world size: (?P<world_size>\d+), data-parallel size: (?P<dp>\d+)"
    r"(?:, context-parallel size: (?P<cp>\d+))?"
    r"(?:, hierarchical context-parallel sizes: (?P<hcp>.*?),?\s*(?=tensor-model-parallel))?"
    r"(?:, )?tensor-model-parallel size: (?P<tp>\d+)"
    r"(?:, encoder-tensor-model-parallel size: \d+)?"
    r", pipeline-model-parallel size: (?P<pp>\d+)"
)
# Megatron-Core warns at import when Transformer Engine is missing (optimizer, DDP, clip_grads):
# the log's own evidence that TE-only knobs cannot work in that run.
_NO_TE = re.compile(r"Transformer Engine (?:and Apex )?(?:is|are) not installed")
# the bundled workload names the grouped-GEMM backend its environment offers without TE
_GROUPED_BACKEND = re.compile(r"grouped GEMM backend = (\S+)|experts=TorchGroupedMLP\((\S+?)\)")
_INT = re.compile(r"^[+-]?\d+$")
_FLOAT = re.compile(r"^[+-]?(?:\d+\.\d*|\.\d+|\d+)(?:[eE][+-]?\d+)?$|^[+-]?(?:inf|nan)$")
_ENUM = re.compile(r"^[A-Z][A-Za-z0-9]*\.([A-Za-z_][A-Za-z0-9_]*)$")  # AttnBackend.auto -> auto

def strip_prefix(line: str) -> tuple[str, str]:
    """(launcher prefix, rest of the line)."""
    m = _PREFIX.match(line)
    if not m:
        return "", line
    return m.group(0).strip(), line[m.end() :]


def parse_value(text: str) -> Any:
    """`str()` of a Python attribute back to a value: None, bools, ints, floats, lists, enums."""
    s = text.strip()
    if s in ("None", ""):
        return None if s == "None" else ""
    if s in ("True", "False"):
        return s == "True"
    if _INT.match(s):
        return int(s)
    if _FLOAT.match(s):
        return float(s)
    if s[0] in "[({" and s[-1] in "])}":
        try:
            value = ast.literal_eval(s)
        except (ValueError, SyntaxError, MemoryError, RecursionError):
            return s
        return list(value) if isinstance(value, tuple) else value
    m = _ENUM.match(s)
    if m and not s.startswith("torch."):
        return m.group(1)
    return s


def parse_args_dump(text: str) -> dict[str, object]:
    """Arguments from the `arguments` block(s) of a Megatron log, typed, names as printed.

    Only lines from the stream (launcher prefix) that printed the header count, so other ranks'
    interleaved output is ignored; a block cut off before its footer still yields what it has; a
    hard-wrapped list value is re-joined. Several dumps (restarts): later values win. Deprecated
    names are kept as printed; `normalize_args` (moetune.knobs: the catalog's `deprecated`
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


def contract_from_args(args: Mapping[str, Any], *, world: Mapping[str, int] | None = None) -> dict:
    """A contract document from Megatron arguments (normalized here): `megatron_args` plus every
    section field the schema mirrors (`x-megatron-arg`), precision, routing, shape and the label."""
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
        if arg not in margs:
            continue
        value = margs[arg]
        section, field = path.split(".")
        if path == "data.synthetic" and value is not True:
            value = False
        if path == "cuda_graphs.modules":
            value = _as_modules(value)
        doc.setdefault(section, {})[field] = value
    precision = doc.setdefault("precision", {})
    precision["params"] = "bf16" if margs.get("bf16") else "fp16" if margs.get("fp16") else "fp32"
    if not precision.get("fp8_format"):
        precision.pop("fp8_recipe", None)  # the recipe default is printed even without FP8
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
    doc["label"] = "benchmark-only" if benchmark_only_reasons(doc) else "training-equivalent"
    order = ["schema", "label", "model", "data", "routing", "precision", "shape", "parallelism",
             "cuda_graphs", "training", "megatron_args"]
    return {k: doc[k] for k in order if k in doc}


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


def contract_from_log(text: str) -> dict:
    """`contract_from_args` over a whole log: args dump + `using world size` line."""
    args = parse_args_dump(text)
    world = parse_world_size(text)
    if not args and not world:
        return {}
    doc = contract_from_args(args, world=world)
    versions: dict[str, Any] = {}
    if _NO_TE.search(text):  # null = not installed: knob preconditions block TE-only changes
        versions["transformer_engine"] = None
    if m := _GROUPED_BACKEND.search(text):
        versions["grouped_gemm"] = m.group(1) or m.group(2)
    if versions:
        margs = doc.pop("megatron_args")
        doc["versions"] = versions
        doc["megatron_args"] = margs
    return doc
