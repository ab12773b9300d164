"""Cross-rank view: clock alignment, per-rank step time, stragglers, collective arrival skew.

Alignment (offset added to a rank's ts to put it on rank `ref`'s clock, ref = lowest rank):
1. `session_start`: readers set `ranks.clock_offset_ns` (nsys TARGET_INFO_SESSION_START_TIME);
   used when any rank has a non-zero offset.
2. `collective_end`: the members of one collective finish together (the last arrival releases
   everyone, and the ring completes on all ranks within microseconds), so for every collective
   instance matched across two ranks (`moetune.analyzer.graph.match_collectives`: same group, same index
   k) end_ref − end_r estimates the offset; the median over instances is kept. Ranks that share
   no matched collective with an aligned rank stay unaligned (offset 0, listed).
3. `none`: one rank, or nothing to match.

Stragglers: robust z-score of per-rank median step time, z = 0.6745·(x − median)/MAD, flagged
when z > 3.5 (Iglewicz–Hoaglin); MAD is floored at 1 % of the median so identical ranks do not
divide by zero. Needs ≥ 3 ranks (with 2 ranks neither can be told apart as the outlier).

Arrival skew of a collective instance = max − min of its members' aligned start times. For the
MoE all-to-all this is the proxy for expert-load imbalance upstream of the dispatch; the rank
that arrives last most often is reported per group (`last_arrival`).
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass, field

import polars as pl
from moetune.analyzer.frames import Trace
from moetune.analyzer.graph import collective_instances, match_collectives, wall_of

Z_THRESHOLD = 3.5
MAD_FLOOR = 0.01
MIN_RANKS_FOR_STRAGGLERS = 3


@dataclass(frozen=True, slots=True)
class Alignment:
    method: str  # session_start | collective_end | none
    offsets_ns: dict[int, int]
    unaligned: tuple[int, ...] = ()
    pairs: dict[int, int] = field(default_factory=dict)  # rank → instances used


def _instances(trace: Trace) -> pl.DataFrame:
    """Communication kernels numbered per (rank, group), node = event row index."""
    lf = trace.events.lazy().with_row_index("node").filter(
        pl.col("kind") == "kernel")
    if "wall" in trace.events.columns:  # classified: only communication kernels are numbered
        lf = lf.filter(pl.col("wall") == "communication")
    gpu = lf.with_columns(pl.col("node").cast(pl.Int64)).collect()
    gpu = gpu.with_columns(wall=wall_of(gpu), end_ns=pl.col("ts_ns") + pl.col("dur_ns"))
    return collective_instances(gpu, trace.comms)


def align_clocks(trace: Trace, *, instances: pl.DataFrame | None = None) -> Alignment:
    """Offsets (ns) that put every rank on the lowest rank's clock; see module docstring."""
    ranks = trace.events.get_column("rank").drop_nulls().unique().sort().to_list()
    if len(ranks) < 2:
        return Alignment("none", dict.fromkeys(ranks, 0))
    r = trace.ranks
    if r.height and "clock_offset_ns" in r.columns:
        offs = {int(a): int(b or 0) for a, b in r.select("rank", "clock_offset_ns").iter_rows()}
        if any(offs.get(k, 0) for k in ranks):
            base = offs.get(ranks[0], 0)
            return Alignment("session_start", {k: offs.get(k, 0) - base for k in ranks})
    inst = _instances(trace) if instances is None else instances
    m = match_collectives(inst, {})
    if m.height == 0:
        return Alignment("none", dict.fromkeys(ranks, 0), unaligned=tuple(ranks[1:]))
    ends = m.select("group", "k", "rank", "end_ns")
    pair = ends.join(ends, on=["group", "k"], suffix="_b").filter(pl.col("rank") != pl.col("rank_b"))
    # est[(a, b)] = median(end_a − end_b): add to b's clock to reach a's.
    est_df = pair.group_by("rank", "rank_b").agg(
        d=(pl.col("end_ns") - pl.col("end_ns_b")).median(), n=pl.len())
    est = {(a, b): (round(d), n) for a, b, d, n in est_df.iter_rows()}
    offsets = {ranks[0]: 0}
    used: dict[int, int] = {}
    frontier = [ranks[0]]
    while frontier:  # BFS over ranks that share collectives: bounded by ranks²
        a = frontier.pop(0)
        for b in ranks:
            if b not in offsets and (a, b) in est:
                d, n = est[(a, b)]
                offsets[b] = offsets[a] + d
                used[b] = n
                frontier.append(b)
    unaligned = tuple(k for k in ranks if k not in offsets)
    for k in unaligned:
        offsets[k] = 0
    return Alignment("collective_end", dict(sorted(offsets.items())), unaligned, used)


