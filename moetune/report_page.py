"""The HTML report's page: `render` turns `ReportData` (moetune/report.py, which reads the run) into
one self-contained HTML string, plotly.js inlined once, every chart a div calling it. Pure: no
file is read here. Every string that came from a trace or a ledger passes `redact_text`.
"""

from __future__ import annotations

import html
from collections.abc import Mapping, Sequence
from typing import Any

import polars as pl

from moetune.analyzer.path_summary import HOST_IDLE_OTHER, path_lines
from moetune.errors import UserError
from moetune.redact import redact_text
from moetune.report_data import ReportData, Timeline
from moetune.report_decisions import DecisionSections
from moetune.report_format import (
    MEMORY_KIND_COLORS,
    WALL_COLORS,
    chart_text,
    collective,
    count,
    esc,
    ms,
    short,
)
from moetune.report_phases import phases_section
from moetune.report_verdict import steps_card, verdict_line, window_text
from moetune.resources import data as data_file
from moetune.vocabulary import WALLS

# Boxes per timeline lane before its events are merged into time bins: plotly draws each bar as
# an SVG path, and a few thousand keep zooming fluid.
LANE_MAX_BOXES = 600
LANE_BINS = 400
PATH_LANE = "critical path"
PATH_MAX_BOXES = 3000  # the critical path is one lane, and the one read closest
MAX_LANES = 16  # GPU streams and host threads of the median step, busiest first
MEMORY_POINTS = 1500
OCCUPANCY_FLOOR = 0.06  # opacity of a time bin with work but almost no busy time: still seen
TOP_N = 15
TOP_EDGES = 8
NS = 1e-9


class PlotlyMissing(UserError):
    """The `report` extra is not installed."""


def plotly_modules() -> tuple[Any, Any]:
    """plotly's graph_objects and offline modules, or a one-line PlotlyMissing."""
    try:
        import plotly.graph_objects as go
        import plotly.offline as po
    except ImportError:
        raise PlotlyMissing("the report needs plotly: pip install 'moetune[report]'") from None
    return go, po


def render(data: ReportData) -> str:
    """One HTML document: plotly.js inlined once, every chart a div calling it."""
    go, po = plotly_modules()
    page = _Page(go)
    an = data.analysis
    d = an.diagnosis if an is not None else None
    page.verdict_section(data, d)
    page.run_section(data, d)
    if d is not None:
        page.walls_section(d)
        page.timeline_section(data.timeline, d)
        page.kernels_section(d, data.cpu_ops)
        phases_section(page, d)
        page.ranks_section(d)
        page.memory_section(d, data.memory, data.memory_binned, data.timeline)
    page.audit_section(an.audit if an is not None else None, data.contract_given,
                       diagnosed=d is not None)
    page.advice_section(data.advice, data.advice_problem, d is not None)
    page.ledger_section(data)
    if data.baseline is not None:
        page.baseline_section(data.baseline, data)
    return page.html(po.get_plotlyjs(), title=_title(data))


def _title(data: ReportData) -> str:
    shown = ", ".join(data.files[:3]) + (f" +{len(data.files) - 3}" if len(data.files) > 3 else "")
    return f"moetune report · {redact_text(shown)}"


