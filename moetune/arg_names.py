"""Current Megatron argument names: an argument dict as a log, a contract or an argument dump
gives it (flag spellings, the catalog's deprecated renames and switches) rewritten under the names
rules/knobs.yaml uses today, with a note per rewrite.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from moetune.knobs import Catalog, load


def as_list(value: Any) -> list[Any]:
    """A list argument's value: None and "" are empty, a string is split on spaces and commas."""
    if value in (None, ""):
        return []
    if isinstance(value, str):
        return [v for v in re.split(r"[\s,]+", value) if v]
    return list(value)


def _copy(value: Any) -> Any:
    return list(value) if isinstance(value, list) else value  # never hand out the catalog's lists


def spelling_of(key: str, catalog: Catalog | None = None) -> tuple[str, bool]:
    """(argument name, negated) for a name as a user may write it: the argument itself, or a flag
    spelling (`--fp8-format`, `fp8-format`, `fp8_format` -> `fp8`, Megatron's `dest`); a bool
    knob's negative flag (`--no-overlap-p2p-communication`) names it negated. Names the catalog
    has no flag for keep Megatron's generated form (`--foo-bar` -> `foo_bar`)."""
    cat = catalog or load()
    name = key[2:] if key.startswith("--") else key
    name = name.replace("-", "_")
    if name in cat.knobs:
        return name, False
    k = cat.by_flag.get("--" + name.replace("_", "-"))
    if k is not None and k.kind == "arg":
        if k.flag and k.flag[2:].replace("-", "_") == name:
            return k.name, False
        if k.type == "bool" and k.negative_flag and k.negative_flag[2:].replace("-", "_") == name:
            return k.name, True
    return name, False


def _spellings(args: Mapping[str, Any], cat: Catalog) -> tuple[dict[str, Any], list[str]]:
    """`args` under argument names (`spelling_of`); a name given both ways keeps the argument's
    own value. An underscore spelling stays beside its argument (Megatron may print it as an
    argument of its own: `num_virtual_stages_per_pipeline_rank`); dashed ones go. Deprecated
    names stay for the renames and switches."""
    out: dict[str, Any] = {}
    notes: list[str] = []
    moved: list[tuple[str, str, Any]] = []
    for key, value in args.items():
        name, negated = spelling_of(key, cat)
        if name == key or "-" not in key:
            out[key] = value
        if name != key:
            moved.append((key, name, (not value) if negated and isinstance(value, bool) else value))
    for key, name, value in moved:
        if name not in out:
            out[name] = value
            notes.append(f"{key} -> {name}")
    return out, notes


def normalize_args(args: Mapping[str, Any], catalog: Catalog | None = None
                   ) -> tuple[dict[str, Any], list[str]]:
    """Current Megatron argument names for flag spellings and the catalog's deprecated names.
    Returns (args, notes).

    Flag spellings first (`spelling_of`: `fp8_format` -> `fp8`). A rename hands its value to the
    current argument unless that is already set (not None/empty); a switch a log prints True sets
    its arguments where they are unset or at their default (`forces`: always); a switch printed
    False states `sets_when_false` where the log is silent. Renames then switches, each in
    catalog order."""
    cat = catalog or load()
    out, notes = _spellings(args, cat)
    for d in cat.renames:
        if d.arg not in out:
            continue
        new = str(d.renamed_to)
        value = out.pop(d.arg)
        meaning = d.values.get(value) if isinstance(value, str) else None
        if meaning is not None:
            for name, v in meaning.items():
                if name != new:
                    out.setdefault(name, _copy(v))
            value = _copy(meaning.get(new, value))
        elif cat.knobs[new].type == "list":
            value = as_list(value)
        if out.get(new) in (None, [], "") and value not in (None, []):
            out[new] = value
            notes.append(f"{d.arg} -> {new}")
        else:
            out.setdefault(new, value)
    for d in cat.switches:
        if d.arg not in out:
            continue
        if out.pop(d.arg) is not True:
            for name, v in d.sets_when_false.items():
                out.setdefault(name, _copy(v))
            continue
        for name, new_value in d.sets.items():
            current = out.get(name)
            if cat.knobs[name].type == "list" and isinstance(current, list):
                out[name] = sorted({*current, *new_value})
            elif (name in d.forces or current in (None, False, [])
                  or current == cat.knobs[name].default):
                out[name] = _copy(new_value)
        notes.append(f"{d.arg}=True -> " + ", ".join(f"{k}={v}" for k, v in d.sets.items()))
    return out, notes
