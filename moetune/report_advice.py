"""The HTML report's recommendations: each ranked change with its flags, its predicted gain and
its memory verdict, what to verify and its risk (moetune/recommendation_words.py: the words the
terminal prints), a gate with the changes it unlocks, and the changes considered but predicted
not to fit. Pure: strings in, HTML out; every string passes `redact_text`."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from moetune.report_format import esc as _e
from moetune.report_format import gib as _gib
from moetune.report_format import ms as _ms
from moetune.report_format import pct as _pct


def _missing(text: str) -> str:
    return f'<p class="missing">{text}</p>'


def advice_body(advice: Mapping[str, Any] | None, problem: str | None, diagnosed: bool
                ) -> tuple[str, str | None]:
    """(the section's HTML, its note)."""
    from moetune.recommendation_words import memory_words, risk_text, verify_text

    if advice is None:
        why = problem or ("no diagnosis to advise on" if not diagnosed else "no advice")
        return _missing(f"No recommendations: {_e(why)}."), None
    recs = advice.get("recommendations") or []
    d = advice.get("diagnosis") or {}
    body = ""
    ref = d.get("reference") or {}
    if ref.get("step_s"):
        body += (f'<p class="reference">Gains start from the unprofiled step '
                 f'<b>{_ms(ref["step_s"])}</b>: {_e(ref.get("text"))} (the profiled step: '
                 f'{_ms(d.get("step_time_s"))}).</p>')
    mem = d.get("memory") or {}
    if mem.get("source") not in (None, "none"):
        body += (f'<p class="memnow">Memory now: peak allocated '
                 f'{_gib(mem.get("peak_allocated_gib"))}, reserved '
                 f'{_gib(mem.get("peak_reserved_gib"))} of {_gib(mem.get("device_gib"))} '
                 f'(source: {_e(_source_words(mem))}).</p>')
    if not recs:
        body += _missing(advice.get("none_because")
                             or f"No rule fired ({advice.get('rules_checked', '?')} checked).")
    for r in recs:
        g = r.get("gain") or {}
        sp = g.get("speedup") or {}
        flags = [*(r.get("megatron_flags") or []),
                 *(f"remove {f}" for f in r.get("remove_flags") or [])]
        gate = (" alone: a gate, worth what it unlocks (below)" if r.get("gate") else "")
        body += (
            f'<article class="rec"><h3>{_e(r.get("rank"))}. {_e(r.get("title"))}</h3>'
            f'<p class="meta"><span class="wall w-{_e(r.get("wall"))}">{_e(r.get("wall"))}</span>'
            f' {_e(r.get("rule"))} · {_e(r.get("status"))} · confidence '
            f'{_e(r.get("confidence"))}</p>'
            f'<pre>{_e(chr(10).join(flags) or "(no flag)")}</pre>'
            f'<p>Predicted gain <b>{_pct(sp.get("mid"), True)}</b> (range '
            f'{_pct(sp.get("low"), True)} to {_pct(sp.get("high"), True)}){gate}. '
            f'Basis: {_e(g.get("basis"))}</p>'
            + _memory_html(memory_words(r), r.get("memory"))
            + f'<p class="verify"><b>Verify</b> on the next profile: {_e(verify_text(r))}</p>'
            + f'<p class="risk risk-{_e((r.get("risk") or {}).get("level"))}"><b>Risk</b> '
            f'{_e(risk_text(r))}</p>')
        for u in r.get("unlocks") or []:
            usp = (u.get("gain") or {}).get("speedup") or {}
            ch = u.get("change") or {}
            body += (f'<div class="unlocks"><p>Unlocks <b>{_e(u.get("rule"))}</b> '
                     f'({_e(ch.get("knob"))} → {_e(ch.get("to"))}): predicted '
                     f'<b>{_pct(usp.get("mid"), True)}</b> (range '
                     f'{_pct(usp.get("low"), True)} to {_pct(usp.get("high"), True)}) on top.'
                     '</p>'
                     + (f'<pre>{_e(chr(10).join(u["megatron_flags"]))}</pre>'
                        if u.get("megatron_flags") else "")
                     + _memory_html(memory_words(u), u.get("memory")) + "</div>")
        for c in r.get("considered") or []:
            body += (f'<p class="considered">Considered, not unlocked: {_e(c.get("rule"))}: '
                     f'{_e("; ".join(c.get("reasons") or []))}</p>')
        notes = [c for c in r.get("caveats") or [] if not c.startswith("memory ")]
        if notes:
            body += "<ul class=\"notes\">" + "".join(f"<li>{_e(c)}</li>" for c in notes) + "</ul>"
        body += "</article>"
    no_room = [b for b in advice.get("blocked") or []
               if (b.get("memory") or {}).get("verdict") == "does not fit"]
    if no_room:
        body += "<h3>Considered, predicted not to fit</h3>" + "".join(
            f'<article class="rec noroom"><p><b>{_e(b.get("title"))}</b> '
            f'({_e(b.get("rule"))}): would gain '
            f'{_pct(((b.get("gain") or {}).get("speedup") or {}).get("low"), True)} to '
            f'{_pct(((b.get("gain") or {}).get("speedup") or {}).get("high"), True)}</p>'
            + _memory_html(memory_words(b), b.get("memory")) + "</article>"
            for b in no_room)
    blocked = (advice.get("prerequisites") or []) + [
        b for b in advice.get("blocked") or [] if b not in no_room]
    if blocked:
        body += "<details><summary>" + f"{len(blocked)} more, blocked or needing a " \
            "prerequisite</summary><ul>" + "".join(
                f"<li>{_e(b.get('title'))} ({_e(b.get('rule'))}): "
                f"{_e('; '.join(b.get('needs') or b.get('reasons') or []))}</li>"
                for b in blocked) + "</ul></details>"
    return body, ("Ranked by predicted gain; one knob each. Flags are Megatron-LM spellings "
                 "(NAME=value: environment). Memory: the change's predicted peak against the "
                 "GPU with a margin (fits / tight / does not fit), from the run's measured "
                 "peak and the memory model's delta; a change that does not fit is listed as "
                 "considered, never ranked.")


def _memory_html(words: tuple[str, str] | None, memory: Mapping[str, Any] | None) -> str:
    """A change's memory verdict: the headline, and its basis in small print."""
    if words is None:
        return ""
    verdict = (memory or {}).get("verdict", "unknown").replace(" ", "-")
    basis = f'<br><span class="small">Basis: {_e(words[1])}</span>' if words[1] else ""
    return f'<p class="memory v-{_e(verdict)}">Memory: <b>{_e(words[0])}</b>{basis}</p>'


def _source_words(mem: Mapping[str, Any]) -> str:
    from moetune.analyzer.device_memory import SOURCE_WORDS

    files = ", ".join(mem.get("files") or [])
    at = f", after iteration {mem['iteration']}" if mem.get("iteration") else ""
    return SOURCE_WORDS.get(mem.get("source"), str(mem.get("source"))) + (
        f" {files}" if files else "") + at
