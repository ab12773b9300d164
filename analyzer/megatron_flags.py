"""Megatron-LM flags a log spells out -> arguments: the launcher's command line and echoed flag
variables.

Logs often carry the command that started the run: a shell's `set -x` trace (`+ python -u
pretrain_gpt.py --num-layers 28 …`), a job script printed before its output (`srun torchrun …
pretrain_gpt.py \\` continued over lines) or launch scripts' echoes of their flag groups
(`MOE_ARGS: --num-experts 8 …`, `+ GPT_ARGS='  --bf16 …'`). Flags are read after the Megatron entry
script (`pretrain_*.py`); the launcher's own flags before it (torchrun's `--nproc_per_node`) never
count. Flag -> argument: the knob catalog's spellings (`--fp8-format` -> fp8, negative and
deprecated flags), else Megatron-LM's own parser (analyzer/megatron_arguments.json:
`--disable-bias-linear` -> add_bias_linear False), else argparse's generated dest (`--num-layers`
-> num_layers; `--no-foo` -> foo False where moetune knows `foo` and no `no_foo`). A flag whose
value is an unexpanded shell variable (`--num-layers $LAYERS`) is left out, not guessed.
"""

from __future__ import annotations

import re
import shlex
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

from moetune.analyzer.contract import known_megatron_args, megatron_flags
from moetune.analyzer.megatron_text import parse_value, strip_prefix

from moetune import knobs
from moetune.errors import UserError

# the Megatron-LM entry scripts (pretrain_gpt.py, pretrain_mamba.py, …), maybe behind a path
_SCRIPT = re.compile(r"(?:^|[\s/'\"=])pretrain_\w+\.py(?=$|[\s'\"])")
# `NAME: --flag …` (a script's echo) or `[+ ][export ]NAME='--flag …'` / `=(--flag …` (set -x, bash)
_VARIABLE = re.compile(
    r"^\+*\s*(?:export\s+)?(?P<name>[A-Z][A-Z0-9_]*)(?::\s*|=\(?['\"]?)\s*(?P<rest>--[a-z].*)$")
_MORE_FLAGS = re.compile(r"\s--[a-z]")
# shell syntax that ends a command's arguments
_SHELL_END = {"|", "||", "&&", ";", "&", ">", ">>", "2>&1", "<"}
# launchers' flags (torchrun, deepspeed, srun) that can share an echoed variable with Megatron's
_LAUNCHER_FLAGS = frozenset({
    "nnodes", "nproc-per-node", "node-rank", "master-addr", "master-port", "rdzv-backend",
    "rdzv-endpoint", "rdzv-id", "rdzv-conf", "standalone", "max-restarts", "monitor-interval",
    "log-dir", "tee", "redirects", "no-python", "local-addr", "role", "run-path", "start-method",
    "num-gpus", "num-nodes", "hostfile", "include", "exclude",
})


@dataclass(frozen=True, slots=True)
class Flags:
    """Arguments read from flags (names as Megatron prints them, deprecated ones kept)."""

    args: dict[str, Any]
    unread: tuple[str, ...] = ()   # flags left out: a value the shell had not expanded
    complete: bool = True          # no unexpanded `$VAR` stood among the flags


def _joined_lines(text: str) -> Iterator[str]:
    """Lines with shell continuations (`\\` at the end) joined, launcher prefixes kept."""
    buf = ""
    for raw in text.splitlines():
        line = raw.rstrip()
        if line.endswith("\\"):
            buf += line[:-1] + " "
            continue
        yield buf + line
        buf = ""
    if buf:
        yield buf


# A launcher's command line is a few KB (Linux caps one argument at 128 KB); a longer "line" (a
# runaway terminal line in a log) is split on blanks instead of by shlex, which is quadratic.
_SHLEX_MAX_CHARS = 1 << 16


def _tokens(text: str) -> list[str]:
    """Shell words up to the first shell operator or comment (quotes that do not close: split on
    blanks and strip them)."""
    try:
        if len(text) > _SHLEX_MAX_CHARS:  # shlex grows a token char by char: quadratic
            raise ValueError("too long for shlex")
        words = shlex.split(text, comments=True)
    except ValueError:
        words = [w.strip("'\"") for w in text.split()]
    out = []
    for w in words:
        if w in _SHELL_END or w.startswith(("#", ">", "2>", "1>")):
            break
        if w:
            out.append(w)
    return out


def _spans(words: Sequence[str]) -> Iterator[tuple[str, list[str]]]:
    """(flag, its values) for each `--flag` in order; words before the first flag are skipped."""
    flag: str | None = None
    values: list[str] = []
    for w in words:
        if w.startswith("--") and len(w) > 2:
            if flag is not None:
                yield flag, values
            flag, values = w, []
            if "=" in w:
                flag, _, first = w.partition("=")
                values = [first]
        elif flag is not None:
            values.append(w)
    if flag is not None:
        yield flag, values


