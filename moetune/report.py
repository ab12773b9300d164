"""The HTML report: one self-contained page (plotly charts, plotly.js inlined once) that shows what
the pipeline (`moetune.analysis`) found in a run, its advice, and optionally a tune ledger and a
baseline run.

Two halves. `collect` (here) does the reading: the traces once (`analyze_trace`), the median step's
timeline cut from the same frames (its graph and critical path: analyzer/graph.py,
analyzer/critical_path.py), the allocator curve, the ledger. `render` (moetune/report_page.py) is pure: `ReportData` →
one HTML string. Aggregated, never dumped: timeline lanes above `LANE_MAX_BOXES` boxes are merged into
time bins, the memory curve into `MEMORY_POINTS` bins, tables into their top rows, and the page
says where it did so. Every string that came from a trace or a ledger passes `redact_text`; rank
metadata is the readers' whitelist, passed through `redact_metadata`.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import polars as pl

from moetune.analysis import Analysis, analyze_trace, read_contract
from moetune.errors import UserError
from moetune.redact import redact_metadata, redact_text
from moetune.report_data import ReportData, Timeline
from moetune.report_format import short
from moetune.report_page import (
    LANE_BINS,
    LANE_MAX_BOXES,
    MAX_LANES,
    MEMORY_POINTS,
    NS,
    PATH_LANE,
    PATH_MAX_BOXES,
    TOP_EDGES,
    TOP_N,
    PlotlyMissing,
    plotly_modules,
    render,
)

# the page's half, re-exported: `moetune.report` is the module commands and tests use
__all__ = ["LANE_BINS", "LANE_MAX_BOXES", "PlotlyMissing", "ReportData", "Timeline", "collect",
           "downsample", "merge_runs", "plotly_modules", "render", "write"]

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
    reference: Any = None,
    log: str | Path | None = None,
    baseline_contract: str | Path | None = None,
    baseline_log: str | Path | None = None,
) -> ReportData:
    """Read the run (and optionally its ledger and a baseline run) into a `ReportData`.
    `reference`: the run's reference inputs (`moetune.analysis.read_reference`), as `recommend`
    takes them, so the page's advice and memory are the same numbers. `log`: the run's Megatron
    log (the reference's), read again for its arguments; `baseline_contract`, `baseline_log`: the
    baseline's, for its audit, reference step and arguments. Each side's arguments (contract,
    else log) give the comparison's configuration delta.

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
        an = analyze_trace(trace, con, files=files, window=window, step_range=step_range,
                           reference_step_s=reference)
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
        from moetune.analysis import read_reference

        # the contract describes this run; the baseline's claims are its own contract's
        base = collect(baseline, baseline_contract, window=window, step_range=step_range,
                       allow_mixed_runs=allow_mixed_runs,
                       reference=read_reference(baseline_log, require_step=False)
                       if baseline_log else None)
        diff = _diff(base, an, arguments(baseline_contract, baseline_log),
                     arguments(contract, log))
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


Arguments = tuple[str | None, dict[str, Any], dict[str, Any]]


def arguments(contract: Any, log: str | Path | None) -> Arguments:
    """(where from, Megatron arguments, model fields) of one run: its contract's, else its
    Megatron log's; (None, {}, {}) with neither."""
    from moetune.analyzer.contract import thaw
    from moetune.compare import config_of, model_of

    if contract is not None:
        doc = thaw(read_contract(contract))
        if doc.get("megatron_args"):
            return "contract", config_of(doc), model_of(doc)
    if log is not None:
        from moetune.analyzer.megatron_args import contract_from_log
        from moetune.errors import read_user_text

        found = contract_from_log(read_user_text(Path(log), errors="replace"))
        if found:
            return "log", config_of(found), model_of(found)
    return None, {}, {}


def _diff(base: ReportData, an: Analysis, args_a: Arguments, args_b: Arguments
          ) -> dict[str, Any] | None:
    """The `moetune diff` document of baseline → this run (None when either has no diagnosis),
    its configuration delta from each side's `arguments`."""
    from moetune.compare import config_delta, diff_analyses

    if base.analysis is None or base.analysis.diagnosis is None or an.diagnosis is None:
        return None
    return diff_analyses(base.analysis, an, labels=("baseline", "this run"),
                         model_a=args_a[2] or None, model_b=args_b[2] or None,
                         config=config_delta(args_a[1], args_b[1],
                                             sources=(args_a[0], args_b[0])))


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
                      "label": f"{short(names[s.waiter], 60)} waited on "
                               f"{short(names[s.node], 60)} ({s.edge})",
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
    """Lanes with more than `max_boxes` events become LANE_BINS time bins each: a box spanning
    its bin, coloured by the wall busiest in it and shaded by `occupancy` (the share of the bin
    some event of the lane covers: nested host calls and overlapping kernels count once), so a
    GPU busy 10 % of the step reads pale, not solid; n = events starting in the bin. Other lanes
    keep one box per event (n = 1, occupancy 1)."""
    counts = boxes.group_by("lane").len()
    big = counts.filter(pl.col("len") > max_boxes)
    merged = dict(zip(big["lane"].to_list(), big["len"].to_list(), strict=True))
    small = boxes.filter(~pl.col("lane").is_in(list(merged))).with_columns(
        n=pl.lit(1, pl.UInt32), occupancy=pl.lit(1.0))
    if not merged:
        return small, {}
    width = max(1, math.ceil(length_ns / LANE_BINS))
    many = boxes.filter(pl.col("lane").is_in(list(merged)))
    # each event cut at the bin edges it crosses: its time in every bin it touches
    pieces = _by_bin(many.with_columns(d=pl.col("end") - pl.col("start")), width)
    per_wall = pieces.group_by("lane", "bin", "wall").agg(pl.col("c").sum().alias("wd"))
    top = (per_wall.sort(["wd", "wall"], descending=[True, False])
           .group_by("lane", "bin").agg(pl.col("wall").first()))
    stats = pieces.group_by("lane", "bin").agg(
        (pl.col("bin") == pl.col("start") // width).sum().cast(pl.UInt32).alias("n"),
        pl.col("label").sort_by("d").last().alias("longest"))
    # the lane's union of intervals: what "busy" means for a bin
    union = (many.sort("lane", "start")
             .with_columns(reach=pl.col("end").cum_max().over("lane"))
             .with_columns(new=(pl.col("start") > pl.col("reach").shift(1).over("lane"))
                           .fill_null(True))
             .with_columns(run=pl.col("new").cum_sum().over("lane"))
             .group_by("lane", "run").agg(pl.col("start").min(), pl.col("end").max()))
    busy = _by_bin(union, width).group_by("lane", "bin").agg(pl.col("c").sum().alias("busy"))
    bins = (stats.join(top, on=["lane", "bin"]).join(busy, on=["lane", "bin"], how="left")
            .with_columns(start=pl.col("bin") * width,
                          end=pl.min_horizontal((pl.col("bin") + 1) * width, pl.lit(length_ns)),
                          busy=pl.col("busy").fill_null(0))
            .with_columns(occupancy=(pl.col("busy") / pl.max_horizontal(
                pl.col("end") - pl.col("start"), pl.lit(1))).clip(0.0, 1.0))
            .with_columns(label=pl.format("{} events, {} µs busy ({} % of the bin); longest: {}",
                                          pl.col("n"), (pl.col("busy") / 1000).round(1),
                                          (pl.col("occupancy") * 100).round(1),
                                          pl.col("longest")))
            .sort("lane", "bin"))
    out = pl.concat([small, bins.select("lane", "start", "end", "wall", "label", "n",
                                        "occupancy")])
    return out, merged


def _by_bin(iv: pl.DataFrame, width: int) -> pl.DataFrame:
    """Each interval's rows, one per time bin it touches, with `c` its time inside that bin."""
    last = pl.max_horizontal(pl.col("end") - 1, pl.col("start")) // width
    return (iv.with_columns(bin=pl.int_ranges(pl.col("start") // width, last + 1))
            .explode("bin")
            .with_columns(c=(pl.min_horizontal(pl.col("end"), (pl.col("bin") + 1) * width)
                             - pl.max_horizontal(pl.col("start"), pl.col("bin") * width))
                          .clip(0, None)))


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
    """Host ops started inside the analysed steps, as `--top` counts them (analyzer/top.py
    `op_table`): count, self time (less the ops nested in it) and inclusive time per step, the
    TOP_N by self time. Inclusive time would rank the autograd wrappers first."""
    from moetune.analyzer.top import op_table

    table = op_table(events, steps)
    if table.height == 0:
        return None
    n = steps.height  # (rank, step) pairs: per step and rank, as `--top` divides
    return table.head(TOP_N).select(
        "name", (pl.col("count") / n).alias("per_step"),
        (pl.col("self_ns") * NS / n).alias("per_step_s"),
        (pl.col("total_ns") * NS / n).alias("per_step_total_s"))


# --------------------------------------------------------------------------- rendering


def write(data: ReportData, out: str | Path) -> Path:
    """Render and write the page; a path that cannot be written is a UserError naming it."""
    text = render(data)
    p = Path(out)
    try:
        p.write_text(text, encoding="utf-8")
    except OSError as exc:
        raise UserError(f"cannot write the report ({exc.strerror or exc})", path=p) from None
    return p
