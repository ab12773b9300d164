"""The predicted step-time gain of a rule's change: the what-if replay's estimate when the
diagnosis holds one (`whatif.transforms.<id>`), else the rule's fixed range, else its recoverable
time R × its efficiency range (speedup T/(T−R) − 1, ceiling T/(T−R) − 1 at full efficiency).

A replayed range is made an honest interval (`calibrate`): the replay's own range, widened to what
measured A/B pairs showed of its error (rules/gain_ranges.yaml, written by `bench/grid_advice.py
--calibrate` from the H200 grid): ln(1 + measured) fell within (1 + z) × ln(1 + mid) ± a noise
floor of the replay's midpoint. Where the evidence is weaker it is wider: from the profiled step
alone (no unprofiled reference step) the profiled-only calibration applies, and a replay whose
untouched step misses the measured one by more than the tolerance widens by that miss. The
midpoint (and so the ranking) is the replay's. A rule's stated range (no replay) is not calibrated
on measured pairs and says so.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from functools import cache
from typing import Any

from moetune.rules.inputs import lookup, num, window_s
from moetune.rules.load import Rule, schema


def reference_step_s(diagnosis: Mapping[str, Any]) -> float:
    """T, the step a gain is relative to: the run's unprofiled reference step (its log, the
    diagnosis' `reference`) when given, as the what-if estimates use it; else the profiled step."""
    ref = (diagnosis.get("reference") or {}).get("step_s")
    return float(ref) if num(ref) and ref > 0 else float(diagnosis["step_time_s"])


def recoverable_s(spec: Mapping[str, Any], diagnosis: Mapping[str, Any]) -> tuple[float, str] | None:
    """R (seconds per step) and the path it came from, or None when the diagnosis lacks it."""
    t = reference_step_s(diagnosis)
    if "metric" in spec:
        v = lookup(diagnosis, spec["metric"])
        if not num(v):
            return None
        unit = spec.get("unit", "s")
        if unit == "step_fraction":
            return v * t, f"{spec['metric']} × step_time_s"
        if unit == "window_total":
            w = window_s(diagnosis)
            return (v / w * t, f"{spec['metric']} ÷ window_s × step_time_s") if num(w) and w else None
        return v, spec["metric"]
    wall = spec["wall"]
    v = lookup(diagnosis, f"critical_path.recoverable_s.{wall}")
    if num(v):
        return v, f"critical_path.recoverable_s.{wall}"
    g = lookup(diagnosis, f"critical_path.gain_ceiling.{wall}")
    if num(g) and num(t):
        return t * g / (1 + g), f"critical_path.gain_ceiling.{wall}"
    v = lookup(diagnosis, f"wall_detail.{wall}.exposed_s")
    if num(v):
        return v, f"wall_detail.{wall}.exposed_s"
    return None


