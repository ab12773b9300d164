"""The HTML report: one self-contained page (plotly charts, plotly.js inlined once) that shows what
the pipeline (`moetune.analysis`) found in a run, its advice, and optionally a tune ledger and a
baseline run.

Two halves. `collect` does the reading: the traces once (`analyze_trace`), the median step's
timeline cut from the same frames (its graph and critical path: analyzer/graph.py,
analyzer/critical_path.py), the allocator curve, the ledger. `render` is pure: `ReportData` → one
HTML string. Aggregated, never dumped: timeline lanes above `LANE_MAX_BOXES` boxes are merged into
time bins, the memory curve into `MEMORY_POINTS` bins, tables into their top rows, and the page
says where it did so. Every string that came from a trace or a ledger passes `redact_text`; rank
metadata is the readers' whitelist, passed through `redact_metadata`.
"""

from __future__ import annotations

import html
import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import polars as pl

from moetune.analysis import Analysis, analyze_trace, read_contract
from moetune.errors import UserError
from moetune.redact import redact_metadata, redact_text
from moetune.vocabulary import WALLS

WALL_COLORS: dict[str, str] = {"compute": "#4c78a8", "communication": "#f58518",
                               "memory": "#54a24b", "host": "#e45756", "other": "#9d9d9d"}
# memory kinds of copies: apart from the walls' colours (a red copy is not host time)
MEMORY_KIND_COLORS: dict[str, str] = {"device": "#72b7b2", "pinned": "#b279a2",
                                      "pageable": "#ff9da6", "managed": "#9d755d"}
# Boxes per timeline lane before its events are merged into time bins: plotly draws each bar as
# an SVG path, and a few thousand keep zooming fluid.
LANE_MAX_BOXES = 600
LANE_BINS = 400
PATH_LANE = "critical path"
PATH_MAX_BOXES = 3000  # the critical path is one lane, and the one read closest
MAX_LANES = 16  # GPU streams and host threads of the median step, busiest first
MEMORY_POINTS = 1500
TOP_N = 15
TOP_EDGES = 8
NS = 1e-9


class PlotlyMissing(UserError):
    """The `report` extra is not installed."""


@dataclass(frozen=True)
class Timeline:
    """The median step of one rank, ready to draw (times in ns from the step's start)."""

    rank: int
    step: int
    length_ns: int
    boxes: pl.DataFrame      # lane, start, end, wall, label, n (events merged into the box)
    path: pl.DataFrame       # the critical path's boxes (runs of one wall merged), as `boxes`
    edges: list[dict[str, Any]]  # blocking edges: src_lane, src_start, src_end (the awaited
    #                              communication on the path), dst_lane, dst_start, label, on_path
    lanes: list[str]         # lane names, top to bottom
    merged: dict[str, int]   # lane -> events shown as bins (lanes over LANE_MAX_BOXES only)
    lanes_dropped: int = 0   # quietest lanes left out above MAX_LANES


@dataclass(frozen=True)
class ReportData:
    """Everything the page shows; `render` reads nothing else."""

    files: list[str]
    analysis: Analysis | None
    problem: str | None = None          # why there is no diagnosis (no GPU work, no step, …)
    advice: dict[str, Any] | None = None
    advice_problem: str | None = None
    timeline: Timeline | None = None
    cpu_ops: pl.DataFrame | None = None  # name, count, per_step_s (inclusive)
    memory: pl.DataFrame | None = None   # t_ms, allocated_gib, reserved_gib (median step, rank)
    memory_binned: bool = False
    metadata: list[dict[str, Any]] = field(default_factory=list)
    ledger: dict[str, Any] | None = None
    ledger_problem: str | None = None
    ledger_name: str | None = None
    baseline: ReportData | None = None
    diff: dict[str, Any] | None = None
    contract_given: bool = False


# --------------------------------------------------------------------------- reading


def collect(
    paths: Sequence[str | Path],
    contract: Any = None,
    *,
    ledger: str | Path | None = None,
    baseline: Sequence[str | Path] | None = None,
    window: str | None = None,
    step_range: str | None = None,
    allow_mixed_runs: bool = False,
) -> ReportData:
    """Read the run (and optionally its ledger and a baseline run) into a `ReportData`.

    Unreadable files and invalid contracts are UserErrors as everywhere; a run the pipeline cannot
    analyse (no GPU work, no step) still gives a page that says why.
    """
    from moetune.analyzer.readers import expand, load_trace

    plist = list(paths)
    if not plist:
        raise UserError("no trace given")
    con = read_contract(contract)
    files = expand(plist)
    trace = load_trace(plist, allow_mixed_runs=allow_mixed_runs)
    names = [f.name for f in files]
    meta = rank_metadata(trace.ranks)
    try:
        an = analyze_trace(trace, con, files=files, window=window, step_range=step_range)
    except UserError as exc:
        return ReportData(names, None, problem=_own_words(exc), metadata=meta,
                          contract_given=con is not None, **_ledger_fields(ledger))
    advice, advice_problem = None, None
    try:
        advice = an.advise().document
    except UserError as exc:
        advice_problem = _own_words(exc)
    tl, cpu, mem, binned = None, None, None, False
    if an.diagnosis is not None:
        win = window if window is not None else (an.contract_doc.get("window") or {}).get("steady")
        rng = step_range or (an.contract_doc.get("window") or {}).get("step_range")
        tl, cpu, mem, binned = _step_views(trace, an.diagnosis, window=win, step_range=rng)
    base, diff = None, None
    if baseline:
        # the contract describes this run; the baseline's claims are not known
        base = collect(baseline, None, window=window, step_range=step_range,
                       allow_mixed_runs=allow_mixed_runs)
        diff = _diff(base, an)
    return ReportData(names, an, advice=advice, advice_problem=advice_problem, timeline=tl,
                      cpu_ops=cpu, memory=mem, memory_binned=binned, metadata=meta,
                      baseline=base, diff=diff, contract_given=con is not None,
                      **_ledger_fields(ledger))


