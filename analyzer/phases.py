"""The diagnosis' `phases` and `rank_breakdown` sections: where each layer's time goes, per phase.

The phases of each rank's median step (analyzer/phases.yaml, labelled by
analyzer/phases_sequence.py, timed by analyzer/phases_table.py), averaged over the ranks like the
walls: one row per phase that ran (its source, GPU busy / exposed / hidden time, the GPU idle time
spent waiting for it, its share of the step, forward / backward / recompute split, kernels,
launches and the host time issuing it) and, where the layers can be told apart, one row per
phase and layer. `rank_breakdown`: each rank's median step split HTA-style (compute,
communication, memory, host: the GPU starved by launches, idle: the rest of the GPU's idle time)
with its phases, and the phase the slowest rank loses its time in.
"""

from __future__ import annotations

import statistics
from collections.abc import Mapping
from typing import Any

import polars as pl
from moetune.analyzer.classify import load_classes
from moetune.analyzer.phases_book import PhaseBook, load_phases
from moetune.analyzer.phases_sequence import Labelled, label_items, windows
from moetune.analyzer.phases_table import TAIL, phase_times

NS = 1e-9
DIRECTIONS = ("forward", "backward", "recompute")
RULE_FIELDS = ("share", "step_s", "busy_s", "exposed_s", "idle_s", "kernels", "launches", "host_s")


def diagnosis_section(trace: Any, steps: Any, ctx: Any) -> dict[str, Any]:
    """`diagnose.Section`: the `phases` and `rank_breakdown` sections of the median steps."""
    book = load_phases()
    classes = getattr(ctx, "classes", None) or load_classes()
    table = steps.table if hasattr(steps, "table") else steps
    win = windows(table, ctx.median)
    formats = {int(r): str(f or "kineto") for r, f in trace.ranks.select("rank", "format").iter_rows()}
    lab = label_items(ctx.events, win, book=book, classes=classes, comms=trace.comms,
                      recompute=ctx.recompute, formats=formats,
                      layers_per_pass=layers_per_stage(ctx.contract))
    add, busy = phase_times(lab.items, win)
    return {"phases": phases_document(add, busy, win, book=book, labelled=lab),
            "rank_breakdown": rank_breakdown(ctx.median, add)}


def layers_per_stage(contract: Mapping[str, Any] | None) -> int | None:
    """Transformer layers one pipeline stage (or virtual stage) runs, from the contract."""
    if not contract:
        return None
    from moetune.analyzer.contract import effective_args

    a = effective_args(contract)
    try:
        n = int(a["num_layers"])
    except (KeyError, TypeError, ValueError):
        return None
    pp = int(a.get("pipeline_model_parallel_size") or 1)
    vpp = int(a.get("virtual_pipeline_model_parallel_size") or 1)
    per = n // max(pp * vpp, 1)
    return per if per >= 1 and per * pp * vpp == n else None


def _order(book: PhaseBook) -> dict[str, int]:
    return {p: i for i, p in enumerate((*book.names, TAIL))}


def phases_document(add: pl.DataFrame, busy: pl.DataFrame, win: pl.DataFrame, *,
                    book: PhaseBook, labelled: Labelled) -> dict[str, Any]:
    ranks = win.height
    step_ns = float((win.get_column("win_end_ns") - win.get_column("win_start_ns")).sum()) / max(ranks, 1)
    layers = _layers(labelled)
    # few rows (phases × layers × directions × sources): plain Python from here
    add_rows = add.select("phase", "layer", "direction", "source", "exposed_ns", "idle_ns",
                          "kernels", "launches", "host_ns").rows()
    busy_rows = busy.select("by", "phase", "layer", "direction", "busy_ns").rows()
    rows = _rows(add_rows, {(ph,): b for by, ph, _, _, b in _sum(busy_rows, "phase")},
                 ("phase",), ranks, step_ns, book)
    n = max(ranks, 1)
    by_dir = {(ph, d): b for _, ph, _, d, b in _sum(busy_rows, "direction")}
    for r in rows:
        r["busy_by_direction_s"] = {d: by_dir.get((r["phase"], d), 0) / n * NS for d in DIRECTIONS}
    doc: dict[str, Any] = {
        "source": book.source,
        "ranks": ranks,
        "step_time_s": step_ns * NS,
        "rows": rows,
        "layers": layers,
        "not_found": [p.phase for p in book.phases
                      if p.part != "step" and p.phase not in {r["phase"] for r in rows}],
    }
    # the rules' view: maps keyed by phase and group (rules read dotted paths, not list rows)
    doc["by_phase"] = {r["phase"]: {k: r[k] for k in RULE_FIELDS} for r in rows}
    doc["groups"] = {g: {"share": sum(r["share"] for r in rows if r["phase"] in ph),
                         "step_s": sum(r["step_s"] for r in rows if r["phase"] in ph)}
                     for g, ph in book.groups.items()}
    if layers["distinguishable"]:
        doc["by_layer"] = _rows([r for r in add_rows if r[1] is not None],
                                {(ph, la): b for _, ph, la, _, b in _sum(busy_rows, "layer")},
                                ("phase", "layer"), ranks, step_ns, book)
    return doc


