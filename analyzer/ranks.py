"""Cross-rank view: per-rank step time, stragglers, collective arrival skew, on clocks aligned by
`moetune.analyzer.clocks` (alignment method and offsets are reported here too).

Stragglers: robust z-score of per-rank median step time, z = 0.6745·(x − median)/MAD, flagged
when z > 3.5 (Iglewicz–Hoaglin); MAD is floored at 1 % of the median so identical ranks do not
divide by zero. Needs ≥ 3 ranks (with 2 ranks neither can be told apart as the outlier): with
fewer the verdict is unobservable (`stragglers` null, `stragglers_unobservable` says why), never
"none".

Arrival skew of a collective instance = max − min of its members' aligned start times. For the
MoE all-to-all this is the proxy for expert-load imbalance upstream of the dispatch; the rank
that arrives last most often is reported per group (`last_arrival`).
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import polars as pl
from moetune.analyzer.clocks import align_clocks
from moetune.analyzer.collectives import comm_instances, match_collectives
from moetune.analyzer.frames import Trace
from moetune.analyzer.steps import find_steps

Z_THRESHOLD = 3.5
MAD_FLOOR = 0.01
MIN_RANKS_FOR_STRAGGLERS = 3


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


def straggler_fields(step_s: dict[int, float], *, unobservable: str | None = None
                     ) -> dict[str, Any]:
    """The `ranks` section's straggler verdict: `stragglers` (the flagged ranks), the rule and
    every rank's z. Where it cannot be judged (fewer than MIN_RANKS_FOR_STRAGGLERS ranks with a
    step time, or `unobservable`: the caller's reason) `stragglers` is null and
    `stragglers_unobservable` says why: "none" would claim a comparison that was not made."""
    rule = f"robust z > {Z_THRESHOLD} (MAD floor {MAD_FLOOR:.0%} of median)"
    n = len(step_s)
    if unobservable is None and n < MIN_RANKS_FOR_STRAGGLERS:
        unobservable = (f"{n} rank{'s' if n != 1 else ''} with a step time: it takes "
                        f"{MIN_RANKS_FOR_STRAGGLERS} to tell an outlier from its peers")
    if unobservable is not None:
        return {"stragglers": None, "stragglers_unobservable": unobservable,
                "straggler_rule": rule, "robust_z": {}}
    strag, z = stragglers(step_s)
    return {"stragglers": strag, "straggler_rule": rule,
            "robust_z": {str(k): v for k, v in z.items()}}


def straggler_text(r: dict[str, Any]) -> str:
    """The straggler verdict in words: the ranks, "none", or "unobservable (why)"."""
    if r.get("stragglers") is None:
        return f"unobservable ({r.get('stragglers_unobservable') or 'no verdict'})"
    return ", ".join(map(str, r["stragglers"])) or "none"


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


def ranks_section(trace: Trace, steps: pl.DataFrame | None = None,
                  skipped: Sequence[tuple[int, str]] = ()) -> dict[str, dict]:
    """`{"ranks": {...}}` for the diagnosis document (paths read by rules: ranks.count,
    ranks.step_time_s_by_rank, ranks.stragglers, ranks.collective_arrival_skew_s).
    `skipped`: (rank, why) of ranks with no analysed step (`steps.Steps.skipped`)."""
    if steps is None:
        found = find_steps(trace.events)
        steps, skipped = found.table, found.skipped
    ranks = trace.events.get_column("rank").drop_nulls().unique().sort().to_list()
    inst = comm_instances(trace)
    al = align_clocks(trace, instances=inst)
    unlinked: dict[str, int] = {}
    matched = match_collectives(inst, al.offsets_ns, unlinked)
    st = step_time_by_rank(steps)
    # peers: the ranks on the reference rank's clock (one clock, or joined by collectives), as
    # the cross-rank view judges them (analyzer/cross_rank.py)
    peers = {k: v for k, v in st.items() if k not in al.unaligned}
    why = (f"no {MIN_RANKS_FOR_STRAGGLERS} ranks joined by collectives to compare"
           if len(st) >= MIN_RANKS_FOR_STRAGGLERS > len(peers) else None)
    out: dict[str, dict] = {
        "ranks": {
            "count": len(ranks),
            "step_time_s_by_rank": {str(k): round(v, 9) for k, v in st.items()},
            **straggler_fields(peers, unobservable=why),
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
    if why is None and len(peers) < len(st):
        out["ranks"]["ranks_not_judged"] = len(st) - len(peers)  # on no shared clock
    if skipped:  # ranks with GPU work and no analysed step, each with why
        out["ranks"]["skipped"] = [{"rank": int(r), "file": _file_of(trace, r), "reason": why}
                                   for r, why in skipped]
    return out


def summary_lines(section: dict[str, dict]) -> list[str]:
    r = section.get("ranks")
    if not r or r["count"] < 2:
        return []
    sk = r["collective_arrival_skew_s"]
    skipped = r.get("skipped") or []
    n = len(section.get("ranks_analyzed") or [])
    analysed = f" ({n} analysed)" if skipped and n else ""
    # beside the cross-rank view (which also judges compute time) this rule is named
    rule = " by step time" if section.get("cross_rank") else ""
    lines = [f"ranks: {r['count']}{analysed} · alignment {r['alignment']['method']} · "
             f"stragglers{rule}: " + straggler_text(r)]
    lines += [f"  rank {s['rank']} ({s['file']}) not analysed: {s['reason']}" for s in skipped]
    if sk["p50"] is not None:
        lines.append(f"  collective arrival skew p50 {sk['p50'] * 1e6:.1f} µs, max "
                     f"{sk['max'] * 1e6:.1f} µs over {sk['instances']} collectives")
    return lines


def _file_of(trace: Trace, rank: int) -> str | None:
    """The file name (no directories) a rank came from."""
    src = trace.ranks.filter(pl.col("rank") == rank)["source"].drop_nulls()
    return Path(src[0]).name if src.len() else None


def _s(ns: float) -> float:
    return round(ns / 1e9, 9)