def _own_words(exc: UserError) -> str:
    """The error's message with the file named by its name only (no host directories)."""
    msg = exc.message
    if exc.path:
        msg = msg.replace(exc.path, Path(exc.path).name, 1)
    return redact_text(msg)


def _ledger_fields(path: str | Path | None) -> dict[str, Any]:
    if path is None:
        return {}
    from moetune.executor.ledger import Ledger

    p = Path(path)
    if not p.exists():
        return {"ledger_problem": f"{p.name}: no such ledger file", "ledger_name": p.name}
    try:
        with Ledger.open_readonly(p) as led:
            doc = led.document()
    except UserError as exc:
        return {"ledger_problem": _own_words(exc), "ledger_name": p.name}
    return {"ledger": doc, "ledger_name": p.name}


def _diff(base: ReportData, an: Analysis) -> dict[str, Any] | None:
    """The `moetune diff` document of baseline → this run (None when either has no diagnosis)."""
    from moetune.compare import diff_analyses, model_of

    if base.analysis is None or base.analysis.diagnosis is None or an.diagnosis is None:
        return None
    return diff_analyses(base.analysis, an, labels=("baseline", "this run"),
                         model_a=model_of(base.analysis.contract_doc) or None,
                         model_b=model_of(an.contract_doc) or None)


def rank_metadata(ranks: pl.DataFrame) -> list[dict[str, Any]]:
    """Per rank, the readers' whitelisted fields in trace-metadata shape, through
    `redact_metadata` (device name, memory, SMs; backend, world size; NCCL version)."""
    out = []
    for r in ranks.sort("rank").to_dicts():
        cc = str(r.get("compute_capability") or "").split(".")
        meta = {
            "deviceProperties": [{"name": r.get("device_name"), "numSms": r.get("num_sms"),
                                  "totalGlobalMem": r.get("device_memory_bytes"),
                                  "computeMajor": int(cc[0]) if cc[0].isdigit() else None,
                                  "computeMinor": int(cc[1]) if len(cc) > 1 and cc[1].isdigit()
                                  else None}],
            "distributedInfo": {"rank": r.get("rank"), "world_size": r.get("world_size"),
                                "backend": r.get("backend"), "nccl_version": r.get("nccl_version")},
        }
        clean = redact_metadata(meta)
        dev = (clean.get("deviceProperties") or [{}])[0]
        dist = clean.get("distributedInfo") or {}
        out.append({"rank": dist.get("rank", r.get("rank")), "file": Path(str(r.get("source") or "")).name,
                    "format": r.get("format"), "device": dev.get("name"),
                    "memory_gib": (dev["totalGlobalMem"] / 2**30) if dev.get("totalGlobalMem") else None,
                    "sms": dev.get("numSms"), "world_size": dist.get("world_size"),
                    "backend": dist.get("backend"), "nccl": dist.get("nccl_version"),
                    "rank_from": r.get("rank_from")})
    return out


def _step_views(trace: Any, diagnosis: Mapping[str, Any], *, window: str | None,
                step_range: str | None
                ) -> tuple[Timeline | None, pl.DataFrame | None, pl.DataFrame | None, bool]:
    """The median step's timeline and memory curve (first analysed rank), and the CPU ops of the
    analysed steps."""
    from moetune.analyzer.classify import classify
    from moetune.analyzer.steps import find_steps

    by_rank = diagnosis.get("median_step_by_rank") or {}
    if not by_rank:
        return None, None, None, False
    events = classify(trace.events)
    steps = find_steps(events, window=window, step_range=step_range).table
    rank = min(int(r) for r in by_rank)
    step = int(by_rank[str(rank)])
    row = steps.filter((pl.col("rank") == rank) & (pl.col("step") == step))
    if row.height == 0:
        return None, None, None, False
    lo, hi = int(row["win_start_ns"][0]), int(row["win_end_ns"][0])
    tl = median_timeline(trace, events, rank=rank, step=step, lo=lo, hi=hi)
    mem, binned = memory_curve(trace.memory, rank=rank, lo=lo, hi=hi)
    return tl, cpu_ops(events, steps), mem, binned


