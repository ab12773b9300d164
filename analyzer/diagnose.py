"""Orchestration: trace files → the diagnosis document (schemas/diagnosis.schema.json).

read → classify → steps (+ window) → walls per (rank, step) → median step per rank → observed
facts → sections added by other modules (critical path, blocking, ranks) → a plain dict with sorted
keys and rounded floats. File names only, never host paths or trace metadata.

Extension point: `SECTIONS` lists `(name, fn)` pairs; each `fn(trace, steps, ctx) -> dict` returns
top-level document keys that are merged into the document (e.g. `{"critical_path": …,
"blocking": …}`); `name` labels the section. `steps` is a `steps.Steps` (`steps.table` has rank,
step, win_start_ns, win_end_ns); `ctx` is a `Context` (classified events, per-step walls, the
document so far). Sections run after the core fields, in list order.
"""

from __future__ import annotations

import hashlib
import threading
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import polars as pl
from moetune.analyzer import device_memory, phases, throughput
from moetune.analyzer.classify import KernelClasses, class_table, classify, load_classes
from moetune.analyzer.frames import GPU_KINDS, Trace
from moetune.analyzer.observed import gpu_facts, in_windows, observe
from moetune.analyzer.path_summary import diagnosis_section
from moetune.analyzer.steps import Steps, find_steps
from moetune.analyzer.walls import (
    attribute_walls,
    fractions,
    gpu_layers,
    median_step,
    recompute_evidence,
    recompute_launches,
    recompute_ops,
    starved_layer,
    step_counts,
    sync_layer,
    union_layers,
)
from moetune.analyzer.whatif import whatif_section

from moetune import __version__
from moetune.errors import UserError
from moetune.vocabulary import WALLS

SCHEMA_ID = "moetune.diagnosis/1"
NS = 1e-9
SECONDS_DIGITS = 6  # µs resolution in seconds fields
FRACTION_DIGITS = 4
CORE_KEYS = frozenset(
    {"schema", "tool", "inputs", "ranks_analyzed", "window", "steps", "step_time_s", "walls",
     "dominant_wall", "wall_detail", "host", "median_step_by_rank", "per_step", "observed",
     "evidence", "warnings"}
)


@dataclass(frozen=True, slots=True)
class Context:
    """What a section function may read (never mutate)."""

    events: pl.DataFrame  # classified: + kclass, wall, rclass, blocking
    gpu: pl.DataFrame  # observed.in_windows: the GPU rows inside the analysed steps, with step
    per_step: pl.DataFrame  # walls.attribute_walls output
    median: pl.DataFrame  # walls.median_step output (one row per rank)
    doc: dict[str, Any]  # the document built so far
    contract: dict[str, Any] | None
    reference_step_s: float | None = None  # the run's unprofiled step time (its log), if known
    recompute: pl.DataFrame | None = None  # walls.recompute_launches of `events`, if computed
    classes: KernelClasses | None = None  # the kernel classes the events were classified with
    run_log: dict[str, Any] | None = None  # the run's log, as throughput.log_check reads it


Section = tuple[str, Callable[[Trace, Steps, Context], dict[str, Any]]]

# Sections owned by other modules: the timeline graph (built once) gives critical_path, blocking
# and, with several ranks, ranks; the allocator's events give memory; the median step's graph,
# replayed with each applicable knob change, gives whatif; the median step's work labelled by
# phase gives phases and rank_breakdown, and throughput reads their busy times.
SECTIONS: list[Section] = [("timeline_graph", diagnosis_section),
                           ("device_memory", device_memory.diagnosis_section),
                           ("whatif", whatif_section),
                           ("phases", phases.diagnosis_section),
                           ("throughput", throughput.diagnosis_section)]


def diagnose(
    paths: Sequence[str | Path] | str | Path,
    *,
    window: str | None = None,
    contract: str | Path | dict[str, Any] | None = None,
    step_range: str | None = None,
    sections: Sequence[Section] | None = None,
    classes: KernelClasses | None = None,
) -> dict[str, Any]:
    """Diagnose trace files (one or many ranks) and return the diagnosis document."""
    from moetune.analyzer.readers import expand, load_trace

    plist = [paths] if isinstance(paths, (str, Path)) else list(paths)
    files = expand(plist)
    digest_later(files)
    trace = load_trace(plist)
    return diagnose_trace(
        trace,
        files=files,
        window=window,
        contract=contract,
        step_range=step_range,
        sections=sections,
        classes=classes,
    )


