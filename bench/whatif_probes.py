"""Probes of the what-if model on the H200 grid's per-expert profiles: the measurements behind
docs/advisor.md's notes on the MBS 1 → 8 per-expert miss. Each prints what it measured; none
changes the transforms.

    python bench/whatif_probes.py

- fold: CPU time between host calls in the micro-batch passes (per micro-batch) and in the
  per-step tail, at MBS 1 and 8 without recompute, and `host_scale` against each trace's own run.
- per-op: the profiler priced as a fixed cost per recorded CPU op (subtracted from the CPU time
  before each host call, and from each call) instead of a scale: the cost that matches each
  trace's own run, and MBS 1 → 8 predicted both ways against those runs.
- syncs: grouped GEMM with the host waits on the folded ops (the gradient norm's `.item()` per
  parameter tensor) folded as well, against the transform, from every per-expert start.
"""

from __future__ import annotations

import json
import statistics
import sys
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
TRACES = ROOT / "fixtures" / "traces"
FIXED_US = 5.0  # the middle of the transforms' 2-8 µs


def profile(point: str) -> dict[str, Any]:
    """The what-if episode of a grid point's trace, its per-step tail, the CPU time before each
    host call (from the predecessor that released it) and the CPU ops recorded in that time."""
    import polars as pl
    from moetune.analyzer import whatif as W
    from moetune.analyzer import whatif_transforms as T
    from moetune.analyzer.megatron_args import contract_from_log

    from moetune.analysis import analyze

    folder = TRACES / f"grid_host_{point}"
    truth = json.loads((folder / "truth.json").read_text())["measured"]
    got: dict[str, Any] = {}
    build = W.episode

    def episode(trace, events, rank, start, end, **kw):  # the diagnosis's own episode
        got.update(ep=build(trace, events, rank, start, end, **kw), events=events,
                   tail=(rank, start, end))
        return got["ep"]

    W.episode = episode
    try:
        contract = contract_from_log((folder / "train.log").read_text())
        contract.setdefault("versions", {}).setdefault("grouped_gemm", "torch._grouped_mm")
        analyze(folder / "trace.json.gz", contract)
    finally:
        W.episode = build
    ep, events = got["ep"], got["events"]
    tail = T.per_step_tail(ep, W._passes_end_ns(events, *got["tail"]))
    tids = events.get_column("tid")[ep.ids].to_list()
    ops = events.filter(pl.col("kind") == "cpu_op").select("tid", "ts_ns")
    starts = {t: np.sort(g.get_column("ts_ns").to_numpy())
              for (t,), g in ops.group_by(["tid"])}
    gap, nops = np.zeros(len(ep.ids)), np.zeros(len(ep.ids))
    for i in np.nonzero(~ep.is_gpu)[0]:
        host = [p for p, k in ep.preds[i] if k == "host"]
        if not host:
            continue
        lo, hi = ep.te[max(host, key=lambda p: ep.te[p])], ep.ts[i]
        if hi > lo:
            gap[i] = hi - lo
            s = starts.get(tids[i])
            nops[i] = 0 if s is None else np.searchsorted(s, hi) - np.searchsorted(s, lo)
    return {"ep": ep, "tail": tail, "gap": gap, "nops": nops,
            "own_run_ns": statistics.median(truth["steady_iter_ms"]) * 1e6,
            "grid_ns": truth["step_ms"] * 1e6, "contract": contract,
            "mbs": int(contract["megatron_args"]["micro_batch_size"])}


def per_op(p: dict[str, Any], o: float, edit: Any = None) -> Any:
    """`edit` (untouched by default) with `o` ns taken off every host call and off the CPU time
    before it per CPU op recorded in that time, both never below zero."""
    from moetune.analyzer import replay as R

    ep, base = p["ep"], R.untouched(p["ep"])
    e = edit if edit is not None else base
    e = R.Edit(e.dur.copy(), e.gap.copy(), e.no_launch.copy())
    host = ~ep.is_gpu & (p["gap"] > 0)
    kept = np.maximum(p["gap"][host] * e.gap[host] - o * p["nops"][host] * e.gap[host], 0)
    e.gap[host] = kept / p["gap"][host]
    calls = ~ep.is_gpu & (base.dur > 0)
    e.dur[calls] = np.maximum(e.dur[calls] - o, 0)
    return e


