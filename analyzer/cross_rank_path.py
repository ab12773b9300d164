"""The median step's critical path across ranks, from the cross-rank reduce's matched collectives
(`moetune.analyzer.cross_rank`): from the step's end on the last-finishing rank, back through each
collective to the rank that arrived last at it, at collective granularity, refined within ranks
by their own critical path (analyzer/critical_path.py) where the caller gives a way to re-read
their full traces (docs/cross-rank.md).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from typing import Any

import numpy as np
import polars as pl
from moetune.analyzer.frames import Trace

MAX_RELOAD = 8  # most ranks whose full trace the critical path re-reads


def cross_rank_path(steps: pl.DataFrame, ai: pl.DataFrame, per: pl.DataFrame,
                    gtab: pl.DataFrame, offsets: dict[int, int], component: dict[int, int],
                    load_rank: Callable[[int], Trace] | None) -> dict[str, Any]:
    """The median step's path across ranks at collective granularity (see docs/cross-rank.md),
    refined within ranks by their own critical path where `load_rank` re-reads their traces.
    `ai`: matched collective instances on aligned clocks; `per`: one row per instance (its last
    arriver); `offsets`, `component`: the alignment's clock offsets and components."""
    if steps.height == 0:
        return {"unobservable": "no analysed step"}
    if per.height == 0:
        return {"unobservable": "no collective matched across ranks: the ranks' paths do not meet"}
    ref = min(component)
    main = [r for r, c in component.items() if c == component[ref]]
    if len(main) < 2:
        return {"unobservable": "the reference rank shares no collective with another rank"}
    off = pl.DataFrame({"rank": main, "_off": [offsets[r] for r in main]},
                       schema={"rank": pl.Int32, "_off": pl.Int64})
    st = steps.join(off, on="rank", how="inner").with_columns(
        a0=pl.col("start_ns") + pl.col("_off").fill_null(0),
        a1=pl.col("end_ns") + pl.col("_off").fill_null(0))
    nr = st.get_column("rank").n_unique()
    common = (st.group_by("step").agg(n=pl.col("rank").n_unique(), lo=pl.col("a0").min(),
                                      hi=pl.col("a1").max())
              .filter(pl.col("n") == nr).with_columns(span=pl.col("hi") - pl.col("lo"))
              .sort("span", "step"))
    if common.height == 0:
        return {"unobservable": "no step id is analysed on every rank aligned with the "
                                "reference rank"}
    step, lo, span = common.row((common.height - 1) // 2, named=True)["step"], \
        common.row((common.height - 1) // 2, named=True)["lo"], \
        common.row((common.height - 1) // 2, named=True)["span"]
    win = st.filter(pl.col("step") == step)
    a0 = dict(zip(win.get_column("rank").to_list(), win.get_column("a0").to_list(), strict=True))
    a1 = dict(zip(win.get_column("rank").to_list(), win.get_column("a1").to_list(), strict=True))
    last_rank = int(win.sort(["a1", "rank"], descending=[True, False]).get_column("rank")[0])
    # This step's collectives on each rank, by aligned end, with the instance's last arriver.
    mine = (ai.join(win.select("rank", "a0", "a1"), on="rank")
            .filter((pl.col("ats") >= pl.col("a0")) & (pl.col("aend") <= pl.col("a1")))
            .join(per.select("gid", "k", "last_any", "last_ats", "n_last"), on=["gid", "k"])
            .join(gtab.select("gid", "group"), on="gid")
            .select("rank", "k", "ats", "aend", "last_any", "last_ats", "n_last", "group")
            .sort("rank", "aend", "ats"))
    by_rank: dict[int, pl.DataFrame] = {}

    def of(r: int) -> pl.DataFrame:
        if r not in by_rank:  # only ranks the walk reaches are split out
            by_rank[r] = mine.filter(pl.col("rank") == r)
        return by_rank[r]

    segs: list[dict[str, Any]] = []
    r, t = last_rank, a1[last_rank]
    cur = {"rank": r, "to": t, "collective_ns": 0, "exit_via": None}
    ties = 0
    for _ in range(mine.height + nr + 1):  # each turn moves t back: bounded by the instances
        c = of(r)
        i = int(np.searchsorted(c.get_column("aend").to_numpy(), t, side="right")) - 1
        while i >= 0 and c.get_column("ats")[i] >= t:  # zero-length or already passed
            i -= 1
        if i < 0:
            break
        row = c.row(i, named=True)
        if row["ats"] == row["last_ats"]:  # this rank came last (alone or tied): its own
            cur["collective_ns"] += row["aend"] - row["ats"]
            t = row["ats"]
            continue
        lr = int(row["last_any"])
        if row["n_last"] > 1:  # several came last together: the lowest of them carries the path
            ties += 1
        cur["collective_ns"] += row["aend"] - row["last_ats"]
        cur["from"] = row["last_ats"]
        segs.append(cur)
        r, t = lr, row["last_ats"]
        cur = {"rank": r, "to": t, "collective_ns": 0,
               "exit_via": {"group": row["group"], "k": int(row["k"])}}
    cur["from"] = max(min(t, a0.get(r, t)), lo)
    segs.append(cur)
    segs.reverse()
    path_ranks: list[int] = []
    for sg in segs:
        if sg["rank"] not in path_ranks:
            path_ranks.append(sg["rank"])
    doc: dict[str, Any] = {
        "step": int(step), "span_s": _s(span), "last_finishing_rank": last_rank,
        "component_ranks": len(main), "ranks": path_ranks, "rank_switches": len(segs) - 1,
        "segments": [{"rank": sg["rank"], "from_s": _s(sg["from"] - lo), "to_s": _s(sg["to"] - lo),
                      "collective_s": _s(sg["collective_ns"]),
                      "work_s": _s(max(0, sg["to"] - sg["from"] - sg["collective_ns"])),
                      "exit_via": sg["exit_via"]} for sg in segs],
        "granularity": "collective",
        "reread_ranks": [],
        "rule": "from the step's end on the last-finishing rank, back through each collective "
                "to the rank that arrived last at it (its start is where the others were "
                "released from); time on a rank between collectives is that rank's work",
    }
    if ties:
        doc["ties"] = ties  # jumps to one of several ranks that arrived last together
    if load_rank is not None:
        _refine(doc, segs, steps, step, lo, offsets, load_rank)
    else:
        doc["note"] = "within-rank segments not refined: no full trace given (load_rank)"
    return doc


def _refine(doc: dict[str, Any], segs: list[dict[str, Any]], steps: pl.DataFrame, step: int,
            lo: int, offsets: dict[int, int], load_rank: Callable[[int], Trace]) -> None:
    """Walls of each segment from its rank's own critical path (analyzer/critical_path.py) of
    the same step, re-reading the full trace of at most MAX_RELOAD path ranks."""
    from moetune.analyzer.classify import classify
    from moetune.analyzer.path_summary import analyze

    ranks = doc["ranks"][:MAX_RELOAD]
    paths: dict[int, list[Any]] = {}
    for r in ranks:
        tr = load_rank(r)
        tr = replace(tr, events=classify(tr.events))
        win = steps.filter((pl.col("rank") == r) & (pl.col("step") == step)).select(
            "rank", "step", win_start_ns="start_ns", win_end_ns="end_ns")
        res = analyze(tr, win, ranks=[r])
        paths[r] = res[0]["path"] if res else []
    for sg, d in zip(segs, doc["segments"], strict=True):
        if sg["rank"] not in paths:
            continue
        o = offsets.get(sg["rank"], 0)
        a, b = sg["from"] - o, sg["to"] - o  # back on the rank's own clock
        walls: dict[str, int] = {}
        for p in paths[sg["rank"]]:
            ov = min(p.end_ns, b) - max(p.start_ns, a)
            if ov > 0:
                walls[p.wall] = walls.get(p.wall, 0) + ov
        d["walls_s"] = {w: _s(v) for w, v in sorted(walls.items())}
    doc["reread_ranks"] = ranks
    doc["granularity"] = "critical_path" if len(ranks) == len(doc["ranks"]) else "mixed"
    if len(ranks) < len(doc["ranks"]):
        doc["note"] = (f"within-rank walls for the first {MAX_RELOAD} path ranks only; the "
                       "others at collective granularity")


def _s(ns: float | int | None) -> float | None:
    return None if ns is None else round(float(ns) / 1e9, 9)
