"""A knob's value as text a launch uses: Megatron flags, environment assignments and
Megatron-Bridge overrides (the one renderer: rules, docs, planner and executor all call it), and a
command line with a knob set or read in any of its spellings (current, negative, `--no-`,
deprecated).
"""

from __future__ import annotations

import shlex
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from moetune.knobs import Catalog, Knob, knob, parse_value

# ----------------------------------------------------------------------------- rendering


def value_text(value: Any) -> str:
    """One value as one token: a float in its short `%g` form when that is exact, bools
    lower-case, everything else `str`."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float):
        text = f"{value:g}"
        return text if float(text) == value else repr(value)
    return str(value)


def flag_tokens(k: Knob, value: Any) -> tuple[str, ...]:
    """The command-line tokens that set argument knob `k` to `value`; () when that is the flag's
    absence (None: back to the default; False for a switch without a negative flag)."""
    if k.kind != "arg" or not k.flag:
        raise ValueError(f"{k.name} is not a Megatron argument")
    if value is None:
        return ()
    if k.type == "bool" or isinstance(value, bool):
        if value and k.default is True and k.negative_flag:
            return ()  # on by default: the negative flag's absence (current Megatron has no other)
        if value:
            return (k.flag,)
        return (k.negative_flag,) if k.negative_flag else ()
    if isinstance(value, list | tuple):
        return (k.flag, *(value_text(v) for v in value))
    return (k.flag, value_text(value))


def shell_text(tokens: Iterable[str]) -> str:
    """Tokens as shell text (layout strings such as `Et*3|(tt|)*29m|L` single-quoted)."""
    return " ".join(shlex.quote(t) for t in tokens)


def render_flags(k: Knob, value: Any) -> tuple[list[str], list[str]]:
    """(flags or environment assignments to set, flags to remove) for one knob value, as shell
    text: one string per flag with its values."""
    if k.kind == "env":
        if value is None:
            return [], [f"unset {k.name}"]
        return [f"{k.name}={shlex.quote(value_text(value))}"], []
    tokens = flag_tokens(k, value)
    if tokens:
        return [shell_text(tokens)], []
    return [], [str(k.negative_flag if value is True else k.flag)]


def render_flag(arg: str | Knob, value: Any, catalog: Catalog | None = None) -> str:
    """The shell text that sets one Megatron argument (catalog spelling, else `--foo-bar`)."""
    k = arg if isinstance(arg, Knob) else knob(arg, catalog)
    return " ".join(render_flags(k, value)[0])


def render_bridge(k: Knob, value: Any) -> str | None:
    """The Megatron-Bridge override (`model.moe_grouped_gemm=true`), None without a Bridge key."""
    if not k.bridge:
        return None
    if isinstance(value, bool):
        text = "true" if value else "false"
    elif value is None:
        text = "null"
    elif isinstance(value, list | tuple):
        text = "[" + ",".join(map(str, value)) + "]"
    else:
        text = str(value)
    return f"{k.bridge}={text}"


# ----------------------------------------------------------------------------- command lines


def _arity(k: Knob) -> dict[str, str]:
    """Every spelling of argument knob `k` -> the values it takes on a command line: `none`,
    `one`, `many` (a list: every following token up to the next flag)."""
    own = "none" if k.type == "bool" else "many" if k.type == "list" else "one"
    out: dict[str, str] = {}
    if k.flag:
        out[k.flag] = own
        if k.type == "bool" and not k.negative_flag:
            out["--no-" + k.flag[2:]] = "none"
    if k.negative_flag:
        out[k.negative_flag] = "none"
    for d in k.deprecated:
        out[d.flag] = own if d.takes_value else "none"
    return out


def _flag_spans(argv: Sequence[str], arity: Mapping[str, str]) -> list[tuple[int, int]]:
    """(start, end) index spans of each occurrence of a spelling in `arity` with its values."""
    spans = []
    i = 0
    while i < len(argv):
        tok = argv[i]
        name = tok.split("=", 1)[0]
        if name not in arity:
            i += 1
            continue
        j = i + 1
        if "=" not in tok and arity[name] != "none":
            if arity[name] == "many":
                while j < len(argv) and not argv[j].startswith("--"):
                    j += 1
            elif j < len(argv) and not argv[j].startswith("--"):
                j += 1
        spans.append((i, j))
        i = j
    return spans


def set_flag(argv: Sequence[str], k: Knob, value: Any) -> tuple[str, ...]:
    """`argv` with argument knob `k` set to `value`: every spelling of it (current, negative,
    `--no-`, deprecated) taken off with its values, `flag_tokens` put where the first one stood,
    else at the end."""
    out = list(argv)
    spans = _flag_spans(out, _arity(k))
    for s, e in reversed(spans):
        del out[s:e]
    at = spans[0][0] if spans else len(out)
    out[at:at] = flag_tokens(k, value)
    return tuple(out)


def set_env(env: Mapping[str, str], k: Knob, value: Any) -> dict[str, str]:
    """`env` with environment knob `k` set to `value` (None: removed)."""
    out = dict(env)
    if value is None:
        out.pop(k.name, None)
    else:
        out[k.name] = value_text(value)
    return out


def read_flag(argv: Sequence[str], k: Knob) -> Any:
    """What a command line sets argument knob `k` to (None when it does not mention it); the last
    mention wins, a deprecated switch reads as what it sets."""
    arity = _arity(k)
    spans = _flag_spans(argv, arity)
    if not spans:
        return None
    s, e = spans[-1]
    tok = argv[s]
    name = tok.split("=", 1)[0]
    if name != k.flag and arity[name] == "none":
        old = next((d for d in k.deprecated if d.flag == name), None)
        if old is None:  # the negative flag or `--no-…`
            return False
        value = old.sets.get(k.name, True)
        return list(value) if isinstance(value, list) else value
    vals = [tok.split("=", 1)[1]] if "=" in tok else list(argv[s + 1:e])
    if not vals:
        return True
    return vals if k.type == "list" else parse_value(vals[0], k)
