"""The diagnosis' `critical_path` and `blocking` sections from every step's critical path
(`moetune.analyzer.critical_path`), and their lines on the terminal.

Per (rank, step) the path's time by wall and the communication split; the document describes
each rank's median step (by T; lower median; the rule of analyzer/walls.median_step), averaged
over ranks like the rest of the document.

The path's parts by wall (`path_s`, with `other`: GPU time no op, host call or launch accounts
for, split by kind in `path_other_s`) sum to the step time T. The recoverable time of a wall, R,
and its gain ceiling T/(T−R)−1 (null when R = T) are what removing that wall's time gains, by
the what-if replay of the step's graph without it (`moetune.analyzer.ceilings`), not the wall's
time on the path: time on the path may hide work that takes its place (a kernel that ran beside
host time still runs when the host is instant), and time off it may be what the path moves to.
`host_gpu_busy_s` is the host path time during which the GPU was running queued work. `paced_by`
says which side set the step (moetune/vocabulary.py `paced_by`): `host` when the path's host time
with the GPU idle is over half the step, else `device`.
The walls (analyzer/walls.py) say where the GPU's time went, and the rules read them; the path
says what set the step's length.

Communication per step splits into three disjoint parts (all clipped to the window):
hidden = comm ∩ compute; blocking = critical-path comm segments whose path successor was entered
through a dependency edge (event_wait, stream, sync; a comm op blocking another blocking comm op
counts too), minus compute; exposed = comm − compute − blocking (GPU not computing for other
reasons while comm ran, or comm at the step's end that nothing waited on).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import polars as pl
from moetune.analyzer import intervals as iv
from moetune.analyzer.ceilings import BASIS as CEILING_BASIS
from moetune.analyzer.ceilings import mean_recoverable
from moetune.analyzer.classify import classify

# the path's columns and codes, shared with the walk that makes them
from moetune.analyzer.critical_path import (
    _OP,
    _WALL_NAMES,
    _WHAT_NAMES,
    CEILING_TEXT_MAX,
    TOP_EDGES,
    TOP_SEGMENTS,
    Segment,
    _Cols,
    _concat,
    _longest_cols,
    _Path,
    _path,
    _RankView,
    _segments,
    _view,
    _walk_arrays,
    graph_scope,
    step_windows,
)
from moetune.analyzer.frames import Trace
from moetune.analyzer.graph import TimelineGraph, _no_gc, build_graph
from moetune.analyzer.ranks import ranks_section
from moetune.analyzer.walls import recompute_as_memory

from moetune.vocabulary import PACED_BY, PACED_BY_LABEL, RECOMPUTE, WALLS, paced_by


def _path_walls(p: _Path, wall_names: Sequence[str | None]) -> dict[str, int]:
    """Path time by wall."""
    by = dict.fromkeys((*WALLS, "other"), 0)
    dur = p.end - p.start
    for c in np.unique(p.wall).tolist():
        name = wall_names[c]
        if name not in by:
            raise KeyError(name)
        by[name] += int(dur[p.wall == c].sum())
    return by


# What the path's `other` time is, by the kind of segment (critical_path.py's table): GPU time
# no GPU op, host call or launch accounts for.
OTHER_KINDS: dict[str, str] = {
    "unexplained_gap": "over 50 µs after its launch returned, nothing in the trace it waited for",
    "stream_gap": "after the previous op on its stream ended (scheduling gap)",
    "event_wait_gap": "after the event it waited on was recorded",
    "step_start": "before the path's first op, nothing in the trace it waited for",
}


# What each count of `critical_path.graph.unlinked` is (analyzer/graph.py, collectives.py), in
# the terminal's and the report's words
UNLINKED_KINDS: dict[str, str] = {
    "event_record_unknown": "event waits whose recording op the trace does not name: bounded "
                            "by the wait call instead",
    "event_wait_inferred": "cross-stream waits inferred from timing: the trace records the "
                           "wait calls but not what they waited on",
    "event_wait_no_recorded_op": "event waits whose recorded op is not in the trace",
    "event_wait_no_waiter": "event waits with no later op on the waiting stream",
    "sync_unresolved": "blocking syncs with no finished op to wait for",
    "gpu_without_launch": "GPU ops with no launch call in the trace",
    "duplicate_launch_correlation": "launches sharing one correlation id",
    "time_inconsistent": "dependencies dropped as impossible in time (clock skew)",
    "self_loops": "dependencies of an op on itself, dropped",
    "cycle_edges_dropped": "dependencies dropped to break cycles (malformed correlation data)",
    "collectives_unmatched": "collectives not matched across ranks",
}


# What the host wall's `other` idle is (analyzer/walls.py: GPU idle neither sync-blocked nor
# launch-starved), in the terminal's and the report's words
HOST_IDLE_OTHER = ("its next op already launched, no host call blocking: launch latency or a "
                   "wait the trace does not record")


def _path_other(p: _Path, wall_names: Sequence[str | None]) -> dict[str, int]:
    """The path's `other` time by segment kind (OTHER_KINDS)."""
    mask = p.wall == list(wall_names).index("other")
    dur, what = (p.end - p.start)[mask], p.what[mask]
    return {_WHAT_NAMES[c]: int(dur[what == c].sum()) for c in np.unique(what).tolist()}


