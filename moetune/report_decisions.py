"""The report page's decision sections: what the audit found of the claims, the advice, the tune
ledger's history and the comparison with a baseline run. A mixin of `report_page._Page`, whose
building blocks (`section`, `table`, `chart`, `missing`) they use."""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from moetune.compare import arg_word
from moetune.report_format import (
    WALL_COLORS,
    chart_text,
    esc,
    gib,
    ms,
    pairs,
    pct,
    short,
    steps_text,
)
from moetune.vocabulary import WALLS

if TYPE_CHECKING:
    from moetune.report_data import ReportData


class DecisionSections:
    """Sections appended after the evidence: audit, advice, ledger, baseline."""

    def audit_section(self, audit: Mapping[str, Any] | None, has_contract: bool, *,
                      diagnosed: bool) -> None:
        if audit is None:
            if not has_contract:
                why = "No contract given (--contract FILE): nothing claimed, nothing audited."
            elif not diagnosed:
                why = ("Not audited: the claims are checked against the analysed steps, and "
                       "there are none.")
            else:
                why = "The contract claims nothing the trace can check."
            self.section("audit", "Audit of claims", self.missing(why))
            return
        doc = audit.get("document", audit)
        s = doc.get("summary") or {}
        rows = []
        for key, v in sorted((doc.get("verdicts") or {}).items()):
            verdict = v.get("verdict") or "?"
            rows.append([esc(v.get("title") or key),
                         f'<span class="mono">{pairs(v.get("claimed"))}</span>',
                         f'<span class="v-{esc(verdict)}">{esc(verdict)}</span>',
                         esc(v.get("reason")),
                         f'<span class="mono small">{pairs(v.get("evidence"))}</span>'])
        body = (f"<p>{s.get('confirmed', 0)} confirmed, {s.get('contradicted', 0)} contradicted, "
                f"{s.get('unobservable', 0)} unobservable"
                + (f"; not audited: {esc(', '.join(s.get('unaudited') or []))}" if s.get("unaudited") else "")
                + ".</p>")
        if s.get("outcome") == "undecided":
            body += self.missing("Undecided: no claim could be checked against this trace, so the "
                                 "audit neither passes nor fails (moetune audit exits 3).")
        body += self.table(["claim", "claimed", "verdict", "why", "evidence"], rows, "audit")
        self.section("audit", "Audit of claims", body)

    def advice_section(self, advice: Mapping[str, Any] | None, problem: str | None,
                       diagnosed: bool) -> None:
        from moetune.report_advice import advice_body

        body, note = advice_body(advice, problem, diagnosed)
        self.section("advice", "Recommendations", body, note=note)

    def ledger_section(self, data: ReportData) -> None:
        if data.ledger is None and data.ledger_problem is None:
            return
        if data.ledger is None:
            self.section("ledger", "Tune history",
                         self.missing(f"No tune history: {esc(data.ledger_problem)}."))
            return
        go = self.go
        decs = data.ledger.get("decisions") or []
        runs = data.ledger.get("runs") or []
        body = (f"<p>Ledger {esc(data.ledger_name)}: {len(data.ledger.get('sessions') or [])} "
                f"session(s), {len(runs)} run(s), {len(decs)} decision(s).</p>")
        if decs:
            xs = [f"{i + 1}. {chart_text(x['label'])}" for i, x in enumerate(decs)]
            fig = go.Figure()
            fig.add_bar(name="measured (± noise)", x=xs,
                        y=[(x["measured_gain"] or 0) * 100 for x in decs],
                        error_y={"type": "data", "array": [(x["noise"] or 0) * 100 for x in decs],
                                 "visible": True},
                        marker_color=["#54a24b" if x["verdict"] == "accepted" else "#bab0ac"
                                      for x in decs])
            fig.add_scatter(name="predicted", x=xs,
                            y=[x["predicted_gain"] * 100 if x["predicted_gain"] is not None
                               else None for x in decs],
                            mode="markers", marker={"symbol": "diamond", "size": 11,
                                                    "color": "#222"})
            fig.update_layout(yaxis_title="step-time gain, %", xaxis_type="category")
            body += self.chart("ledger", fig, 300)
            body += self.table(
                ["#", "change", "rule", "predicted", "measured", "noise", "verdict", "cause"],
                [[str(i + 1), f'<span class="mono">{esc(x["label"])}</span>', esc(x["source"]),
                  pct(x["predicted_gain"], True), pct(x["measured_gain"], True),
                  "±" + pct(x["noise"]), f'<span class="v-{esc(x["verdict"])}">'
                  f'{esc(x["verdict"])}</span>', esc(x["cause"] or "")]
                 for i, x in enumerate(decs)])
        else:
            body += self.missing("The ledger holds no decision yet.")
        self.section("ledger", "Tune history", body,
                     note="Gain = baseline step time / candidate step time − 1; noise: the band "
                     "the validation measured around it (docs/executor.md).")

    def baseline_section(self, base: ReportData, cur: ReportData) -> None:
        d = cur.diff
        if d is None:
            missing = "the baseline" if base.analysis is None else "this run"
            why = (base.problem if base.analysis is None else cur.problem) or "no diagnosis"
            self.section("baseline", "Against the baseline",
                         self.missing(f"No comparison: {missing} has no diagnosis ({esc(why)})."))
            return
        go = self.go
        st = d["step_time"]
        a, b = st["a"], st["b"]
        body = f'<p class="config">{config_html(d.get("config"))}</p>'
        for w in d.get("warnings") or []:
            if w.startswith("model shape not compared"):
                w = ("model shape not compared (give the baseline's --baseline-contract or "
                     "--baseline-log and this run's --contract or --log)")
            body += f'<p class="missing">{esc(w)}</p>'
        if st.get("beyond_noise") is None:
            verdict = (f"not decidable: {st.get('noise_unknown') or 'noise unknown'}, so a change "
                       "cannot be told from step-to-step variation")
        else:
            verdict = ("beyond both runs' noise" if st["beyond_noise"]
                       else "within the runs' noise: not a change")

        def pm(x: Mapping[str, Any]) -> str:
            return " ± noise unknown" if x.get("noise_s") is None else f" ± {ms(x['noise_s'])}"

        body += (f"<p>Baseline {esc(', '.join(d['a']['inputs']))} (steps "
                 f"{esc(steps_text(d['a']['steps']))}): median step {ms(a['median_s'])}{pm(a)}; "
                 f"this run {ms(b['median_s'])}{pm(b)}: "
                 f"<b>{pct((st.get('delta_pct') or 0) / 100, True)}</b>, {verdict}. Dominant "
                 f"wall {esc(d['dominant_wall']['a'])} → {esc(d['dominant_wall']['b'])}.</p>")
        fig = go.Figure()
        for w in WALLS:
            pair = d["walls"][w]
            fig.add_bar(name=w, x=["baseline", "this run"], marker_color=WALL_COLORS[w],
                        y=[(pair["a"] or 0) * 1e3, (pair["b"] or 0) * 1e3])
        fig.update_layout(barmode="stack", yaxis_title="exposed, ms per median step")
        rows = [[esc(c["kclass"]), esc(c["status"]), ms(c["a_s"]), ms(c["b_s"]),
                 ms(c["delta_s"])] for c in d.get("classes") or []]
        body += ('<div class="row">' + self.chart("baseline", fig, 300)
                 + self.table(["kernel class", "", "baseline / step", "this run / step", "Δ"],
                              rows) + "</div>")
        for key, title in (("kernels", "Kernels"), ("ops", "Host ops (self time)")):
            named = d.get(key) or []
            if named:
                body += f"<h3>{title} that changed most</h3>" + self.table(
                    ["name", "", "baseline / step", "this run / step", "Δ"],
                    [[f'<span class="mono">{esc(short(n.get("name") or "?", 110))}</span>',
                      esc(n["status"]), ms(n["a_s"]), ms(n["b_s"]), ms(n["delta_s"])]
                     for n in named])
        news = [o["text"] for o in d.get("observed") or []] + [
            x["text"] for x in d.get("audit") or []]
        mem = d.get("memory") or {}
        pk = mem.get("peak_allocated_gib") or {}
        if pk.get("a") is not None or pk.get("b") is not None:
            news.append(f"peak allocated memory: {gib(pk.get('a'))} → {gib(pk.get('b'))}")
        for role, pair in sorted((d.get("comm_groups") or {}).items()):
            news.append(f"communication, {role}: {ms(pair.get('a'))} → {ms(pair.get('b'))} "
                        "per step")
        if news:
            body += "<h3>What else changed</h3><ul>" + "".join(
                f"<li>{esc(x)}</li>" for x in news) + "</ul>"
        self.section("baseline", "Against the baseline", body,
                     note="What moetune diff says of the baseline and this run (docs/diff.md); noise: "
                     "half the range of each run's analysed step times.")


def config_html(config: Mapping[str, Any] | None) -> str:
    """The configuration delta, first in the comparison: each changed Megatron argument."""
    if not config or config.get("changes") is None:
        missing = [side for side, k in (("the baseline", "a_from"), ("this run", "b_from"))
                   if not (config or {}).get(k)]
        flags = {"the baseline": "--baseline-contract or --baseline-log",
                 "this run": "--contract or --log"}
        return ("<b>Configuration</b>: not compared, no Megatron arguments for "
                + " and ".join(f"{m} ({flags[m]})" for m in missing) + ".")
    src = f" (baseline's {esc(config['a_from'])}, this run's {esc(config['b_from'])})"
    ch = config["changes"]
    if not ch:
        return f"<b>Configuration</b>{src}: no Megatron argument differs."
    return (f"<b>Configuration</b>{src}: " + ", ".join(
        f'<span class="mono">{esc(c["arg"])}</span> {esc(arg_word(c["a"]))} → '
        f'<b>{esc(arg_word(c["b"]))}</b>' for c in ch) + ".")
