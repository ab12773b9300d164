"""Run identity: are the files given as ranks really ranks of one run?

Several trace files are merged as ranks of one job only when nothing they carry says otherwise.
Evidence, each read from the files themselves (never from their names):

- rank: two files claiming the same rank from their own metadata (Kineto `distributedInfo.rank`,
  nsys `ncclCommInitRank`) are two runs, or one rank given twice;
- world size: declared world sizes that differ, or more ranks than a declared world size holds;
- distributed or not: a Kineto file with `distributedInfo` beside one without (PyTorch writes it
  in every process of an initialised process group, so the second was no member of one);
- time: ranks of one job are profiled together, so on a wall clock (Kineto
  `baseTimeNanoseconds` + ts, nsys session start + ts; a time after 2001 in ns is taken as one)
  their capture windows overlap. Windows further apart than two hosts' clocks can disagree are
  two runs; windows that do not overlap at all, captured by the same host process id, are one
  process profiled twice;
- step numbering: `ProfilerStep#N` ids count the same training iterations on every rank, so two
  files whose step ids share none cannot be compared step by step.

Where the evidence is absent (no metadata, clocks that are not wall clocks) nothing is refused:
the files stay ranks in the order given. Process names and hosts are not evidence: they differ
between ranks of one job (`pyper:trainer:0:0`, `pyper:trainer:8:2`) and are equal across
unrelated runs (`python3`).

Ranks the files do not declare are numbered in the order given; one that would collide with a
rank already taken gets the lowest free number instead.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path

import polars as pl
from moetune.analyzer.classify import load_classes
from moetune.analyzer.frames import Trace

from moetune.errors import UserError

ABSOLUTE_NS = 10**18  # 2001-09-09 in ns since the epoch: later times are wall-clock times
# Two hosts' wall clocks: Kineto's base time is whole seconds, NTP keeps hosts within ms.
CLOCK_SLACK_NS = 2 * 10**9
DECLARED = ("distributedInfo", "nccl")  # `ranks.rank_from` values a file itself asserts
HOST_KINDS = ("cpu_op", "runtime", "annotation")
REFUSED = "; pass the rank files of one run, or diagnose --allow-mixed-runs to merge them anyway"


@dataclass(frozen=True, slots=True)
class Part:
    """What one file says about who captured it."""

    file: str
    ranks: tuple[int, ...]
    declared: bool  # the ranks come from the file's own metadata
    world: int | None  # declared world size
    distributed: bool | None  # Kineto: has distributedInfo with a rank; nsys: None (unknown)
    span: tuple[int, int] | None  # capture window on a wall clock (ns), when it has one
    pids: frozenset[int]  # host process ids
    steps: frozenset[int]  # ProfilerStep ids


def part_of(trace: Trace, file: str | Path) -> Part:
    """The identity evidence of one file's Trace."""
    r = trace.ranks
    declared = r.height > 0 and r["rank_from"].is_in(list(DECLARED)).all()
    worlds = r.filter(pl.col("rank_from").is_in(list(DECLARED)))["world_size"].drop_nulls()
    fmt = r["format"].drop_nulls()
    distributed = None
    if fmt.len() and (fmt == "kineto").all():
        distributed = bool((r["rank_from"] == "distributedInfo").all())
    offset = int(r["clock_offset_ns"].fill_null(0).max() or 0) if r.height else 0
    ev = trace.events
    lo, hi = ev.select(pl.col("ts_ns").min().alias("lo"),
                       (pl.col("ts_ns") + pl.col("dur_ns")).max().alias("hi")).row(0)
    span = None
    if lo is not None and hi is not None and lo + offset >= ABSOLUTE_NS:
        span = (int(lo + offset), int(hi + offset))
    host = ev.lazy().filter(pl.col("kind").is_in(HOST_KINDS))
    pids = host.select(pl.col("pid").drop_nulls().unique()).collect()["pid"].to_list()
    pattern = load_classes().steps.get("profiler_step", r"^ProfilerStep#(\d+)$")
    steps = (host.filter(pl.col("kind") == "annotation")
             .select(pl.col("name").str.extract(pattern, 1).cast(pl.Int64, strict=False)
                     .drop_nulls().unique().alias("s"))
             .collect()["s"].to_list())
    return Part(
        file=str(file), ranks=tuple(sorted(r["rank"].to_list())), declared=declared,
        world=int(worlds.max()) if worlds.len() else None, distributed=distributed, span=span,
        pids=frozenset(int(p) for p in pids), steps=frozenset(int(s) for s in steps),
    )


