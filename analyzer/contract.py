"""The measurement contract: what was measured, under which conditions (schemas/contract.schema.json).

A contract is JSON or YAML. Every section is optional, so a contract of only `megatron_args` is valid
input for audit and recommend; `check_contract(doc, strict=True)` demands the complete set. Field
types are enforced by the schema; the rest of the knowledge this module applies is data in that
schema too: `x-megatron-arg` (which Megatron argument a section field mirrors),
`x-benchmark-only-when` (fields that force the `benchmark-only` label). The argument names moetune
knows (others only warn) are `analyzer/megatron_arguments.json`, read from Megatron-LM's own
parser by `tools/megatron_arguments.py`.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from types import MappingProxyType
from typing import TYPE_CHECKING, Any, Literal

import yaml

from moetune import knobs, resources
from moetune.arg_names import normalize_args, spelling_of
from moetune.errors import UserError, bad_json, read_user_text
from moetune.resources import schema

if TYPE_CHECKING:
    import jsonschema

SCHEMA_PATH = schema("contract")
SCHEMA_ID = "moetune.contract/1"
Severity = Literal["error", "warning"]
MISSING = object()


@dataclass(frozen=True, slots=True)
class Problem:
    """One finding of `check_contract`, naming the field by its dotted path."""

    path: str
    message: str
    severity: Severity = "error"

    def __str__(self) -> str:
        return f"{self.path}: {self.message}" if self.path else self.message


@dataclass(frozen=True, slots=True)
class Parallelism:
    tp: int | None = None
    pp: int | None = None
    vpp: int | None = None
    cp: int | None = None
    ep: int | None = None
    etp: int | None = None
    dp: int | None = None
    sequence_parallel: bool | None = None
    world_size: int | None = None


@dataclass(frozen=True, slots=True)
class Contract:
    """A frozen, typed view of a contract plus the raw document (read-only mappings all the way)."""

    raw: Mapping[str, Any]
    source: str | None
    label: str | None
    parallelism: Parallelism
    megatron_args: Mapping[str, Any]
    warnings: tuple[str, ...] = ()

    def get(self, path: str, default: Any = None) -> Any:
        """Value at a dotted path (`shape.static`, `megatron_args.moe_grouped_gemm`) or `default`."""
        value = lookup(self.raw, path)
        return default if value is MISSING else value

    def section(self, name: str) -> Mapping[str, Any]:
        value = self.raw.get(name)
        return value if isinstance(value, Mapping) else MappingProxyType({})

    def claims(self) -> Mapping[str, Any]:
        """Megatron arguments the contract asserts, current names only: `megatron_args` first, then
        section fields that mirror an argument (`parallelism.ep` -> `expert_model_parallel_size`)
        where the args are silent; deprecated names mapped (`moe_enable_deepep` -> flex + deepep)."""
        return MappingProxyType(normalize_args(effective_args(self.raw))[0])


# --- schema -----------------------------------------------------------------------------------


@cache
def contract_schema() -> Mapping[str, Any]:
    return json.loads(SCHEMA_PATH.read_text())


@cache
def _validators() -> tuple[jsonschema.Draft202012Validator, jsonschema.Draft202012Validator]:
    import jsonschema  # only when validating: a heavy import the start-up does not need
    from referencing import Registry, Resource

    schema = contract_schema()
    registry = Registry().with_resource(schema["$id"], Resource.from_contents(schema))
    base = jsonschema.Draft202012Validator(schema, registry=registry)
    strict = jsonschema.Draft202012Validator(schema["$defs"]["complete"], registry=registry)
    return base, strict


@cache
def megatron_arguments() -> dict[str, Any]:
    """analyzer/megatron_arguments.json: Megatron-LM's arguments at a pinned commit (name → flags,
    type, default, choices), the names its argument dump derives, earlier versions' names."""
    return json.loads(resources.data("moetune.analyzer", "megatron_arguments.json").read_text())


@cache
def megatron_flags() -> Mapping[str, tuple[str, Mapping[str, Any]]]:
    """Every Megatron-LM flag (`--disable-bias-linear`) → (the argument it sets, its entry)."""
    return MappingProxyType({f: (dest, e) for dest, e in megatron_arguments()["arguments"].items()
                             for f in e["flags"]})


@cache
def known_megatron_args() -> frozenset[str]:
    m = megatron_arguments()
    return frozenset(m["arguments"]) | frozenset(m["derived"]) | frozenset(m["older"])


@cache
def arg_mirrors() -> tuple[tuple[str, str], ...]:
    """(section.field, megatron_arg) pairs declared by `x-megatron-arg` in the schema."""
    out = []
    for sec, sub in contract_schema()["properties"].items():
        for field, spec in sub.get("properties", {}).items():
            if "x-megatron-arg" in spec:
                out.append((f"{sec}.{field}", spec["x-megatron-arg"]))
    return tuple(out)


