"""The report's "Phases" section: where each layer's time goes (a stacked bar per layer, or one for
the whole step when the layers cannot be told apart), the phase table (sortable by any column), the
throughput cards and, with several ranks, each rank's breakdown. Pure: the diagnosis document in,
HTML out through the page's building blocks (moetune/report_page.py)."""

from __future__ import annotations

import html
from collections.abc import Mapping
from typing import Any

from moetune.analyzer.throughput import log_words
from moetune.redact import redact_text

# One colour per phase (Tableau-like, the report's palette family), in the vocabulary's order
PHASE_COLORS: dict[str, str] = {
    "embedding": "#9d755d", "attention": "#4c78a8", "dense_mlp": "#72b7b2",
    "shared_experts": "#b279a2", "router": "#f58518", "permute": "#eeca3b", "dispatch": "#e45756",
    "experts": "#54a24b", "combine": "#ff9da6", "unpermute": "#bab0ac", "loss": "#79706e",
    "grad_reduce": "#d67195", "optimizer": "#2f4b7c", "other": "#c7c7c7", "idle": "#eeeeee",
}
# Sorting by a click on a header, as an inline handler: the page keeps one <script> per chart
# and plotly.js's own (tests/test_report.py counts them).
SORT = ("var t=this.closest('table'),i=this.cellIndex,b=t.tBodies[0],d=this.dataset.dir==='asc'"
        "?-1:1;this.dataset.dir=d>0?'asc':'desc';Array.from(b.rows).sort(function(x,y){var "
        "a=x.cells[i].dataset.v,c=y.cells[i].dataset.v;return a!==undefined&&c!==undefined?"
        "d*(parseFloat(a)-parseFloat(c)):d*x.cells[i].textContent.localeCompare(y.cells[i]"
        ".textContent)}).forEach(function(r){b.appendChild(r)})")


def _e(x: Any) -> str:
    return html.escape(redact_text("" if x is None else str(x)))


def _ms(s: float | None) -> str:
    return "—" if s is None else f"{s * 1e3:,.2f}"


def _cell(text: str, value: float | None) -> str:
    v = "" if value is None else f' data-v="{value:.9g}"'
    return f"<td{v}>{text}</td>"


def phases_section(page: Any, d: Mapping[str, Any]) -> None:
    """Append the section to `page` (report_page._Page)."""
    ph = d.get("phases") or {}
    rows = ph.get("rows") or []
    if not rows:
        page.section("phases", "Phases", page.missing(
            "No phase table: the median step has no GPU work to label."))
        return
    go = page.go
    layers = ph.get("layers") or {}
    by_layer = ph.get("by_layer") or []
    fig = go.Figure()
    order = [r["phase"] for r in rows]
    if by_layer:
        xs = sorted({r["layer"] for r in by_layer})
        for name in order:
            ys = {r["layer"]: r["step_s"] * 1e3 for r in by_layer if r["phase"] == name}
            if not ys:
                continue
            fig.add_bar(name=name, x=[f"layer {x}" for x in xs], y=[ys.get(x, 0.0) for x in xs],
                        marker_color=PHASE_COLORS.get(name, "#999"),
                        hovertemplate="%{x}<br>" + name + " %{y:.3f} ms<extra></extra>")
        title = "ms of the median step per layer"
    else:
        for r in rows:
            fig.add_bar(name=r["phase"], x=["median step"], y=[r["step_s"] * 1e3],
                        marker_color=PHASE_COLORS.get(r["phase"], "#999"),
                        hovertemplate=r["phase"] + " %{y:.3f} ms<extra></extra>")
        title = "ms of the median step"
    fig.update_layout(barmode="stack", yaxis_title=title, xaxis_type="category")
    body = page.chart("phases-per-layer", fig, 340)
    rates = {p["phase"]: p.get("tflops") for p in (d.get("throughput") or {}).get("phases") or []}
    head = ["phase", "source", "step ms", "share", "busy ms", "exposed ms", "hidden ms", "waited ms",
            "forward ms", "backward ms", "recompute ms", "kernels", "launches", "host ms", "TFLOP/s"]
    trs = []
    for r in rows:
        rate = rates.get(r["phase"])
        cells = [f'<td><span class="swatch" style="background:{PHASE_COLORS.get(r["phase"], "#999")}">'
                 f"</span>{_e(r['phase'])}</td>", f"<td>{_e(r.get('source') or '—')}</td>",
                 _cell(_ms(r["step_s"]), r["step_s"]), _cell(f"{r['share'] * 100:.1f} %", r["share"]),
                 *[_cell(_ms(r[k]), r[k]) for k in ("busy_s", "exposed_s", "hidden_s", "idle_s",
                                                     "forward_s", "backward_s", "recompute_s")],
                 _cell(f"{r['kernels']:,.0f}", r["kernels"]), _cell(f"{r['launches']:,.0f}", r["launches"]),
                 _cell(_ms(r["host_s"]), r["host_s"]),
                 _cell("—" if rate is None else f"{rate:,.1f}", rate)]
        trs.append("<tr>" + "".join(cells) + "</tr>")
    th = "".join(f'<th title="sort" onclick="{html.escape(SORT)}">{h}</th>' for h in head)
    body += (f'<table class="sortable phases"><thead><tr>{th}</tr></thead><tbody>{"".join(trs)}'
             "</tbody></table>")
    body += _throughput_cards(d.get("throughput") or {})
    body += _ranks(page, d.get("rank_breakdown") or {})
    notes = ["Each bar: a layer's phases, stacked (the step time each phase held the GPU plus the "
             "GPU idle time spent waiting for it to be issued); rows sum to the step."]
    if not by_layer:
        notes.append(f"Layers not told apart: {_e(layers.get('why') or 'no layer structure')}.")
    else:
        notes.append(f"{layers.get('count')} layers per pass, told apart by "
                     f"{_e(layers.get('source'))}.")
    if ph.get("not_found"):
        notes.append("Not seen in this trace: " + _e(", ".join(ph["not_found"])) + ".")
    notes.append("Click a column to sort. Source: what labelled the phase (NVTX range, scope, Python "
                 "stack, kernel name, or its place in the MoE layer's pass).")
    page.section("phases", "Phases of the MoE layer", body, note=" ".join(notes))


