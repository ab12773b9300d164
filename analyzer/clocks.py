"""Rank clock alignment: the offset added to each rank's timestamps to put it on the lowest rank's
clock (ref = lowest rank).

1. `session_start`: readers set `ranks.clock_offset_ns` (nsys TARGET_INFO_SESSION_START_TIME);
   used when any rank has a non-zero offset.
2. `collective_end`: the members of one collective finish together (the last arrival releases
   everyone, and the ring completes on all ranks within microseconds), so for every collective
   instance matched across two ranks (`moetune.analyzer.collectives.match_collectives`: same
   group, same index k) end_ref − end_r estimates the offset; the median over instances is kept.
   Ranks that share no matched collective with an aligned rank stay unaligned (offset 0, listed).
3. `none`: one rank, or nothing to match.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import polars as pl
from moetune.analyzer.collectives import comm_instances, match_collectives
from moetune.analyzer.frames import Trace


@dataclass(frozen=True, slots=True)
class Alignment:
    method: str  # session_start | collective_end | none
    offsets_ns: dict[int, int]
    unaligned: tuple[int, ...] = ()
    pairs: dict[int, int] = field(default_factory=dict)  # rank → instances used


def align_clocks(trace: Trace, *, instances: pl.DataFrame | None = None) -> Alignment:
    """Offsets (ns) that put every rank on the lowest rank's clock; see the module docstring.
    `instances`: `comm_instances(trace)` when the caller has them already."""
    ranks = trace.events.get_column("rank").drop_nulls().unique().sort().to_list()
    if len(ranks) < 2:
        return Alignment("none", dict.fromkeys(ranks, 0))
    r = trace.ranks
    if r.height and "clock_offset_ns" in r.columns:
        offs = {int(a): int(b or 0) for a, b in r.select("rank", "clock_offset_ns").iter_rows()}
        if any(offs.get(k, 0) for k in ranks):
            base = offs.get(ranks[0], 0)
            return Alignment("session_start", {k: offs.get(k, 0) - base for k in ranks})
    inst = comm_instances(trace) if instances is None else instances
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