def median_timeline(trace: Any, events: pl.DataFrame, *, rank: int, step: int, lo: int, hi: int
                    ) -> Timeline | None:
    """Lanes (GPU streams, host threads), the critical path and its blocking edges of one step."""
    from moetune.analyzer.critical_path import critical_path
    from moetune.analyzer.frames import Trace
    from moetune.analyzer.graph import build_graph

    tr = Trace(events=events, comms=trace.comms, flows=trace.flows, ranks=trace.ranks,
               warnings=trace.warnings)
    graph = build_graph(tr, window=(lo, hi), rank=rank)
    nodes = graph.nodes.filter((pl.col("end_ns") > lo) & (pl.col("ts_ns") < hi))
    if nodes.height == 0:
        return None
    nodes = nodes.with_columns(
        lane=pl.when(pl.col("is_gpu"))
        .then(pl.format("GPU {} · stream {}", pl.col("device").fill_null(0), pl.col("stream")))
        .otherwise(pl.format("CPU thread {}", pl.col("tid"))),
        start=(pl.col("ts_ns").clip(lo, hi) - lo),
        end=(pl.col("end_ns").clip(lo, hi) - lo),
        wall=pl.col("wall").cast(pl.String).fill_null("host"),
        label=pl.col("name").cast(pl.String).fill_null("?"),
    )
    segs = critical_path(graph, rank=rank, step=step, start_ns=lo, end_ns=hi)
    names = dict(zip(nodes["node"].to_list(), nodes["label"].to_list(), strict=True))
    lane_of = dict(zip(nodes["node"].to_list(), nodes["lane"].to_list(), strict=True))
    path = pl.DataFrame(
        [(s.start_ns - lo, s.end_ns - lo, s.wall,
          names.get(s.node, s.what) if s.what == "op" else s.what.replace("_", " "))
         for s in segs],
        schema={"start": pl.Int64, "end": pl.Int64, "wall": pl.String, "label": pl.String},
        orient="row",
    )
    edges = []
    for s in sorted((s for s in segs if s.blocking), key=lambda s: s.start_ns - s.end_ns)[:TOP_EDGES]:
        if s.waiter is None or s.waiter not in lane_of or s.node not in lane_of:
            continue
        w = nodes.filter(pl.col("node") == s.waiter)
        edges.append({"src_lane": lane_of[s.node], "src_start": s.start_ns - lo,
                      "src_end": s.end_ns - lo, "dst_lane": lane_of[s.waiter],
                      "dst_start": int(w["start"][0]),
                      "label": f"{_short(names[s.waiter], 60)} waited on "
                               f"{_short(names[s.node], 60)} ({s.edge})",
                      "on_path": s.end_ns - s.start_ns})
    busy = (nodes.group_by("lane").agg(pl.col("is_gpu").first(), (pl.col("end") - pl.col("start"))
                                       .sum().alias("busy"))
            .sort(["is_gpu", "busy", "lane"], descending=[True, True, False]))
    keep = busy["lane"].head(MAX_LANES).to_list()
    nodes = nodes.filter(pl.col("lane").is_in(keep))
    boxes, merged = downsample(nodes.select("lane", "start", "end", "wall", "label"), hi - lo)
    path_boxes, path_merged = downsample(
        merge_runs(path).select(pl.lit(PATH_LANE).alias("lane"), "start", "end", "wall", "label"),
        hi - lo, max_boxes=PATH_MAX_BOXES)
    return Timeline(rank, step, hi - lo, boxes, path_boxes, edges,
                    sorted(keep, key=_lane_order), merged | path_merged, busy.height - len(keep))



def _lane_order(lane: str) -> tuple[int, int, str]:
    """GPU lanes first (device, then stream), then host threads."""
    nums = [int(x) for x in lane.replace("·", " ").split() if x.isdigit()]
    return (0 if lane.startswith("GPU") else 1, nums[-1] if lane.startswith("GPU") else 0, lane)


def merge_runs(path: pl.DataFrame) -> pl.DataFrame:
    """Contiguous path segments of one wall as one box (labels: the longest segment's)."""
    if path.height == 0:
        return path
    p = path.sort("start").with_columns(
        run=(pl.col("wall") != pl.col("wall").shift(1)).fill_null(True).cum_sum())
    return (p.with_columns(d=pl.col("end") - pl.col("start"))
            .group_by("run", maintain_order=True)
            .agg(pl.col("start").min(), pl.col("end").max(), pl.col("wall").first(),
                 pl.col("label").sort_by("d").last(), pl.len().alias("n"))
            .drop("run"))