def fit_per_op(p: dict[str, Any], reference_ns: float) -> float:
    from moetune.analyzer import replay as R

    lo, hi = 0.0, 50_000.0
    for _ in range(40):  # bisection: the replay shrinks as the per-op cost grows
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if R.replay(p["ep"], per_op(p, mid)) > reference_ns else (lo, mid)
    return (lo + hi) / 2


def scaled_gain(p: dict[str, Any], edit: Any, reference_ns: float) -> float:
    from moetune.analyzer import replay as R

    ep = p["ep"]
    hs = R.host_scale_for(ep, reference_ns, R.replay(ep, R.untouched(ep)))
    return R.replay(ep, R.untouched(ep), hs) / R.replay(ep, edit, hs) - 1


def fold(p: dict[str, Any], k: int) -> Any:
    from moetune.analyzer import whatif_transforms as T

    return T.fold_micro_batches(p["ep"], {"fixed_us": FIXED_US},
                                {"factor": k, "per_step_tail": p["tail"]})


def main() -> int:
    from moetune.analyzer import replay as R
    from moetune.analyzer import whatif as W
    from moetune.analyzer import whatif_transforms as T

    one, eight = profile("mbs1_seq_rcnone_a2a_eager"), profile("mbs8_seq_rcnone_a2a_eager")
    print("fold: CPU time before host calls, profiled (ms); host_scale against the trace's run")
    for name, p in (("MBS 1", one), ("MBS 8", eight)):
        body, tail = ~p["ep"].is_gpu & ~p["tail"], ~p["ep"].is_gpu & p["tail"]
        hs = R.host_scale_for(p["ep"], p["own_run_ns"], R.replay(p["ep"], R.untouched(p["ep"])))
        print(f"  {name}: passes {p['gap'][body].sum() / 1e6 / (8 // p['mbs']):.1f} per "
              f"micro-batch, tail {p['gap'][tail].sum() / 1e6:.1f}, host_scale {hs:.2f}")
    print("per-op: the profiler's cost per recorded CPU op that matches the trace's own run")
    costs = {}
    for name, p in (("MBS 1", one), ("MBS 8", eight)):
        costs[name] = fit_per_op(p, p["own_run_ns"])
        print(f"  {name}: {costs[name] / 1e3:.1f} µs per op")
    measured = one["own_run_ns"] / eight["own_run_ns"] - 1
    o = costs["MBS 1"]
    as_per_op = R.replay(one["ep"], per_op(one, o)) / R.replay(one["ep"], per_op(one, o, fold(one, 8))) - 1
    print(f"  MBS 1 → 8 from the traces' runs: measured {measured:+.0%}, scaled "
          f"{scaled_gain(one, fold(one, 8), one['own_run_ns']):+.0%}, per op {as_per_op:+.0%}")
    print("syncs: grouped GEMM from each per-expert start (grid medians), the transform and with "
          "the host waits on its folded ops folded too")
    launches = T._with_launches

    def with_waits(ep: Any, flags: np.ndarray) -> np.ndarray:
        out = launches(ep, flags)
        for i in np.nonzero(~ep.is_gpu)[0]:
            out[i] |= any(k == "sync" and flags[p] for p, k in ep.preds[i])
        return out

    for start in ("mbs8_seq_rcnone", "mbs8_seq_rcfull", "mbs4_seq_rcfull", "mbs2_seq_rcfull",
                  "mbs1_seq_rcnone", "mbs1_seq_rcfull"):
        p = profile(f"{start}_a2a_eager")
        to = json.loads((TRACES / f"grid_host_{start.replace('seq', 'grp')}_a2a_eager"
                         / "truth.json").read_text())["measured"]["step_ms"] * 1e6
        ctx = W.contract_context("grouped_gemm", W.transforms()["grouped_gemm"], p["contract"])
        ranges = []
        for how in (launches, with_waits):
            T._with_launches = how
            try:
                ranges.append(sorted(scaled_gain(p, T.group_expert_gemms(p["ep"], {"fixed_us": f},
                                                                         ctx), p["grid_ns"])
                                     for f in (2.0, 8.0)))
            finally:
                T._with_launches = launches
        (a0, a1), (b0, b1) = ranges
        print(f"  {start}: measured {p['grid_ns'] / to - 1:+.0%}, transform {a0:+.0%} … {a1:+.0%},"
              f" with the waits {b0:+.0%} … {b1:+.0%}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