def _sum(busy_rows: list[tuple], by: str) -> list[tuple]:
    """The busy rows of one grouping, summed over ranks."""
    acc: dict[tuple, float] = {}
    for b, ph, la, d, v in busy_rows:
        if b == by:
            acc[(b, ph, la, d)] = acc.get((b, ph, la, d), 0) + (v or 0)
    return [(*k, v) for k, v in acc.items()]


def _rows(add_rows: list[tuple], busy: dict[tuple, float], by: tuple[str, ...], ranks: int,
          step_ns: float, book: PhaseBook) -> list[dict[str, Any]]:
    """Document rows per (phase) or (phase, layer), averaged over `ranks`."""
    n = max(ranks, 1)
    tot: dict[tuple, dict[str, Any]] = {}
    for phase, layer, direction, source, ex, idle, kern, launch, host in add_rows:
        key = (phase,) if by == ("phase",) else (phase, layer)
        a = tot.setdefault(key, {"ex": 0.0, "idle": 0.0, "kern": 0, "launch": 0, "host": 0,
                                 "dir": dict.fromkeys(DIRECTIONS, 0.0), "src": {}})
        a["ex"] += ex
        a["idle"] += idle
        a["kern"] += kern
        a["launch"] += launch
        a["host"] += host
        if direction in a["dir"]:
            a["dir"][direction] += ex + idle
        if source is not None:
            a["src"][source] = a["src"].get(source, 0.0) + ex + idle
    order = _order(book)
    out = []
    for key, a in tot.items():
        phase = key[0]
        total = sum(a["src"].values())
        by_src = {s: (v / total if total > 0 else 0.0)
                  for s, v in sorted(a["src"].items(), key=lambda x: (-x[1], x[0]))}
        st = (a["ex"] + a["idle"]) / n
        bz = busy.get(key, 0) / n
        ex = a["ex"] / n
        out.append({
            **({"layer": int(key[1])} if len(key) > 1 else {}),
            "phase": phase,
            "title": book.phase(phase).title if phase in book.names else "GPU idle after the step's last work",
            "source": next(iter(by_src), "gap" if phase == TAIL else None),
            "sources": by_src,
            "busy_s": bz * NS,
            "exposed_s": ex * NS,
            "hidden_s": max(bz - ex, 0.0) * NS,
            "idle_s": a["idle"] / n * NS,
            "step_s": st * NS,
            "share": st / step_ns if step_ns > 0 else 0.0,
            "kernels": a["kern"] / n,
            "launches": a["launch"] / n,
            "host_s": a["host"] / n * NS,
            **{f"{d}_s": a["dir"][d] / n * NS for d in DIRECTIONS},
        })
    out.sort(key=lambda x: (x.get("layer", 0), order.get(x["phase"], len(order))))
    return out