def downsample(boxes: pl.DataFrame, length_ns: int, *, max_boxes: int = LANE_MAX_BOXES
               ) -> tuple[pl.DataFrame, dict[str, int]]:
    """Lanes with more than `max_boxes` events become LANE_BINS time bins each, coloured by the
    wall busiest in the bin (n = events merged); the others keep one box per event (n = 1)."""
    counts = boxes.group_by("lane").len()
    big = counts.filter(pl.col("len") > max_boxes)
    merged = dict(zip(big["lane"].to_list(), big["len"].to_list(), strict=True))
    small = boxes.filter(~pl.col("lane").is_in(list(merged))).with_columns(n=pl.lit(1, pl.UInt32))
    if not merged:
        return small, {}
    width = max(1, math.ceil(length_ns / LANE_BINS))
    many = boxes.filter(pl.col("lane").is_in(list(merged))).with_columns(
        bin=pl.col("start") // width, d=pl.col("end") - pl.col("start"))
    per_wall = many.group_by("lane", "bin", "wall").agg(pl.col("d").sum().alias("wd"))
    top = per_wall.sort("wd", descending=True).group_by("lane", "bin").agg(
        pl.col("wall").first(), pl.col("wd").sum().alias("busy"))
    bins = (many.group_by("lane", "bin")
            .agg(pl.col("start").min(), pl.col("end").max(), pl.len().alias("n"),
                 pl.col("label").sort_by("d").last().alias("longest"))
            .join(top, on=["lane", "bin"])
            .with_columns(label=pl.format("{} events, {} µs busy; longest: {}", pl.col("n"),
                                          (pl.col("busy") / 1000).round(1), pl.col("longest"))))
    out = pl.concat([small, bins.select("lane", "start", "end", "wall", "label",
                                        pl.col("n").cast(pl.UInt32))])
    return out, merged


def memory_curve(memory: pl.DataFrame, *, rank: int, lo: int, hi: int
                 ) -> tuple[pl.DataFrame | None, bool]:
    """Allocated and reserved device memory over [lo, hi) of `rank` (GiB, ms from lo); above
    MEMORY_POINTS events, the maximum per time bin. None without allocator events there."""
    m = memory.filter((pl.col("rank") == rank) & (pl.col("device_type") == 1)).sort("ts_ns")
    inside = m.filter(pl.col("ts_ns").is_between(lo, hi, closed="left"))
    if inside.height == 0:
        return None, False
    before = m.filter(pl.col("ts_ns") < lo).tail(1).with_columns(ts_ns=pl.lit(lo, pl.Int64))
    pts = pl.concat([before, inside]).with_columns(t=pl.col("ts_ns") - lo)
    binned = pts.height > MEMORY_POINTS
    if binned:
        width = max(1, math.ceil((hi - lo) / MEMORY_POINTS))
        pts = (pts.group_by(pl.col("t") // width * width)
               .agg(pl.col("allocated").max(), pl.col("reserved").max()).sort("t"))
    return pts.select(t_ms=pl.col("t") / 1e6, allocated_gib=pl.col("allocated") / 2**30,
                      reserved_gib=pl.col("reserved") / 2**30), binned


def cpu_ops(events: pl.DataFrame, steps: pl.DataFrame) -> pl.DataFrame | None:
    """CPU ops started inside the analysed steps' host windows: count and inclusive time per step
    (nested ops count in their parents too), the TOP_N by time."""
    ops = events.filter(pl.col("kind") == "cpu_op").select("rank", "name", "ts_ns", "dur_ns")
    if ops.height == 0 or steps.height == 0:
        return None
    win = steps.select("rank", pl.col("start_ns").alias("lo"), pl.col("end_ns").alias("hi"))
    hit = (ops.join(win, on="rank").filter(pl.col("ts_ns").is_between(pl.col("lo"), pl.col("hi"),
                                                                      closed="left")))
    if hit.height == 0:
        return None
    n = steps.height
    return (hit.group_by("name").agg(pl.len().alias("count"), pl.col("dur_ns").sum().alias("t"))
            .sort(["t", "name"], descending=[True, False]).head(TOP_N)
            .select("name", (pl.col("count") / n).alias("per_step"),
                    (pl.col("t") * NS / n).alias("per_step_s")))


# --------------------------------------------------------------------------- rendering


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
    page.run_section(data, d)
    if d is not None:
        page.walls_section(d)
        page.timeline_section(data.timeline, d)
        page.kernels_section(d, data.cpu_ops)
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


def _e(x: Any) -> str:
    """Trace- or ledger-derived text for the page: credentials redacted, HTML escaped."""
    return html.escape(redact_text("" if x is None else str(x)))


def _r(x: Any) -> str:
    """Text for a chart label (plotly escapes it itself)."""
    return redact_text("" if x is None else str(x))


def _ms(s: float | None) -> str:
    return "—" if s is None else f"{s * 1e3:,.2f} ms"


def _pct(x: float | None, signed: bool = False) -> str:
    if x is None:
        return "—"
    return f"{x * 100:+.1f} %" if signed else f"{x * 100:.1f} %"


def _short(s: str, n: int = 90) -> str:
    return s if len(s) <= n else s[: n - 1] + "…"


class _Page:
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
            f"<title>{html.escape(title)}</title><style>{CSS}</style>"
            f"<script>{plotlyjs}</script></head><body>"
            f"<header><h1>{html.escape(title)}</h1><nav>{toc}</nav></header><main>"
            + "".join(self.parts) + "</main><footer>moetune · charts by plotly.js, inlined: "
            "this page opens offline</footer></body></html>\n"
        )

    # ---- sections

    def run_section(self, data: ReportData, d: Mapping[str, Any] | None) -> None:
        cards = []
        if d is not None:
            w = d.get("window") or {}
            steps = d.get("steps") or []
            cards = [("median step", _ms(d.get("step_time_s"))),
                     ("dominant wall", d.get("dominant_wall") or "—"),
                     ("ranks analysed", str(len(d.get("ranks_analyzed") or []))),
                     ("steps analysed", _steps_text(steps)),
                     ("steps from", w.get("step_source") or "—")]
            cp = d.get("critical_path") or {}
            if cp.get("paced_by"):
                cards.append(("paced by", cp["paced_by"]))
        body = "".join(f'<div class="card"><div class="k">{html.escape(k)}</div>'
                       f'<div class="v">{_e(v)}</div></div>' for k, v in cards)
        body = f'<div class="cards">{body}</div>' if body else ""
        if data.problem:
            body += self.missing(f"No diagnosis: {_e(data.problem)}. The sections that need steps "
                                 "(walls, timeline, kernels, ranks, memory, advice) are left out.")
        if d is not None:
            w = d.get("window") or {}
            dropped = w.get("dropped_incomplete") or []
            body += (f"<p>Steady window: {_e(w.get('declared') or 'all complete steps')}; steps "
                     f"found {_e(_steps_text(w.get('steps_found') or []))}"
                     + (f", dropped as incomplete {_e(_steps_text(dropped))}" if dropped else "")
                     + ".</p>")
        rows = [[_e(m["rank"]), _e(m["file"]), _e(m["format"]), _e(m["device"] or "—"),
                 _e(f"{m['memory_gib']:.1f} GiB" if m["memory_gib"] else "—"), _e(m["sms"] or "—"),
                 _e(m["world_size"] or "—"), _e(m["backend"] or "—"), _e(m["nccl"] or "—")]
                for m in data.metadata]
        if rows:
            body += self.table(["rank", "file", "format", "GPU", "memory", "SMs", "world size",
                                "backend", "NCCL"], rows, "meta")
        warnings = (d or {}).get("warnings") or []
        if warnings:
            body += "<details><summary>" + f"{len(warnings)} warning(s)</summary><ul>" + "".join(
                f"<li>{_e(x)}</li>" for x in warnings) + "</ul></details>"
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
            labels = [_r(_short(x, 120)) for x in p["label"].to_list() + b["label"].to_list()]
            fig.add_bar(name=w, orientation="h", y=ys, base=[s / 1e6 for s in starts],
                        x=[max(x, 1) / 1e6 for x in durs], marker_color=WALL_COLORS[w],
                        marker_line_width=0, showlegend=w not in shown,
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
                            customdata=[[_r(e["label"]), e["on_path"] / 1e6] for e in tl.edges],
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
                f"{_e(k)} ({v:,} events)" for k, v in sorted(tl.merged.items()))
                + f" shown as {LANE_BINS} time bins each (over {LANE_MAX_BOXES} events in a lane, "
                f"{PATH_MAX_BOXES} on the critical path), "
                "each coloured by its busiest wall; hover for counts.")
        if tl.lanes_dropped:
            notes.append(f"{tl.lanes_dropped} quieter lane(s) not shown (at most {MAX_LANES}).")
        self.section("timeline", "Median step timeline",
                     self.chart("timeline", fig, height=height), note=" ".join(notes))

    def kernels_section(self, d: Mapping[str, Any], ops: pl.DataFrame | None) -> None:
        go = self.go
        ev = d.get("evidence") or {}
        classes = sorted(((k, v) for k, v in (ev.get("classes") or {}).items()),
                         key=lambda kv: -kv[1]["time_s"])
        nsteps = max(1, len(d.get("per_step") or []))
        body = '<div class="row">'
        if classes:
            top = classes[:TOP_N][::-1]
            fig = go.Figure()
            fig.add_bar(orientation="h", y=[_r(k) for k, _ in top],
                        x=[v["time_s"] / nsteps * 1e3 for _, v in top],
                        marker_color=[WALL_COLORS.get(v.get("wall") or "other", "#999") for _, v in top],
                        customdata=[v["count"] for _, v in top],
                        hovertemplate="%{y}: %{x:.3f} ms/step, %{customdata} launches<extra></extra>")
            fig.update_layout(xaxis_title="ms per step (GPU time)", showlegend=False)
            body += self.chart("kernel-classes", fig, height=120 + 22 * len(top))
        if ops is not None and ops.height:
            o = ops.reverse()
            fig = go.Figure()
            fig.add_bar(orientation="h", y=[_r(_short(n, 48)) for n in o["name"].to_list()],
                        x=[t * 1e3 for t in o["per_step_s"].to_list()], marker_color="#e45756",
                        customdata=o["per_step"].to_list(),
                        hovertemplate="%{y}: %{x:.3f} ms/step, %{customdata:.0f} calls<extra></extra>")
            fig.update_layout(xaxis_title="ms per step (CPU, inclusive)", showlegend=False)
            body += self.chart("cpu-ops", fig, height=120 + 22 * o.height)
        else:
            body += self.missing("No CPU ops in the analysed steps (an nsys export, or a profile "
                                 "without record_shapes/cpu_op rows).")
        body += "</div>"
        tk = ev.get("top_kernels") or []
        if tk:
            body += "<h3>Top kernels</h3>" + self.table(
                ["kernel", "class", "launches", "time / step"],
                [[f'<span class="mono">{_e(_short(k.get("name") or "?", 110))}</span>',
                  _e(k.get("kclass")), _e(k["count"]), _ms(k["time_s"] / nsteps)] for k in tk])
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
                               [[_e(dr), _e(m), f"{v['count'] / nsteps:,.1f}",
                                 f"{v['bytes'] / 2**20 / nsteps:,.2f}", _ms(v["time_s"] / nsteps)]
                                for dr, m, v in rows])
            body += ("<h3>Copies by direction and memory kind</h3><div class=\"row\">"
                     + self.chart("copies", fig, 240) + table + "</div>")
        else:
            body += self.missing("No copies in the analysed steps.")
        self.section("kernels", "Kernels, CPU ops and copies", body,
                     note=f"Top {TOP_N} kernel classes (coloured by wall) and CPU ops; CPU time is "
                     "inclusive (an op's children count in it too). Per step: totals over the "
                     "analysed steps divided by their number.")

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
            ys = [_r(_collective(k)) for k, _ in top]
            fig2.add_bar(name="p50", orientation="h", y=ys,
                         x=[v.get("p50", 0) * 1e3 for _, v in top], marker_color="#72b7b2")
            fig2.add_bar(name="max", orientation="h", y=ys,
                         x=[v.get("max", 0) * 1e3 for _, v in top], marker_color="#f58518")
            fig2.update_layout(barmode="group", xaxis_title="arrival skew, ms")
            body += self.chart("arrival-skew", fig2, 120 + 30 * len(top))
        body += "</div>"
        body += (f"<p>Stragglers ({_e(rk.get('straggler_rule') or '')}): "
                 f"{_e(', '.join(f'rank {s}' for s in sorted(strag, key=int)) or 'none')}. "
                 f"Collective arrival skew over {_e(sk.get('instances', 0))} instances: p50 "
                 f"{_ms(sk.get('p50'))}, max {_ms(sk.get('max'))}.</p>")
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
                     f"{m.get('device_gib') or 0:.1f} GiB (source: {_e(m.get('source'))}).</p>")
        if curve is None:
            body += self.missing("No allocator events in this step: profile with "
                                 "profile_memory=True (Kineto) to see memory over the step.")
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
            rows.append([_e(v.get("title") or key),
                         f'<span class="mono">{_pairs(v.get("claimed"))}</span>',
                         f'<span class="v-{_e(verdict)}">{_e(verdict)}</span>',
                         _e(v.get("reason")),
                         f'<span class="mono small">{_pairs(v.get("evidence"))}</span>'])
        body = (f"<p>{s.get('confirmed', 0)} confirmed, {s.get('contradicted', 0)} contradicted, "
                f"{s.get('unobservable', 0)} unobservable"
                + (f"; not audited: {_e(', '.join(s.get('unaudited') or []))}" if s.get("unaudited") else "")
                + ".</p>")
        body += self.table(["claim", "claimed", "verdict", "why", "evidence"], rows, "audit")
        self.section("audit", "Audit of claims", body)

    def advice_section(self, advice: Mapping[str, Any] | None, problem: str | None,
                       diagnosed: bool) -> None:
        if advice is None:
            why = problem or ("no diagnosis to advise on" if not diagnosed else "no advice")
            self.section("advice", "Recommendations", self.missing(f"No recommendations: {_e(why)}."))
            return
        recs = advice.get("recommendations") or []
        body = ""
        if not recs:
            body += self.missing(f"No rule fired ({advice.get('rules_checked', '?')} checked).")
        for r in recs:
            g = r.get("gain") or {}
            sp = g.get("speedup") or {}
            flags = [*(r.get("megatron_flags") or []),
                     *(f"remove {f}" for f in r.get("remove_flags") or [])]
            body += (
                f'<article class="rec"><h3>{_e(r.get("rank"))}. {_e(r.get("title"))}</h3>'
                f'<p class="meta"><span class="wall w-{_e(r.get("wall"))}">{_e(r.get("wall"))}</span>'
                f' {_e(r.get("rule"))} · {_e(r.get("status"))} · confidence '
                f'{_e(r.get("confidence"))}</p>'
                f'<pre>{_e(chr(10).join(flags) or "(no flag)")}</pre>'
                f'<p>Predicted gain <b>{_pct(sp.get("mid"), True)}</b> (range '
                f'{_pct(sp.get("low"), True)} to {_pct(sp.get("high"), True)}). '
                f'Basis: {_e(g.get("basis"))}</p></article>')
        blocked = (advice.get("prerequisites") or []) + (advice.get("blocked") or [])
        if blocked:
            body += "<details><summary>" + f"{len(blocked)} more, blocked or needing a " \
                "prerequisite</summary><ul>" + "".join(
                    f"<li>{_e(b.get('title'))} ({_e(b.get('rule'))}): "
                    f"{_e('; '.join(b.get('needs') or b.get('reasons') or []))}</li>"
                    for b in blocked) + "</ul></details>"
        self.section("advice", "Recommendations", body,
                     note="Ranked by predicted gain; one knob each. Flags are Megatron-LM spellings "
                     "(NAME=value: environment).")

    def ledger_section(self, data: ReportData) -> None:
        if data.ledger is None and data.ledger_problem is None:
            return
        if data.ledger is None:
            self.section("ledger", "Tune history",
                         self.missing(f"No tune history: {_e(data.ledger_problem)}."))
            return
        go = self.go
        decs = data.ledger.get("decisions") or []
        runs = data.ledger.get("runs") or []
        body = (f"<p>Ledger {_e(data.ledger_name)}: {len(data.ledger.get('sessions') or [])} "
                f"session(s), {len(runs)} run(s), {len(decs)} decision(s).</p>")
        if decs:
            xs = [f"{i + 1}. {_r(x['label'])}" for i, x in enumerate(decs)]
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
                [[str(i + 1), f'<span class="mono">{_e(x["label"])}</span>', _e(x["source"]),
                  _pct(x["predicted_gain"], True), _pct(x["measured_gain"], True),
                  "±" + _pct(x["noise"]), f'<span class="v-{_e(x["verdict"])}">'
                  f'{_e(x["verdict"])}</span>', _e(x["cause"] or "")]
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
                         self.missing(f"No comparison: {missing} has no diagnosis ({_e(why)})."))
            return
        go = self.go
        st = d["step_time"]
        a, b = st["a"], st["b"]
        body = ""
        for w in d.get("warnings") or []:
            body += f'<p class="missing">{_e(w)}</p>'
        verdict = ("beyond both runs' noise" if st.get("beyond_noise")
                   else "within the runs' noise: not a change")
        if min(a.get("n") or 0, b.get("n") or 0) < 2:
            verdict += " (one analysed step on a side: its noise is unknown)"

        def pm(x: Mapping[str, Any]) -> str:
            return f" ± {_ms(x['noise_s'])}" if (x.get("n") or 0) >= 2 else ""

        body += (f"<p>Baseline {_e(', '.join(d['a']['inputs']))} (steps "
                 f"{_e(_steps_text(d['a']['steps']))}): median step {_ms(a['median_s'])}{pm(a)}; "
                 f"this run {_ms(b['median_s'])}{pm(b)}: "
                 f"<b>{_pct((st.get('delta_pct') or 0) / 100, True)}</b>, {verdict}. Dominant "
                 f"wall {_e(d['dominant_wall']['a'])} → {_e(d['dominant_wall']['b'])}.</p>")
        fig = go.Figure()
        for w in WALLS:
            pair = d["walls"][w]
            fig.add_bar(name=w, x=["baseline", "this run"], marker_color=WALL_COLORS[w],
                        y=[(pair["a"] or 0) * 1e3, (pair["b"] or 0) * 1e3])
        fig.update_layout(barmode="stack", yaxis_title="exposed, ms per median step")
        rows = [[_e(c["kclass"]), _e(c["status"]), _ms(c["a_s"]), _ms(c["b_s"]),
                 _ms(c["delta_s"])] for c in d.get("classes") or []]
        body += ('<div class="row">' + self.chart("baseline", fig, 300)
                 + self.table(["kernel class", "", "baseline / step", "this run / step", "Δ"],
                              rows) + "</div>")
        for key, title in (("kernels", "Kernels"), ("ops", "Host ops (self time)")):
            named = d.get(key) or []
            if named:
                body += f"<h3>{title} that changed most</h3>" + self.table(
                    ["name", "", "baseline / step", "this run / step", "Δ"],
                    [[f'<span class="mono">{_e(_short(n.get("name") or "?", 110))}</span>',
                      _e(n["status"]), _ms(n["a_s"]), _ms(n["b_s"]), _ms(n["delta_s"])]
                     for n in named])
        news = [o["text"] for o in d.get("observed") or []] + [
            x["text"] for x in d.get("audit") or []]
        mem = d.get("memory") or {}
        pk = mem.get("peak_allocated_gib") or {}
        if pk.get("a") is not None or pk.get("b") is not None:
            news.append(f"peak allocated memory: {_gib(pk.get('a'))} → {_gib(pk.get('b'))}")
        for role, pair in sorted((d.get("comm_groups") or {}).items()):
            news.append(f"communication, {role}: {_ms(pair.get('a'))} → {_ms(pair.get('b'))} "
                        "per step")
        if news:
            body += "<h3>What else changed</h3><ul>" + "".join(
                f"<li>{_e(x)}</li>" for x in news) + "</ul>"
        self.section("baseline", "Against the baseline", body,
                     note="What moetune diff says of the baseline and this run (docs/diff.md); noise: "
                     "half the range of each run's analysed step times.")