def with_args(doc: Mapping[str, Any] | None, changes: Mapping[str, Any]) -> dict[str, Any]:
    """A copy of contract `doc` with Megatron arguments set: in `megatron_args` and in every
    section field that mirrors one (`shape.micro_batch_size`), so the contract still agrees with
    itself (`_mirror_problems`)."""
    import copy

    out = copy.deepcopy(dict(doc or {}))
    out.setdefault("schema", SCHEMA_ID)
    out.setdefault("megatron_args", {}).update(changes)
    for path, arg in arg_mirrors():
        section, field = path.split(".")
        if arg in changes and isinstance(out.get(section), dict) and field in out[section]:
            out[section][field] = changes[arg]
    return out


def lookup(doc: Mapping[str, Any], path: str) -> Any:
    node: Any = doc
    for part in path.split("."):
        if not isinstance(node, Mapping) or part not in node:
            return MISSING
        node = node[part]
    return node


def field_value(doc: Mapping[str, Any], path: str) -> Any:
    """A section field (`shape.global_batch_size`), else the `megatron_args` value of the argument
    it mirrors (`x-megatron-arg`): a contract of only `megatron_args` still states it; MISSING
    when neither is there."""
    value = lookup(doc, path)
    if value is not MISSING:
        return value
    margs = doc.get("megatron_args")
    arg = dict(arg_mirrors()).get(path)
    if arg is not None and isinstance(margs, Mapping) and arg in margs:
        return margs[arg]
    return MISSING


def effective_args(doc: Mapping[str, Any]) -> dict[str, Any]:
    """`megatron_args` plus the arguments that section fields mirror (explicit args win)."""
    margs = doc.get("megatron_args")
    out: dict[str, Any] = dict(margs) if isinstance(margs, Mapping) else {}
    for path, arg in arg_mirrors():
        value = lookup(doc, path)
        if value is not MISSING and arg not in out:
            out[arg] = value
    precision = doc.get("precision")
    if isinstance(precision, Mapping) and precision.get("params") in ("bf16", "fp16"):
        out.setdefault(precision["params"], True)
    return out


# --- checking ---------------------------------------------------------------------------------


def _json(value: Any) -> str:
    return json.dumps(value, default=str)


def _type_word(t: Any) -> str:
    return " or ".join(t) if isinstance(t, list) else str(t)


def _schema_problems(error: jsonschema.ValidationError) -> Iterator[Problem]:
    if error.context:  # anyOf/oneOf/allOf: report the leaves
        for sub in error.context:
            yield from _schema_problems(sub)
        return
    path = ".".join(str(p) for p in error.absolute_path)
    kind, inst = error.validator, error.instance
    if kind == "type":
        yield Problem(path, f"expected {_type_word(error.validator_value)}, got {_json(inst)}")
    elif kind == "required":
        present = inst if isinstance(inst, Mapping) else {}
        for name in error.validator_value:
            if name not in present:
                yield Problem(f"{path}.{name}" if path else name, "missing (required by --strict)")
    elif kind == "additionalProperties":
        allowed = set(error.schema.get("properties", {}))
        for name in sorted(k for k in inst if k not in allowed):
            hint = ", ".join(sorted(allowed)) if len(allowed) <= 16 else "see schemas/contract.schema.json"
            yield Problem(f"{path}.{name}" if path else name, f"unknown field (expected one of: {hint})")
    elif kind == "enum":
        choices = ", ".join(_json(v) for v in error.validator_value)
        yield Problem(path, f"expected one of {choices}, got {_json(inst)}")
    elif kind == "const":
        yield Problem(path, f"expected {_json(error.validator_value)}, got {_json(inst)}")
    elif kind == "minimum":
        yield Problem(path, f"expected >= {error.validator_value}, got {_json(inst)}")
    elif kind == "pattern":
        yield Problem(path, f"expected a string matching {error.validator_value}, got {_json(inst)}")
    elif kind == "minProperties":
        yield Problem(path, "must not be empty (required by --strict)")
    else:
        yield Problem(path, error.message)