def _read(flag: str, values: list[str], cat: knobs.Catalog) -> tuple[str, Any] | None:
    """(argument, value) a flag sets, None for one moetune cannot read as Megatron's."""
    k = cat.by_flag.get(flag)
    if k is not None and k.kind == "arg":
        if flag == k.negative_flag:
            return k.name, False
        old = next((d for d in k.deprecated if d.flag == flag), None)
        if old is not None:  # the old name, as a log prints it: normalize_args maps it
            return old.arg, (True if not values else parse_value(values[0]) if len(values) == 1
                             else [parse_value(v) for v in values])
        if not values:
            return k.name, True
        if k.type == "list":
            return k.name, [parse_value(v) for v in values]
        try:
            return k.name, knobs.parse_value(values[0], k)
        except UserError:
            return k.name, parse_value(values[0])
    own = megatron_flags().get(flag)
    if own is not None:
        dest, entry = own
        if entry["type"] == "flag" and not values:
            return dest, not entry.get("negates", False)
        if values:
            return dest, parse_value(values[0]) if len(values) == 1 else [parse_value(v)
                                                                            for v in values]
    name = flag[2:].replace("-", "_")
    if "_" in flag[2:] or flag[2:] in _LAUNCHER_FLAGS:  # Megatron spells flags with dashes only
        return None
    if not values:
        known = known_megatron_args()
        if name.startswith("no_") and name not in known and (
                name[3:] in known or (name[3:] in cat.knobs and cat.knobs[name[3:]].type == "bool")):
            return name[3:], False  # argparse `store_false` under the positive name
        return name, True
    return name, parse_value(values[0]) if len(values) == 1 else [parse_value(v) for v in values]


def parse_flags(words: Sequence[str], catalog: knobs.Catalog | None = None) -> Flags:
    """Megatron arguments from flag words (the last mention of an argument wins). A flag next to
    an unexpanded shell variable is unread: its arity is unknown, so `--bf16 $MORE` and
    `--num-layers $LAYERS` look alike."""
    cat = catalog or knobs.load()
    args: dict[str, Any] = {}
    unread: list[str] = []
    first = next((i for i, w in enumerate(words) if w.startswith("--")), len(words))
    complete = not any("$" in w for w in words[:first])
    for flag, values in _spans(words):
        if "$" in flag or any("$" in v for v in values):
            complete = False
            unread.append(flag.split("$")[0] or flag)
            continue
        got = _read(flag, values, cat)
        if got is not None:
            args[got[0]] = got[1]
    return Flags(args, tuple(unread), complete)


def command_line_args(text: str) -> Flags | None:
    """The flags of the last command line in a log that runs a Megatron entry script; None when
    the log shows none. An unexpanded variable among the words (`$GPT_ARGS`) makes it incomplete."""
    found: Flags | None = None
    for line in _joined_lines(text):
        _, rest = strip_prefix(line)
        m = _SCRIPT.search(rest)
        if not m:
            continue
        words = _tokens(rest[m.end():])
        if not any(w.startswith("--") for w in words):
            continue
        found = parse_flags(words)
    return found


def _wraps(line: str, nxt: str, width: int) -> bool:
    """`nxt` goes on with `line` cut by a terminal: `line` is as wide as the first line of the
    echo (a wide one), ends mid-word, and `nxt` starts at column 0 with more flags to come."""
    return (width >= 80 and len(line) == width and not line[-1:].isspace() and nxt[:1].isalnum()
            and _MORE_FLAGS.search(nxt) is not None and not _VARIABLE.match(nxt.strip())
            and not _SCRIPT.search(nxt))


def echoed_args(text: str) -> dict[str, Any]:
    """Arguments from echoed flag variables (`MOE_ARGS: --num-experts 8 …`); a variable echoed
    again replaces its earlier value, different variables add up. An echo a terminal hard-wrapped
    (a line ending mid-word, the next line going on with no variable name) is joined back."""
    lines = [strip_prefix(line)[1] for line in text.splitlines()]
    by_name: dict[str, dict[str, Any]] = {}
    for i, rest in enumerate(lines):
        m = _VARIABLE.match(rest.strip())
        if not m or _SCRIPT.search(m.group("rest")):
            continue  # a variable holding the whole command is a command line
        echo, width = m.group("rest"), len(rest)
        for nxt in lines[i + 1:]:
            if not _wraps(rest, nxt, width):
                break
            echo, rest = echo + nxt, nxt
        by_name[m.group("name")] = parse_flags(_tokens(echo)).args
    out: dict[str, Any] = {}
    for args in by_name.values():
        out.update(args)
    return out
