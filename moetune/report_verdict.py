"""The report page's first lines: one verdict (the dominant wall and its share, what paced the
step, the median step time, the top change with its predicted gain and memory verdict), then how
many steps it rests on. What the sections below show as evidence, said once, up front."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from moetune.report_format import esc, ms, pct, steps_text
from moetune.vocabulary import PACED_BY_WHO as PACED_BY  # critical_path.paced_by, in words


def verdict_line(d: Mapping[str, Any] | None, advice: Mapping[str, Any] | None,
                 problem: str | None) -> str:
    """The verdict as HTML (one paragraph): every figure the diagnosis and the advice hold."""
    from moetune.analyzer.planner.verdict import describe

    if d is None:
        return (f'<p class="verdict">No verdict: {esc(problem or "no diagnosis")}.</p>')
    wall = d.get("dominant_wall")
    share = (d.get("walls") or {}).get(wall) if wall else None
    head = (f"<b>{esc(wall)}-bound</b>" + (f" ({pct(share)} of the step)" if share is not None
                                           else "")) if wall else "<b>no dominant wall</b>"
    pace = (d.get("critical_path") or {}).get("paced_by")
    parts = [head]
    if pace:
        parts.append(f"paced by {esc(PACED_BY.get(pace, pace))}")
    whole = (d.get("window") or {}).get("step_source") == "whole_trace"
    parts.append(f"{'the whole trace (one step)' if whole else 'median step'} "
                 f"{ms(d.get('step_time_s'))}")
    recs = (advice or {}).get("recommendations") or []
    if recs:
        r = recs[0]
        sp = (r.get("gain") or {}).get("speedup") or {}
        mem = describe(r.get("memory"))
        change = (f'top change: <a href="#advice"><b>{esc(r.get("title"))}</b></a>, predicted '
                  f'<b>{pct(sp.get("mid"), True)}</b> ({pct(sp.get("low"), True)} to '
                  f'{pct(sp.get("high"), True)})')
        before = ((r.get("gain") or {}).get("step_time_s") or {}).get("before")
        ref = d.get("reference") or {}
        if before and ref.get("source") == "log":  # the gain's base is not the profiled median
            change += (f" over the {ms(before)} unprofiled step of "
                       f"{esc(ref.get('file') or 'the log')}")
        elif before and d.get("step_time_s") and abs(before - d["step_time_s"]) > 5e-7:
            change += f" over a {ms(before)} step"
        if mem is not None:
            verdict = (r.get("memory") or {}).get("verdict", "unknown")
            change += f', memory <b class="m-{esc(verdict.replace(" ", "-"))}">{esc(verdict)}</b>'
        parts.append(change)
    elif advice is not None:
        parts.append("no change recommended"
                     + (f" ({esc(advice['none_because'])})" if advice.get("none_because") else ""))
    return '<p class="verdict">' + " · ".join(parts) + ".</p>"


def steps_card(d: Mapping[str, Any]) -> tuple[str, str]:
    """("steps analysed", a count with its ids): a count, never a step id; one whole-trace step
    says so."""
    w = d.get("window") or {}
    ids = list(d.get("steps") or [])
    if w.get("step_source") == "whole_trace":
        return "steps analysed", "1 (the whole trace)"
    return "steps analysed", (f"{len(ids)} (step{'s' if len(ids) > 1 else ''} {steps_text(ids)})"
                             if ids else "0")


def window_text(d: Mapping[str, Any]) -> str:
    """Which steps the page rests on: the declared window, the steps found and dropped."""
    w = d.get("window") or {}
    if w.get("step_source") == "whole_trace":
        return ("No step markers (ProfilerStep, NVTX or annotation ranges) and no repeating "
                "GPU-idle gap: the whole trace is analysed as one step.")
    found = w.get("steps_found") or []
    dropped = w.get("dropped_incomplete") or []
    return (f"Steady window: {esc(w.get('declared') or 'all complete steps')}; {len(found)} "
            f"step(s) found ({esc(steps_text(found))})"
            + (f", dropped as incomplete {esc(steps_text(dropped))}" if dropped else "") + ".")