def _path_recompute(p: _Path, recompute: np.ndarray | None) -> int:
    """The path's time in GPU ops that are memory-saving recompute (node ids `recompute`)."""
    if recompute is None:
        return 0
    mask = (p.what == _OP) & np.isin(p.node, recompute)
    return int((p.end - p.start)[mask].sum())


def _gain(t: float, r: float) -> float | None:
    return None if t - r <= 0 else round(t / (t - r) - 1, 6)


def _interval_frame(c: _Cols, mask: np.ndarray, like: pl.DataFrame) -> pl.DataFrame:
    """rank, step, start, end of the masked segments, rank/step typed like `like`'s."""
    return pl.DataFrame({"rank": c.rank[mask], "step": c.step[mask], iv.START: c.start[mask],
                         iv.END: c.end[mask]},
                        schema={"rank": pl.Int64, "step": pl.Int64, iv.START: pl.Int64,
                                iv.END: pl.Int64},
                        ).with_columns(pl.col("rank").cast(like.schema["rank"]),
                                       pl.col("step").cast(like.schema["step"]))


def _is_recompute(graph: TimelineGraph, recompute: np.ndarray) -> pl.Series:
    """Per GPU node of `graph` (in `nodes` order, `is_gpu` rows): whether it is memory-saving
    recompute (`recompute`: the node ids, `recompute_nodes`)."""
    gpu = graph.nodes.filter(pl.col("is_gpu")).get_column("node").to_numpy()
    return pl.Series(np.isin(gpu, recompute))


def recompute_nodes(graph: TimelineGraph, launches: pl.DataFrame | None) -> np.ndarray | None:
    """Node ids of the GPU ops launched for memory-saving recompute (`launches`: rank,
    correlation, walls.recompute_launches); None without any."""
    if launches is None or launches.height == 0:
        return None
    nodes = graph.nodes.filter(pl.col("is_gpu")).select("node", "rank", "correlation")
    hit = nodes.join(launches.select(pl.col("rank").cast(nodes.schema["rank"]),
                                     pl.col("correlation").cast(nodes.schema["correlation"])),
                     on=["rank", "correlation"], how="semi")
    return hit.get_column("node").to_numpy()


def _gpu_clipped(graph: TimelineGraph, win: pl.DataFrame,
                 recompute: np.ndarray | None = None) -> pl.DataFrame:
    """The graph's GPU ops (rank, wall, start, end) clipped to their step windows, once for the
    communication split and the host-busy share (a clip is per row: filtering by wall after it
    keeps the same pieces)."""
    w = win.rename({"win_start_ns": "lo", "win_end_ns": "hi"})
    ops = graph.nodes.filter(pl.col("is_gpu")).select(
        "rank", "wall", pl.col("ts_ns").alias(iv.START), pl.col("end_ns").alias(iv.END))
    if recompute is not None:  # re-run forward work hides communication as compute does (walls)
        ops = ops.with_columns(pl.when(_is_recompute(graph, recompute))
                               .then(pl.lit("compute")).otherwise(pl.col("wall").cast(pl.String))
                               .alias("wall"))
    return iv.clip(ops, w, on=["rank"], window_cols=["step"], start="lo", end="hi")


