"""bench/grid_advice.py's judgement helpers: a gain paired within the device calls that ran both
points, failed runs left out, calls that ran only one point skipped."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
spec = importlib.util.spec_from_file_location("grid_advice", ROOT / "bench" / "grid_advice.py")
assert spec is not None and spec.loader is not None
grid_advice = importlib.util.module_from_spec(spec)
spec.loader.exec_module(grid_advice)


def _call(folder: Path, n: int, runs: list[tuple[str, float | None]]) -> None:
    lines = [json.dumps({"shape": "host", "id": f"{pid}__rep{i}", "step_ms": ms})
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
    out = grid_advice.paired_by_call(rows, tmp_path)
    assert rec["paired_gains"] == [round(100 / 45 - 1, 4), 0.3]
    assert other["paired_gains"] == [] and "paired_gains" not in unmeasured
    # median of (+122 %, +30 %) = +76 %: inside 20 … 130 % and within ±25 % of +70 %
    assert out == {"judged": 1, "in_range": 1, "within_25": 1}
    rec["predicted"] = [0.8, 1.2, 1.5]
    assert grid_advice.paired_by_call(rows, tmp_path) == {"judged": 1, "in_range": 0,
                                                          "within_25": 0}
