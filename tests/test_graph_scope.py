"""Above GRAPH_MAX_EVENTS the timeline graph covers one step id on every rank: same path for
that step as the full graph gives, and the document says what was left out."""

from __future__ import annotations

import json
from pathlib import Path

import jsonschema
import moetune.analyzer.critical_path as cp
import pytest
from moetune.analyzer.diagnose import diagnose
from moetune.analyzer.path_summary import summary_lines

ROOT = Path(__file__).resolve().parents[1]
SCHEMA = json.loads((ROOT / "schemas" / "diagnosis.schema.json").read_text())


def _scoped(path: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[dict, dict]:
    full = diagnose([path])
    monkeypatch.setattr(cp, "GRAPH_MAX_EVENTS", 1000)
    return full, diagnose([path])


def _check(full: dict, part: dict, n_steps: int) -> None:
    jsonschema.validate(part, SCHEMA)
    assert "sampled" not in full["critical_path"]["graph"]
    sm = part["critical_path"]["graph"]["sampled"]
    assert sm["steps_in_window"] == n_steps and sm["limit"] == 1000
    assert sm["events_in_span"] > 1000
    pick = sm["steps"][0]
    # the lower median by window length (one rank here: the per-step rows say it)
    lengths = sorted((r["wall_s"], r["step"]) for r in full["per_step"])
    assert pick == lengths[(len(lengths) - 1) // 2][1]
    assert [r["step"] for r in part["critical_path"]["per_step"]] == [pick] * len(full["ranks_analyzed"])
    want = [r for r in full["critical_path"]["per_step"] if r["step"] == pick]
    assert part["critical_path"]["per_step"] == want  # same path as in the full graph
    # the core of the document does not depend on the graph's scope
    for k in ("walls", "step_time_s", "steps", "per_step", "observed"):
        assert part[k] == full[k]


def test_scope_on_megatron_hostbound_trace(monkeypatch: pytest.MonkeyPatch) -> None:
    full, part = _scoped(ROOT / "fixtures/traces/gpu_mcore_hostbound/trace.json.gz", monkeypatch)
    _check(full, part, 4)  # ProfilerSteps 3-6, each whole (2,521 GPU ops)


def test_scope_on_nsys_loop(corpus: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    full, part = _scoped(corpus / "made" / "h200_moe_eager_loop.nsys.sqlite.gz", monkeypatch)
    _check(full, part, len(full["steps"]))
    assert part["critical_path"]["graph"]["nodes"] < full["critical_path"]["graph"]["nodes"] / 4


def test_scope_line_in_terminal_summary(monkeypatch: pytest.MonkeyPatch) -> None:
    _, part = _scoped(ROOT / "fixtures/traces/gpu_mcore_hostbound/trace.json.gz", monkeypatch)
    lines = summary_lines({k: part[k] for k in ("critical_path", "blocking")})
    assert any(ln.strip().startswith("graph over step 5 only (") for ln in lines), lines
