"""The many-ranks path's reduce (`moetune.scale`): the map's result, and the diagnosis' sections
that speak of every rank, from the summaries (`cross_rank`, `ranks`, `rank_breakdown`) and, for
the ranks the cross-rank critical path crosses, their full traces re-read."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from moetune.errors import UserError

if TYPE_CHECKING:  # polars and the analyzer load on use
    from moetune.analyzer.rank_summary import Summaries


@dataclass
class MapResult:
    """The summaries of every rank and how they were obtained."""

    summaries: Summaries
    files: list[Path]  # in the order given (a file's index is its default rank)
    rank_file: dict[int, Path]  # rank → the file it came from
    rank_in_file: dict[int, int]  # rank → its number in that file (differs where renumbered)
    engine: str  # "cached", "in-process", "local cluster, N workers", "scheduler ADDRESS"
    cache_dir: Path
    computed: int  # files summarised in this run
    cached: int  # files served from the cache
    seconds: float
    worker_peak_rss: dict[str, int] = field(default_factory=dict)  # worker → bytes (Dask only)
    warnings: list[str] = field(default_factory=list)


def load_rank_fn(result: MapResult) -> Callable[[int], Any]:
    """`load_rank(rank) -> Trace` for the reduce: the full trace of one rank, re-read from its
    file (only for the ranks the cross-rank critical path passes through)."""
    from moetune.analyzer.frames import Trace
    from moetune.analyzer.readers import sniff
    from moetune.analyzer.readers.kineto import read_kineto
    from moetune.analyzer.readers.nsys import read_nsys

    index = {f: i for i, f in enumerate(result.files)}

    def load_rank(rank: int) -> Trace:
        import polars as pl

        from moetune.analyzer.run_identity import renumber

        f = result.rank_file.get(int(rank))
        if f is None:
            raise UserError(f"no file holds rank {rank}")
        i, own = index[f], result.rank_in_file[int(rank)]
        t = (read_kineto(f, default_rank=i) if sniff(f) == "kineto"
             else read_nsys(f, first_rank=i))
        if t.ranks.height > 1:  # a multi-rank export: the one rank asked for
            keep = pl.col("rank") == own
            t = Trace(events=t.events.filter(keep), comms=t.comms.filter(keep),
                      flows=t.flows.filter(keep), ranks=t.ranks.filter(keep),
                      memory=t.memory.filter(keep), warnings=t.warnings)
        return t if own == int(rank) else renumber(t, {own: int(rank)})

    return load_rank


def cross_rank_section(result: MapResult) -> dict[str, Any]:
    """`{"cross_rank": {...}}` from the summaries (`moetune.analyzer.cross_rank`)."""
    from moetune.analyzer.cross_rank import cross_rank

    return cross_rank(result.summaries, load_rank=load_rank_fn(result))


def representative_rank(s: Summaries) -> int:
    """The rank whose median step time is the median over ranks (lower median): a typical rank,
    whose full trace stands for the run in the per-step sections of the diagnosis."""
    import polars as pl

    if s.steps.height == 0:
        return int(s.meta.get_column("rank").min())
    per = (s.steps.group_by("rank")
           .agg(((pl.col("end_ns") - pl.col("start_ns")).sort().get(
               (pl.len() - 1) // 2)).alias("t"))
           .sort("t", "rank"))
    return int(per.get_column("rank")[(per.height - 1) // 2])


def ranks_section(s: Summaries, cross: dict[str, Any] | None) -> dict[str, Any]:
    """The diagnosis' `ranks` section (analyzer/ranks.py's figures: step time by rank,
    stragglers, collective arrival skew) over every rank, from the summaries, on the clocks the
    cross-rank reduce aligned, so `ranks` speaks of all ranks as it does in-process."""
    from moetune.analyzer.collectives import match_collectives
    from moetune.analyzer.ranks import arrival_skew, step_time_by_rank, straggler_fields

    al = ((cross or {}).get("cross_rank") or {}).get("alignment") or {}
    offsets = {int(k): int(v) for k, v in (al.get("offsets_ns") or {}).items()}
    inst = s.collectives.select("rank", "group", "k", "ts_ns", "end_ns")
    unlinked: dict[str, int] = {}
    matched = match_collectives(inst, offsets, unlinked)
    st = step_time_by_rank(s.steps)
    # one verdict with the cross-rank view's: ranks that no collective joins are not peers
    why = (((cross or {}).get("cross_rank") or {}).get("stragglers") or {}).get("unobservable")
    return {
        "count": s.meta.height,
        "step_time_s_by_rank": {str(k): round(v, 9) for k, v in st.items()},
        **straggler_fields(st, unobservable=why),
        "collective_arrival_skew_s": arrival_skew(matched),
        "alignment": {"method": al.get("method", "none"),
                      "offsets_ns": {str(k): v for k, v in sorted(offsets.items())},
                      "unaligned": list(al.get("unaligned", []))},
        "unlinked": {"collectives_unmatched": unlinked.get("collectives_unmatched", 0),
                     "collectives": inst.height},
    }


def rank_breakdown_section(s: Summaries) -> dict[str, Any]:
    """`{"rank_breakdown": …}` over every rank, from the summaries' `phases` tables (each rank's
    median step by part and by phase), as analyzer/phases.py gives it for the ranks it reads."""
    from moetune.analyzer.phases import breakdown

    rows = []
    t = s.phases
    for rank in sorted(set(t.get_column("rank").to_list())):
        r = t.filter(t.get_column("rank") == rank)
        part = {n: v for k, n, v in r.select("kind", "name", "s").iter_rows() if k == "part"}
        rows.append({"rank": int(rank), "step": int(r.get_column("step")[0]),
                     **{f"{k}_s": part.get(k, 0.0) for k in ("step", "compute", "communication",
                                                             "memory", "host", "idle")},
                     "phases": {n: v for k, n, v in r.select("kind", "name", "s").iter_rows()
                                if k == "phase"}})
    return {"rank_breakdown": breakdown(rows)}


def cross_rank_lines(doc: dict[str, Any]) -> list[str]:
    """The terminal's lines for the `cross_rank` section."""
    from moetune.analyzer.cross_rank import summary_lines

    return list(summary_lines(doc)) if doc.get("cross_rank") else []


def inputs(result: MapResult) -> list[dict[str, Any]]:
    """The diagnosis' `inputs`: one entry per file, from the summaries' meta."""
    by: dict[str, dict[str, Any]] = {}
    for r in result.summaries.meta.sort("rank").iter_rows(named=True):
        e = by.setdefault(r["file"], {"file": r["file"], "format": r["format"], "ranks": [],
                                      "bytes": int(r["bytes"]), "sha256": r["sha256"]})
        e["ranks"].append(int(r["rank"]))
    return [by[k] for k in sorted(by)]

