"""moetune's findings as Chrome-trace tracks (`moetune annotate`), beside the trace's own events.

One process, "moetune", with four threads per rank: walls (a slice per step, a child slice per
wall sized by its exposed time), the critical path of the median step (its segments, in order),
blocking (each top blocking communication's waiter, joined to the communication by a flow arrow)
and audit (instant markers: observed backends and, with a contract, each claim's verdict). Pure:
diagnosis document, step windows and critical-path segments in, a list of event dicts out; the
caller maps nanoseconds to the output's microseconds (`to_us`).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

import polars as pl
from moetune.analyzer import path_summary

from moetune.vocabulary import WALLS

PID = 2_000_000_000  # far above Linux pids and the GPU pids Kineto writes (device ids)
TRACKS = ("walls", "critical path", "blocking", "audit")
TOP_EDGES = 20  # blocking edges drawn per rank
CAT = "moetune"

ToUs = Callable[[int, int], float]  # (rank, ns) → output µs


def tid(rank: int, track: str) -> int:
    return rank * 10 + TRACKS.index(track) + 1


def _meta(ranks: Sequence[int]) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = [
        {"ph": "M", "name": "process_name", "pid": PID, "tid": 0, "ts": 0, "args": {"name": "moetune"}},
        {"ph": "M", "name": "process_sort_index", "pid": PID, "tid": 0, "ts": 0,
         "args": {"sort_index": -1}},
    ]
    for r in ranks:
        for track in TRACKS:
            t = tid(r, track)
            out.append({"ph": "M", "name": "thread_name", "pid": PID, "tid": t, "ts": 0,
                        "args": {"name": f"rank {r} · {track}"}})
            out.append({"ph": "M", "name": "thread_sort_index", "pid": PID, "tid": t, "ts": 0,
                        "args": {"sort_index": t}})
    return out


def _slice(rank: int, track: str, name: str, start: float, end: float,
           args: Mapping[str, Any]) -> dict[str, Any]:
    return {"ph": "X", "cat": CAT, "name": name, "pid": PID, "tid": tid(rank, track),
            "ts": round(start, 3), "dur": max(round(end - start, 3), 0.001), "args": dict(args)}


def wall_events(doc: Mapping[str, Any], steps: pl.DataFrame, to_us: ToUs) -> list[dict[str, Any]]:
    """Per analysed (rank, step): a step slice over its GPU window and, inside it, one slice per
    wall, laid end to end, each as long as the wall's exposed share of the step."""
    walls = {(r["rank"], r["step"]): r for r in doc.get("per_step") or []}
    out = []
    for rank, step, lo, hi in steps.select("rank", "step", "win_start_ns", "win_end_ns").iter_rows():
        row = walls.get((rank, step))
        if row is None or lo is None or hi is None:
            continue
        a, b = to_us(rank, lo), to_us(rank, hi)
        out.append(_slice(rank, "walls", f"step {step}", a, b,
                          {"step": step, "wall_s": row["wall_s"], "kernels": row.get("kernels")}))
        t = a
        for w in WALLS:
            share = float((row.get("walls") or {}).get(w) or 0.0)
            if share <= 0:
                continue
            d = min(share * (b - a), b - t)
            out.append(_slice(rank, "walls", w, t, t + d,
                              {"wall": w, "share": share, "exposed_s": round(share * row["wall_s"], 6)}))
            t += d
    return out


