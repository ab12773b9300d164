"""bench/grid_advice.py's judgement helpers: a gain paired within the device calls that ran both
points, failed runs left out, calls that ran only one point skipped, a corrupt call file refused
in one line."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))  # grid_advice reads call files through grid_run
spec = importlib.util.spec_from_file_location("grid_advice", ROOT / "bench" / "grid_advice.py")
assert spec is not None and spec.loader is not None
grid_advice = importlib.util.module_from_spec(spec)
spec.loader.exec_module(grid_advice)

GRID = {"shapes": {"host": {"points": [{"id": "a"}, {"id": "b"}, {"id": "c"}]}},
        "repeat_files": ["call6.jsonl", "call11.jsonl", "call12.jsonl"]}  # merged, read again


def _call(folder: Path, n: int, runs: list[tuple[str, float | None]]) -> None:
    lines = [json.dumps({"shape": "host", "id": f"{pid}__rep{i}", "step_ms": ms,
                         "status": "ok" if ms else "failed"})
             for i, (pid, ms) in enumerate(runs)]
    (folder / f"call{n}.jsonl").write_text("\n".join(lines) + "\n")


def test_gains_are_paired_within_calls(tmp_path: Path) -> None:
    _call(tmp_path, 6, [("a", 100.0), ("b", 50.0), ("b", 40.0)])   # a/b = 100/45
    _call(tmp_path, 11, [("a", 130.0), ("a", None), ("b", 100.0)])  # the failed run is left out
    _call(tmp_path, 12, [("a", 90.0)])                              # b not run: no pair
    rec = {"measured": 1.0, "point": "b", "predicted": [0.2, 0.7, 1.3]}
    other = {"measured": 0.5, "point": "c", "predicted": [0.1, 0.2, 0.3]}  # never run
    unmeasured = {"measured": None, "point": None, "predicted": [0.0, 0.0, 0.0]}
    rows = [{"shape": "host", "start": "a", "recommendations": [rec, other, unmeasured]}]
    runs = grid_advice.call_runs(GRID, tmp_path)
    out = grid_advice.paired_by_call(rows, runs)
    assert rec["paired_gains"] == [round(100 / 45 - 1, 4), 0.3]
    assert other["paired_gains"] == [] and "paired_gains" not in unmeasured
    # median of (+122 %, +30 %) = +76 %: inside 20 … 130 % and within ±25 % of +70 %
    assert out == {"judged": 1, "in_range": 1, "within_25": 1}
    rec["predicted"] = [0.8, 1.2, 1.5]
    assert grid_advice.paired_by_call(rows, runs) == {"judged": 1, "in_range": 0,
                                                      "within_25": 0}


def test_a_corrupt_call_file_is_named_in_one_line(tmp_path: Path) -> None:
    _call(tmp_path, 6, [("a", 100.0)])
    (tmp_path / "call7.jsonl").write_text('{"shape": "host", "id": "a__rep1", "status": "ok"}\n'
                                          '{"shape": "host", "id": "a__rep2", "st')
    with pytest.raises(ValueError, match=r"call7\.jsonl:2: not a JSON record"):
        grid_advice.call_runs(GRID, tmp_path)
    (tmp_path / "call7.jsonl").write_text('{"shape": "host", "id": "z__rep1", "status": "ok"}\n')
    with pytest.raises(ValueError, match="a repeat of z, which the grid has not measured"):
        grid_advice.call_runs(GRID, tmp_path)