def _layers(lab: Labelled) -> dict[str, Any]:
    """Whether the layers can be told apart: by the layer modules' own numbers (stack), or when
    each forward and backward pass of every rank counts the same layers (sequence)."""
    if lab.layer_source == "stack":
        n = lab.items.get_column("layer").drop_nulls().n_unique()
        return {"distinguishable": n >= 1, "source": "stack", "count": n or None,
                "why": None if n else "no layer module ranges"}
    counts = [c for per in lab.passes.values() for d in ("forward", "backward")
              for c in per.get(d, [])]
    if lab.layer_source is None or not counts:
        return {"distinguishable": False, "source": None, "count": None,
                "why": "no layer structure found (no norms or layer ranges between the phases)"}
    if len(set(counts)) != 1 or counts[0] < 1:
        return {"distinguishable": False, "source": lab.layer_source, "count": None,
                "why": f"passes show different layer counts ({', '.join(map(str, sorted(set(counts))))})"}
    return {"distinguishable": True, "source": lab.layer_source, "count": counts[0], "why": None}


def rank_breakdown(median: pl.DataFrame, add: pl.DataFrame) -> dict[str, Any]:
    """Per rank (its median step): compute / communication / memory / host / idle and phases;
    with several ranks, the slowest rank's extra time over the median rank and the phase it is in."""
    return breakdown(rank_rows(median, add))


def rank_rows(median: pl.DataFrame, add: pl.DataFrame) -> list[dict[str, Any]]:
    """One `rank_breakdown` row per rank from its median step's walls and phase times."""
    per: dict[int, dict[str, int]] = {}
    for rank, phase, ex, idle in add.select("rank", "phase", "exposed_ns", "idle_ns").rows():
        d = per.setdefault(int(rank), {})
        d[phase] = d.get(phase, 0) + int(ex) + int(idle)  # whole ns: the sum is exact in any order
    rows = []
    for r in median.sort("rank").iter_rows(named=True):
        ph = {p: v * NS for p, v in per.get(int(r["rank"]), {}).items()}
        rows.append({
            "rank": int(r["rank"]), "step": int(r["step"]), "step_s": r["wall_ns"] * NS,
            "compute_s": r["compute_exposed_ns"] * NS,
            "communication_s": r["comm_exposed_ns"] * NS,
            "memory_s": r["mem_exposed_ns"] * NS,
            "host_s": r["launch_starved_ns"] * NS,
            "idle_s": (r["idle_ns"] - r["launch_starved_ns"]) * NS,
            "phases": dict(sorted(ph.items())),
        })
    return rows


def breakdown(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """The `rank_breakdown` section from its rank rows (`rank_rows`, or the many-rank path's
    summaries): the rows, and with several ranks the slowest one's extra time over the median
    rank and the phase most of it is in."""
    doc: dict[str, Any] = {"ranks": rows, "slowest": None}
    if len(rows) >= 2:
        slow = max(rows, key=lambda x: (x["step_s"], -x["rank"]))
        med = statistics.median(x["step_s"] for x in rows)
        names = sorted({p for x in rows for p in x["phases"]})
        extra = {p: slow["phases"].get(p, 0.0) - statistics.median(x["phases"].get(p, 0.0) for x in rows)
                 for p in names}
        worst = max(extra, key=lambda p: (extra[p], p)) if extra else None
        doc["slowest"] = {"rank": slow["rank"], "extra_s": slow["step_s"] - med,
                          "phase": worst, "phase_extra_s": extra.get(worst) if worst else None}
    return doc


# ----------------------------------------------------------------------------- text


def _ms(s: float) -> str:
    return f"{s * 1e3:,.2f} ms"


def summary_lines(doc: Mapping[str, Any]) -> list[str]:
    """Lines after the phase table: layers, what was not found, the slowest rank."""
    ph = doc.get("phases") or {}
    if not ph:
        return []
    lines = []
    lay = ph.get("layers") or {}
    if lay.get("distinguishable"):
        lines.append(f"layers: {lay['count']} per pass, told apart by {lay['source']}")
    elif lay.get("why"):
        lines.append(f"layers: not told apart ({lay['why']})")
    if ph.get("not_found"):
        lines.append("phases not seen in this trace: " + ", ".join(ph["not_found"]))
    slow = (doc.get("rank_breakdown") or {}).get("slowest")
    if slow and slow.get("phase") and slow["extra_s"] > 0:
        lines.append(f"slowest rank {slow['rank']}: +{_ms(slow['extra_s'])} over the median rank, "
                     f"most of it in {slow['phase']} (+{_ms(slow['phase_extra_s'])})")
    return lines
