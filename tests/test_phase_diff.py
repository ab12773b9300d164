"""`moetune diff` phase by phase (moetune/compare.py `_phase_diff`): two real H200 runs of one
model, eager vs the router and preprocess scopes under local CUDA graphs."""

from __future__ import annotations

import json
from pathlib import Path

import jsonschema
import pytest

from tests.golden import run_cli

ROOT = Path(__file__).resolve().parents[1]
TRACES = ROOT / "fixtures" / "traces"
SCHEMA = json.loads((ROOT / "schemas" / "diff.schema.json").read_text())
A = TRACES / "grid_host_mbs8_grp_rcnone_a2a_eager"
B = TRACES / "grid_host_mbs8_grp_rcnone_a2a_local"


@pytest.fixture(scope="module")
def diff() -> dict:
    code, out, err = run_cli(["diff", str(A / "trace.json.gz"), str(B / "trace.json.gz"), "--json"])
    assert code == 0, err
    doc = json.loads(out)
    jsonschema.validate(doc, SCHEMA)
    return doc


def test_phases_change_where_the_graphs_are(diff: dict) -> None:
    rows = {r["phase"]: r for r in diff["phases"]["rows"]}
    # the router's scope runs as a graph replay in B: its host-issued work is gone from it
    assert rows["router"]["delta_s"] < 0 and rows["router"]["launches_delta"] < 0
    deltas = [abs(r["delta_s"]) for r in diff["phases"]["rows"]]
    assert deltas == sorted(deltas, reverse=True)
    # the per-phase changes add up to the step's change (both sides tile their one step)
    total = sum(r["delta_s"] for r in diff["phases"]["rows"])
    st = diff["step_time"]
    assert total == pytest.approx(st["b"]["median_s"] - st["a"]["median_s"], abs=2e-5)
    layers = diff["phases"]["by_layer"]
    assert {r["layer"] for r in layers} == {1, 2, 3}


def test_terminal_diff_shows_the_phase_table() -> None:
    code, out, err = run_cli(["diff", str(A / "trace.json.gz"), str(B / "trace.json.gz")])
    assert code == 0, err
    assert "phases of the median step by |Δ|" in out and "router" in out
