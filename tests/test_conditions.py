"""The condition language (moetune.conditions) on its own: grammar, operators and the three-valued
logic that rules, knob constraints and audit signatures all evaluate through."""

from __future__ import annotations

from typing import Any

import pytest

from moetune import conditions as c
from moetune.conditions import MISSING, UNKNOWN, ExprError, Node, Predicate


def facts_resolver(facts: dict[str, Any]) -> c.Resolver:
    """One flat source, `fact`, as a test resolver: an absent key is missing."""

    def resolve(source: str, path: str) -> Any:
        assert source in ("fact", "metric")
        return facts.get(path, MISSING)

    return resolve


def ev(raw: dict, **facts: Any) -> bool | None:
    return c.evaluate(c.parse(raw), facts_resolver(facts))[0]


def leaf(op: str, value: Any = None, path: str = "x", *, no_value: bool = False) -> dict:
    return {"fact": path, "op": op} if no_value else {"fact": path, "op": op, "value": value}


# --------------------------------------------------------------------------- grammar


def test_parse_builds_the_tree_in_document_order() -> None:
    missing_c = {"not": leaf("missing", path="c", no_value=True)}
    cond = c.parse({"all": [leaf(">", 1, "a"), {"any": [leaf("==", "g", "b"), missing_c]}]})
    assert isinstance(cond, Node) and cond.kind == "all"
    assert [p.path for p in c.predicates(cond)] == ["a", "b", "c"]
    assert c.predicates(cond)[0] == Predicate("fact", "a", ">", 1)
    assert c.predicates(cond)[2].describe() == "fact:c"
    assert c.predicates(cond)[0].describe() == "fact:a > 1"


@pytest.mark.parametrize(("raw", "message", "where"), [
    ([leaf(">", 1)], "must be a mapping", ()),
    ({"all": []}, "non-empty list", ("all",)),
    ({"all": [leaf(">", 1)], "any": [leaf(">", 1)]}, "must be alone", ()),
    ({"not": leaf(">", 1), "fact": "x"}, "must be alone", ()),
    ({"op": ">", "value": 1}, "exactly one of", ()),
    ({"fact": "x", "metric": "y", "op": ">", "value": 1}, "exactly one of", ()),
    ({"fact": "", "op": ">", "value": 1}, "non-empty string", ("fact",)),
    ({"fact": "x", "op": "gt", "value": 1}, "unknown op 'gt'", ("op",)),
    ({"fact": "x", "op": ">"}, "needs a value", ()),
    ({"fact": "x", "op": "exists", "value": 1}, "takes no value", ("value",)),
    ({"fact": "x", "op": ">", "value": "1"}, "compares numbers", ("value",)),
    ({"fact": "x", "op": "<", "value": True}, "compares numbers", ("value",)),
    ({"fact": "x", "op": "in", "value": "graph"}, "needs a list", ("value",)),
    ({"fact": "x", "op": "version_at_least", "value": "new"}, "version string", ("value",)),
    ({"audit": "fp8", "op": "==", "value": "ran"}, "audit verdicts", ("value",)),
    ({"fact": "x", "op": ">", "value": 1, "of": "y"}, "`of` divides a metric", ("of",)),
    ({"fact": "x", "op": ">", "value": 1, "path": "y"}, "unknown key", ("path",)),
])
def test_parse_errors_name_the_node(raw: Any, message: str, where: tuple) -> None:
    with pytest.raises(ExprError, match=message) as info:
        c.parse(raw, ("top",))
    assert info.value.where[: 1] == ("top",)
    assert info.value.where[1:][: len(where)] == where


def test_parse_error_path_reaches_into_groups() -> None:
    with pytest.raises(ExprError) as info:
        c.parse({"all": [leaf(">", 1), {"any": [leaf("approx", 1)]}]}, ("ran_when",))
    assert info.value.where == ("ran_when", "all", 1, "any", 0, "op")


# --------------------------------------------------------------------------- three-valued logic

T, F, U = leaf("==", 1, "t"), leaf("==", 2, "t"), leaf("==", 1, "absent")
BOOL = {"T": T, "F": F, "U": U}
FACTS = {"t": 1}


@pytest.mark.parametrize(("a", "b", "all_", "any_"), [
    ("T", "T", True, True), ("T", "F", False, True), ("F", "F", False, False),
    ("T", "U", None, True), ("F", "U", False, None), ("U", "U", None, None),
])
def test_kleene_and_or(a: str, b: str, all_: bool | None, any_: bool | None) -> None:
    for x, y in ((a, b), (b, a)):
        assert ev({"all": [BOOL[x], BOOL[y]]}, **FACTS) is all_
        assert ev({"any": [BOOL[x], BOOL[y]]}, **FACTS) is any_


def test_not_keeps_unknown_unknown() -> None:
    assert ev({"not": T}, **FACTS) is False
    assert ev({"not": F}, **FACTS) is True
    assert ev({"not": U}, **FACTS) is None


