"""The knob vocabulary: rules/knobs.yaml loaded once, validated against schemas/knobs.schema.json,
as typed frozen records; a knob looked up by any of its names, and a value given as text typed for
it. What a (knob, value) is on a command line, in the environment or as a Megatron-Bridge override
is moetune/knob_flags.py; old and flag spellings of arguments as current names,
moetune/arg_names.py.

A neutral module: the analyzer (planner, contracts, argument dumps), the rules (loader, engine,
docs) and the executor (candidate launches) all import it; it imports none of them.
"""

from __future__ import annotations

import ast
import json
import re
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path
from types import MappingProxyType
from typing import TYPE_CHECKING, Any

from moetune import conditions as expr
from moetune.analyzer.gpus import gpu_table
from moetune.errors import UserError
from moetune.resources import data, schema
from moetune.yamlio import line_of, read_yaml

if TYPE_CHECKING:
    import jsonschema

KNOBS_FILE = data("moetune.rules", "knobs.yaml")
_EMPTY: Mapping[str, Any] = MappingProxyType({})


def _empty() -> Mapping[str, Any]:
    return _EMPTY


# ----------------------------------------------------------------------------- records


@dataclass(frozen=True, slots=True)
class Constraint:
    """`then` must hold on a configuration where `when` holds (checked after a change)."""

    when: expr.Condition
    then: expr.Condition
    reason: str


@dataclass(frozen=True, slots=True)
class Deprecated:
    """An old spelling of a knob and what it means in current arguments.

    A rename (`renamed_to` set) takes the same value(s) as the knob it names; `values` maps old
    values that mean other current settings now. A switch (`sets` non-empty) sets those current
    arguments when given (a log prints it True); `forces` names those it sets even over a value a
    log states beside it; `sets_when_false` is what a printed False states about arguments the log
    leaves out.
    """

    flag: str
    knob: str                                  # the knob whose entry lists it
    renamed_to: str | None = None
    sets: Mapping[str, Any] = field(default_factory=_empty)
    forces: tuple[str, ...] = ()
    sets_when_false: Mapping[str, Any] = field(default_factory=_empty)
    values: Mapping[str, Mapping[str, Any]] = field(default_factory=_empty)
    takes_value: bool = False                  # on a command line it is followed by value(s)
    note: str | None = None

    @property
    def arg(self) -> str:
        """The old argument name as Megatron prints it (`--moe-enable-deepep` -> moe_enable_deepep)."""
        return self.flag[2:].replace("-", "_")


@dataclass(frozen=True, slots=True)
class Knob:
    """One Megatron-LM argument (kind `arg`, `name` = its dest) or environment variable (`env`).

    Only `name` is needed to build one: a knob the catalog lacks is an `arg` spelled `--foo-bar`
    (`knob()`), or an `env` variable.
    """

    name: str
    kind: str = "arg"                          # arg | env
    type: str = "str"                          # bool | enum | int | float | str | list
    flag: str | None = None
    negative_flag: str | None = None
    values: tuple[Any, ...] = ()               # legal values (enum) or list items (list)
    default: Any = None
    minimum: float | None = None
    maximum: float | None = None
    bridge: str | None = None
    contract_path: str | None = None
    wall: str | None = None
    scope: tuple[str, ...] = ()
    requires: tuple[Constraint, ...] = ()
    training_equivalent: bool = True
    equivalent_values: tuple[Any, ...] = ()
    equivalence_note: str | None = None
    note: str | None = None
    deprecated: tuple[Deprecated, ...] = ()
    sources: tuple[str, ...] = ()
    status: str | None = None

    def __hash__(self) -> int:
        return hash((self.name, self.kind, self.flag))

    @property
    def spec(self) -> Mapping[str, Any]:
        """The entry under knobs.yaml's field names, read-only (for code that predates the typed
        fields; new code reads the fields)."""
        out: dict[str, Any] = {"kind": self.kind, "type": self.type, "default": self.default,
                               "training_equivalent": self.training_equivalent}
        optional = {
            "flag": self.flag, "negative_flag": self.negative_flag, "values": self.values,
            "minimum": self.minimum, "maximum": self.maximum, "bridge": self.bridge,
            "contract_path": self.contract_path, "wall": self.wall, "scope": self.scope,
            "equivalent_values": self.equivalent_values,
            "equivalence_note": self.equivalence_note, "note": self.note,
            "sources": self.sources, "status": self.status,
        }
        out.update({k: v for k, v in optional.items() if v not in (None, ())})
        return MappingProxyType(out)


