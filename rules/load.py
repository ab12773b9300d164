"""Load and validate rule files, and check the knob catalog (moetune.knobs) against the diagnosis
and contract schemas: YAML safe-load only, JSON Schema, then the cross-checks a schema cannot
express (knob names, metric paths, legal values, id = file stem).

Every problem names the file and line. A user rule folder is data only: plain YAML scalars,
lists and mappings (no tags, no duplicate keys), never code.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path
from typing import TYPE_CHECKING, Any

from moetune import conditions as expr
from moetune import knobs as knob_catalog
from moetune.errors import UserError
from moetune.knobs import KNOBS_FILE, Catalog, value_problem
from moetune.knobs import Knob as Knob  # re-exported: rules.engine reads it from here
from moetune.resources import data
from moetune.vocabulary import WALLS
from moetune.yamlio import line_of, read_yaml

if TYPE_CHECKING:
    from referencing import Registry

SCHEMAS = data("moetune.schemas")
CATALOG = data("moetune.rules", "catalog")
WHATIF = data("moetune.analyzer", "whatif.yaml")
FIXTURES_FOLDER = "fixtures"  # <rule folder>/fixtures/: its rules' scenarios, not rules
# Pseudo metric: seconds of GPU window analyzed (all steps, all ranks); see rules/engine.py.
WINDOW = "window_s"

# Sections the diagnosis schema still declares as open objects; these are the paths
# docs/architecture.md promises in them. Once the schema spells them out, the schema wins.
_OPEN_SECTION_PATHS = (
    "critical_path.recoverable_s.<wall>",
    "critical_path.gain_ceiling.<wall>",
    "blocking.communication_blocking_s",
    "blocking.communication_exposed_s",
    "blocking.communication_hidden_s",
    "ranks.count",
    "ranks.step_time_s_by_rank",
    "ranks.stragglers",
    "ranks.collective_arrival_skew_s.p50",
    "ranks.collective_arrival_skew_s.max",
    "ranks.collective_arrival_skew_s.instances",
)
# Contract sections (docs/architecture.md) used until schemas/contract.schema.json exists.
_CONTRACT_SECTIONS = (
    "schema", "label", "model", "hardware", "versions", "data", "routing", "precision", "shape",
    "parallelism", "cuda_graphs", "training", "window", "env", "megatron_args",
)


@dataclass(frozen=True, slots=True)
class Problem:
    path: str
    line: int | None
    message: str

    def __str__(self) -> str:
        return f"{self.path}:{self.line}: {self.message}" if self.line else f"{self.path}: {self.message}"


@dataclass(frozen=True)
class Rule:
    id: str
    spec: Mapping[str, Any]
    when: expr.Condition
    path: Path
    lines: Mapping[tuple, int] = field(repr=False, default_factory=dict)

    @property
    def wall(self) -> str:
        return self.spec["wall"]

    @property
    def knob(self) -> str:
        return self.spec["change"]["knob"]


# ----------------------------------------------------------------------------- schemas


@cache
def schema(name: str) -> dict[str, Any]:
    return json.loads((SCHEMAS / f"{name}.schema.json").read_text(encoding="utf-8"))


@cache
def _registry() -> Registry:
    from referencing import Registry, Resource

    resources = [
        (s["$id"], Resource.from_contents(s))
        for s in (schema(n) for n in ("rule", "diagnosis"))
    ]
    return Registry().with_resources(resources)


def _schema_problems(doc: Any, name: str, path: Path, lines: Mapping[tuple, int]) -> list[Problem]:
    import jsonschema  # only when validating: a heavy import the start-up does not need

    validator = jsonschema.Draft202012Validator(schema(name), registry=_registry())
    out: list[Problem] = []
    grammar_done: set[tuple] = set()
    for err in sorted(validator.iter_errors(doc), key=lambda e: list(map(str, e.absolute_path))):
        at = list(err.absolute_path)
        cond_root = _condition_root(at)
        if cond_root is not None:
            # jsonschema's oneOf message prints the whole subtree; the grammar parser says what
            # is wrong and where.
            if cond_root in grammar_done:
                continue
            grammar_done.add(cond_root)
            node = doc
            for k in cond_root:
                node = node[k]
            try:
                expr.parse(node, cond_root)
            except expr.ExprError as exc:
                out.append(Problem(str(path), line_of(lines, exc.where), f"{cond_root[-1]}: {exc}"))
                continue
        msg = err.message
        if err.validator == "additionalProperties":
            extra = re.findall(r"'([^']+)' was unexpected", msg) or re.findall(r"\('([^']+)'", msg)
            if extra:
                at = [*at, extra[0]]
                msg = f"unknown field {extra[0]!r}"
        where = ".".join(map(str, err.absolute_path))
        text = f"{where}: {_shorten(msg)}" if where else _shorten(msg)
        out.append(Problem(str(path), line_of(lines, at), text))
    return out


def _condition_root(at: list) -> tuple | None:
    """The path of the condition tree an error lies in (a rule's `when`)."""
    return ("when",) if at[:1] == ["when"] else None


def _shorten(msg: str, limit: int = 160) -> str:
    msg = " ".join(msg.split())
    return msg if len(msg) <= limit else msg[: limit - 1] + "…"


# ----------------------------------------------------------------------------- paths


def diagnosis_path_ok(path: str) -> bool:
    """Does `path` (dotted) name a value field of schemas/diagnosis.schema.json?

    Keys of open maps (`evidence.classes.<kclass>`) may themselves contain dots (`comm.ep.deepep`).
    """
    return _schema_walk(schema("diagnosis"), path.split("."), 0)


def _schema_walk(node: Any, parts: list[str], i: int) -> bool:
    node = _deref(node)
    if i == len(parts):
        return node.get("type") != "object"  # a leaf must be a value, not a section
    props = node.get("properties", {})
    extra = node.get("additionalProperties")
    if parts[i] in props:
        return _schema_walk(props[parts[i]], parts, i + 1)
    if isinstance(extra, dict):
        return any(_schema_walk(extra, parts, j) for j in range(i + 1, len(parts) + 1))
    if node.get("type") == "object" and not props and extra is None:
        return _open_path_ok(parts, i)
    return False


def _open_path_ok(parts: list[str], _: int) -> bool:
    for pattern in _OPEN_SECTION_PATHS:
        want = pattern.split(".")
        if len(want) == len(parts) and all(
            w == p or (w == "<wall>" and p in WALLS) for w, p in zip(want, parts, strict=True)
        ):
            return True
    return False


def _deref(node: Any) -> Any:
    ref = node.get("$ref") if isinstance(node, dict) else None
    if ref and ref.startswith("#/$defs/"):
        return schema("diagnosis")["$defs"][ref.removeprefix("#/$defs/")]
    return node


def contract_path_ok(path: str) -> bool:
    """Does `path` name a contract field (schemas/contract.schema.json; open sections accept any)?"""
    parts = path.split(".")
    f = SCHEMAS / "contract.schema.json"
    if not f.exists():
        return parts[0] in _CONTRACT_SECTIONS
    node: Any = json.loads(f.read_text(encoding="utf-8"))
    for part in parts:
        props = node.get("properties", {}) if isinstance(node, dict) else {}
        if part in props:
            node = props[part]
            continue
        # an open section (no properties, or additionalProperties allowed): anything declared
        return isinstance(node, dict) and (
            not props or node.get("additionalProperties") not in (False, None)
        )
    return True


# ----------------------------------------------------------------------------- knobs


def load_catalog(path: Path | None = None) -> Catalog:
    """The knob catalog (moetune.knobs.load: rules/knobs.yaml or `path`) with the metric and
    contract paths of its constraints checked; raise UserError on the first problem."""
    return _checked_catalog((path or KNOBS_FILE).resolve())


@cache
def _checked_catalog(path: Path) -> Catalog:
    catalog = knob_catalog.load(path)
    for knob in catalog.knobs.values():
        for i, c in enumerate(knob.requires):
            for part, cond in (("when", c.when), ("then", c.then)):
                for p in expr.predicates(cond):
                    if bad := _predicate_problem(p, catalog.knobs):
                        at = ("knobs", knob.name, "requires", i, part)
                        raise UserError(f"{path}:{line_of(catalog.lines, at)}: {bad}")
    return catalog


def _predicate_problem(p: expr.Predicate, knob_names: Iterable[str]) -> str | None:
    names = set(knob_names)
    if p.source == "metric":
        for path in (p.path, p.of) if p.of else (p.path,):
            if path != WINDOW and not diagnosis_path_ok(path):
                return f"unknown metric path {path!r} (not in schemas/diagnosis.schema.json)"
    elif p.source == "contract" and not contract_path_ok(p.path):
        return f"unknown contract path {p.path!r}"
    elif p.source in ("audit", "knob") and p.path not in names:
        return f"unknown knob {p.path!r} (not in rules/knobs.yaml)"
    return None


# ----------------------------------------------------------------------------- rules


@cache
def whatif_transforms() -> dict[str, Any]:
    """The transforms of analyzer/whatif.yaml a rule's `expected_gain.whatif` may name (read as
    plain YAML: analyzer.whatif, which validates it, pulls numpy and polars into `rules check`)."""
    doc, _ = read_yaml(WHATIF)
    return dict(doc.get("transforms") or {}) if isinstance(doc, dict) else {}


def check_rule_file(path: Path, catalog: Catalog) -> tuple[Rule | None, list[Problem]]:
    """Validate one rule file; return the rule (when valid) and every problem found."""
    try:
        data, lines = read_yaml(path)
    except UserError as exc:
        return None, [Problem(str(path), None, exc.message.removeprefix(f"{path}: "))]
    probs = _schema_problems(data, "rule", path, lines)
    if probs:
        return None, probs

    def bad(at: tuple, msg: str) -> None:
        probs.append(Problem(str(path), line_of(lines, at), msg))

    rid = data["id"]
    if rid != path.stem:
        bad(("id",), f"id {rid!r} must equal the file stem {path.stem!r}")
    if rid.split(".")[0] != data["wall"]:
        bad(("wall",), f"wall {data['wall']!r} must be the id prefix of {rid!r}")
    if path.parent.name in WALLS and path.parent.name != data["wall"]:
        bad(("wall",), f"rule of wall {data['wall']!r} lies in folder {path.parent.name!r}")
    try:
        when = expr.parse(data["when"], ("when",))
    except expr.ExprError as exc:
        bad(exc.where, f"when: {exc}")
        return None, probs
    knobs = catalog.knobs
    for i, p in enumerate(expr.predicates(when)):
        msg = _predicate_problem(p, knobs)
        if msg:
            at = _find_predicate(data["when"], p, ("when",)) or ("when",)
            bad(at, f"when[{i}]: {msg}")
    change = data["change"]
    knob = knobs.get(change["knob"])
    if knob is None:
        bad(("change", "knob"), f"unknown knob {change['knob']!r} (not in rules/knobs.yaml)")
    else:
        for key in ("to", "from"):
            if key in change and (msg := value_problem(knob, change[key])):
                bad(("change", key), msg)
        if "scale" in change and knob.type != "int":
            bad(("change", "scale"), f"`scale` multiplies an int knob; {knob.name} is {knob.type}")
        if "at_most" in change and "scale" not in change:
            bad(("change", "at_most"), "`at_most` bounds a `scale` change")
        for sub, val in (change.get("with") or {}).items():
            if sub not in knob.scope:
                bad(("change", "with", sub),
                    f"{sub!r} is not in the scope of {knob.name} ({list(knob.scope)}): "
                    "a rule changes exactly one knob")
            elif msg := value_problem(knobs[sub], val):
                bad(("change", "with", sub), msg)
    gain = data["expected_gain"]
    rec = gain.get("recoverable", {})
    if "metric" in rec and not diagnosis_path_ok(rec["metric"]):
        bad(("expected_gain", "recoverable", "metric"), f"unknown metric path {rec['metric']!r}")
    named = gain.get("whatif", [])
    for tid in [named] if isinstance(named, str) else named:
        spec = whatif_transforms().get(tid)
        if spec is None:
            bad(("expected_gain", "whatif"),
                f"unknown what-if transform {tid!r} (not in analyzer/whatif.yaml)")
        elif spec.get("knob") != change["knob"]:
            bad(("expected_gain", "whatif"), f"what-if transform {tid!r} models "
                f"{spec.get('knob')}, the rule changes {change['knob']}")
    for key in ("efficiency", "fixed"):
        if key in gain and gain[key][0] > gain[key][1]:
            bad(("expected_gain", key), f"{key} range must be [low, high]")
    if "efficiency" in gain and not all(0 <= x <= 1 for x in gain["efficiency"]):
        bad(("expected_gain", "efficiency"), "efficiency is a fraction of R in [0, 1]")
    ver = data["verify"]
    if not diagnosis_path_ok(ver["metric"]):
        bad(("verify", "metric"), f"unknown metric path {ver['metric']!r}")
    if "audit" in ver and ver["audit"] not in knobs:
        bad(("verify", "audit"), f"unknown knob {ver['audit']!r}")
    if probs:
        return None, probs
    return Rule(rid, data, when, path, lines), probs


def _find_predicate(raw: Any, p: expr.Predicate, at: tuple) -> tuple | None:
    if isinstance(raw, dict):
        if raw.get(p.source) == p.path and raw.get("op") == p.op:
            return (*at, p.source)
        for k, v in raw.items():
            if found := _find_predicate(v, p, (*at, k)):
                return found
    elif isinstance(raw, list):
        for i, v in enumerate(raw):
            if found := _find_predicate(v, p, (*at, i)):
                return found
    return None


def rule_files(folder: Path) -> list[Path]:
    """The rule files of a folder, at any depth, except its `fixtures/` (the scenarios its rules
    name: rules/scenarios.py)."""
    if folder.exists() and not folder.is_dir():
        raise UserError("is a file, not a rules folder (a folder of rule .yaml files)", path=folder)
    if not folder.is_dir():
        raise UserError("rules folder not found", path=folder)
    return sorted(p for p in folder.rglob("*") if p.suffix in (".yaml", ".yml") and p.is_file()
                  and p.relative_to(folder).parts[0] != FIXTURES_FOLDER)


def check_rules(folder: Path, catalog: Catalog | None = None) -> tuple[dict[str, Rule], list[Problem]]:
    """Every rule of a folder and every problem (including duplicate ids)."""
    catalog = catalog or load_catalog()
    rules: dict[str, Rule] = {}
    problems: list[Problem] = []
    for f in rule_files(folder):
        rule, probs = check_rule_file(f, catalog)
        problems += probs
        if rule is None:
            continue
        if rule.id in rules:
            problems.append(Problem(str(f), line_of(rule.lines, ("id",)),
                                    f"duplicate id {rule.id!r} (also {rules[rule.id].path})"))
            continue
        rules[rule.id] = rule
    return rules, problems


def load_rules(extra: Iterable[Path] = (), catalog: Catalog | None = None) -> dict[str, Rule]:
    """Built-in rules, then each extra folder: a rule with an existing id overrides it."""
    catalog = catalog or load_catalog()
    merged: dict[str, Rule] = {}
    for folder in (CATALOG, *extra):
        rules, problems = check_rules(Path(folder), catalog)
        if problems:
            raise UserError(str(problems[0]) + (f" (+{len(problems) - 1} more)" if len(problems) > 1 else ""))
        merged.update(rules)
    for rule in merged.values():  # a rule named by another must exist once every folder is in
        for i, rid in enumerate(rule.spec["expected_gain"].get("weigh_with") or ()):
            if rid not in merged:
                at = line_of(rule.lines, ("expected_gain", "weigh_with", i))
                raise UserError(f"{rule.path}:{at}: expected_gain.weigh_with names no rule "
                                f"{rid!r}")
    return dict(sorted(merged.items()))