def check_contract(doc: Any, *, strict: bool = False) -> list[Problem]:
    """Every problem with a contract document: schema errors, label violations, section/argument
    disagreements (errors); unknown Megatron argument names (warnings). Sorted, errors first."""
    if not isinstance(doc, Mapping):
        return [Problem("", f"expected a mapping of sections, got {type(doc).__name__}")]
    base, complete = _validators()
    validator = complete if strict else base
    problems = [p for e in validator.iter_errors(doc) for p in _schema_problems(e)]
    problems += _label_problems(doc)
    problems += _mirror_problems(doc)
    margs = doc.get("megatron_args")
    if isinstance(margs, Mapping):
        known = known_megatron_args()
        spelled = _spelling_problems(margs)
        problems += spelled
        problems += [
            Problem(f"megatron_args.{k}", "not a Megatron-LM argument moetune knows (kept as is)", "warning")
            for k in margs
            if k not in known and spelling_of(k)[0] not in known | set(knobs.load().knobs)
        ]
        problems += _deprecated_problems(margs)
    unique = {(p.severity, p.path, p.message): p for p in problems}
    return sorted(unique.values(), key=lambda p: (p.severity != "error", p.path, p.message))


def _spelling_problems(margs: Mapping[str, Any]) -> list[Problem]:
    """Flag spellings (`fp8_format`, `--fp8-format` for `fp8`): read as the argument, with a
    warning; an error when the value is not one the argument takes, or when the contract also
    gives the argument a different value (which one was run is then unknown)."""
    cat = knobs.load()
    own = megatron_arguments()
    out = []
    for k, value in margs.items():
        name, negated = spelling_of(k, cat)
        if name == k or k in own["arguments"] or k in own["derived"]:
            continue  # an argument of current Megatron-LM in its own right
        at = f"megatron_args.{k}"
        if name in cat.knobs and (msg := knobs.value_problem(cat.knobs[name], value)):
            out.append(Problem(at, f"flag spelling of {name}: {msg}"))
            continue
        read = (not value) if negated and isinstance(value, bool) else value
        if name in margs and margs[name] != read:
            out.append(Problem(at, f"{_json(value)} disagrees with megatron_args.{name} = "
                                   f"{_json(margs[name])}"))
        elif name in cat.knobs or "-" in k:
            out.append(Problem(at, f"flag spelling; read as {name} = {_json(read)}", "warning"))
    return out


def _deprecated_problems(margs: Mapping[str, Any]) -> list[Problem]:
    """Old argument names (the knob catalog's `deprecated` spellings): read as current ones."""
    deprecated = knobs.load().deprecated
    out = []
    for k, value in margs.items():
        old = deprecated.get(spelling_of(k)[0])
        if old is None:
            continue
        if old.renamed_to:
            out.append(Problem(f"megatron_args.{k}", f"deprecated name; read as {old.renamed_to}",
                               "warning"))
        elif value is True:
            read_as = ", ".join(f"{a}={v}" for a, v in old.sets.items())
            out.append(Problem(f"megatron_args.{k}", f"deprecated switch; read as {read_as}",
                               "warning"))
    return out


def benchmark_only_reasons(doc: Mapping[str, Any]) -> list[tuple[str, Any, str]]:
    """(path, value, why) for every field that makes the run benchmark-only."""
    out = []
    for rule in contract_schema()["x-benchmark-only-when"]:
        value = lookup(doc, rule["path"])
        if value is not MISSING and value == rule["equals"] and type(value) is type(rule["equals"]):
            out.append((rule["path"], value, rule["why"]))
    return out


def _label_problems(doc: Mapping[str, Any]) -> list[Problem]:
    if doc.get("label") != "training-equivalent":
        return []
    return [
        Problem(
            "label",
            f"training-equivalent, but {path} = {_json(value)} ({why}): label must be benchmark-only",
        )
        for path, value, why in benchmark_only_reasons(doc)
    ]


def _mirror_problems(doc: Mapping[str, Any]) -> list[Problem]:
    """A section field and the Megatron argument it mirrors must agree when both are given."""
    margs = doc.get("megatron_args")
    if not isinstance(margs, Mapping):
        return []
    out = []
    for path, arg in arg_mirrors():
        value = lookup(doc, path)
        if value is MISSING or arg not in margs:
            continue
        other = margs[arg]
        if isinstance(value, list) and (other is None or isinstance(other, list | tuple)):
            same = list(value) == list(other or [])  # an unset list argument prints None
        else:
            same = value == other
        if not same:
            out.append(
                Problem(path, f"{_json(value)} disagrees with megatron_args.{arg} = {_json(other)}")
            )
    return out


# --- loading ----------------------------------------------------------------------------------


# A contract is a few sections of scalars and short lists: anything far deeper or larger is not one,
# and must be refused before the schema, freeze() or json.dumps walk it (recursion, alias bombs).
MAX_DEPTH = 32
MAX_VALUES = 100_000