@dataclass(frozen=True, slots=True)
class Catalog:
    """rules/knobs.yaml: knobs in file order, the GPU-model table, every spelling."""

    knobs: Mapping[str, Knob]
    gpus: tuple[tuple[str, str], ...]          # (model substring, architecture), first match wins
    path: Path
    deprecated: Mapping[str, Deprecated] = field(default_factory=_empty, repr=False)  # by old arg
    by_flag: Mapping[str, Knob] = field(default_factory=_empty, repr=False)  # any spelling -> knob
    lines: Mapping[tuple, int] = field(default_factory=_empty, repr=False, compare=False)

    @property
    def renames(self) -> tuple[Deprecated, ...]:
        return tuple(d for d in self.deprecated.values() if d.renamed_to)

    @property
    def switches(self) -> tuple[Deprecated, ...]:
        return tuple(d for d in self.deprecated.values() if d.sets)


# ----------------------------------------------------------------------------- loading


def load(path: Path | None = None) -> Catalog:
    """The knob catalog (rules/knobs.yaml, or `path`), parsed and validated once; UserError names
    the file and line of the first problem."""
    return _load((path or KNOBS_FILE).resolve())


@cache
def _load(path: Path) -> Catalog:
    doc, lines = read_yaml(path)
    _validate(doc, lines, path)

    def fail(at: tuple, msg: str) -> UserError:
        return UserError(f"{path}:{line_of(lines, at)}: {msg}")

    names = set(doc["knobs"])
    knobs: dict[str, Knob] = {}
    for name, spec in doc["knobs"].items():
        at = ("knobs", name)
        requires = tuple(_constraint(req, (*at, "requires", i), names, path, lines)
                         for i, req in enumerate(spec.get("requires", [])))
        for sub in spec.get("scope", []):
            if sub not in names:
                raise fail((*at, "scope"), f"scope names unknown knob {sub!r}")
        values = tuple(spec.get("values", ()))
        if spec["type"] == "enum" and spec["default"] is not None and spec["default"] not in values:
            raise fail((*at, "default"), "default not in values")
        deprecated = tuple(
            Deprecated(
                flag=d["flag"], knob=name,
                renamed_to=None if "sets" in d else name,
                sets=_frozen(d.get("sets", {})),
                forces=tuple(d.get("forces", ())),
                sets_when_false=_frozen(d.get("sets_when_false", {})),
                values=MappingProxyType({str(k): _frozen(v) for k, v in d.get("values", {}).items()}),
                takes_value="sets" not in d and spec["type"] != "bool",
                note=d.get("note"),
            )
            for d in spec.get("deprecated", ())
        )
        knobs[name] = Knob(
            name=name, kind=spec["kind"], type=spec["type"], flag=spec.get("flag"),
            negative_flag=spec.get("negative_flag"), values=values, default=spec["default"],
            minimum=spec.get("minimum"), maximum=spec.get("maximum"), bridge=spec.get("bridge"),
            contract_path=spec.get("contract_path"), wall=spec["wall"],
            scope=tuple(spec.get("scope", ())), requires=requires,
            training_equivalent=spec["training_equivalent"],
            equivalent_values=tuple(spec.get("equivalent_values", ())),
            equivalence_note=spec.get("equivalence_note"), note=spec.get("note"),
            deprecated=deprecated, sources=tuple(spec.get("sources", ())),
            status=spec.get("status"),
        )
    by_flag: dict[str, Knob] = {}
    by_arg: dict[str, Deprecated] = {}
    for k in knobs.values():
        for i, d in enumerate(k.deprecated):
            at = ("knobs", k.name, "deprecated", i)
            for arg, value in _settings(d):
                if arg not in knobs:
                    raise fail(at, f"{d.flag} sets unknown knob {arg!r}")
                if msg := value_problem(knobs[arg], value):
                    raise fail(at, f"{d.flag}: {msg}")
            if not set(d.forces) <= set(d.sets):
                raise fail((*at, "forces"), "`forces` names arguments of `sets` only")
            if d.arg in knobs:
                raise fail(at, f"{d.flag} is the argument of knob {d.arg!r}, not an old spelling")
            by_arg[d.arg] = d
        spellings = [(k.flag, ("knobs", k.name, "flag")),
                     (k.negative_flag, ("knobs", k.name, "negative_flag")),
                     *((d.flag, ("knobs", k.name, "deprecated", i))
                       for i, d in enumerate(k.deprecated))]
        for f, at in spellings:
            if f is not None and f in by_flag:
                raise fail(at, f"{f} belongs to both {by_flag[f].name} and {k.name}")
            if f is not None:
                by_flag[f] = k
    gpus = tuple((g.match, g.arch) for g in gpu_table())  # the one GPU table (analyzer/gpus.yaml)
    return Catalog(MappingProxyType(knobs), gpus, path, MappingProxyType(by_arg),
                   MappingProxyType(by_flag), MappingProxyType(lines))