def step_time_by_rank(steps: pl.DataFrame) -> dict[int, float]:
    """Median step wall time (s) per rank from a steps table (GPU windows when present)."""
    lo, hi = ("win_start_ns", "win_end_ns") if "win_start_ns" in steps.columns else (
        "start_ns", "end_ns")
    t = steps.group_by("rank").agg(((pl.col(hi) - pl.col(lo)).median() / 1e9).alias("s"))
    return {int(a): float(b) for a, b in t.sort("rank").iter_rows()}


def stragglers(step_s: dict[int, float]) -> tuple[list[int], dict[int, float]]:
    """Ranks whose robust z-score exceeds Z_THRESHOLD, and every rank's z."""
    if len(step_s) < MIN_RANKS_FOR_STRAGGLERS:
        return [], {}
    xs = list(step_s.values())
    med = statistics.median(xs)
    mad = statistics.median(abs(x - med) for x in xs)
    scale = max(mad, MAD_FLOOR * abs(med)) or 1e-12
    z = {k: round(0.6745 * (x - med) / scale, 3) for k, x in step_s.items()}
    return sorted(k for k, v in z.items() if v > Z_THRESHOLD), z


def arrival_skew(matched: pl.DataFrame) -> dict:
    """Start-time spread of each matched collective instance across its members (aligned)."""
    inst = matched.filter(pl.col("members") >= 2).group_by("group", "k").agg(
        skew=pl.col("ats_ns").max() - pl.col("ats_ns").min(),
        last=pl.col("rank").sort_by("ats_ns").last(),
    ).with_columns(last=pl.when(pl.col("skew") > 0).then("last"))  # no last in a tie
    if inst.height == 0:
        return {"p50": None, "max": None, "instances": 0, "by_collective": {}}
    by = {}
    for g, part in inst.sort("group", "k").group_by("group", maintain_order=True):
        sk = part.get_column("skew").to_list()
        last = part.get_column("last").drop_nulls().value_counts(sort=True)
        by[str(g[0])] = {
            "count": part.height,
            "p50": _s(statistics.median(sk)),
            "max": _s(max(sk)),
            "last_arrival": {str(r): int(c) for r, c in last.iter_rows()},
        }
    sk = inst.get_column("skew").to_list()
    return {"p50": _s(statistics.median(sk)), "max": _s(max(sk)), "instances": inst.height,
            "by_collective": by}


def ranks_section(trace: Trace, steps: pl.DataFrame | None = None) -> dict[str, dict]:
    """`{"ranks": {...}}` for the diagnosis document (paths read by rules: ranks.count,
    ranks.step_time_s_by_rank, ranks.stragglers, ranks.collective_arrival_skew_s)."""
    if steps is None:
        from moetune.analyzer.steps import find_steps

        steps = find_steps(trace.events).table
    ranks = trace.events.get_column("rank").drop_nulls().unique().sort().to_list()
    inst = _instances(trace)
    al = align_clocks(trace, instances=inst)
    unlinked: dict[str, int] = {}
    matched = match_collectives(inst, al.offsets_ns, unlinked)
    st = step_time_by_rank(steps)
    strag, z = stragglers(st)
    return {
        "ranks": {
            "count": len(ranks),
            "step_time_s_by_rank": {str(k): round(v, 9) for k, v in st.items()},
            "stragglers": strag,
            "straggler_rule": f"robust z > {Z_THRESHOLD} (MAD floor {MAD_FLOOR:.0%} of median)",
            "robust_z": {str(k): v for k, v in z.items()},
            "collective_arrival_skew_s": arrival_skew(matched),
            "alignment": {
                "method": al.method,
                "offsets_ns": {str(k): v for k, v in al.offsets_ns.items()},
                "unaligned": list(al.unaligned),
            },
            "unlinked": {"collectives_unmatched": unlinked.get("collectives_unmatched", 0),
                         "collectives": inst.height},
        }
    }


def summary_lines(section: dict[str, dict]) -> list[str]:
    r = section.get("ranks")
    if not r or r["count"] < 2:
        return []
    sk = r["collective_arrival_skew_s"]
    lines = [f"ranks: {r['count']} · alignment {r['alignment']['method']} · stragglers: "
             + (", ".join(map(str, r["stragglers"])) or "none")]
    if sk["p50"] is not None:
        lines.append(f"  collective arrival skew p50 {sk['p50'] * 1e6:.1f} µs, max "
                     f"{sk['max'] * 1e6:.1f} µs over {sk['instances']} collectives")
    return lines


def _s(ns: float) -> float:
    return round(ns / 1e9, 9)