def read_document(path: str | Path) -> Any:
    """Parse a JSON or YAML file (YAML is a superset; JSON errors read better for .json)."""
    p = Path(path)
    text = read_user_text(p)
    repeat = None
    try:
        if p.suffix.lower() == ".json":
            doc = json.loads(text)
        else:
            doc, repeat = _load_yaml(text, p)
    except json.JSONDecodeError:
        raise bad_json(text, p) from None
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" at line {mark.line + 1}" if mark is not None else ""
        raise UserError(f"invalid YAML{where}: {getattr(exc, 'problem', exc)}", path=p) from None
    except RecursionError:  # the parsers recurse per nesting level
        raise UserError(f"nested more than {MAX_DEPTH} levels deep: not a contract",
                        path=p) from None
    _check_shape(doc, p)
    if repeat is not None:
        raise repeat
    return doc


def _load_yaml(text: str, path: Path) -> tuple[Any, UserError | None]:
    """`yaml.safe_load`, and the refusal of a key repeated in one mapping (raised once the
    document's size is checked): YAML would keep only the last (`hardware: {gpu_memory_gb: …}`
    then `hardware: {gpu_model: …}` loses the memory). Each node is visited once: aliases share
    nodes, and an alias bomb must not make the walk exponential."""
    loader = yaml.SafeLoader(text)
    try:
        node = loader.get_single_node()
        todo, seen_nodes, repeat = ([node] if node is not None else []), set(), None
        while todo and repeat is None:
            n = todo.pop()
            if id(n) in seen_nodes:
                continue
            seen_nodes.add(id(n))
            if isinstance(n, yaml.MappingNode):
                keys: dict[Any, int] = {}
                for k, v in n.value:
                    if isinstance(k, yaml.ScalarNode):
                        if k.value in keys:
                            repeat = UserError(
                                f"key {k.value!r} at line {k.start_mark.line + 1} repeats line "
                                f"{keys[k.value]}'s: YAML keeps only the last; merge them into "
                                "one", path=path)
                            break
                        keys[k.value] = k.start_mark.line + 1
                    todo.append(v)
            elif isinstance(n, yaml.SequenceNode):
                todo.extend(n.value)
        return (loader.construct_document(node) if node is not None else None), repeat
    finally:
        loader.dispose()


def _check_shape(doc: Any, path: Path) -> None:
    """Refuse documents nested deeper than MAX_DEPTH or holding more than MAX_VALUES values
    (YAML aliases can make a few lines expand to billions); an iterative walk with a budget."""
    stack: list[tuple[Any, int]] = [(doc, 0)]
    seen = 0
    while stack:
        node, depth = stack.pop()
        seen += 1
        if seen > MAX_VALUES:
            raise UserError(f"holds more than {MAX_VALUES:,} values (YAML aliases?): not a "
                            "contract", path=path)
        if depth > MAX_DEPTH:
            raise UserError(f"nested more than {MAX_DEPTH} levels deep: not a contract", path=path)
        if isinstance(node, dict):
            stack.extend((v, depth + 1) for v in node.values())
        elif isinstance(node, list):
            stack.extend((v, depth + 1) for v in node)


def freeze(value: Any) -> Any:
    if isinstance(value, Mapping):
        return MappingProxyType({k: freeze(v) for k, v in value.items()})
    if isinstance(value, list | tuple):
        return tuple(freeze(v) for v in value)
    return value


def thaw(value: Any) -> Any:
    """Plain dicts and lists of a frozen document (`freeze`) or of a Contract."""
    if isinstance(value, Contract):
        value = value.raw
    if isinstance(value, Mapping):
        return {k: thaw(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [thaw(v) for v in value]
    return value


def contract_from_doc(doc: Mapping[str, Any], *, source: str | None = None) -> Contract:
    """Validate (non-strict) and wrap; any error is a UserError naming the first bad field."""
    problems = check_contract(doc)
    errors = [p for p in problems if p.severity == "error"]
    if errors:
        more = f" (and {len(errors) - 1} more; run `moetune contract check`)" if len(errors) > 1 else ""
        raise UserError(f"invalid contract: {errors[0]}{more}", path=source)
    par = doc.get("parallelism") if isinstance(doc.get("parallelism"), Mapping) else {}
    return Contract(
        raw=freeze(doc),
        source=source,
        label=doc.get("label"),
        parallelism=Parallelism(**{k: par.get(k) for k in Parallelism.__slots__}),
        megatron_args=freeze(doc.get("megatron_args") or {}),
        warnings=tuple(str(p) for p in problems if p.severity == "warning"),
    )


def load_contract(path: str | Path) -> Contract:
    """Read, validate and freeze a contract file (JSON or YAML). Bad input raises UserError."""
    doc = read_document(path)
    if doc is None:
        raise UserError("is empty", path=path)
    if not isinstance(doc, Mapping):
        raise UserError(f"expected a mapping of sections, got {type(doc).__name__}", path=path)
    return contract_from_doc(doc, source=str(path))