class _Page(DecisionSections):
    """Sections appended in order; each chart becomes a div with a stable id."""

    def __init__(self, go: Any) -> None:
        self.go = go
        self.parts: list[str] = []
        self.toc: list[tuple[str, str]] = []

    # ---- building blocks

    def section(self, sid: str, title: str, body: str, note: str | None = None) -> None:
        self.toc.append((sid, title))
        extra = f'<p class="note">{note}</p>' if note else ""
        self.parts.append(f'<section id="{sid}"><h2>{html.escape(title)}</h2>{body}{extra}</section>')

    def chart(self, cid: str, fig: Any, height: int = 320) -> str:
        fig.update_layout(height=height, margin={"l": 60, "r": 20, "t": 30, "b": 40},
                          template="plotly_white", font={"size": 12},
                          legend={"orientation": "h", "y": 1.02, "yanchor": "bottom", "x": 0,
                                  "traceorder": "normal"})
        fig.update_yaxes(automargin=True)
        fig.update_xaxes(automargin=True)
        div = fig.to_html(full_html=False, include_plotlyjs=False, div_id=f"chart-{cid}",
                          config={"displaylogo": False, "responsive": True})
        return f'<div class="chart" data-chart="{cid}">{div}</div>'

    @staticmethod
    def missing(text: str) -> str:
        return f'<p class="missing">{text}</p>'

    @staticmethod
    def table(head: Sequence[str], rows: Sequence[Sequence[str]], cls: str = "") -> str:
        th = "".join(f"<th>{h}</th>" for h in head)
        body = "".join("<tr>" + "".join(f"<td>{c}</td>" for c in r) + "</tr>" for r in rows)
        return f'<table class="{cls}"><thead><tr>{th}</tr></thead><tbody>{body}</tbody></table>'

    def html(self, plotlyjs: str, *, title: str) -> str:
        toc = "".join(f'<a href="#{sid}">{html.escape(t)}</a>' for sid, t in self.toc)
        return (
            "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">"
            f"<meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">"
            f"<title>{html.escape(title)}</title><style>{_css()}</style>"
            f"<script>{plotlyjs}</script></head><body>"
            f"<header><h1>{html.escape(title)}</h1><nav>{toc}</nav></header><main>"
            + "".join(self.parts) + "</main><footer>moetune · charts by plotly.js, inlined: "
            "this page opens offline</footer></body></html>\n"
        )

    # ---- sections

    def verdict_section(self, data: ReportData, d: Mapping[str, Any] | None) -> None:
        self.section("verdict", "Verdict", verdict_line(d, data.advice, data.problem or
                                                         data.advice_problem),
                     note=None if d is None else "The evidence follows: walls, the median "
                     "step's timeline, kernels, ranks, memory, the audit and every "
                     "recommendation with its basis.")

    def run_section(self, data: ReportData, d: Mapping[str, Any] | None) -> None:
        cards = []
        if d is not None:
            w = d.get("window") or {}
            cards = [("median step", ms(d.get("step_time_s"))),
                     ("dominant wall", d.get("dominant_wall") or "—"),
                     ("ranks analysed", str(len(d.get("ranks_analyzed") or []))),
                     steps_card(d),
                     ("steps from", (w.get("step_source") or "—").replace("_", " "))]
            cp = d.get("critical_path") or {}
            if cp.get("paced_by"):
                cards.append(("paced by", cp["paced_by"]))
        body = "".join(f'<div class="card"><div class="k">{html.escape(k)}</div>'
                       f'<div class="v">{esc(v)}</div></div>' for k, v in cards)
        body = f'<div class="cards">{body}</div>' if body else ""
        if data.problem:
            body += self.missing(f"No diagnosis: {esc(data.problem)}. The sections that need steps "
                                 "(walls, timeline, kernels, ranks, memory, advice) are left out.")
        if d is not None:
            body += f"<p>{window_text(d)}</p>"
        rows = [[esc(m["rank"]), esc(m["file"]), esc(m["format"]), esc(m["device"] or "—"),
                 esc(f"{m['memory_gib']:.1f} GiB" if m["memory_gib"] else "—"), esc(m["sms"] or "—"),
                 esc(m["world_size"] or "—"), esc(m["backend"] or "—"), esc(m["nccl"] or "—")]
                for m in data.metadata]
        if rows:
            body += self.table(["rank", "file", "format", "GPU", "memory", "SMs", "world size",
                                "backend", "NCCL"], rows, "meta")
        warnings = (d or {}).get("warnings") or []
        if warnings:
            body += "<details><summary>" + f"{len(warnings)} warning(s)</summary><ul>" + "".join(
                f"<li>{esc(x)}</li>" for x in warnings) + "</ul></details>"
        self.section("run", "The run", body, note="Metadata shown: the readers' whitelist (device, "
                     "distributed info), credential-shaped text redacted.")

    def walls_section(self, d: Mapping[str, Any]) -> None:
        go = self.go
        rows = d.get("per_step") or []
        multi = len({r["rank"] for r in rows}) > 1
        xs = [f"r{r['rank']} s{r['step']}" if multi else f"step {r['step']}" for r in rows]
        fig = go.Figure()
        for w in WALLS:
            fig.add_bar(name=w, x=xs, y=[r["wall_s"] * r["walls"][w] * 1e3 for r in rows],
                        marker_color=WALL_COLORS[w],
                        hovertemplate="%{x}<br>" + w + " %{y:.2f} ms<extra></extra>")
        fig.update_layout(barmode="stack", yaxis_title="ms (exposed)", xaxis_type="category")
        body = '<div class="row">' + self.chart("walls-per-step", fig)
        det = d.get("wall_detail") or {}
        fig2 = go.Figure()
        fig2.add_bar(name="exposed", x=list(WALLS), y=[det.get(w, {}).get("exposed_s", 0) * 1e3
                                                       for w in WALLS],
                     marker_color=[WALL_COLORS[w] for w in WALLS])
        fig2.add_bar(name="hidden (overlapped by compute)", x=list(WALLS),
                     y=[max(0.0, det.get(w, {}).get("hidden_s", 0)) * 1e3 for w in WALLS],
                     marker_color=[WALL_COLORS[w] for w in WALLS], marker_pattern_shape="/",
                     opacity=0.45)
        fig2.update_layout(barmode="stack", yaxis_title="ms in the median step")
        body += self.chart("walls-exposed-hidden", fig2) + "</div>"
        h = d.get("host") or {}
        if h.get("idle_s"):
            body += (f"<p>Host (GPU idle) {ms(h['idle_s'])} in the median step: launch-starved "
                     f"{ms(h.get('launch_starved_s'))}, sync-blocked {ms(h.get('sync_blocked_s'))}"
                     f", other {ms(h.get('other_s'))}"
                     + (f" ({esc(HOST_IDLE_OTHER)})" if h.get("other_s") else "") + ".</p>")
        self.section("walls", "Walls per step", body,
                     note="Left: each analysed step's time split by the wall that held the GPU "
                     "(exposed time; sums to the step). Right: the median step, exposed beside "
                     "hidden (work that ran under compute and cost no step time).")

    def timeline_section(self, tl: Timeline | None, d: Mapping[str, Any]) -> None:
        if tl is None:
            self.section("timeline", "Median step timeline",
                         self.missing("No timeline: the median step has no GPU work in the trace "
                                      "frames."))
            return
        go = self.go
        fig = go.Figure()
        lanes = [PATH_LANE, *tl.lanes]
        shown: set[str] = set()
        for w in (*WALLS, "other"):
            b = tl.boxes.filter(pl.col("wall") == w)
            p = tl.path.filter(pl.col("wall") == w)
            ys = [PATH_LANE] * p.height + b["lane"].to_list()
            if not ys:
                continue
            starts = p["start"].to_list() + b["start"].to_list()
            durs = ((p["end"] - p["start"]).to_list() + (b["end"] - b["start"]).to_list())
            labels = [chart_text(short(x, 120)) for x in p["label"].to_list() + b["label"].to_list()]
            # a time bin's shade is its occupancy: a lane busy 10 % of the step reads pale
            shade = [OCCUPANCY_FLOOR + (1 - OCCUPANCY_FLOOR) * x
                     for x in p["occupancy"].to_list() + b["occupancy"].to_list()]
            fig.add_bar(name=w, orientation="h", y=ys, base=[s / 1e6 for s in starts],
                        x=[max(x, 1) / 1e6 for x in durs], marker_color=WALL_COLORS[w],
                        marker_opacity=shade, marker_line_width=0, showlegend=w not in shown,
                        # plotly's %{x} of a bar with a base is its end: the length goes along
                        customdata=[[lab, s / 1e6, d / 1e3] for lab, s, d
                                    in zip(labels, starts, durs, strict=True)],
                        hovertemplate="%{customdata[0]}<br>at %{customdata[1]:.3f} ms, lasting "
                                      "%{customdata[2]:,.1f} µs<extra>" + w + "</extra>")
            shown.add(w)
        for e in tl.edges:
            # the awaited communication's time on the path, as a band over every lane
            fig.add_vrect(x0=e["src_start"] / 1e6, x1=e["src_end"] / 1e6, fillcolor="#f58518",
                          opacity=0.13, line_width=0, layer="below")
            if e["src_lane"] != e["dst_lane"]:
                fig.add_annotation(x=e["dst_start"] / 1e6, y=e["dst_lane"],
                                   ax=e["src_end"] / 1e6, ay=e["src_lane"], xref="x", yref="y",
                                   axref="x", ayref="y", showarrow=True, arrowhead=2,
                                   arrowwidth=1.2, arrowcolor="#222", text="")
        if tl.edges:
            fig.add_scatter(name="blocking wait", mode="markers",
                            x=[e["dst_start"] / 1e6 for e in tl.edges],
                            y=[e["dst_lane"] for e in tl.edges],
                            marker={"symbol": "triangle-right", "size": 11, "color": "#222"},
                            customdata=[[chart_text(e["label"]), e["on_path"] / 1e6] for e in tl.edges],
                            hovertemplate="%{customdata[0]}<br>%{customdata[1]:.3f} ms on the "
                                          "critical path<extra>blocking</extra>")
        fig.update_layout(barmode="overlay", bargap=0.25, xaxis_title="ms from the step's start",
                          yaxis={"categoryorder": "array", "categoryarray": lanes[::-1],
                                 "type": "category"},
                          dragmode="zoom", hovermode="closest")
        height = 160 + 34 * len(lanes)
        notes = [f"Rank {tl.rank}, step {tl.step}, {tl.length_ns / 1e6:,.2f} ms: drag to zoom, "
                 "double-click to reset. Top lane: the critical path (what set the step's length), "
                 "runs of one wall merged. Shaded bands and ▶: the longest blocking waits "
                 f"(communication on the path that the marked op waited for; up to {TOP_EDGES}), "
                 "an arrow where the waiter is on another lane."]
        if tl.merged:
            notes.append("Downsampled: " + ", ".join(
                f"{esc(k)} ({v:,} events)" for k, v in sorted(tl.merged.items()))
                + f" shown as {LANE_BINS} time bins each (over {LANE_MAX_BOXES} events in a lane, "
                f"{PATH_MAX_BOXES} on the critical path), "
                "each coloured by its busiest wall and shaded by its occupancy (the share of "
                "the bin the lane was busy: pale is idle, solid is busy); hover for counts.")
        if tl.lanes_dropped:
            notes.append(f"{tl.lanes_dropped} quieter lane(s) not shown (at most {MAX_LANES}).")
        cp = d.get("critical_path") or {}
        path = "".join(f"<p>{esc(line.strip())}</p>" for line in path_lines(cp)) if cp else ""
        self.section("timeline", "Median step timeline",
                     self.chart("timeline", fig, height=height) + path, note=" ".join(notes))

    def kernels_section(self, d: Mapping[str, Any], ops: pl.DataFrame | None) -> None:
        go = self.go
        ev = d.get("evidence") or {}
        classes = sorted(((k, v) for k, v in (ev.get("classes") or {}).items()),
                         key=lambda kv: -kv[1]["time_s"])
        nsteps = max(1, len(d.get("per_step") or []))
        body = '<div class="row">'
        if classes:
            top = classes[:TOP_N][::-1]
            shown = (f"all {len(top)}" if len(top) == len(classes)
                     else f"the top {len(top)} of {len(classes)}")
            body += (f'<div><h3>Kernel classes: {shown}, by GPU time</h3>')
            fig = go.Figure()
            fig.add_bar(orientation="h", y=[chart_text(k) for k, _ in top],
                        x=[v["time_s"] / nsteps * 1e3 for _, v in top],
                        marker_color=[WALL_COLORS.get(v.get("wall") or "other", "#999") for _, v in top],
                        customdata=[v["count"] for _, v in top],
                        hovertemplate="%{y}: %{x:.3f} ms/step, %{customdata} launches<extra></extra>")
            fig.update_layout(xaxis_title="ms per step (GPU time)", showlegend=False)
            body += self.chart("kernel-classes", fig, height=120 + 22 * len(top)) + "</div>"
        if ops is not None and ops.height:
            o = ops.reverse()
            fig = go.Figure()
            fig.add_bar(orientation="h", y=[chart_text(short(n, 48)) for n in o["name"].to_list()],
                        x=[t * 1e3 for t in o["per_step_s"].to_list()], marker_color="#e45756",
                        customdata=[[c, t * 1e3] for c, t in zip(
                            o["per_step"].to_list(), o["per_step_total_s"].to_list(), strict=True)],
                        hovertemplate="%{y}: self %{x:.3f} ms/step (inclusive "
                                      "%{customdata[1]:.3f} ms), %{customdata[0]:.0f} calls"
                                      "<extra></extra>")
            fig.update_layout(xaxis_title="ms per step (CPU self time)", showlegend=False)
            body += (f"<div><h3>CPU ops: the top {o.height} by self time</h3>"
                     + self.chart("cpu-ops", fig, height=120 + 22 * o.height) + "</div>")
        else:
            body += self.missing("No CPU ops in the analysed steps (an nsys export, or a profile "
                                 "without record_shapes/cpu_op rows).")
        body += "</div>"
        tk = ev.get("top_kernels") or []
        if tk:
            body += "<h3>Top kernels</h3>" + self.table(
                ["kernel", "class", "launches / step", "time / step"],
                [[f'<span class="mono">{esc(short(k.get("name") or "?", 110))}</span>',
                  esc(k.get("kclass")), count(k["count"] / nsteps), ms(k["time_s"] / nsteps)]
                 for k in tk])
        copies = ev.get("copies") or {}
        rows = [(direction, mem, v) for direction, mems in sorted(copies.items())
                for mem, v in sorted(mems.items())]
        if rows:
            fig = go.Figure()
            for mem in sorted({m for _, m, _ in rows}):
                sel = [(dr, v) for dr, m, v in rows if m == mem]
                fig.add_bar(name=mem, x=[dr for dr, _ in sel],
                            marker_color=MEMORY_KIND_COLORS.get(mem, "#bab0ac"),
                            y=[v["time_s"] / nsteps * 1e3 for _, v in sel],
                            customdata=[[v["count"], v["bytes"] / 2**20] for _, v in sel],
                            hovertemplate="%{x} " + mem + ": %{y:.3f} ms/step, %{customdata[0]} "
                            "copies, %{customdata[1]:.1f} MiB<extra></extra>")
            fig.update_layout(barmode="group", yaxis_title="ms per step")
            table = self.table(["direction", "memory", "copies / step", "MiB / step", "time / step"],
                               [[esc(dr), esc(m), count(v["count"] / nsteps),
                                 f"{v['bytes'] / 2**20 / nsteps:,.2f}", ms(v["time_s"] / nsteps)]
                                for dr, m, v in rows])
            body += ("<h3>Copies by direction and memory kind</h3><div class=\"row\">"
                     + self.chart("copies", fig, 240) + table + "</div>")
        else:
            body += self.missing("No copies in the analysed steps.")
        self.section("kernels", "Kernels, CPU ops and copies", body,
                     note="Kernel classes coloured by wall. CPU ops ranked by self time (an op's "
                     "time less the ops nested in it, as `moetune diagnose --top` ranks them; "
                     "hover for the inclusive time). Per step: totals over the analysed steps "
                     "(and ranks) divided by their number.")

    def ranks_section(self, d: Mapping[str, Any]) -> None:
        rk = d.get("ranks")
        n = len(d.get("ranks_analyzed") or [])
        if not rk:
            self.section("ranks", "Across ranks", self.missing(
                f"{'One rank' if n <= 1 else f'{n} ranks'} analysed: no cross-rank view (give "
                "every rank's trace, or a directory of them, to compare ranks)."))
            return
        go = self.go
        by = rk.get("step_time_s_by_rank") or {}
        strag = {str(s.get("rank")) if isinstance(s, Mapping) else str(s)
                 for s in rk.get("stragglers") or []}
        xs = sorted(by, key=int)
        fig = go.Figure()
        fig.add_bar(x=[f"rank {r}" for r in xs], y=[by[r] * 1e3 for r in xs],
                    marker_color=["#e45756" if r in strag else "#4c78a8" for r in xs],
                    hovertemplate="%{x}: %{y:.2f} ms<extra></extra>")
        fig.update_layout(yaxis_title="median step, ms", showlegend=False)
        body = '<div class="row">' + self.chart("rank-step-times", fig, 280)
        sk = rk.get("collective_arrival_skew_s") or {}
        bc = sorted((sk.get("by_collective") or {}).items(), key=lambda kv: -kv[1].get("max", 0))
        if bc:
            top = bc[:TOP_N][::-1]
            fig2 = go.Figure()
            ys = [chart_text(collective(k)) for k, _ in top]
            fig2.add_bar(name="p50", orientation="h", y=ys,
                         x=[v.get("p50", 0) * 1e3 for _, v in top], marker_color="#72b7b2")
            fig2.add_bar(name="max", orientation="h", y=ys,
                         x=[v.get("max", 0) * 1e3 for _, v in top], marker_color="#f58518")
            fig2.update_layout(barmode="group", xaxis_title="arrival skew, ms")
            body += self.chart("arrival-skew", fig2, 120 + 30 * len(top))
        body += "</div>"
        verdict = (f"unobservable ({rk.get('stragglers_unobservable') or 'no verdict'})"
                   if rk.get("stragglers") is None
                   else ', '.join(f'rank {s}' for s in sorted(strag, key=int)) or 'none')
        body += (f"<p>Stragglers ({esc(rk.get('straggler_rule') or '')}): {esc(verdict)}. "
                 f"Collective arrival skew over {esc(sk.get('instances', 0))} instances: p50 "
                 f"{ms(sk.get('p50'))}, max {ms(sk.get('max'))}.</p>")
        self.section("ranks", "Across ranks", body,
                     note="Skew: how much later the last rank reached each collective than the "
                     "first (clocks aligned on collective ends).")

    def memory_section(self, d: Mapping[str, Any], curve: pl.DataFrame | None, binned: bool,
                       tl: Timeline | None) -> None:
        m = d.get("memory") or {}
        body = ""
        if m.get("peak_allocated_gib") is not None:
            body += (f"<p>Peak allocated {m['peak_allocated_gib']:.2f} GiB, reserved "
                     f"{m.get('peak_reserved_gib') or 0:.2f} GiB of "
                     f"{m.get('device_gib') or 0:.1f} GiB (source: {esc(m.get('source'))}).</p>")
        if curve is None:
            body += self.missing("No allocator events in this step: " + _memory_hint(d))
            self.section("memory", "Device memory", body)
            return
        go = self.go
        fig = go.Figure()
        fig.add_scatter(name="allocated", x=curve["t_ms"].to_list(),
                        y=curve["allocated_gib"].to_list(), mode="lines", line_shape="hv",
                        line_color="#4c78a8")
        fig.add_scatter(name="reserved", x=curve["t_ms"].to_list(),
                        y=curve["reserved_gib"].to_list(), mode="lines", line_shape="hv",
                        line_color="#9d9d9d")
        fig.update_layout(xaxis_title="ms from the step's start", yaxis_title="GiB")
        where = f" (rank {tl.rank}, step {tl.step})" if tl else ""
        note = "The caching allocator's totals after each event" + where + "."
        if binned:
            note += f" Downsampled: the maximum per time bin ({MEMORY_POINTS} bins)."
        self.section("memory", "Device memory", body + self.chart("memory", fig, 280), note=note)




def _memory_hint(d: Mapping[str, Any]) -> str:
    """How to record device memory over a step, in the words of the profiler that wrote the
    trace: nsys and Kineto spell it differently."""
    formats = {i.get("format") for i in d.get("inputs") or []}
    hints = []
    if "nsys" in formats:
        hints.append("profile with <code>nsys profile --cuda-memory-usage=true</code> (Nsight "
                     "Systems) to see the GPU memory the driver allocated over the step")
    if formats - {"nsys"} or not formats:
        hints.append("profile with <code>profile_memory=True</code> (torch.profiler) to see the "
                     "caching allocator's memory over the step")
    return "; ".join(hints) + "."


def _css() -> str:
    """The page's style sheet (moetune/data/report.css), inlined: the page opens offline."""
    return data_file("moetune", "data", "report.css").read_text(encoding="utf-8")
