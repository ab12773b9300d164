"""Megatron-LM log text: launcher prefixes and values printed with `str()`, shared by the readers
of its start-up output (`megatron_args`: the argument dump; `megatron_flags`: command lines)."""

from __future__ import annotations

import ast
import re
from typing import Any

# Launcher prefixes, possibly stacked: torchrun `[default7]: `, srun -l `[lrdn3321:3]: ` or `3: `,
# torch's `[rank0]:`. Stripped before anything else.
_PREFIX = re.compile(r"^(?:\s*\[[\w.:@/-]+\]: ?|\s*\d+: )+")
_INT = re.compile(r"^[+-]?\d+$")
_FLOAT = re.compile(r"^[+-]?(?:\d+\.\d*|\.\d+|\d+)(?:[eE][+-]?\d+)?$|^[+-]?(?:inf|nan)$")
_ENUM = re.compile(r"^[A-Z][A-Za-z0-9]*\.([A-Za-z_][A-Za-z0-9_]*)$")  # AttnBackend.auto -> auto


def strip_prefix(line: str) -> tuple[str, str]:
    """(launcher prefix, rest of the line)."""
    m = _PREFIX.match(line)
    if not m:
        return "", line
    return m.group(0).strip(), line[m.end() :]


def parse_value(text: str) -> Any:
    """`str()` of a Python attribute back to a value: None, bools, ints, floats, lists, enums."""
    s = text.strip()
    if s in ("None", ""):
        return None if s == "None" else ""
    if s in ("True", "False"):
        return s == "True"
    if _INT.match(s):
        return int(s)
    if _FLOAT.match(s):
        return float(s)
    if s[0] in "[({" and s[-1] in "])}":
        try:
            value = ast.literal_eval(s)
        except (ValueError, SyntaxError, MemoryError, RecursionError):
            return s
        if isinstance(value, tuple | set | frozenset):
            value = list(value)
        return value if isinstance(value, list | dict) else s  # bytes, complex: keep the text
    m = _ENUM.match(s)
    if m and not s.startswith("torch."):
        return m.group(1)
    return s
