"""One knob change applied to a launch: a Megatron command line and its environment.

A thin layer over moetune.knobs and moetune.knob_flags, the one home of spellings and rendering: `parse_change` finds
the knob by name, flag or deprecated alias (`foo_bar` → `--foo-bar` when the catalog lacks it),
`apply` replaces every spelling of it (deprecated aliases, `--no-` negatives) by the flags
`moetune.knob_flags.flag_tokens` renders. Pure functions: the input command is never modified.
"""

from __future__ import annotations

import shlex
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from moetune.errors import UserError
from moetune.knob_flags import read_flag, set_env, set_flag
from moetune.knobs import Catalog, Knob, knob, parse_value

__all__ = ["Change", "Knob", "Launch", "apply", "current_value", "diff", "parse_change",
           "split_command"]


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


def parse_change(text: str, catalog: Catalog | None = None) -> Change:
    """`knob=value` (`micro_batch_size=4`, `--moe-grouped-gemm=true`, `NCCL_X=1`)."""
    if "=" not in text:
        raise UserError(f"--change wants knob=value, got {text!r}")
    name, value = text.split("=", 1)
    k = knob(name.strip(), catalog)
    return Change(k, parse_value(value, k))


def apply(launch: Launch, change: Change) -> Launch:
    """The launch with exactly one knob changed (flag replaced, inserted or removed)."""
    k, v = change.knob, change.value
    if k.kind == "env":
        return Launch(launch.argv, set_env(launch.env, k, v))
    return Launch(set_flag(launch.argv, k, v), dict(launch.env))


def current_value(launch: Launch, k: Knob) -> Any:
    """What the launch sets a knob to (None when it does not mention it)."""
    if k.kind == "env":
        return launch.env.get(k.name)
    return read_flag(launch.argv, k)


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