def conflict(a: Part, b: Part) -> str | None:
    """Why `a` and `b` cannot be ranks of one run, or None when nothing says so."""
    if a.declared and b.declared:
        both = sorted(set(a.ranks) & set(b.ranks))
        if both:
            return f"both are rank {_ids(both)}"
    if a.world is not None and b.world is not None and a.world != b.world:
        return f"world sizes differ ({a.world} and {b.world})"
    if a.distributed is not None and b.distributed is not None and a.distributed != b.distributed:
        first, second = ("the first", "the second") if a.distributed else ("the second", "the first")
        return (f"{first} has distributedInfo (a process of a distributed job), {second} has "
                "none")
    if a.span is not None and b.span is not None:
        gap = max(a.span[0], b.span[0]) - min(a.span[1], b.span[1])
        if gap > CLOCK_SLACK_NS:
            return f"captured {_duration(gap)} apart (ranks of one job are profiled together)"
        same = sorted(a.pids & b.pids)
        if gap > 0 and same:
            return (f"one host process (pid {same[0]}) captured twice, {_duration(gap)} apart "
                    "(a rank is one process, profiled once)")
    if a.steps and b.steps and not a.steps & b.steps:
        return (f"their profiler steps share no id ({_ids(sorted(a.steps))} and "
                f"{_ids(sorted(b.steps))})")
    return None


def too_many(parts: Sequence[Part], ranks: Sequence[int]) -> str | None:
    """More ranks than a declared world size holds, or a rank beyond it."""
    ids = sorted(set(ranks))
    for p in parts:
        if p.world is not None and ids and (len(ids) > p.world or ids[-1] >= p.world):
            return (f"{p.file} declares world size {p.world}, but the inputs hold "
                    f"{len(ids)} ranks ({_ids(ids)})")
    return None


def one_run(traces: Sequence[Trace], files: Sequence[str | Path], *, allow_mixed: bool = False
            ) -> tuple[list[Trace], tuple[str, ...]]:
    """The traces of several files as ranks of one run: undeclared ranks numbered without
    collisions. Files that cannot be ranks of one run are a UserError naming them, unless
    `allow_mixed` (then a warning says what was merged, and colliding ranks are renumbered)."""
    if len(traces) < 2:
        return list(traces), ()
    parts = [part_of(t, f) for t, f in zip(traces, files, strict=True)]
    first = next(((a, b, why) for i, a in enumerate(parts) for b in parts[i + 1:]
                  if (why := conflict(a, b)) is not None), None)
    text = f"{first[0].file} and {first[1].file} are not ranks of one run: {first[2]}" if first else None
    if text and not allow_mixed:
        raise UserError(text + REFUSED)
    out, renumbered = _renumber_all(list(traces), parts)
    if text is None and (why := too_many(parts, [r for t in out for r in t.ranks["rank"].to_list()])):
        text = f"not ranks of one run: {why}"
        if not allow_mixed:
            raise UserError(text + REFUSED)
    merged = [f"{text}; analysed together as asked (--allow-mixed-runs)"] if text else []
    return out, tuple(merged + renumbered)


def _renumber_all(traces: list[Trace], parts: list[Part]) -> tuple[list[Trace], list[str]]:
    """Declared ranks stay (the first file keeps a rank two files declare); other ranks keep
    their given number when free, else take the lowest free ones. Notes name the declared ranks
    moved (only files merged with --allow-mixed-runs declare a taken rank)."""
    taken: set[int] = set()
    keep = [False] * len(parts)
    for i, p in enumerate(parts):
        if p.declared and not set(p.ranks) & taken:
            taken |= set(p.ranks)
            keep[i] = True
    notes: list[str] = []
    for i, p in enumerate(parts):
        if keep[i]:
            continue
        if not set(p.ranks) & taken:
            taken |= set(p.ranks)
            continue
        free = (n for n in range(len(taken) + len(p.ranks) + 1) if n not in taken)
        mapping = {old: next(free) for old in p.ranks}
        taken |= set(mapping.values())
        traces[i] = renumber(traces[i], mapping)
        if p.declared:
            moved = ", ".join(f"{o} → {n}" for o, n in mapping.items())
            notes.append(f"{p.file}: rank {moved} (its rank was taken by an earlier file)")
    return traces, notes


def renumber(trace: Trace, mapping: dict[int, int]) -> Trace:
    """The same Trace with its ranks renamed by `mapping`."""
    old, new = list(mapping), list(mapping.values())

    def ranked(df: pl.DataFrame) -> pl.DataFrame:
        if not df.height:
            return df
        return df.with_columns(pl.col("rank").replace(old, new).cast(pl.Int32))

    return replace(trace, events=ranked(trace.events), comms=ranked(trace.comms),
                   flows=ranked(trace.flows), ranks=ranked(trace.ranks).sort("rank"),
                   memory=ranked(trace.memory))


def _ids(ids: list[int]) -> str:
    if len(ids) > 2 and ids == list(range(ids[0], ids[-1] + 1)):
        return f"{ids[0]}–{ids[-1]}"
    return ", ".join(map(str, ids))


def _duration(ns: int) -> str:
    s = ns / 1e9
    if s >= 86400:
        return f"{s / 86400:,.0f} days"
    if s >= 3600:
        return f"{s / 3600:.1f} h"
    return f"{s:,.1f} s" if s >= 1 else f"{s * 1e3:.0f} ms"

