"""Golden documents: `diagnose`, `audit` and `recommend` JSON for every in-repo fixture trace,
kept beside the trace (`golden/` in its folder) and compared byte for byte by
tests/test_golden.py.

Refresh them on purpose only, after a change meant to alter the documents:

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