def test_evaluate_reports_every_leaf_seen() -> None:
    verdict, seen = c.evaluate(c.parse({"all": [leaf(">", 0, "n"), leaf(">", 0, "gone")]}),
                               facts_resolver({"n": 3}))
    assert verdict is None
    assert [(o.predicate.path, o.actual, o.result) for o in seen] == [("n", 3, True), ("gone", None, None)]


# --------------------------------------------------------------------------- operators


def test_equality_normalizes_numbers_and_compares_null() -> None:
    assert ev(leaf("==", 1), x=1.0) is True
    assert ev(leaf("==", 32), x="32") is True  # env values are strings
    assert ev(leaf("==", "graph"), x="graph") is True
    assert ev(leaf("==", "graph"), x="node") is False
    assert ev(leaf("==", True), x=True) is True
    assert ev(leaf("==", False), x=True) is False
    assert ev(leaf("==", None), x=None) is True  # a stated null is a value
    assert ev(leaf("==", None), x=4) is False
    assert ev(leaf("!=", None), x=4) is True
    assert ev(leaf("==", 0), x=None) is False
    assert ev(leaf("==", 0)) is None  # missing: unknown, never false
    assert ev(leaf("!=", 0)) is None


@pytest.mark.parametrize(("op", "value", "actual", "want"), [
    (">", 0, 1, True), (">", 0, 0, False), (">=", 50, 50, True), (">=", 0.25, 0.2499, False),
    ("<", 0.02, 0.0199, True), ("<", 2, 2, False), ("<=", 2, 2, True),
    (">", 1, "2", True),  # a numeric string orders as its number
    (">", 0, None, None),  # null never orders
    (">", 1, "graph", None), (">", 1, [2], None), (">", 0, True, None),  # not numbers: unknown
])
def test_ordering(op: str, value: float, actual: Any, want: bool | None) -> None:
    assert ev(leaf(op, value), x=actual) is want


def test_ordering_on_a_missing_input_is_unknown() -> None:
    assert ev(leaf(">", 0)) is None


def test_in_and_not_in() -> None:
    assert ev(leaf("in", ["graph", "node"]), x="graph") is True
    assert ev(leaf("in", ["graph", "node"]), x="none") is False
    assert ev(leaf("in", [1, 2]), x=2.0) is True
    assert ev(leaf("in", [None]), x=None) is True
    assert ev(leaf("not_in", ["nccl_alltoall", "deepep"]), x="hybridep") is True
    assert ev(leaf("in", ["graph"])) is None


def test_contains() -> None:
    assert ev(leaf("contains", "attn"), x=["attn", "moe_router"]) is True
    assert ev(leaf("contains", "mlp"), x=["attn"]) is False
    assert ev(leaf("contains", "expandable_segments:True"), x="expandable_segments:True,x") is True
    assert ev(leaf("not_contains", "attn"), x=None) is True
    assert ev(leaf("contains", "attn")) is None


def test_exists_and_missing_treat_null_as_absent() -> None:
    ex, mi = leaf("exists", no_value=True), leaf("missing", no_value=True)
    assert (ev(ex, x=0), ev(mi, x=0)) == (True, False)
    assert (ev(ex, x=None), ev(mi, x=None)) == (False, True)
    assert (ev(ex), ev(mi)) == (False, True)


def test_versions() -> None:
    assert ev(leaf("version_at_least", "2.7.0"), x="2.10.1+cu128") is True
    assert ev(leaf("version_at_least", "2.7"), x="v2.6.9") is False
    assert ev(leaf("version_below", "2.7.0"), x="2.6") is True
    assert ev(leaf("version_at_least", "0"), x=None) is False  # null: not installed


def test_unknown_input_is_unknown_for_every_op() -> None:
    resolve = lambda _s, _p: UNKNOWN  # noqa: E731 - e.g. a contract section that is absent
    for raw in (leaf("==", 1), leaf(">", 1), leaf("in", [1]), leaf("exists", no_value=True),
                leaf("missing", no_value=True), leaf("contains", "a")):
        assert c.evaluate(c.parse(raw), resolve)[0] is None, raw


def test_of_divides_by_another_metric() -> None:
    cond = {"metric": "a", "op": ">=", "value": 0.5, "of": "b"}
    assert ev(cond, a=3, b=4) is True
    assert ev(cond, a=1, b=4) is False
    assert ev(cond, a=1, b=0) is None  # no ratio
    assert ev(cond, a=1) is None


def test_holds_only_when_true_is_how_two_valued_callers_read_it() -> None:
    """The audit reads a condition as holding only when it is True: a missing fact (unknown)
    and a false one both leave it unproven, inside `all` and `any` alike."""

    def holds(raw: dict, **facts: Any) -> bool:
        return ev(raw, **facts) is True

    assert not holds(leaf(">", 0))
    assert not holds({"any": [leaf(">", 0), leaf("==", 1, "y")]}, y=2)
    assert holds({"any": [leaf(">", 0), leaf("==", 1, "y")]}, y=1)
    assert not holds({"all": [leaf(">", 0), leaf("==", 1, "y")]}, y=1)