def path_events(segments: Sequence[Any], names: Mapping[int, str], events: pl.DataFrame,
                to_us: ToUs, *, top_edges: int = TOP_EDGES) -> list[dict[str, Any]]:
    """Critical-path segments (`critical_path.Segment`) as slices; the `top_edges` longest
    blocking ones each get a waiter slice on the blocking track and a flow arrow to it."""
    out = []
    for s in segments:
        label = names.get(s.node) if s.node is not None else None
        out.append(_slice(s.rank, "critical path", f"{s.wall}: {label or s.what}",
                          to_us(s.rank, s.start_ns), to_us(s.rank, s.end_ns),
                          {"wall": s.wall, "what": s.what, "blocking": s.blocking, "step": s.step,
                           "dur_ms": round((s.end_ns - s.start_ns) / 1e6, 6), "name": label}))
    longest = sorted((s for s in segments if s.blocking and s.waiter is not None),
                     key=lambda s: (s.start_ns - s.end_ns, s.rank, s.start_ns))
    per_rank: dict[int, int] = {}
    blocking = []
    for s in longest:  # the longest `top_edges` of each rank
        if per_rank.get(s.rank, 0) < top_edges:
            per_rank[s.rank] = per_rank.get(s.rank, 0) + 1
            blocking.append(s)
    if not blocking:
        return out
    rows = events.select("ts_ns", "dur_ns", "name")
    for i, s in enumerate(blocking):
        w_ts, w_dur, w_name = rows.row(s.waiter)
        if w_ts is None:
            continue
        a, b = to_us(s.rank, w_ts), to_us(s.rank, w_ts + max(int(w_dur or 0), 1000))
        comm = names.get(s.node) if s.node is not None else None
        out.append(_slice(s.rank, "blocking", f"waits: {w_name}", a, b,
                          {"communication": comm, "edge": s.edge, "step": s.step,
                           "on_path_ms": round((s.end_ns - s.start_ns) / 1e6, 6)}))
        src = to_us(s.rank, (s.start_ns + s.end_ns) // 2)
        flow = {"cat": CAT, "name": "blocking", "id": i + 1, "pid": PID}
        out.append({**flow, "ph": "s", "tid": tid(s.rank, "critical path"), "ts": round(src, 3)})
        out.append({**flow, "ph": "f", "bp": "e", "tid": tid(s.rank, "blocking"),
                    "ts": round((a + b) / 2, 3)})
    return out


def _word(v: Any) -> str:
    if isinstance(v, bool):
        return "yes" if v else "no"
    return str(v)


def audit_events(doc: Mapping[str, Any], audit: Mapping[str, Any] | None,
                 steps: pl.DataFrame, to_us: ToUs) -> list[dict[str, Any]]:
    """Instant markers at each rank's first analysed window: observed backends, audit verdicts."""
    obs = doc.get("observed") or {}
    marks = [(f"observed {k.replace('_', ' ')}: {_word(v)}", {"fact": k, "value": v})
             for k, v in sorted(obs.items())]
    for claim, v in sorted(((audit or {}).get("verdicts") or {}).items()):
        marks.append((f"audit {claim}: {v.get('verdict')}",
                      {"claim": claim, "verdict": v.get("verdict"), "reason": v.get("reason")}))
    first = steps.group_by("rank").agg(pl.col("win_start_ns").min()).sort("rank")
    out = []
    for rank, lo in first.iter_rows():
        if lo is None:
            continue
        for name, args in marks:
            out.append({"ph": "i", "s": "t", "cat": CAT, "name": name, "pid": PID,
                        "tid": tid(rank, "audit"), "ts": round(to_us(rank, lo), 3), "args": args})
    return out


def median_paths(trace: Any, steps: pl.DataFrame, doc: Mapping[str, Any],
                 ) -> tuple[list[Any], dict[int, str]]:
    """The critical path of each rank's median step (`doc.median_step_by_rank`) as
    `critical_path.Segment`s, and the names of the events they mention. `trace`: the classified
    events (the diagnosis' rows: segment node ids are their row indices)."""
    med = {int(r): int(s) for r, s in (doc.get("median_step_by_rank") or {}).items()}
    want = pl.DataFrame({"rank": list(med), "step": list(med.values())},
                        schema={"rank": steps.schema["rank"], "step": steps.schema["step"]})
    med_steps = steps.join(want, on=["rank", "step"], how="semi")
    if med_steps.height == 0:
        return [], {}
    segments = [s for r in path_summary.analyze(trace, med_steps) for s in r["path"]]
    ids = sorted({i for s in segments for i in (s.node, s.waiter) if i is not None})
    col = trace.events.get_column("name")
    return segments, dict(zip(ids, col.gather(ids).to_list(), strict=True)) if ids else {}


def moetune_events(doc: Mapping[str, Any], steps: pl.DataFrame, segments: Sequence[Any],
                   names: Mapping[int, str], events: pl.DataFrame, to_us: ToUs, *,
                   audit: Mapping[str, Any] | None = None) -> list[dict[str, Any]]:
    """All of moetune's tracks for one analysis."""
    ranks = sorted(int(r) for r in steps.get_column("rank").unique())
    return [*_meta(ranks), *wall_events(doc, steps, to_us),
            *path_events(segments, names, events, to_us), *audit_events(doc, audit, steps, to_us)]


def window_events(events: pl.DataFrame, lo: int, hi: int, to_us: ToUs) -> list[dict[str, Any]]:
    """A trace without its own Chrome events (nsys): its kernels, copies, memsets, runtime calls,
    syncs and NVTX ranges in [lo, hi) as Chrome slices, GPU work on a process per rank and device
    (a thread per stream), host work on its process and thread."""
    kinds = ["kernel", "memcpy", "memset", "graph", "runtime", "sync", "annotation"]
    ev = events.filter(pl.col("kind").cast(pl.String).is_in(kinds)
                       & (pl.col("ts_ns") < hi) & ((pl.col("ts_ns") + pl.col("dur_ns")) >= lo))
    gpu_kinds = {"kernel", "memcpy", "memset", "graph"}
    out: list[dict[str, Any]] = []
    named: set[tuple[int, str]] = set()
    for rank, kind, name, ts, dur, pid, tid_, dev, stream, corr in ev.select(
            "rank", pl.col("kind").cast(pl.String), "name", "ts_ns", "dur_ns", "pid", "tid",
            "device", "stream", "correlation").iter_rows():
        if kind in gpu_kinds:
            p, t = 1_000_000 + int(rank) * 100 + int(dev or 0), int(stream or 0)
            label = f"rank {rank} · GPU {dev if dev is not None else '?'}"
        else:
            p, t = int(pid or 0), int(tid_ or 0)
            label = f"rank {rank} · host"
        if (p, label) not in named:
            named.add((p, label))
            out.append({"ph": "M", "name": "process_name", "pid": p, "tid": 0, "ts": 0,
                        "args": {"name": label}})
        out.append({"ph": "X", "cat": kind, "name": name or "?", "pid": p, "tid": t,
                    "ts": round(to_us(int(rank), ts), 3), "dur": max(int(dur or 0), 0) / 1000,
                    "args": {"correlation": corr} if corr is not None else {}})
    return out