def _constraint(req: Mapping[str, Any], at: tuple, names: set[str], path: Path,
                lines: Mapping[tuple, int]) -> Constraint:
    conds = []
    for part in ("when", "then"):
        try:
            cond = expr.parse(req[part], (*at, part))
        except expr.ExprError as exc:
            raise UserError(f"{path}:{line_of(lines, exc.where)}: {exc}") from None
        for p in expr.predicates(cond):
            if p.source in ("knob", "audit") and p.path not in names:
                raise UserError(f"{path}:{line_of(lines, (*at, part))}: unknown knob {p.path!r} "
                                f"(not in {path.name})")
        conds.append(cond)
    return Constraint(conds[0], conds[1], req["reason"])


def _settings(d: Deprecated) -> Iterator[tuple[str, Any]]:
    yield from d.sets.items()
    yield from d.sets_when_false.items()
    for meaning in d.values.values():
        yield from meaning.items()


def _frozen(x: Any) -> Any:
    if isinstance(x, Mapping):
        return MappingProxyType({k: _frozen(v) for k, v in x.items()})
    return x


@cache
def _validator() -> jsonschema.Draft202012Validator:
    import jsonschema  # only when validating: a heavy import the start-up does not need
    from referencing import Registry, Resource

    schemas = [json.loads(schema(n).read_text(encoding="utf-8")) for n in ("knobs", "rule")]
    registry = Registry().with_resources((s["$id"], Resource.from_contents(s)) for s in schemas)
    return jsonschema.Draft202012Validator(schemas[0], registry=registry)


def _validate(doc: Any, lines: Mapping[tuple, int], path: Path) -> None:
    """Raise UserError for the first schema problem (file:line: where: what)."""
    errors = sorted(_validator().iter_errors(doc), key=lambda e: list(map(str, e.absolute_path)))
    if not errors:
        return
    err = errors[0]
    at = list(err.absolute_path)
    if len(at) >= 5 and at[0] == "knobs" and at[2] == "requires" and at[4] in ("when", "then"):
        # the schema's oneOf message prints the whole subtree; the grammar says what is wrong
        try:
            expr.parse(doc["knobs"][at[1]]["requires"][at[3]][at[4]], tuple(at[:5]))
        except expr.ExprError as exc:
            raise UserError(f"{path}:{line_of(lines, exc.where)}: {at[4]}: {exc}") from None
    msg = err.message
    if err.validator == "additionalProperties":
        extra = re.findall(r"'([^']+)' was unexpected", msg) or re.findall(r"\('([^']+)'", msg)
        if extra:
            at, msg = [*at, extra[0]], f"unknown field {extra[0]!r}"
    msg = " ".join(msg.split())
    msg = msg if len(msg) <= 160 else msg[:159] + "…"
    where = ".".join(map(str, err.absolute_path))
    raise UserError(f"{path}:{line_of(lines, at)}: " + (f"{where}: {msg}" if where else msg))


