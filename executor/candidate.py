"""One knob change applied to a launch: a Megatron command line and its environment.

Flag spellings come from `rules/knobs.yaml` (the only home of flag spellings) when it is there:
`flag`, `negative_flag` for bools that default to True, `deprecated_flags` as aliases that are
removed from the command line when the current flag is set. Without the catalog a knob
`foo_bar` maps to `--foo-bar`. Pure functions: the input command is never modified.
"""

from __future__ import annotations

import ast
import re
import shlex
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import Any

import yaml

from moetune.errors import UserError
from moetune.resources import data

KNOBS_YAML = data("moetune.rules", "knobs.yaml")


@dataclass(frozen=True, slots=True)
class Knob:
    name: str
    kind: str = "arg"                 # arg | env
    type: str = "str"                 # bool | enum | int | float | str | list
    flag: str | None = None
    negative_flag: str | None = None
    aliases: tuple[str, ...] = ()     # deprecated spellings
    renames: tuple[str, ...] = ()     # deprecated spellings that take the same value(s)
    values: tuple[Any, ...] = ()


@dataclass(frozen=True, slots=True)
class Change:
    knob: Knob
    value: Any

    @property
    def label(self) -> str:
        v = self.value
        text = ",".join(map(str, v)) if isinstance(v, list) else str(v).lower() \
            if isinstance(v, bool) else str(v)
        return f"{self.knob.name}={text}"


@dataclass(frozen=True, slots=True)
class Launch:
    """A command line and the environment additions it runs with."""

    argv: tuple[str, ...]
    env: Mapping[str, str] = field(default_factory=dict)


@lru_cache(maxsize=4)
def load_knobs(path: str = str(KNOBS_YAML)) -> dict[str, Knob]:
    p = Path(path)
    if not p.is_file():
        return {}
    try:
        doc = yaml.safe_load(p.read_text()) or {}
    except yaml.YAMLError as exc:
        raise UserError(f"invalid YAML: {exc}", path=p) from None
    out: dict[str, Knob] = {}
    for name, k in (doc.get("knobs") or {}).items():
        out[name] = Knob(
            name=name, kind=k.get("kind", "arg"), type=k.get("type", "str"), flag=k.get("flag"),
            negative_flag=k.get("negative_flag"),
            aliases=tuple(d["flag"] for d in k.get("deprecated_flags") or ()),
            renames=tuple(d["flag"] for d in k.get("deprecated_flags") or ()
                          if d.get("means", "").strip() == k.get("flag")),
            values=tuple(k.get("values") or ()),
        )
    return out


def knob(name: str, knobs: Mapping[str, Knob] | None = None) -> Knob:
    """The catalog entry for a knob (underscore name, flag spelling or env variable)."""
    cat = load_knobs() if knobs is None else knobs
    key = name.lstrip("-").replace("-", "_") if name.startswith("--") else name
    if key in cat:
        return cat[key]
    for k in cat.values():
        if name in (k.flag, k.negative_flag, *k.aliases):
            return k
    if re.fullmatch(r"[A-Z][A-Z0-9_]*", name):
        return Knob(name=name, kind="env")
    if not re.fullmatch(r"[a-z][a-z0-9_]*", key):
        raise UserError(f"not a knob name: {name!r} (use e.g. micro_batch_size=4)")
    return Knob(name=key, flag="--" + key.replace("_", "-"))


def parse_value(text: str, k: Knob) -> Any:
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


def parse_change(text: str, knobs: Mapping[str, Knob] | None = None) -> Change:
    """`knob=value` (`micro_batch_size=4`, `--moe-grouped-gemm=true`, `NCCL_X=1`)."""
    if "=" not in text:
        raise UserError(f"--change wants knob=value, got {text!r}")
    name, value = text.split("=", 1)
    k = knob(name.strip(), knobs)
    return Change(k, parse_value(value, k))