def _comm_split(graph: TimelineGraph, win: pl.DataFrame, cols: _Cols,
                clipped: pl.DataFrame | None = None) -> dict[tuple[int, int], dict[str, int]]:
    """Per (rank, step) window: communication busy, hidden (∩ compute), blocking (blocking path
    segments − compute, at most busy − hidden) and exposed ns, for every step in one pass of
    interval algebra (GPU ops clipped to their window)."""
    by = ["rank", "step"]
    if clipped is None:
        clipped = _gpu_clipped(graph, win)
    comm = clipped.filter(pl.col("wall") == "communication").drop("wall")
    comp = clipped.filter(pl.col("wall") == "compute").drop("wall")
    blk = _interval_frame(cols, cols.blocking, comm)

    def lengths(df: pl.DataFrame) -> dict[tuple[int, int], int]:
        return {(r, st): n for r, st, n in iv.total(df, by=by).iter_rows()}

    busy = lengths(comm)
    hidden = lengths(iv.intersect(comm, comp, by=by))
    blocking = lengths(iv.subtract(blk, comp, by=by))
    out = {}
    for p in cols.paths:
        key = (p.rank, p.step)
        b, h = busy.get(key, 0), hidden.get(key, 0)
        bl = min(blocking.get(key, 0), b - h)
        out[key] = {"busy": b, "hidden": h, "blocking": bl, "exposed": b - h - bl}
    return out


def _host_while_gpu_busy(graph: TimelineGraph, win: pl.DataFrame, cols: _Cols,
                         wall_names: Sequence[str | None], clipped: pl.DataFrame | None = None
                         ) -> dict[tuple[int, int], int]:
    """Per (rank, step): host path time during which the rank's GPU was running an op. The CPU
    chain set the step's length there, but the GPU was busy too: a faster host alone cannot
    recover that time, the GPU would still have its queued work to run."""
    by = ["rank", "step"]
    if clipped is None:
        clipped = _gpu_clipped(graph, win)
    gpu = clipped.drop("wall")
    host = _interval_frame(cols, cols.wall == list(wall_names).index("host"), gpu)
    return {(r, st): n for r, st, n in iv.total(iv.intersect(host, gpu, by=by), by=by).iter_rows()}


def _analyze(trace: Trace, steps: pl.DataFrame | None, graph: TimelineGraph | None,
             ranks: Sequence[int] | None, recompute: pl.DataFrame | None = None
             ) -> tuple[list[dict], _Cols, tuple[str | None, ...]]:
    """`analyze` with each path as columns (`_Path`), plus all steps' segments concatenated.
    `recompute`: walls.recompute_launches, whose GPU ops the events already give the memory
    wall (`recompute_as_memory`): their path time is also counted apart (`recompute`)."""
    win = step_windows(trace, steps)
    if ranks is not None:
        win = win.filter(pl.col("rank").is_in(list(ranks)))
    if graph is None:
        lo, hi = win["win_start_ns"].min(), win["win_end_ns"].max()
        window = (int(lo), int(hi)) if lo is not None else None
        graph = build_graph(trace, window=window, rank=None)
    views: dict[int, _RankView] = {}
    paths: list[_Path] = []
    arrays = _walk_arrays(graph) if win.height else None
    names = arrays.wall_names if arrays is not None else _WALL_NAMES
    rows = win.rows()
    for rank, step, lo, hi in rows:
        if rank not in views:
            views[rank] = _view(graph, rank, arrays)
        paths.append(_path(views[rank], rank, step, lo, hi))
    cols = _concat(paths)
    rc = recompute_nodes(graph, recompute)
    clipped = _gpu_clipped(graph, win, rc)
    comm = _comm_split(graph, win, cols, clipped)
    busy = _host_while_gpu_busy(graph, win, cols, names, clipped)
    res = [{"rank": rank, "step": step, "start_ns": lo, "end_ns": hi, "path": p,
            "walls": _path_walls(p, names), "other": _path_other(p, names),
            "recompute": _path_recompute(p, rc),
            "comm": comm[(rank, step)], "host_gpu_busy": busy.get((rank, step), 0)}
           for (rank, step, lo, hi), p in zip(rows, paths, strict=True)]
    return res, cols, names