def value_problem(knob: Knob, value: Any) -> str | None:
    """Why `value` is not legal for `knob`, or None (None itself is: unset = the default)."""
    if value is None:
        return None
    kind, legal = knob.type, knob.values
    if kind == "bool" and not isinstance(value, bool):
        return f"{knob.name} is a bool; got {value!r}"
    if kind == "int" and (isinstance(value, bool) or not isinstance(value, int)):
        return f"{knob.name} is an int; got {value!r}"
    if kind == "float" and (isinstance(value, bool) or not isinstance(value, int | float)):
        return f"{knob.name} is a number; got {value!r}"
    if kind in ("int", "float") and knob.minimum is not None and value < knob.minimum:
        return f"{knob.name} must be ≥ {knob.minimum}; got {value!r}"
    if kind in ("int", "float") and knob.maximum is not None and value > knob.maximum:
        return f"{knob.name} must be ≤ {knob.maximum}; got {value!r}"
    if kind == "enum" and value not in legal:
        return f"{knob.name} must be one of {list(legal)}; got {value!r}"
    if kind == "list":
        if not isinstance(value, list):
            return f"{knob.name} is a list; got {value!r}"
        if legal and (bad := [v for v in value if v not in legal]):
            return f"{knob.name}: {bad} not in {list(legal)}"
    if kind == "str" and legal and value not in legal:
        return f"{knob.name} must be one of {list(legal)}; got {value!r}"
    return None


# ----------------------------------------------------------------------------- names


def flag_spelling(arg: str, catalog: Catalog | None = None) -> str:
    """The catalog's flag for a Megatron argument; one it lacks gets Megatron's generated form
    `foo_bar` -> `--foo-bar`."""
    k = (catalog or load()).knobs.get(arg)
    return k.flag if k is not None and k.flag else "--" + arg.replace("_", "-")


def knob(name: str, catalog: Catalog | None = None) -> Knob:
    """The knob a user names: underscore name, any flag spelling (current, negative, deprecated)
    or an environment variable. Names the catalog lacks become ad-hoc knobs (`--foo-bar`, env)."""
    cat = catalog or load()
    key = name.lstrip("-").replace("-", "_") if name.startswith("--") else name
    if key in cat.knobs:
        return cat.knobs[key]
    if name in cat.by_flag:
        return cat.by_flag[name]
    if re.fullmatch(r"[A-Z][A-Z0-9_]*", name):
        return Knob(name=name, kind="env")
    if not re.fullmatch(r"[a-z][a-z0-9_]*", key):
        raise UserError(f"not a knob name: {name!r} (use e.g. micro_batch_size=4)")
    return Knob(name=key, flag=flag_spelling(key, cat))


def parse_value(text: str, k: Knob) -> Any:
    """A value given as text (`--change k=v`, a command-line token) typed for knob `k`."""
    t = text.strip()
    if k.type == "bool" or (k.type == "str" and t.lower() in ("true", "false") and k.kind == "arg"):
        if t.lower() in ("true", "1", "yes", "on"):
            return True
        if t.lower() in ("false", "0", "no", "off"):
            return False
        raise UserError(f"{k.name} is a switch: give true or false, not {text!r}")
    if k.type == "int":
        try:
            return int(t)
        except ValueError:
            raise UserError(f"{k.name} needs an integer, not {text!r}") from None
    if k.type == "float":
        try:
            return float(t)
        except ValueError:
            raise UserError(f"{k.name} needs a number, not {text!r}") from None
    if k.type == "list":
        if t.startswith("["):
            try:
                return [str(x) for x in ast.literal_eval(t)]
            except (ValueError, SyntaxError):
                raise UserError(f"{k.name}: cannot read list {text!r}") from None
        return [x for x in re.split(r"[,\s]+", t) if x]
    if k.type == "enum" and k.values and t not in map(str, k.values):
        raise UserError(f"{k.name} must be one of {', '.join(map(str, k.values))}, not {text!r}")
    if k.type == "str" and re.fullmatch(r"[+-]?\d+", t):
        return int(t)
    return t
