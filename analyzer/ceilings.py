"""Gain ceilings of the walls: what removing a wall's time would gain, by the what-if replay.

A wall's recoverable time R is the step time its removal saves: the step's graph
(`moetune.analyzer.episode`) replayed with that wall's durations set to zero, against
the untouched replay (`R = T · (1 − replay(without) / replay(untouched))`, so the replay's own
error cancels as in the what-if estimates), and the ceiling is T/(T−R)−1. Interval rules on the
critical path cannot say this: time a wall holds on the path may hide other work that then takes
its place (a kernel that ran during host time still has to run when the host is instant), and
time off the path may be what the path would move to.

- compute, communication, memory: the GPU ops of that wall take no time;
- host: host calls, the CPU time between them and the launch latency take none (every host
  thread's first call starts at the step's start), so each GPU op waits only for what it depends
  on: its stream, the events it waits on, and the host's waits on the GPU (a sync still ends
  when the op it waited for ends).
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import polars as pl
from moetune.analyzer.episode import Episode, episode
from moetune.analyzer.event_walls import wall_of
from moetune.analyzer.frames import Trace
from moetune.analyzer.graph import TimelineGraph
from moetune.analyzer.replay import Edit, replay, untouched

from moetune.vocabulary import WALLS

BASIS = ("what-if replay of the step's graph with the wall's durations set to zero (host: host "
         "calls, the CPU time between them and launch latency), against the untouched replay")


def recoverable_ns(trace: Trace, rank: int, start_ns: int, end_ns: int,
                   graph: TimelineGraph | None = None) -> tuple[dict[str, float], float] | None:
    """(R per wall in ns, the untouched replay's length / the measured step) for one step
    window of one rank; None when the window has no GPU op. `trace.events` classified;
    `graph`: the timeline graph already built on them over the window, if any."""
    ep = episode(trace, trace.events, rank, start_ns, end_ns, graph=graph)
    if ep is None:
        return None
    walls = np.array(wall_of(trace.events[ep.ids.tolist()]).to_list(), dtype=object)
    base = replay(ep, untouched(ep))
    measured = float(end_ns - start_ns)
    out = {}
    for w in WALLS:
        ep_w, edit = _without(ep, walls, w)
        r = replay(ep_w, edit)
        out[w] = min(max(measured * (1 - r / base), 0.0), measured) if base > 0 else 0.0
    return out, (base / measured if measured else 1.0)


def _without(ep: Episode, walls: np.ndarray, wall: str) -> tuple[Episode, Edit]:
    """The episode and the edit that take `wall`'s time away."""
    e = untouched(ep)
    if wall != "host":
        e.dur[ep.is_gpu & (walls == wall)] = 0.0
        return ep, e
    host = ~ep.is_gpu
    e.dur[host] = 0.0
    e.gap[host] = 0.0
    # a host call with no predecessor in the step starts at its measured time: at zero host
    # time every thread's first call is at the step's start
    roots = host & (np.diff(ep.pred_ptr) == 0)
    ts = ep.ts.copy()
    ts[roots] = ep.start_ns
    return replace(ep, ts=ts, lat_typ=0), e


def mean_recoverable(trace: Trace, windows: pl.DataFrame, graph: TimelineGraph | None = None
                     ) -> tuple[dict[str, float], float] | None:
    """R per wall (ns) and the replay's fidelity, each averaged over `windows` (rank, step,
    start_ns, end_ns: the median step of each rank); None when no window replays."""
    got = [x for rank, _step, lo, hi in windows.iter_rows()
           if (x := recoverable_ns(trace, int(rank), int(lo), int(hi), graph)) is not None]
    if not got:
        return None
    return ({w: sum(r[w] for r, _ in got) / len(got) for w in WALLS},
            sum(f for _, f in got) / len(got))
