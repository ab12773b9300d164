"""How well each rule's predicted gain matched what the executor measured (`moetune ledger
--by-rule`): the feedback that keeps a rule's `expected_gain` honest.

One row per rule that proposed a candidate with a prediction. The ratio measured / predicted is
taken over decisions that produced a measured gain (accepted, or rejected after measuring: no
gain, within noise, loss); runs that crashed or were refused have none and are only counted.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from statistics import median
from typing import Any


def by_rule(decisions: Iterable[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """Rows sorted by rule: decisions, accepted, measured, median predicted and measured gain,
    median ratio, and the rejection causes seen."""
    groups: dict[str, list[Mapping[str, Any]]] = {}
    for d in decisions:
        src = d.get("source") or ""
        rule = src[len("user ("):-1] if src.startswith("user (") else src  # a --try a rule shared
        if d.get("predicted_gain") is None or not rule or rule == "user":
            continue
        groups.setdefault(rule, []).append(d)
    out = []
    for rule, ds in sorted(groups.items()):
        measured = [d for d in ds if d.get("measured_gain") is not None]
        ratios = [d["measured_gain"] / d["predicted_gain"] for d in measured if d["predicted_gain"]]
        causes = sorted({str(d["cause"]) for d in ds if d.get("cause")})
        out.append({
            "rule": rule,
            "decisions": len(ds),
            "accepted": sum(d.get("verdict") == "accepted" for d in ds),
            "measured": len(measured),
            "predicted_gain_median": _med([d["predicted_gain"] for d in ds]),
            "measured_gain_median": _med([d["measured_gain"] for d in measured]),
            "measured_over_predicted": _med(ratios),
            "causes": causes,
        })
    return out


def _med(xs: list[float]) -> float | None:
    return round(median(xs), 4) if xs else None
