"""What a recommendation says beyond its flags and gain, in the words both the terminal
(`moetune recommend`) and the report's cards print: its memory verdict (headline and basis), what
to verify after the change, and its risk. One definition, so the two never drift apart."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any


def memory_words(rec: Mapping[str, Any]) -> tuple[str, str] | None:
    """(headline, basis) of the change's memory verdict: fits / tight / does not fit / unknown;
    the basis is "" where it would repeat the headline (an unknown verdict's reason)."""
    from moetune.analyzer.planner.verdict import describe

    words = describe(rec.get("memory"))
    if words is None:
        return None
    return words[0], "" if words[1] in words[0] else words[1]


def _value(metric: str, x: Any) -> str:
    if isinstance(x, bool) or not isinstance(x, int | float):
        return str(x)
    if metric.endswith("_s"):
        return f"{x * 1e3:,.2f} ms"
    return f"{x:,.3g}" if isinstance(x, float) else f"{x:,}"


def verify_text(rec: Mapping[str, Any]) -> str:
    """What to check on the next profile: the audit verdict expected, the metric's direction and
    least change (with its value now), and the trace signature to look for."""
    v = rec.get("verify") or {}
    audit = f"audit {v['audit']} confirmed; " if v.get("audit") else ""
    now = (f" (now {_value(v['metric'], v['metric_now'])})"
           if v.get("metric_now") is not None else "")
    sig = f"; look for: {v['signature']}" if v.get("signature") else ""
    least = v.get("min_relative_change") or 0
    # a gate's check asks only that the step does not get worse: "down ≥ 0 %" says nothing
    move = (f"{v.get('direction')} ≥ {least * 100:.0f} %" if least else
            {"down": "no higher", "up": "no lower"}.get(str(v.get("direction")), "unchanged"))
    return f"{audit}{v.get('metric')} {move}{now}{sig}"


def risk_text(rec: Mapping[str, Any]) -> str:
    """The risk level and what could go wrong."""
    r = rec.get("risk") or {}
    notes = "; ".join(r.get("notes") or [])
    return f"{r.get('level', 'unknown')}" + (f": {notes}" if notes else "")
