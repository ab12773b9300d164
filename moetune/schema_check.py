"""Validate a catalog against its JSON Schema at load time, without importing jsonschema.

The analyzer's catalogs (analyzer/kernel_classes.yaml, whatif.yaml, phases.yaml) are read by every
diagnosis; importing jsonschema alone costs 0.1–0.17 s, a sixth of a small trace's whole
diagnosis. This module checks the subset of JSON Schema (draft 2020-12) those schemas use, in well
under a millisecond, so every load is validated, the shipped files included. A schema that uses a
keyword outside the subset is refused (`Unsupported`) rather than half-checked, and
tests/test_schema_check.py holds the verdicts equal to jsonschema's on the shipped catalogs and
on mutations of them.
"""

from __future__ import annotations

import re
from collections.abc import Iterator, Mapping
from functools import cache
from typing import Any

# Keywords that say nothing about validity.
_ANNOTATIONS = frozenset({"$schema", "$id", "$comment", "$defs", "title", "description", "default",
                          "examples", "deprecated"})
_CHECKED = frozenset({
    "type", "enum", "const", "properties", "required", "additionalProperties", "propertyNames",
    "minProperties", "maxProperties", "items", "minItems", "maxItems", "uniqueItems", "pattern",
    "minLength", "maxLength", "minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum",
    "oneOf", "anyOf", "allOf", "not", "$ref",
})


class Unsupported(ValueError):
    """The schema uses a keyword this checker does not implement."""


def errors(doc: Any, schema: Mapping[str, Any]) -> list[tuple[tuple, str]]:
    """Every (path, message) where `doc` breaks `schema`, sorted by path."""
    out = list(_check(doc, schema, schema, ()))
    return sorted(out, key=lambda e: [str(p) for p in e[0]])


def first_error(doc: Any, schema: Mapping[str, Any]) -> tuple[tuple, str] | None:
    errs = errors(doc, schema)
    return errs[0] if errs else None


def _check(x: Any, s: Any, root: Mapping[str, Any], at: tuple) -> Iterator[tuple[tuple, str]]:
    if s is True:
        return
    if s is False:
        yield at, f"{_show(x)} is not allowed here"
        return
    unknown = set(s) - _ANNOTATIONS - _CHECKED
    if unknown:
        raise Unsupported(f"schema keyword(s) {sorted(unknown)} at {'/'.join(map(str, at))}")
    if "$ref" in s:
        yield from _check(x, _resolve(root, s["$ref"]), root, at)
    if "type" in s:
        types = s["type"] if isinstance(s["type"], list) else [s["type"]]
        if not any(_is_type(x, t) for t in types):
            yield at, f"{_show(x)} is not of type {', '.join(map(repr, types))}"
            return  # the other keywords of this node would only repeat the mismatch
    if "enum" in s and not any(_equal(x, v) for v in s["enum"]):
        yield at, f"{_show(x)} is not one of {s['enum']!r}"
    if "const" in s and not _equal(x, s["const"]):
        yield at, f"{s['const']!r} was expected"
    if isinstance(x, dict):
        yield from _object(x, s, root, at)
    elif isinstance(x, list):
        yield from _array(x, s, root, at)
    elif isinstance(x, str):
        if "pattern" in s and not _regex(s["pattern"]).search(x):
            yield at, f"{x!r} does not match {s['pattern']!r}"
        if "minLength" in s and len(x) < s["minLength"]:
            yield at, f"{x!r} is too short"
        if "maxLength" in s and len(x) > s["maxLength"]:
            yield at, f"{x!r} is too long"
    elif _is_type(x, "number"):
        for key, bad in (("minimum", x < s.get("minimum", x)), ("maximum", x > s.get("maximum", x)),
                         ("exclusiveMinimum", "exclusiveMinimum" in s and x <= s["exclusiveMinimum"]),
                         ("exclusiveMaximum", "exclusiveMaximum" in s and x >= s["exclusiveMaximum"])):
            if bad:
                yield at, f"{x!r} breaks {key} {s[key]!r}"
    for sub in s.get("allOf", ()):
        yield from _check(x, sub, root, at)
    if "anyOf" in s and not any(_valid(x, sub, root) for sub in s["anyOf"]):
        yield at, f"{_show(x)} is not valid under any of the given schemas"
    if "oneOf" in s:
        n = sum(_valid(x, sub, root) for sub in s["oneOf"])
        if n != 1:
            yield at, (f"{_show(x)} is not valid under any of the given schemas" if n == 0 else
                       f"{_show(x)} is valid under each of {n} of the given schemas")
    if "not" in s and _valid(x, s["not"], root):
        yield at, f"{_show(x)} should not be valid under {s['not']!r}"


