"""Memory-saving recompute (moetune/vocabulary.py RECOMPUTE) is one thing everywhere: the memory
wall's share, the critical path's memory part and the evidence count the same kernels, and the
terminal shows it as its own line under each (real Megatron-LM trace, full recompute, H200)."""

from __future__ import annotations

import contextlib
import io
import json
from pathlib import Path

import pytest

from moetune.cli import main
from moetune.vocabulary import RECOMPUTE, RECOMPUTE_SHARE

ROOT = Path(__file__).resolve().parents[1]
TRACE = ROOT / "fixtures" / "traces" / "mlm_mem_mbs1_rcfull" / "trace.json.gz"


def _run(*argv: str) -> str:
    out = io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(io.StringIO()):
        assert main(["diagnose", str(TRACE), *argv]) == 0
    return out.getvalue()


@pytest.fixture(scope="module")
def doc() -> dict:
    return json.loads(_run("--json"))


def test_walls_path_and_evidence_count_the_same_work(doc: dict) -> None:
    mem, cp, ev = doc["wall_detail"]["memory"], doc["critical_path"], doc["evidence"]["recompute"]
    # the walls: recompute is most of the memory wall (183.6 of 251.4 ms)
    assert 0.6 < mem["recompute_s"] / mem["exposed_s"] < 0.8
    # the evidence's busy time is the same kernels (busy ⊇ exposed: compute may overlap them)
    assert mem["recompute_s"] <= ev["busy_s"] < mem["recompute_s"] * 1.01
    # the path charges them to memory too: its memory part holds them, compute does not
    assert 0 < cp["recompute_s"] <= cp["path_s"]["memory"]
    assert cp["path_s"]["memory"] > cp["path_s"]["memory"] - cp["recompute_s"] > 0
    # the share's denominator is said: all compute-kernel time, re-runs included
    assert doc["observed"]["recompute_fraction"] == pytest.approx(
        ev["busy_s"] / ev["compute_busy_s"], abs=1e-4)
    assert ev["compute_busy_s"] == pytest.approx(
        doc["wall_detail"]["compute"]["busy_s"] + ev["busy_s"], rel=1e-3)


def test_terminal_names_it_once_and_the_same_way(doc: dict) -> None:
    text = _run()
    wall_row = next(line for line in text.splitlines() if line.strip().startswith("of which"))
    assert RECOMPUTE in wall_row and "183.6 ms" in wall_row
    path = next(line for line in text.splitlines() if line.startswith("critical path"))
    rc_ms = doc["critical_path"]["recompute_s"] * 1e3
    assert f"(of which {RECOMPUTE} {rc_ms:.2f} ms)" in path
    assert f"{RECOMPUTE} 23.0 % {RECOMPUTE_SHARE}" in text
    assert "of compute ·" not in text  # the unlabelled share is gone
    assert f"forward, backward, {RECOMPUTE}" in text  # the phase table's legend