def _flag_spans(argv: Sequence[str], k: Knob, flags: set[str]) -> list[tuple[int, int]]:
    """(start, end) index spans of each occurrence of `flags` with its values in argv: none for
    switches, one for scalars, every following non-flag token for lists."""
    valued = {k.flag, *k.renames} if k.type != "bool" else set()
    spans = []
    i = 0
    while i < len(argv):
        tok = argv[i]
        name = tok.split("=", 1)[0]
        if name in flags:
            j = i + 1
            if "=" not in tok and name in valued:
                if k.type == "list":
                    while j < len(argv) and not argv[j].startswith("--"):
                        j += 1
                elif j < len(argv) and not argv[j].startswith("--"):
                    j += 1
            spans.append((i, j))
            i = j
        else:
            i += 1
    return spans


def _value_tokens(value: Any) -> list[str]:
    if isinstance(value, list):
        return [str(x) for x in value]
    return [str(value)]


def apply(launch: Launch, change: Change) -> Launch:
    """The launch with exactly one knob changed (flag replaced, inserted or removed)."""
    k, v = change.knob, change.value
    if k.kind == "env":
        env = dict(launch.env)
        if v is None:
            env.pop(k.name, None)
        else:
            env[k.name] = str(v).lower() if isinstance(v, bool) else str(v)
        return Launch(launch.argv, env)
    assert k.flag is not None
    argv = list(launch.argv)
    every = {k.flag, *k.aliases, *([k.negative_flag] if k.negative_flag else [])}
    if k.type == "bool" and not k.negative_flag:
        every.add("--no-" + k.flag[2:])
    spans = _flag_spans(argv, k, every)
    # where to put the new flag: where the old one was, else at the end of the script's args
    at = spans[0][0] if spans else len(argv)
    for s, e in reversed(spans):
        del argv[s:e]
        if s < at:
            at -= e - s
    if k.type == "bool" or isinstance(v, bool):
        if v:
            new = [k.flag]
        elif k.negative_flag:
            new = [k.negative_flag]
        else:
            new = []  # a store_true flag is off by being absent
    elif v is None:
        new = []
    else:
        new = [k.flag, *_value_tokens(v)]
    argv[at:at] = new
    return Launch(tuple(argv), dict(launch.env))


def current_value(launch: Launch, k: Knob) -> Any:
    """What the launch sets a knob to (None when it does not mention it)."""
    if k.kind == "env":
        return launch.env.get(k.name)
    flags = {k.flag, *k.aliases} - {None}
    spans = _flag_spans(launch.argv, k, flags)  # type: ignore[arg-type]
    neg = _flag_spans(launch.argv, k, {k.negative_flag} if k.negative_flag else set())
    if neg and (not spans or neg[-1][0] > spans[-1][0]):
        return False
    if not spans:
        return None
    s, e = spans[-1]
    tok = launch.argv[s]
    vals = [tok.split("=", 1)[1]] if "=" in tok else list(launch.argv[s + 1:e])
    if not vals:
        return True
    return vals if k.type == "list" else parse_value(vals[0], k)


def split_command(cmd: str | Sequence[str]) -> tuple[str, ...]:
    if isinstance(cmd, str):
        try:
            return tuple(shlex.split(cmd))
        except ValueError as exc:
            raise UserError(f"cannot split --cmd: {exc}") from None
    return tuple(cmd)


def diff(base: Launch, cand: Launch) -> dict[str, Any]:
    """What differs between two launches: removed/added argv tokens and env changes."""
    import difflib

    sm = difflib.SequenceMatcher(a=base.argv, b=cand.argv, autojunk=False)
    removed, added = [], []
    for op, a0, a1, b0, b1 in sm.get_opcodes():
        if op in ("replace", "delete"):
            removed.extend(base.argv[a0:a1])
        if op in ("replace", "insert"):
            added.extend(cand.argv[b0:b1])
    env = {k: v for k, v in cand.env.items() if base.env.get(k) != v}
    env.update({k: None for k in base.env if k not in cand.env})
    return {"removed": removed, "added": added, "env": env}