def _gib(x: float | None) -> str:
    return "unknown" if x is None else f"{x:.2f} GiB"


def _collective(key: str) -> str:
    """`28:_allgather_base` (process group : collective) → `_allgather_base (group 28)`."""
    pg, _, coll = key.partition(":")
    return f"{coll} (group {pg})" if coll else key


def _pairs(m: Mapping[str, Any] | None) -> str:
    """`key=value, …`: keys are moetune's own vocabulary (a name like moe_token_dispatcher_type
    must not read as a credential assignment), values are checked for credentials."""
    return ", ".join(f"{html.escape(k)}={_e(json.dumps(x))}" for k, x in (m or {}).items())


def _steps_text(ids: Sequence[int]) -> str:
    ids = list(ids)
    if not ids:
        return "none"
    if len(ids) > 2 and ids == list(range(ids[0], ids[-1] + 1)):
        return f"{ids[0]}–{ids[-1]}"
    return ", ".join(map(str, ids))


CSS = """
:root{--fg:#1f2328;--mut:#5b636d;--bd:#d8dee4;--bg:#fff;--alt:#f6f8fa}
*{box-sizing:border-box}
body{margin:0;font:14px/1.45 system-ui,-apple-system,"Segoe UI",Roboto,Helvetica,Arial,sans-serif;
color:var(--fg);background:var(--bg)}
header{position:sticky;top:0;z-index:10;background:#fff;border-bottom:1px solid var(--bd);
padding:10px 24px}
h1{font-size:18px;margin:0 0 6px}
nav a{margin-right:14px;color:#0969da;text-decoration:none;font-size:13px}
main{max-width:1400px;margin:0 auto;padding:8px 24px 40px}
section{border-bottom:1px solid var(--bd);padding:14px 0;scroll-margin-top:70px}
h2{font-size:16px;margin:4px 0 10px}
h3{font-size:14px;margin:14px 0 6px}
.cards{display:flex;flex-wrap:wrap;gap:10px;margin:4px 0 10px}
.card{border:1px solid var(--bd);border-radius:6px;padding:8px 12px;min-width:130px;background:var(--alt)}
.card .k{font-size:12px;color:var(--mut)}.card .v{font-size:17px;font-weight:600}
.row{display:grid;grid-template-columns:minmax(0,1fr) minmax(0,1fr);gap:12px;align-items:start}
@media (max-width:1000px){.row{grid-template-columns:minmax(0,1fr)}}
.chart{min-width:0}
table{border-collapse:collapse;width:100%;margin:6px 0;font-size:13px}
th,td{border-bottom:1px solid var(--bd);padding:4px 8px;text-align:left;vertical-align:top}
th{background:var(--alt);font-weight:600}
.mono{font-family:ui-monospace,SFMono-Regular,Menlo,Consolas,monospace;font-size:12px;word-break:break-all}
.small{font-size:11px;color:var(--mut)}
.note{color:var(--mut);font-size:12.5px;margin:6px 0 0}
.missing{background:#fff8c5;border:1px solid #d4a72c66;border-radius:6px;padding:8px 12px}
.v-confirmed,.v-accepted{color:#1a7f37;font-weight:600}
.v-contradicted,.v-rejected{color:#cf222e;font-weight:600}
.v-unobservable{color:var(--mut);font-weight:600}
.rec{border:1px solid var(--bd);border-radius:6px;padding:8px 14px;margin:8px 0}
.rec h3{margin:4px 0}.rec .meta{color:var(--mut);margin:2px 0}
.rec pre{background:var(--alt);padding:6px 10px;border-radius:4px;margin:6px 0;white-space:pre-wrap}
.wall{display:inline-block;padding:0 6px;border-radius:4px;color:#fff;font-size:12px}
.w-compute{background:#4c78a8}.w-communication{background:#f58518}.w-memory{background:#54a24b}
.w-host{background:#e45756}
details{margin:8px 0}summary{cursor:pointer;color:var(--mut)}
footer{color:var(--mut);font-size:12px;text-align:center;padding:16px}
"""


def write(data: ReportData, out: str | Path) -> Path:
    """Render and write the page; a path that cannot be written is a UserError naming it."""
    text = render(data)
    p = Path(out)
    try:
        p.write_text(text, encoding="utf-8")
    except OSError as exc:
        raise UserError(f"cannot write the report ({exc.strerror or exc})", path=p) from None
    return p