def diagnose_trace(
    trace: Trace,
    *,
    files: Sequence[Path] = (),
    window: str | None = None,
    contract: str | Path | dict[str, Any] | None = None,
    step_range: str | None = None,
    sections: Sequence[Section] | None = None,
    classes: KernelClasses | None = None,
    reference_step_s: float | None = None,
    run_log: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """Same as diagnose() for an already-read Trace. `run_log`: the run's log iterations (and
    model arguments), read by the caller (the analyzer reads no logs): the throughput section's
    cross-check."""
    cl = classes or load_classes()
    first = files[0] if files else None
    con = _load_contract(contract)
    cwin = ((con or {}).get("window") or {}) if con else {}
    win = window if window is not None else cwin.get("steady")
    step_range = step_range or cwin.get("step_range")
    if not trace.events.select(pl.col("kind").is_in(GPU_KINDS).any()).item():
        raise UserError("has no GPU events (CPU-only profile?)", path=first)
    dispatcher_hint = ((con or {}).get("megatron_args") or {}).get("moe_token_dispatcher_type")
    # Two lines of work side by side: polars releases the GIL inside each query, and most of
    # them are small (a fixed cost each), so a second thread fills the gaps. The helper finds the
    # launch-starved gaps while this thread classifies the events (gaps need kinds and times, no
    # class), builds the GPU wall layers and unions all layers (they need no steps) while this
    # thread finds the steps and counts the kernels and launches in them, then sweeps the walls
    # while this thread reads the backend facts: about equal shares. Its one worker runs the
    # tasks in order.
    with ThreadPoolExecutor(max_workers=1, thread_name_prefix="moetune-walls") as helper:
        starved = helper.submit(starved_layer, trace.events)
        events = classify(trace.events, classes=cl)
        rc_ops = helper.submit(recompute_ops, events, classes=cl)
        rc_launches = helper.submit(lambda: recompute_launches(events, ops=rc_ops.result()))
        sync = sync_layer(events)
        unioned = helper.submit(lambda: union_layers(
            gpu_layers(events, rc_launches.result()) | {"sync": sync, "starved": starved.result()}))
        steps = find_steps(events, window=win, step_range=step_range, classes=cl, source_file=first)
        counts = step_counts(events, steps.table)
        walls = helper.submit(lambda: attribute_walls(events, steps.table, unioned=unioned.result(),
                                                      counts=counts))
        gpu = in_windows(events, steps.table)  # located once, read by observe, evidence, sections
        facts = gpu_facts(events, steps.table, comms=trace.comms, dispatcher_hint=dispatcher_hint,
                          classes=cl, gpu=gpu)
        evidence = _evidence(gpu)
        per_step = walls.result()
    med = median_step(per_step)
    observed, obs_ev = observe(facts, per_step,
                               recompute=recompute_evidence(rc_ops.result(), steps.table))
    doc: dict[str, Any] = {
        "schema": SCHEMA_ID,
        "tool": {"name": "moetune", "version": __version__},
        "inputs": _inputs(trace, files),
        "ranks_analyzed": sorted(int(r) for r in steps.table.get_column("rank").unique()),
        "window": {
            "declared": str(win) if win is not None else None,
            "step_source": steps.source,
            "steps_found": steps.found,
            "dropped_incomplete": steps.dropped,
        },
        "steps": steps.ids,
        **_summary(med),
        "per_step": _per_step_rows(per_step),
        "observed": observed,
        "evidence": {**evidence, **obs_ev},
        "warnings": _warnings(trace, steps, events, observed),
    }
    ctx = Context(events=events, gpu=gpu, per_step=per_step, median=med, doc=doc, contract=con,
                  reference_step_s=reference_step_s, recompute=rc_launches.result(), classes=cl,
                  run_log=run_log)
    for name, fn in list(sections if sections is not None else SECTIONS):
        extra = fn(trace, steps, ctx) or {}
        clash = sorted(set(extra) & CORE_KEYS)
        assert not clash, f"section {name} would overwrite {clash}"
        doc.update(extra)
    return normalize(doc)


def _summary(med: pl.DataFrame) -> dict[str, Any]:
    """Walls, wall_detail, host and step time of the median step, averaged over ranks."""
    rows = med.to_dicts()
    n = len(rows)

    def mean(f: Callable[[dict[str, Any]], float]) -> float:
        return sum(f(r) for r in rows) / n

    walls = {k: mean(lambda r, k=k: fractions(r)[k]) for k in WALLS}
    total = sum(walls.values())
    assert abs(total - 1) <= 0.01, f"wall fractions sum to {total}"
    s = lambda col: mean(lambda r: r[col] * NS)  # noqa: E731
    detail = {
        "compute": {"busy_s": s("compute_exposed_ns"), "exposed_s": s("compute_exposed_ns"), "hidden_s": 0.0},
        "communication": {
            "busy_s": s("comm_busy_ns"),
            "exposed_s": s("comm_exposed_ns"),
            "hidden_s": s("comm_busy_ns") - s("comm_exposed_ns"),
        },
        "memory": {
            "busy_s": s("mem_busy_ns") + s("recompute_ns"),
            "exposed_s": s("mem_exposed_ns"),
            "hidden_s": s("mem_busy_ns") - s("mem_copy_exposed_ns"),
            "recompute_s": s("recompute_ns"),
            "copy_exposed_s": s("mem_copy_exposed_ns"),
            "offload_s": s("offload_exposed_ns"),
            "offload_pageable_s": s("offload_pageable_exposed_ns"),
        },
        "host": {"busy_s": s("idle_ns"), "exposed_s": s("idle_ns"), "hidden_s": 0.0},
    }
    for k in WALLS:
        detail[k]["share"] = walls[k]
    idle = s("idle_ns")
    host = {
        "idle_s": idle,
        "launch_starved_s": s("launch_starved_ns"),
        "sync_blocked_s": s("sync_blocked_ns"),
        "other_s": s("other_idle_ns"),
        "launch_starved_share": (s("launch_starved_ns") / idle) if idle > 0 else 0.0,
        "kernels_per_step": mean(lambda r: float(r["kernels"])),
        "launches_per_step": mean(lambda r: float(r["launches"])),
        "median_kernel_us": mean(lambda r: float(r["median_kernel_ns"] or 0) / 1000),
    }
    dominant = max(WALLS, key=lambda k: (walls[k], -WALLS.index(k)))
    return {
        "step_time_s": s("wall_ns"),
        "walls": walls,
        "dominant_wall": dominant,
        "wall_detail": detail,
        "host": host,
        "median_step_by_rank": {str(r["rank"]): int(r["step"]) for r in rows},
    }


def _per_step_rows(per_step: pl.DataFrame) -> list[dict[str, Any]]:
    out = []
    origin = per_step.group_by("rank").agg(pl.col("win_start_ns").min().alias("_o"))
    for r in per_step.join(origin, on="rank").sort(["rank", "step"]).to_dicts():
        out.append(
            {
                "rank": int(r["rank"]),
                "step": int(r["step"]),
                "start_ns": int(r["win_start_ns"] - r["_o"]),  # relative: no capture-host clock
                "wall_s": r["wall_ns"] * NS,
                "walls": fractions(r),
                "kernels": int(r["kernels"]),
            }
        )
    return out


def _evidence(gpu: pl.DataFrame) -> dict[str, Any]:
    """Kernel classes and the top kernels of the analysed steps (the backend facts' evidence is
    merged in by the caller)."""
    classes = {
        row["kclass"]: {"count": int(row["count"]), "time_s": row["time_ns"] * NS, "wall": row["wall"]}
        for row in class_table(gpu).to_dicts()
    }
    top = (
        gpu.group_by("name")
        .agg(pl.len().alias("count"), pl.col("dur_ns").sum().alias("t"), pl.col("kclass").first())
        .sort(["t", "name"], descending=[True, False])
        .head(10)
    )
    top_k = [
        {"name": _short(r["name"]), "kclass": r["kclass"], "count": int(r["count"]), "time_s": r["t"] * NS}
        for r in top.to_dicts()
    ]
    return {"classes": classes, "top_kernels": top_k}


def _short(name: str | None, limit: int = 160) -> str | None:
    # None: the trace names no kernel there (a Kineto event without `name`, an nsys id missing
    # from StringIds); it stays unknown rather than read as a name
    return name if name is None or len(name) <= limit else name[: limit - 1] + "…"


def _inputs(trace: Trace, files: Sequence[Path]) -> list[dict[str, Any]]:
    """One entry per input file: name (no directories), format, ranks, size and digest."""
    by_src: dict[str, dict[str, Any]] = {}
    for r in trace.ranks.sort("rank").to_dicts():
        src = Path(str(r.get("source") or "")).name
        e = by_src.setdefault(
            src, {"file": src, "format": r.get("format") or "kineto", "ranks": [], "graph_trace_mode": r.get("graph_trace_mode")}
        )
        e["ranks"].append(int(r["rank"]))
    for f in files:
        e = by_src.setdefault(f.name, {"file": f.name, "format": "kineto", "ranks": []})
        try:
            e["bytes"] = f.stat().st_size
            e["sha256"] = _sha256(f)
        except OSError:
            pass
    return [by_src[k] for k in sorted(by_src)]


class _Digest(threading.Thread):
    """sha256 of a file on a daemon thread: hashlib releases the GIL on large blocks, so a 1 GB
    input is hashed while it is read and analysed instead of after (0.65 s of its diagnosis);
    a daemon never holds up the exit of a run that failed."""

    def __init__(self, path: Path) -> None:
        super().__init__(name=f"sha256:{path.name}", daemon=True)
        self.path, self.key, self.value = path, _file_key(path), None
        self.error: OSError | None = None

    def run(self) -> None:
        try:
            self.value = _sha256_now(self.path)
        except OSError as exc:
            self.error = exc


_DIGESTS: dict[tuple[str, int, int], _Digest] = {}


def _file_key(path: Path) -> tuple[str, int, int]:
    st = path.stat()
    return (str(path.resolve()), st.st_size, st.st_mtime_ns)


def digest_later(files: Sequence[Path]) -> None:
    for f in files:
        try:
            d = _Digest(f)
        except OSError:
            continue  # the reader reports it
        if d.key not in _DIGESTS:
            _DIGESTS[d.key] = d
            d.start()


def _sha256(path: Path) -> str:
    d = _DIGESTS.pop(_file_key(path), None)
    if d is None:
        return _sha256_now(path)
    d.join()
    if d.error is not None:
        raise d.error
    return d.value or _sha256_now(path)


def _sha256_now(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def _warnings(trace: Trace, steps: Steps, events: pl.DataFrame, observed: dict[str, Any]) -> list[str]:
    # the graph-level trace-mode warning comes from the nsys reader (trace.warnings)
    return list(trace.warnings) + list(steps.warnings)


def _load_contract(contract: str | Path | dict[str, Any] | None) -> dict[str, Any] | None:
    """A contract dict, or a YAML/JSON file (read only; validation is `moetune contract check`)."""
    if contract is None or isinstance(contract, dict):
        return contract
    from moetune.analyzer.contract import read_document

    doc = read_document(contract)
    if not isinstance(doc, dict):
        raise UserError("contract is not a mapping of sections", path=contract)
    return doc


def normalize(obj: Any) -> Any:
    """Deterministic document: sorted keys, rounded floats (seconds to µs, fractions to 1e-4)."""
    if isinstance(obj, dict):
        return {str(k): _round_field(str(k), normalize(v)) for k, v in sorted(obj.items(), key=lambda kv: str(kv[0]))}
    if isinstance(obj, (list, tuple)):
        return [normalize(v) for v in obj]
    return obj


def _round_field(key: str, v: Any) -> Any:
    if isinstance(v, float):
        return round(v, SECONDS_DIGITS if key.endswith(("_s", "_us")) else FRACTION_DIGITS + 2)
    if isinstance(v, dict) and set(v) == set(WALLS) and not key.endswith("_s"):
        return {k: round(x, FRACTION_DIGITS) if isinstance(x, float) else x for k, x in v.items()}
    return v