def _object(x: dict, s: Mapping[str, Any], root: Mapping[str, Any], at: tuple
            ) -> Iterator[tuple[tuple, str]]:
    props = s.get("properties", {})
    for key in s.get("required", ()):
        if key not in x:
            yield at, f"{key!r} is a required property"
    if "minProperties" in s and len(x) < s["minProperties"]:
        yield at, f"{_show(x)} should be non-empty" if s["minProperties"] == 1 else \
            f"{_show(x)} has fewer than {s['minProperties']} properties"
    if "maxProperties" in s and len(x) > s["maxProperties"]:
        yield at, f"{_show(x)} has more than {s['maxProperties']} properties"
    extra = s.get("additionalProperties", True)
    for key, value in x.items():
        if "propertyNames" in s:
            for _, msg in _check(key, s["propertyNames"], root, ()):
                yield (*at, key), msg
        if key in props:
            yield from _check(value, props[key], root, (*at, key))
        elif extra is False:
            yield at, f"Additional properties are not allowed ({key!r} was unexpected)"
        elif extra is not True:
            yield from _check(value, extra, root, (*at, key))


def _array(x: list, s: Mapping[str, Any], root: Mapping[str, Any], at: tuple
           ) -> Iterator[tuple[tuple, str]]:
    if "minItems" in s and len(x) < s["minItems"]:
        yield at, f"{_show(x)} should be non-empty" if s["minItems"] == 1 else \
            f"{_show(x)} is too short"
    if "maxItems" in s and len(x) > s["maxItems"]:
        yield at, f"{_show(x)} is too long"
    if s.get("uniqueItems") and any(_equal(a, b) for i, a in enumerate(x) for b in x[i + 1:]):
        yield at, f"{_show(x)} has non-unique elements"
    if "items" in s:
        for i, item in enumerate(x):
            yield from _check(item, s["items"], root, (*at, i))


def _valid(x: Any, s: Any, root: Mapping[str, Any]) -> bool:
    return next(iter(_check(x, s, root, ())), None) is None


def _resolve(root: Mapping[str, Any], ref: str) -> Any:
    if not ref.startswith("#"):
        raise Unsupported(f"$ref {ref!r}: only references inside the schema are checked")
    node: Any = root
    for part in filter(None, ref[1:].split("/")):
        node = node[part.replace("~1", "/").replace("~0", "~")]
    return node


def _is_type(x: Any, t: str) -> bool:
    if t == "object":
        return isinstance(x, dict)
    if t == "array":
        return isinstance(x, list)
    if t == "string":
        return isinstance(x, str)
    if t == "boolean":
        return isinstance(x, bool)
    if t == "null":
        return x is None
    if isinstance(x, bool):
        return False
    if t == "number":
        return isinstance(x, int | float)
    if t == "integer":
        return isinstance(x, int) or (isinstance(x, float) and x.is_integer())
    raise Unsupported(f"type {t!r}")


def _equal(a: Any, b: Any) -> bool:
    """JSON equality: true is not 1, 1 is 1.0."""
    if isinstance(a, bool) or isinstance(b, bool):
        return isinstance(a, bool) and isinstance(b, bool) and a == b
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(_equal(a[k], b[k]) for k in a)
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(_equal(p, q) for p, q in zip(a, b, strict=True))
    return a == b


@cache
def _regex(pattern: str) -> re.Pattern[str]:
    return re.compile(pattern)


def _show(x: Any, limit: int = 60) -> str:
    text = repr(x)
    return text if len(text) <= limit else text[: limit - 1] + "…"
