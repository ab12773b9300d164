"""Every `diagnose`/`audit`/`recommend` document for the in-repo fixture traces is identical to its
golden file (tests/golden.py); `--update-golden` rewrites them on purpose."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from tests import golden

CASES = golden.cases()
RUNS = [(c, cmd) for c in CASES for cmd in golden.COMMANDS if golden.argv(c, cmd) is not None]


@pytest.mark.parametrize(("case", "command"), RUNS, ids=[f"{c.name}-{cmd}" for c, cmd in RUNS])
def test_document_matches_golden(case: golden.Case, command: str, update_golden: bool) -> None:
    text = golden.document(case, command)
    assert text is not None
    path = golden.ROOT / case.golden(command)
    if update_golden:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text, encoding="utf-8")
        return
    assert path.is_file(), f"no golden document {path}: run {golden.UPDATE}"
    want = path.read_text(encoding="utf-8")
    if text != want:
        pytest.fail(golden.describe(case, command, want, text), pytrace=False)


def test_no_stale_golden_files() -> None:
    """Every golden file belongs to a document some case still produces."""
    expected = {golden.ROOT / c.golden(cmd) for c, cmd in RUNS}
    found = {p for p in golden.ROOT.glob("fixtures/**/golden/*.json")}
    assert found == expected


def test_every_case_has_its_goldens() -> None:
    names = {c.name for c in CASES}
    assert {"gpu_mcore_hostbound", "gpu_ep2_alltoall_overlap", "h200_eager_2steps"} <= names
    assert sum(c.contract is not None for c in CASES) >= 5


@pytest.mark.slow
def test_documents_do_not_depend_on_hash_seed() -> None:
    """Two processes with different PYTHONHASHSEED print the same documents (set and dict order
    must never leak into a document)."""
    case = next(c for c in CASES if c.name == "gpu_ep2_alltoall_overlap")
    outs = []
    for seed in ("1", "4242"):
        env = {**os.environ, "PYTHONHASHSEED": seed}
        docs = []
        for command in ("diagnose", "recommend"):
            proc = subprocess.run([sys.executable, "-m", "moetune", *golden.argv(case, command)],
                                  cwd=golden.ROOT, env=env, capture_output=True, text=True,
                                  timeout=300, check=False)
            assert proc.returncode == 0, proc.stderr
            docs.append(json.loads(proc.stdout))
        outs.append(docs)
    assert outs[0] == outs[1]