def predict_gain(rule: Rule, diagnosis: Mapping[str, Any]) -> dict[str, Any]:
    """Speedup range T/T' − 1 and the predicted step time; ceiling T/(T−R) − 1."""
    spec = rule.spec["expected_gain"]
    t = reference_step_s(diagnosis)
    est = lookup(diagnosis, f"whatif.transforms.{spec['whatif']}") if "whatif" in spec else None
    if isinstance(est, Mapping) and num(lookup(est, "speedup.mid")):
        sp, st = est["speedup"], est["step_time_s"]
        return calibrate({
            "speedup": {"low": sp["low"], "high": sp["high"], "mid": sp["mid"]},
            "step_time_s": {"before": st["before"], "low": st["low"], "high": st["high"]},
            "ceiling": None, "recoverable_s": None, "recoverable_from": f"whatif.{spec['whatif']}",
            "basis": f"{est['basis']} (what-if replay, fidelity {lookup(diagnosis, 'whatif.fidelity')})",
        }, diagnosis)
    if "fixed" in spec:
        lo, hi = spec["fixed"]
        return {
            "speedup": {"low": lo, "high": hi, "mid": (lo + hi) / 2},
            "step_time_s": {"before": t, "low": t / (1 + hi), "high": t / (1 + lo)},
            "ceiling": None, "recoverable_s": None, "recoverable_from": None,
            "basis": spec["basis"],
        }
    found = recoverable_s(spec["recoverable"], diagnosis)
    e_lo, e_hi = spec["efficiency"]
    if found is None or t <= 0:
        return {
            "speedup": {"low": 0.0, "high": 0.0, "mid": 0.0},
            "step_time_s": {"before": t, "low": t, "high": t},
            "ceiling": None, "recoverable_s": None, "recoverable_from": None,
            "basis": spec["basis"] + " (no recoverable time in this diagnosis: gain not quantified)",
        }
    r, source = found
    r = min(max(r, 0.0), 0.99 * t)  # R ≥ T would promise infinite speedup
    lo, hi = t / (t - e_lo * r) - 1, t / (t - e_hi * r) - 1
    return {
        "speedup": {"low": lo, "high": hi, "mid": (lo + hi) / 2},
        "step_time_s": {"before": t, "low": t - e_hi * r, "high": t - e_lo * r},
        "ceiling": t / (t - r) - 1,
        "recoverable_s": r,
        "recoverable_from": source,
        "efficiency": [e_lo, e_hi],
        "basis": spec["basis"],
    }


@cache
def ranges() -> dict[str, Any]:
    """rules/gain_ranges.yaml, validated (schemas/gain_ranges.schema.json)."""
    import jsonschema

    from moetune.resources import data
    from moetune.yamlio import read_yaml

    path = data("moetune.rules") / "gain_ranges.yaml"
    doc, _ = read_yaml(path)
    jsonschema.validate(doc, schema("gain_ranges"))
    return doc


def calibrate(gain: dict[str, Any], diagnosis: Mapping[str, Any]) -> dict[str, Any]:
    """The replayed range widened to the calibrated interval (module docstring); the replay's own
    range stays under `replay`, the calibration used under `calibration`."""
    sp = gain["speedup"]
    mid = sp["mid"]
    if not num(mid) or mid <= -1:
        return gain
    whatif = diagnosis.get("whatif") or {}
    have_ref = num(whatif.get("reference_step_s"))  # what the replay itself started from
    doc = ranges()
    kind = "with_reference" if have_ref else "profiled_only"
    cal = doc["whatif"][kind]
    fidelity = whatif.get("fidelity")
    miss = abs(math.log(fidelity)) if num(fidelity) and fidelity > 0 else 0.0
    extra = max(0.0, miss - doc["fidelity_tolerance"])
    g = math.log1p(mid)
    lo = min(sp["low"], math.expm1(g * (1 + cal["z_low"]) - cal["noise"] - extra))
    hi = max(sp["high"], math.expm1(g * (1 + cal["z_high"]) + cal["noise"] + extra))
    before = gain["step_time_s"]["before"]
    words = ("from an unprofiled reference step" if have_ref
             else "from the profiled step alone (no --log: wider)")
    out = dict(gain)
    out["replay"] = {"low": sp["low"], "high": sp["high"]}
    out["speedup"] = {"low": lo, "high": hi, "mid": mid}
    out["step_time_s"] = {"before": before, "low": before / (1 + hi), "high": before / (1 + lo)}
    out["calibration"] = {"kind": kind, "z": [cal["z_low"], cal["z_high"]],
                          "noise": cal["noise"], "fidelity_widening": round(extra, 4),
                          "pairs": cal["pairs"], "held_out_coverage": cal["held_out_coverage"]}
    out["basis"] = (f"{gain['basis']}; range calibrated on {cal['pairs']} measured H200 pairs "
                    f"{words} ({cal['held_out_coverage']} held out inside)"
                    + (f", widened by a replay fidelity miss of {extra:.0%}" if extra else ""))
    return out