def analyze(
    trace: Trace,
    steps: pl.DataFrame | None = None,
    *,
    graph: TimelineGraph | None = None,
    ranks: Sequence[int] | None = None,
) -> list[dict]:
    """Per (rank, step): the path, its wall split and the communication split."""
    res, _, names = _analyze(trace, steps, graph, ranks)
    # the segment tuples are many small objects and no cycles: no collection while making them
    with _no_gc():
        for r in res:
            r["path"] = _segments(r["path"], names)
    return res


def critical_path_section(
    trace: Trace,
    steps: pl.DataFrame | None = None,
    *,
    graph: TimelineGraph | None = None,
    top: int = TOP_SEGMENTS,
    recompute: pl.DataFrame | None = None,
) -> dict[str, dict]:
    """`{"critical_path": {...}, "blocking": {...}}` for the diagnosis document (paths read by
    the rules engine: critical_path.recoverable_s.<wall>, critical_path.gain_ceiling.<wall>,
    blocking.communication_{blocking,exposed,hidden}_s)."""
    if graph is None:
        win = step_windows(trace, steps)
        lo, hi = win["win_start_ns"].min(), win["win_end_ns"].max()
        graph = build_graph(trace, window=(int(lo), int(hi)) if lo is not None else None)
    res, cols, wall_names = _analyze(trace, steps, graph, None, recompute)
    if not res:
        return {}
    meds = _median_steps(res)
    t = _mean([r["end_ns"] - r["start_ns"] for r in meds])
    walls = {w: _mean([r["walls"][w] for r in meds]) for w in (*WALLS, "other")}
    other = {k: _mean([r["other"].get(k, 0) for r in meds]) for k in OTHER_KINDS}
    host_busy = _mean([r["host_gpu_busy"] for r in meds])
    if "kclass" not in trace.events.columns:  # the replay reads the classes
        trace = Trace(events=classify(trace.events), comms=trace.comms, flows=trace.flows,
                      ranks=trace.ranks, warnings=trace.warnings)
    replayed = mean_recoverable(trace, pl.DataFrame(
        [(r["rank"], r["step"], r["start_ns"], r["end_ns"]) for r in meds],
        schema=["rank", "step", "start_ns", "end_ns"], orient="row"), graph)
    if replayed is not None:
        recoverable, fidelity, basis = replayed[0], replayed[1], CEILING_BASIS
    else:  # no GPU op to replay: the path's own time, host only while the GPU was idle
        recoverable = walls | {"host": walls["host"] - host_busy}
        fidelity, basis = None, "the wall's time on the critical path (no step to replay)"
    comm = {k: _mean([r["comm"][k] for r in meds]) for k in meds[0]["comm"]}
    segs = _longest_cols(cols, np.ones(len(cols.start), dtype=bool), top, wall_names)
    edges = _longest_cols(cols, cols.blocking, TOP_EDGES, wall_names)
    names = _names(trace, [x for s in (*segs, *edges) for x in (s.node, s.waiter, s.via)])
    cp = {
        "length_s": _s(t),
        "median_step": [{"rank": r["rank"], "step": r["step"]} for r in meds],
        "recoverable_s": {w: _s(recoverable[w]) for w in WALLS},
        "gain_ceiling": {w: _gain(t, recoverable[w]) for w in WALLS},
        "ceiling_basis": basis,
        "replay_fidelity": None if fidelity is None else round(fidelity, 4),
        "other_s": _s(walls["other"]),
        "path_s": {w: _s(walls[w]) for w in (*WALLS, "other")},
        "path_other_s": {k: _s(v) for k, v in other.items() if v},
        "recompute_s": _s(_mean([r["recompute"] for r in meds])),
        "host_gpu_busy_s": _s(host_busy),
        "paced_by": paced_by(t, walls["host"], host_busy),
        "segments": [_seg_doc(s, names) for s in segs],
        "per_step": [
            {"rank": r["rank"], "step": r["step"], "length_s": _s(r["end_ns"] - r["start_ns"]),
             "walls_s": {w: _s(r["walls"][w]) for w in (*WALLS, "other")},
             "path_nodes": int(np.count_nonzero(r["path"].what == _OP))}
            for r in res
        ],
        "graph": {"nodes": graph.n_nodes, "edges": graph.edge_counts(),
                  "aggregated": graph.aggregated, "unlinked": dict(graph.unlinked)},
    }
    blocking = {
        "communication_blocking_s": _s(comm["blocking"]),
        "communication_exposed_s": _s(comm["exposed"]),
        "communication_hidden_s": _s(comm["hidden"]),
        "communication_busy_s": _s(comm["busy"]),
        "edges": [
            {"rank": s.rank, "step": s.step, "kind": s.edge, "communication": names.get(s.node),
             "waiter": names.get(s.waiter), "via": names.get(s.via) if s.via is not None else None,
             "on_path_s": _s(s.dur_ns)}
            for s in edges
        ],
    }
    return {"critical_path": cp, "blocking": blocking}


