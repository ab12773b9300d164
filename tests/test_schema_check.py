"""moetune.schema_check, the load-time validator of the analyzer's catalogs, agrees with jsonschema
on the shipped catalogs and on every single-edit mutation of them, and refuses schema keywords it
does not implement."""

from __future__ import annotations

import copy
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import yaml

from moetune.schema_check import Unsupported, errors

ROOT = Path(__file__).resolve().parents[1]
CATALOGS = {  # every catalog whose loader validates with schema_check
    "kernel_classes": ROOT / "analyzer" / "kernel_classes.yaml",
    "whatif": ROOT / "analyzer" / "whatif.yaml",
    "phases": ROOT / "analyzer" / "phases.yaml",
}
_REPLACEMENTS: tuple[Any, ...] = (None, True, 0, 1.5, -1, "", "x", "Bad Name", [], ["x"], {},
                                  {"x": 1})


def _schema(name: str) -> dict[str, Any]:
    return json.loads((ROOT / "schemas" / f"{name}.schema.json").read_text())


def _paths(node: Any, at: tuple = ()) -> Iterator[tuple]:
    yield at
    if isinstance(node, dict):
        for k, v in node.items():
            yield from _paths(v, (*at, k))
    elif isinstance(node, list) and node:
        yield from _paths(node[0], (*at, 0))  # the items of a list share one schema


def _mutants(doc: Any) -> Iterator[tuple[str, Any]]:
    """Each value (of a list, its first item) replaced by each of a few wrong or right values, or
    dropped; an unknown key added to each mapping."""
    for at in list(_paths(doc)):
        if not at:
            continue
        for new in _REPLACEMENTS:
            m = copy.deepcopy(doc)
            parent = m
            for k in at[:-1]:
                parent = parent[k]
            parent[at[-1]] = copy.deepcopy(new)
            yield f"{at}={new!r}", m
        m = copy.deepcopy(doc)
        parent = m
        for k in at[:-1]:
            parent = parent[k]
        del parent[at[-1]]
        yield f"{at} dropped", m
    for at in list(_paths(doc)):
        m = copy.deepcopy(doc)
        node = m
        for k in at:
            node = node[k]
        if isinstance(node, dict):
            node["unknown_key"] = 1
            yield f"{at} + unknown_key", m


@pytest.mark.parametrize("name", sorted(CATALOGS))
def test_agrees_with_jsonschema_on_the_catalog_and_its_mutants(name: str) -> None:
    schema = _schema(name)
    ref = jsonschema.Draft202012Validator(schema)
    doc = yaml.safe_load(CATALOGS[name].read_text())
    assert errors(doc, schema) == [] and ref.is_valid(doc)
    n_invalid = 0
    for label, m in _mutants(doc):
        want = ref.is_valid(m)
        got = errors(m, schema)
        assert (not got) == want, (label, got[:1], [e.message for e in ref.iter_errors(m)][:1])
        n_invalid += not want
    assert n_invalid > 200  # the mutations do reach the schema's constraints


def test_error_paths_name_the_broken_place() -> None:
    schema = _schema("whatif")
    doc = yaml.safe_load(CATALOGS["whatif"].read_text())
    doc["transforms"]["grouped_gemm"]["kind"] = "teleport"
    ((at, message),) = errors(doc, schema)
    assert at == ("transforms", "grouped_gemm", "kind") and "'teleport' is not one of" in message


def test_refuses_a_keyword_it_does_not_implement() -> None:
    with pytest.raises(Unsupported, match="patternProperties"):
        errors({"a": 1}, {"type": "object", "patternProperties": {"^a$": {"type": "string"}}})
    with pytest.raises(Unsupported, match="only references inside"):
        errors(1, {"$ref": "https://example.com/x.json"})
