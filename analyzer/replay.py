"""The what-if replay: an Episode (analyzer/episode.py) run in topological order with its
measured durations and gaps, or with a transform's edits to them (the approach of Daydream, USENIX
ATC 2020, and Lumos, MLSys 2025):

- a GPU op starts when its launch has happened (launch call start + the op's own launch latency,
  capped at the typical one) and its stream and event-wait predecessors have ended;
- a host call starts after its program-order predecessor ended plus the CPU time measured between
  the two (Python and framework work that has no node of its own); a blocking call ends after the
  op it waited on ended plus its measured tail.

Replaying the untouched step reproduces the measured step up to the replay's own error; an `Edit`
changes durations and gaps (the primitives of Daydream: remove, scale, merge).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from moetune.analyzer.episode import Episode

try:  # the compiled replay (setup.py); `_replay_py` is the same loop in Python
    from moetune.analyzer._graph_loops import replay as _replay_c
except ImportError:  # pragma: no cover - built at install; a machine without a compiler
    _replay_c = None


@dataclass
class Edit:
    """Per-node changes a transform makes: new GPU durations, host time factors, launch-free ops,
    host calls that no longer block."""

    dur: np.ndarray          # new duration of every node (GPU op or host call)
    gap: np.ndarray          # factor on the CPU time before a host call (after its predecessor)
    no_launch: np.ndarray    # GPU op no longer waits for its launch (graph replay)
    # host call no longer waits on the GPU op it synced on (removed work: a sync re-run by
    # recompute would otherwise still drain the GPU queue); None = every call blocks as measured
    no_wait: np.ndarray | None = None


def _unbound(edit: Edit) -> np.ndarray:
    """One flag per node for the replay: a GPU op free of its launch, a host call of its sync."""
    free = edit.no_launch.astype(bool)
    return (free | edit.no_wait.astype(bool) if edit.no_wait is not None else free).astype(np.uint8)


def untouched(ep: Episode) -> Edit:
    n = len(ep.ids)
    return Edit((ep.te - ep.ts).astype(np.float64), np.ones(n), np.zeros(n, dtype=bool))


def replay(ep: Episode, edit: Edit, host_scale: float = 1.0) -> float:
    """The step's length (ns) when its graph runs with the edited durations and gaps; host call
    durations and the CPU time between calls are further scaled by `host_scale`. Compiled
    (`_graph_loops.replay`) where built, else `_replay_py`: the same loop, equal floats."""
    if _replay_c is None:
        return _replay_py(ep, edit, host_scale)
    return _replay_c(ep.ts, ep.te, ep.is_gpu.astype(np.uint8), edit.dur.astype(np.float64),
                     edit.gap.astype(np.float64), _unbound(edit), ep.pred_ptr,
                     ep.pred_src, ep.pred_kind, int(ep.start_ns), int(ep.lat_typ),
                     float(host_scale))


def _replay_py(ep: Episode, edit: Edit, host_scale: float = 1.0) -> float:
    """`replay`'s loop in Python (the compiled one mirrors it, operation for operation)."""
    n = len(ep.ids)
    start = [0.0] * n
    end = [0.0] * n
    ts, te, is_gpu = ep.ts.tolist(), ep.te.tolist(), ep.is_gpu.tolist()
    dur, gapf, free = edit.dur.tolist(), edit.gap.tolist(), _unbound(edit).tolist()
    lat = ep.lat_typ
    for i in range(n):
        preds = ep.preds[i]
        ready = float(ts[i] - ep.start_ns) if not preds else 0.0
        if is_gpu[i]:
            for p, k in preds:
                if k == "launch":
                    if free[i]:
                        continue
                    r = start[p] + min(max(ts[i] - ts[p], 0), lat)
                else:  # stream, event_wait, collective: after the predecessor ended
                    r = end[p]
                if r > ready:
                    ready = r
            start[i] = ready
            end[i] = ready + dur[i]
            continue
        waited = 0.0
        blocked_until = ts[i]
        # Of several host predecessors (program order and a hand-off from another thread), the
        # one that ended last released the call: only its gap is CPU work, the others' gaps
        # were waiting for it.
        binding, last = -1, -1
        for p, k in preds:
            if k == "host" and te[p] > last:
                binding, last = p, te[p]
        for p, k in preds:
            if k == "sync":
                if free[i]:  # removed: it no longer waits
                    continue
                waited = max(waited, end[p])
                blocked_until = max(blocked_until, te[p])
            else:
                gap = max(ts[i] - te[p], 0) * gapf[i] * host_scale if p == binding else 0.0
                ready = max(ready, end[p] + gap)
        start[i] = ready
        own = dur[i] * host_scale
        if blocked_until > ts[i]:  # it blocked: own time is the tail after the awaited op ended
            tail = max(te[i] - blocked_until, 0) * (own / max(te[i] - ts[i], 1))
            end[i] = max(ready, waited) + tail
        else:
            end[i] = max(ready + own, waited)
    return max(end) if n else 0.0


def host_scale_for(ep: Episode, reference_ns: float, base_ns: float) -> float:
    """The factor on host time that makes the untouched replay last `reference_ns`: a profiled
    step is slower than the run's unprofiled one, and the profiler's cost is host time (per-op
    bookkeeping), so the host work is scaled to the step time the run's log measured."""
    if not reference_ns or reference_ns >= base_ns:
        return 1.0
    lo, hi = 0.05, 1.0
    e = untouched(ep)
    for _ in range(12):  # bisection: the replay grows monotonically with host time
        mid = (lo + hi) / 2
        if replay(ep, e, mid) > reference_ns:
            hi = mid
        else:
            lo = mid
        if hi - lo < 0.01:
            break
    return (lo + hi) / 2
