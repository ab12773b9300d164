"""The phases a recommended change works on (analyzer/phases.yaml `targets`), with their time in
the median step now and after the change as predicted: the step time the change saves (the
what-if replay's, or the rule's stated range: the gain's midpoint) charged to those phases in
proportion to their time now, none below zero."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from moetune.analyzer.phases_book import load_phases

BASIS = ("the predicted step-time saving (gain midpoint: {src}) charged to the phases the change "
         "targets, in proportion to their time now")


def targeted_phases(knob: str, diagnosis: Mapping[str, Any], gain: Mapping[str, Any]
                    ) -> dict[str, Any] | None:
    """`{"phases": [{phase, now_s, predicted_s}], "basis"}` for `knob`'s target phases that the
    diagnosis shows; None when the knob targets no phase or the diagnosis has no phase table."""
    names = load_phases().targets.get(knob)
    by = ((diagnosis.get("phases") or {}).get("by_phase") or {}) if names else {}
    now = {p: float(by[p]["step_s"]) for p in names or () if p in by}
    if not now:
        return None
    before = float((gain.get("step_time_s") or {}).get("before") or diagnosis.get("step_time_s") or 0)
    mid = float((gain.get("speedup") or {}).get("mid") or 0.0)
    saving = max(before - before / (1 + mid), 0.0) if before > 0 else 0.0
    total = sum(now.values())
    rows = [{"phase": p, "now_s": round(s, 6),
             "predicted_s": round(max(s - saving * s / total, 0.0) if total > 0 else s, 6)}
            for p, s in now.items()]
    src = gain.get("recoverable_from") or "the rule's range"
    return {"phases": rows, "basis": BASIS.format(src=src)}