def _throughput_cards(t: Mapping[str, Any]) -> str:
    if not t:
        return ""
    cards = []
    if t.get("tflops_per_gpu") is not None:
        cards.append(("TFLOP/s per GPU", f"{t['tflops_per_gpu']:,.1f}"))
    if t.get("mfu") is not None:
        cards.append((f"MFU ({t['dtype']} peak {t['peak_tflops']:,.0f})", f"{t['mfu'] * 100:.1f} %"))
    log = t.get("log") or {}
    if log.get("ratio") is not None:
        cards.append(("FLOPs per step vs the log's", f"{'agree' if log['agrees'] else 'DISAGREE'}"
                      f" ({(log['ratio'] - 1) * 100:+.1f} %)"))
    body = "".join(f'<div class="card"><div class="k">{_e(k)}</div><div class="v">{_e(v)}</div></div>'
                   for k, v in cards)
    out = f"<h3>Throughput</h3><div class=\"cards\">{body}</div>" if body else "<h3>Throughput</h3>"
    notes = list(t.get("notes") or [])
    if t.get("flops_per_step"):
        notes.insert(0, f"{t['flops_per_step'] / 1e12:,.2f} TFLOP per step by Megatron's count "
                     f"(model from the {t.get('model_source')}, {t.get('world_size')} "
                     f"GPU{'' if t.get('world_size') == 1 else 's'}).")
    if (said := log_words(log)) is not None:
        notes.insert(1, said[0].upper() + said[1:] + ".")
    return out + "".join(f'<p class="note">{_e(n)}</p>' for n in notes)


def _ranks(page: Any, rb: Mapping[str, Any]) -> str:
    ranks = rb.get("ranks") or []
    if len(ranks) < 2:
        return ""
    go = page.go
    fig = go.Figure()
    xs = [f"rank {r['rank']}" for r in ranks]
    for key, color in (("compute_s", "#4c78a8"), ("communication_s", "#f58518"),
                       ("memory_s", "#54a24b"), ("host_s", "#e45756"), ("idle_s", "#bab0ac")):
        fig.add_bar(name=key[:-2], x=xs, y=[r[key] * 1e3 for r in ranks], marker_color=color,
                    hovertemplate="%{x}<br>" + key[:-2] + " %{y:.2f} ms<extra></extra>")
    fig.update_layout(barmode="stack", yaxis_title="ms of the rank's median step")
    out = "<h3>Per rank</h3>" + page.chart("phases-per-rank", fig, 300)
    slow = rb.get("slowest")
    if slow and slow.get("phase"):
        out += (f"<p>Slowest: rank {_e(slow['rank'])}, {_ms(slow['extra_s'])} ms over the median "
                f"rank; the phase most of it is in: {_e(slow['phase'])} "
                f"({_ms(slow['phase_extra_s'])} ms).</p>")
    return out
