"""The condition language: `all`/`any`/`not` over predicates `{<source>: path, op, value}`.

One language for rule conditions and knob constraints (rules/) and for the backend audit's
signatures (analyzer/audit.py, rules/signatures.yaml). The caller resolves each source: the rules
engine all five (`fact`: derived hardware/topology facts such as `gpu_arch`); the audit only
`fact`, its dotted facts (`observed.*`, `evidence.*`, `probe.*`, `claims.*`, `trace.*`).

A closed grammar evaluated by a tree walk, never `eval`. Three-valued: a predicate whose input is
absent (no critical-path section, contract silent about a field) is *unknown* (None), so a rule
fires only on evidence, a knob constraint that cannot be checked becomes a caveat rather than a
silent pass or block, and an audit condition that is not True gives no verdict.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

SOURCES = ("metric", "contract", "audit", "fact", "knob")
OPS = (
    "==", "!=", "<", "<=", ">", ">=", "in", "not_in", "contains", "not_contains",
    "exists", "missing", "version_at_least", "version_below",
)
_NO_VALUE_OPS = {"exists", "missing"}
_ORDER_OPS = {"<", "<=", ">", ">="}
_LIST_VALUE_OPS = {"in", "not_in"}
AUDIT_VERDICTS = ("confirmed", "contradicted", "unobservable")
_MISSING = object()  # the input has no such field: `exists` is false
_UNKNOWN = object()  # the input does not say at all (e.g. no such contract section): always unknown


class ExprError(ValueError):
    """A malformed condition; `where` is the path inside the condition (for file:line lookup)."""

    def __init__(self, message: str, where: tuple[str | int, ...] = ()) -> None:
        super().__init__(message)
        self.where = where


@dataclass(frozen=True, slots=True)
class Predicate:
    source: str
    path: str
    op: str
    value: Any = None
    of: str | None = None

    def describe(self) -> str:
        lhs = f"{self.source}:{self.path}" + (f"/{self.of}" if self.of else "")
        return lhs if self.op in _NO_VALUE_OPS else f"{lhs} {self.op} {self.value!r}"


@dataclass(frozen=True, slots=True)
class Node:
    kind: str  # "all" | "any" | "not"
    children: tuple[Node | Predicate, ...]


Condition = Node | Predicate


@dataclass(frozen=True, slots=True)
class Observation:
    """One evaluated predicate: what was compared with what, for the evidence list."""

    predicate: Predicate
    actual: Any
    result: bool | None


# A resolver maps (source, path) to a value, or _MISSING when the input does not have it.
Resolver = Callable[[str, str], Any]


def parse(raw: Any, where: tuple[str | int, ...] = ()) -> Condition:
    """Validate and compile a condition tree; raise ExprError naming the offending node."""
    if not isinstance(raw, Mapping):
        raise ExprError("a condition must be a mapping (all/any/not or a predicate)", where)
    for kind in ("all", "any"):
        if kind in raw:
            if set(raw) != {kind}:
                raise ExprError(f"`{kind}` must be alone in its mapping", where)
            items = raw[kind]
            if not isinstance(items, list) or not items:
                raise ExprError(f"`{kind}` needs a non-empty list", (*where, kind))
            return Node(kind, tuple(parse(c, (*where, kind, i)) for i, c in enumerate(items)))
    if "not" in raw:
        if set(raw) != {"not"}:
            raise ExprError("`not` must be alone in its mapping", where)
        return Node("not", (parse(raw["not"], (*where, "not")),))
    return _parse_predicate(raw, where)


def _parse_predicate(raw: Mapping[str, Any], where: tuple[str | int, ...]) -> Predicate:
    unknown = set(raw) - {*SOURCES, "op", "value", "of"}
    if unknown:
        raise ExprError(f"unknown key(s) {sorted(unknown)} in predicate", (*where, sorted(unknown)[0]))
    sources = [s for s in SOURCES if s in raw]
    if len(sources) != 1:
        raise ExprError(f"a predicate names exactly one of {', '.join(SOURCES)}", where)
    source = sources[0]
    path = raw[source]
    if not isinstance(path, str) or not path:
        raise ExprError(f"`{source}` must be a non-empty string", (*where, source))
    op = raw.get("op")
    if op not in OPS:
        raise ExprError(f"unknown op {op!r}; expected one of {', '.join(OPS)}", (*where, "op"))
    if op in _NO_VALUE_OPS:
        if "value" in raw:
            raise ExprError(f"op `{op}` takes no value", (*where, "value"))
    elif "value" not in raw:
        raise ExprError(f"op `{op}` needs a value", where)
    value = raw.get("value")
    if op in _ORDER_OPS and (isinstance(value, bool) or not isinstance(value, int | float)):
        raise ExprError(f"op `{op}` compares numbers; got {value!r}", (*where, "value"))
    if op in _LIST_VALUE_OPS and not isinstance(value, list):
        raise ExprError(f"op `{op}` needs a list value", (*where, "value"))
    if op.startswith("version_") and not (isinstance(value, str) and _VERSION.match(value)):
        raise ExprError(f"op `{op}` needs a version string like '2.7.0'", (*where, "value"))
    if source == "audit" and op in {"==", "!="} and value not in AUDIT_VERDICTS:
        raise ExprError(f"audit verdicts are {', '.join(AUDIT_VERDICTS)}", (*where, "value"))
    of = raw.get("of")
    if of is not None and (source != "metric" or not isinstance(of, str)):
        raise ExprError("`of` divides a metric by another metric path", (*where, "of"))
    return Predicate(source, path, op, value, of)


def predicates(cond: Condition) -> list[Predicate]:
    """Every leaf, in document order (load-time path checks use it)."""
    if isinstance(cond, Predicate):
        return [cond]
    return [p for c in cond.children for p in predicates(c)]


def evaluate(cond: Condition, resolve: Resolver) -> tuple[bool | None, list[Observation]]:
    """Kleene three-valued evaluation; returns the verdict and every leaf observation."""
    seen: list[Observation] = []
    return _eval(cond, resolve, seen), seen


def _eval(cond: Condition, resolve: Resolver, seen: list[Observation]) -> bool | None:
    if isinstance(cond, Predicate):
        actual = resolve(cond.source, cond.path)
        if cond.of is not None and actual not in (_MISSING, _UNKNOWN):
            actual = _ratio(actual, resolve("metric", cond.of))
        result = _compare(cond, actual)
        seen.append(Observation(cond, None if actual in (_MISSING, _UNKNOWN) else actual, result))
        return result
    results = [_eval(c, resolve, seen) for c in cond.children]
    if cond.kind == "not":
        return None if results[0] is None else not results[0]
    if cond.kind == "all":
        return False if False in results else (None if None in results else True)
    return True if True in results else (None if None in results else False)


def _ratio(num: Any, den: Any) -> Any:
    if den is _UNKNOWN:
        return _UNKNOWN
    if den is _MISSING or not _is_number(num) or not _is_number(den) or den == 0:
        return _MISSING
    return num / den


def _is_number(x: Any) -> bool:
    return isinstance(x, int | float) and not isinstance(x, bool)


def _compare(p: Predicate, actual: Any) -> bool | None:
    if actual is _UNKNOWN:
        return None
    if p.op == "exists":
        return actual is not _MISSING and actual is not None
    if p.op == "missing":
        return actual is _MISSING or actual is None
    if actual is _MISSING:
        return None
    v = p.value
    match p.op:
        case "==":
            return _norm(actual) == _norm(v)
        case "!=":
            return _norm(actual) != _norm(v)
        case "in":
            return _norm(actual) in [_norm(x) for x in v]
        case "not_in":
            return _norm(actual) not in [_norm(x) for x in v]
        case "contains" | "not_contains":
            if actual is None:
                found = False
            elif isinstance(actual, list | tuple):
                found = _norm(v) in [_norm(x) for x in actual]
            else:
                found = str(v) in str(actual)
            return found if p.op == "contains" else not found
        case "version_at_least" | "version_below":
            have = _version(actual)
            if have is None:  # null: not installed (contract `versions`), so no version is met
                return False
            ok = have >= _version(v)  # type: ignore[operator]
            return ok if p.op == "version_at_least" else not ok
    actual = _norm(actual)  # env values are strings: "32" > 1
    if actual is None or not _is_number(actual):
        return None
    return {"<": actual < v, "<=": actual <= v, ">": actual > v, ">=": actual >= v}[p.op]


def _norm(x: Any) -> Any:
    # YAML `1` and JSON `1.0`, and env strings "32" vs 32, compare equal.
    if _is_number(x):
        return float(x)
    if isinstance(x, str):
        try:
            return float(x)
        except ValueError:
            return x
    if isinstance(x, list | tuple):
        return tuple(_norm(i) for i in x)
    return x


_VERSION = re.compile(r"^v?(\d+)(?:\.(\d+))?(?:\.(\d+))?")


def _version(x: Any) -> tuple[int, int, int] | None:
    m = _VERSION.match(str(x)) if x is not None else None
    if not m:
        return None
    return tuple(int(g or 0) for g in m.groups())  # type: ignore[return-value]


MISSING = _MISSING
UNKNOWN = _UNKNOWN
