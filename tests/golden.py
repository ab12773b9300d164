"""Golden documents: `diagnose`, `audit` and `recommend` JSON for every in-repo fixture trace,
kept beside the trace (`golden/` in its folder) and compared byte for byte by
tests/test_golden.py.

A document that differs fails with what it pins (its command line) and its changed fields, one
line each (`recommendations[rule=host.cuda-graphs].gain.speedup.low: 0.12 → 0.15`: list items
by their identity key, so an added rule is one line); at the end of the session one summary
groups the changes of every differing document (tests/conftest.py). Refresh them on purpose
only, after a change meant to alter the documents, and say in the commit which fields moved:

    python -m pytest tests/test_golden.py --update-golden

The CLI runs in-process from the repository root with relative paths, so the documents carry no
machine-specific path. Each case's contract (the claims `audit` checks and `recommend` reads) is an
input kept in the same folder: the run's own log through `contract from-log` where the fixture has
one, else the claims its `truth.json` records.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
TRACES = Path("fixtures/traces")
NSYS = Path("fixtures/nsys")
COMMANDS = ("diagnose", "audit", "recommend")
# The H200 grid's traces (bench/grid/README.md) are the advisor's benchmark, judged by
# bench/grid_advice.py and tests/test_whatif.py, not pinned as golden documents.
GRID = "grid_"


@dataclass(frozen=True)
class Case:
    name: str
    inputs: tuple[str, ...]   # relative to the repository root, as the CLI is given them
    folder: Path              # where golden/ lives, relative to the root
    contract: str | None      # relative path of the case's contract, when it has claims

    def golden(self, command: str) -> Path:
        return self.folder / "golden" / f"{self.stem}{command}.json"

    @property
    def stem(self) -> str:
        return "" if self.folder.name == self.name else f"{self.name}."


def cases() -> list[Case]:
    out: list[Case] = []
    for d in sorted((ROOT / TRACES).iterdir()):
        if not d.is_dir() or d.name.startswith(GRID):
            continue
        traces = sorted(p.name for p in d.iterdir() if p.name.endswith((".json", ".json.gz")) and
                        p.name != "truth.json")
        if not traces:
            continue
        rel = TRACES / d.name
        inputs = (str(rel),) if len(traces) > 1 else (str(rel / traces[0]),)
        contract = rel / "golden" / "contract.yaml"
        out.append(Case(d.name, inputs, rel, str(contract) if (ROOT / contract).is_file() else None))
    for f in sorted((ROOT / NSYS).glob("*.sqlite.gz")):
        name = f.name.removesuffix(".sqlite.gz")
        out.append(Case(name, (str(NSYS / f.name),), NSYS, None))
    return out


@contextlib.contextmanager
def _at_root() -> Iterator[None]:
    old = Path.cwd()
    os.chdir(ROOT)
    try:
        yield
    finally:
        os.chdir(old)


def run_cli(argv: list[str]) -> tuple[int, str, str]:
    """The CLI in-process from the repository root: (exit code, stdout, stderr)."""
    from moetune.cli import main

    out, err = io.StringIO(), io.StringIO()
    with _at_root(), contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = main(argv)
    return code, out.getvalue(), err.getvalue()


def argv(case: Case, command: str) -> list[str] | None:
    """The command line for one golden document; None when the case has nothing to run it on."""
    if command == "diagnose":
        return ["diagnose", "--json", *case.inputs]
    if command == "audit":
        return ["audit", "--json", "--contract", case.contract, *case.inputs] if case.contract else None
    extra = ["--contract", case.contract] if case.contract else []
    return ["recommend", "--json", *extra, *case.inputs]


def document(case: Case, command: str) -> str | None:
    """The document as the CLI prints it with its exit code (an audit may exit 1); for input the
    CLI refuses, its one-line message instead."""
    args = argv(case, command)
    if args is None:
        return None
    code, text, err = run_cli(args)
    body = {"document": json.loads(text)} if text.strip() else {"stderr": err.strip()}
    return json.dumps({"exit_code": code, **body}, indent=1, sort_keys=True,
                      ensure_ascii=False) + "\n"


# --------------------------------------------------------------------------- what changed

_IDENTITY = ("rule", "id", "kclass", "knob", "name", "path", "role", "step", "rank", "file", "claim",
             "feature", "transform", "direction", "wall")
_MISSING = object()


@dataclass(frozen=True)
class Change:
    """One changed field of a document: `path` as `a.b[rule=x].c` (list items by their identity
    key where they have one, else by index); `old`/`new` are absent for an added/removed field."""

    path: str
    old: Any = _MISSING
    new: Any = _MISSING

    def __str__(self) -> str:
        if self.old is _MISSING:
            return f"{self.path}: added {_short(self.new)}"
        if self.new is _MISSING:
            return f"{self.path}: removed (was {_short(self.old)})"
        if isinstance(self.old, list) and isinstance(self.new, list):
            return f"{self.path}: {len(self.old)} → {len(self.new)} items"
        return f"{self.path}: {_short(self.old)} → {_short(self.new)}"


def changes(old: Any, new: Any, path: str = "") -> list[Change]:
    """The fields that differ between two JSON documents, deepest first-differing field each:
    a rule added to a list is one change, not a shifted tail of every later item."""
    if isinstance(old, dict) and isinstance(new, dict):
        out: list[Change] = []
        for k in sorted(old.keys() | new.keys()):
            sub = f"{path}.{k}" if path else str(k)
            if k not in new:
                out.append(Change(sub, old[k]))
            elif k not in old:
                out.append(Change(sub, new=new[k]))
            else:
                out += changes(old[k], new[k], sub)
        return out
    if isinstance(old, list) and isinstance(new, list):
        key = _identity(old, new)
        if key is not None:
            a = {item[key]: item for item in old}
            b = {item[key]: item for item in new}
            out = []
            for ident in [*a, *(i for i in b if i not in a)]:
                sub = f"{path}[{key}={ident}]"
                if ident not in b:
                    out.append(Change(sub, a[ident]))
                elif ident not in a:
                    out.append(Change(sub, new=b[ident]))
                else:
                    out += changes(a[ident], b[ident], sub)
            if not out and list(a) != list(b):
                out.append(Change(f"{path} (order)", list(a), list(b)))
            return out
        out = [Change(path, old, new)] if len(old) != len(new) else []
        for i, (x, y) in enumerate(zip(old, new, strict=False)):
            out += changes(x, y, f"{path}[{i}]")
        return out
    if old == new and type(old) is type(new):
        return []
    return [Change(path, old, new)]


def _identity(old: list, new: list) -> str | None:
    """The first identity key every item of both lists has, unique within each list."""
    items = [*old, *new]
    if not items or not all(isinstance(x, dict) for x in items):
        return None
    for key in _IDENTITY:
        if all(key in x and isinstance(x[key], str | int) for x in items) and all(
                len({x[key] for x in side}) == len(side) for side in (old, new)):
            return key
    return None


def _short(value: Any, limit: int = 70) -> str:
    text = json.dumps(value, ensure_ascii=False, sort_keys=True)
    return text if len(text) <= limit else text[: limit - 1] + "…"


UPDATE = "python -m pytest tests/test_golden.py --update-golden"
# Changed fields of every golden document that differed in this session, for the one summary
# tests/conftest.py prints at the end (a rule added is one line there, not one per document).
SESSION: list[tuple[str, list[Change]]] = []


def describe(case: Case, command: str, want: str, got: str, limit: int = 40) -> str:
    """The failure message of a golden document that differs: what it pins (the command line),
    the changed fields, and the command that rewrites it."""
    try:
        found = changes(json.loads(want), json.loads(got))
    except json.JSONDecodeError:  # a hand-edited file: nothing to compare field by field
        found = [Change("(file)", "not JSON", "the document")]
    SESSION.append((f"{case.name} {command}", found))
    lines = [f"{case.golden(command)} pins `moetune {' '.join(argv(case, command) or [])}`; "
             f"{len(found)} field(s) changed:"]
    lines += [f"  {c}" for c in found[:limit]]
    if len(found) > limit:
        lines.append(f"  … and {len(found) - limit} more")
    lines.append(f"If the change is meant: {UPDATE} (and say in the commit which fields moved "
                 "and why)")
    return "\n".join(lines)


def summary(session: list[tuple[str, list[Change]]] = SESSION) -> list[str]:
    """One line per changed field path across all differing documents, with how often each
    change occurred: `recommendations[rule=x]: added (in 12 documents)`."""
    if not session:
        return []
    by_path: dict[str, list[str]] = {}
    for _, found in session:
        for c in found:
            text = str(c)[len(c.path) + 2:]
            by_path.setdefault(c.path, []).append(text)
    out = [f"{len(session)} golden document(s) differ; the changed fields:"]
    for path, seen in sorted(by_path.items(), key=lambda kv: (-len(kv[1]), kv[0])):
        counts: dict[str, int] = {}
        for s in seen:
            counts[s] = counts.get(s, 0) + 1
        shown = ", ".join(f"{s} ×{n}" if n > 1 else s for s, n in list(counts.items())[:3])
        more = f", … {len(counts) - 3} other values" if len(counts) > 3 else ""
        out.append(f"  {path} (in {len(seen)} document(s)): {shown}{more}")
    out.append(f"If the changes are meant: {UPDATE}")
    return out