def _median_steps(res: list[dict]) -> list[dict]:
    """Per rank, the step of median length (lower median; ties by step id): the same rule as
    analyzer/walls.median_step, so both describe the same steps."""
    out = []
    for rank in sorted({r["rank"] for r in res}):
        rs = sorted((r for r in res if r["rank"] == rank),
                    key=lambda r: (r["end_ns"] - r["start_ns"], r["step"]))
        out.append(rs[(len(rs) - 1) // 2])
    return out


def _mean(xs: Sequence[float]) -> float:
    return sum(xs) / len(xs)


def _names(trace: Trace, ids: Sequence[int | None]) -> dict[int, str]:
    """Event names by row index, for the few ids the document mentions."""
    want = sorted({i for i in ids if i is not None})
    if not want:
        return {}
    col = trace.events.get_column("name").gather(want).to_list()
    return dict(zip(want, col, strict=True))


def _seg_doc(s: Segment, names: dict[int, str]) -> dict:
    return {"rank": s.rank, "step": s.step, "wall": s.wall, "what": s.what,
            "name": names.get(s.node) if s.node is not None and s.what == "op" else None,
            "dur_s": _s(s.dur_ns), "blocking": s.blocking}


def _s(ns: float) -> float:
    return round(ns / 1e9, 9)


def summary_lines(section: dict[str, dict]) -> list[str]:
    """Plain lines for the terminal summary (render.py may wrap them in rich markup)."""
    cp, bl = section.get("critical_path"), section.get("blocking")
    if not cp:
        return []
    lines = path_lines(cp)
    lines += _views_lines(cp, section.get("dominant_wall"))
    if bl and (bl["communication_busy_s"] > 0):
        lines.append(
            f"communication: blocking {bl['communication_blocking_s'] * 1e3:.2f} ms, exposed "
            f"{bl['communication_exposed_s'] * 1e3:.2f} ms, hidden "
            f"{bl['communication_hidden_s'] * 1e3:.2f} ms")
        if bl["edges"]:
            e = bl["edges"][0]
            lines.append(f"  longest wait: {_short(e['waiter'])} ← {_short(e['communication'])} "
                         f"via {e['kind']} "
                         f"({e['on_path_s'] * 1e3:.2f} ms on path)")
    sm = cp["graph"].get("sampled")
    if sm:
        lines.append(f"  graph over step {sm['steps'][0]} only ({sm['events_in_span']:,} events in "
                     f"{sm['steps_in_window']} steps > {sm['limit']:,})")
    unl = {k: v for k, v in cp["graph"]["unlinked"].items() if v}
    if unl:
        lines.append("  not linked (dependencies the path follows approximately or not at all): "
                     + "; ".join(f"{k} {v:,} ({UNLINKED_KINDS.get(k, 'see docs/architecture.md')})"
                                 for k, v in sorted(unl.items())))
    return lines


def path_lines(cp: dict) -> list[str]:
    """The path's parts (every wall and `other`; they sum to its length), what `other` was on
    this trace, and each wall's gain ceiling: the terminal's lines, the report's words."""
    t = cp["length_s"]
    on_path = cp["path_s"]
    parts = [f"{w} {on_path[w] * 1e3:.2f} ms" + _part_note(cp, w)
             for w in (*WALLS, "other") if on_path.get(w)]
    ms = cp["median_step"]
    where = (f"step {ms[0]['step']}, rank {ms[0]['rank']}" if len(ms) == 1
             else f"median step of {len(ms)} ranks")
    pace = f", {PACED_BY_LABEL[cp['paced_by']]}" if cp.get("paced_by") in PACED_BY_LABEL else ""
    lines = [f"critical path {t * 1e3:.2f} ms ({where}){pace}: " + ", ".join(parts)]
    other = cp.get("path_other_s") or {}
    if other:
        lines.append(f"  other {on_path['other'] * 1e3:.2f} ms: the GPU waiting with no op, host "
                     "call or launch to account for it — " + "; ".join(
                         f"{v * 1e3:.2f} ms {OTHER_KINDS.get(k, k)}"
                         for k, v in sorted(other.items(), key=lambda kv: -kv[1]) if v >= 5e-6))
    ceilings = ", ".join(f"{w} {_ceiling_text(cp['gain_ceiling'][w])} "
                         f"({cp['recoverable_s'][w] * 1e3:.2f} ms)" for w in WALLS)
    by = ("the step replayed without the wall's time" if cp.get("replay_fidelity") is not None
          else "the wall's time on the path")
    lines.append(f"  gain ceilings ({by}): {ceilings}")
    return lines


def _part_note(cp: dict, wall: str) -> str:
    """What a path part holds beside its wall's own work: host calls made while the GPU ran
    queued work (they did not pace the step, moetune/vocabulary.py `paced_by`); the memory
    part's memory-saving recompute (vocabulary `RECOMPUTE`)."""
    busy = cp.get("host_gpu_busy_s") or 0.0
    if wall == "host" and busy >= 5e-6:
        return f" ({busy * 1e3:.2f} ms of it beside running GPU work)"
    rc = cp.get("recompute_s") or 0.0
    if wall == "memory" and rc >= 5e-6:
        return f" (of which {RECOMPUTE} {rc * 1e3:.2f} ms)"
    return ""


def _views_lines(cp: dict, dominant: str | None) -> list[str]:
    """What the path view means beside the walls, when they could be read as disagreeing: a
    host-paced path on a step where another wall dominates, or a GPU-paced one where the host
    wall dominates (GPU idle spread over many short gaps, none on the path for long)."""
    pace = cp.get("paced_by")
    if pace is None or dominant is None or (pace == "host") == (dominant == "host"):
        return []
    meaning = f"  {PACED_BY[pace]}"
    busy = cp.get("host_gpu_busy_s", 0.0)
    if busy > 0:
        meaning += (f"; for {busy * 1e3:.2f} ms the path ran through host calls while the GPU "
                    "was running work queued earlier (not recoverable by a faster host alone)")
    return [meaning, "  the walls say where the GPU's time went (the rules read them); the path "
                     "says what set the step's length (the what-if estimates replay its graph)"]


def _ceiling_text(gain: float | None) -> str:
    """Gain ceiling for the terminal: when R ≈ T the percentage (+241899 %) says no more than
    "a gain above 10× (+1000 %)"; the JSON keeps the number."""
    if gain is None:
        return "∞"
    return ">10×" if gain > CEILING_TEXT_MAX else f"+{gain * 100:.0f} %"


def diagnosis_section(trace: Trace, steps: Any, ctx: Any) -> dict[str, dict]:
    """`moetune.analyzer.diagnose.SECTIONS` hook: one graph over the steps' span, built on the
    classified events (same rows, so node ids stay row indices and walls match wall_detail),
    shared by the critical path and blocking; plus the cross-rank section when > 1 rank."""
    table = steps.table if hasattr(steps, "table") else steps
    events = getattr(ctx, "events", None)
    recompute = getattr(ctx, "recompute", None)
    if events is not None and recompute is not None and recompute.height:
        # memory-saving recompute is a memory cost on the path as in the walls
        path_events = recompute_as_memory(events, recompute)
    else:
        path_events, recompute = events, None
    tr = trace if events is None else Trace(events=path_events, comms=trace.comms,
                                            flows=trace.flows, ranks=trace.ranks,
                                            warnings=trace.warnings)
    graph_table, sampled = graph_scope(tr.events, table)
    lo, hi = graph_table["win_start_ns"].min(), graph_table["win_end_ns"].max()
    graph = build_graph(tr, window=(int(lo), int(hi)) if lo is not None else None)
    out = critical_path_section(tr, graph_table, graph=graph, recompute=recompute)
    if out and sampled:
        out["critical_path"]["graph"]["sampled"] = sampled
    if tr.events.get_column("rank").n_unique() > 1:
        out |= ranks_section(tr, table, getattr(steps, "skipped", ()))
    return out


def _short(name: str | None, limit: int = 48) -> str:
    n = name or "?"
    return n if len(n) <= limit else n[: limit - 1] + "…"
