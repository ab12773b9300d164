"""Predicted ranges as honest intervals (rules/gain.py `calibrate`, rules/gain_ranges.yaml written
by `bench/grid_advice.py --calibrate`): the replay's range widened to the error measured A/B pairs
showed, wider where the evidence is weaker, the coverage stated from the pairs themselves."""

from __future__ import annotations

import importlib.util
import json
import math
import sys
from pathlib import Path

import pytest
from moetune.rules.gain import calibrate, ranges

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))
spec = importlib.util.spec_from_file_location("grid_advice", ROOT / "bench" / "grid_advice.py")
assert spec is not None and spec.loader is not None
grid_advice = importlib.util.module_from_spec(spec)
spec.loader.exec_module(grid_advice)


def replayed(low: float, mid: float, high: float, before: float = 1.0) -> dict:
    return {"speedup": {"low": low, "mid": mid, "high": high},
            "step_time_s": {"before": before, "low": before / (1 + high),
                            "high": before / (1 + low)},
            "ceiling": None, "recoverable_s": None, "recoverable_from": "whatif.x",
            "basis": "replay"}


WITH_REF = {"reference": {"step_s": 1.0}, "whatif": {"fidelity": 1.0, "reference_step_s": 1.0}}


@pytest.mark.parametrize(("low", "mid", "high", "measured"), [
    (0.47, 0.70, 0.93, 0.41),    # the issue's held-out H200 states: predicted +47 … +93 %
    (1.89, 2.625, 3.36, 1.85),   # and +189 … +336 %, measured +41 % and +185 %
])
def test_the_held_out_misses_fall_inside_the_calibrated_range(low: float, mid: float,
                                                              high: float, measured: float) -> None:
    g = calibrate(replayed(low, mid, high), WITH_REF)
    assert not low <= measured <= high  # the replay's own range missed them
    assert g["speedup"]["low"] <= measured <= g["speedup"]["high"]
    assert g["speedup"]["mid"] == mid and g["replay"] == {"low": low, "high": high}
    assert g["step_time_s"]["low"] == pytest.approx(1 / (1 + g["speedup"]["high"]))
    assert "calibrated on 24 measured H200 pairs" in g["basis"]


def test_weaker_evidence_is_wider() -> None:
    base = calibrate(replayed(0.2, 0.3, 0.4), WITH_REF)["speedup"]
    profiled = calibrate(replayed(0.2, 0.3, 0.4), {"whatif": {"fidelity": 1.0}})
    assert profiled["calibration"]["kind"] == "profiled_only"
    assert "no --log" in profiled["basis"]
    poor = calibrate(replayed(0.2, 0.3, 0.4),
                     {**WITH_REF, "whatif": {"fidelity": 0.8, "reference_step_s": 1.0}})
    miss = abs(math.log(0.8)) - ranges()["fidelity_tolerance"]
    assert poor["calibration"]["fidelity_widening"] == pytest.approx(miss, abs=1e-4)
    assert poor["speedup"]["low"] < base["low"] and poor["speedup"]["high"] > base["high"]


def test_grid_coverage_is_what_the_calibration_file_states() -> None:
    """From bench/grid/advice.json (the engine's own output on the grid): every judged
    recommendation inside its calibrated range, and the held-out coverage recomputed from the
    replays equals the file's."""
    rows = json.loads((ROOT / "bench" / "grid" / "advice.json").read_text())
    judged = [r for row in rows for r in row["recommendations"] if r["measured"] is not None]
    assert len(judged) == 24 and all(r["in_range"] for r in judged)
    bare = sum(r["replay"][0] <= r["measured"] <= r["replay"][2] for r in judged)
    # the replay's own ranges: 75 %; the recompute-off pair at MBS 8 grouped falls just under
    # its range since the replay releases the syncs recompute re-ran (tests/test_whatif.py)
    assert bare == 18
    cal = grid_advice.calibration(rows)
    held = ranges()["whatif"]["with_reference"]
    assert cal["held_out_coverage"] == held["held_out_coverage"] == "22 of 24"
    assert (cal["z_low"], cal["z_high"]) == (held["z_low"], held["z_high"])
