"""What-if estimates: predict a knob change's step time by transforming the median step's timeline
graph and replaying it (the approach of Daydream, USENIX ATC 2020, and Lumos, MLSys 2025).

The median step of the first analysed rank is cut out of the timeline graph as an Episode
(analyzer/episode.py) and replayed with its measured durations and gaps (analyzer/replay.py).
Replaying the untouched step reproduces the measured step up to the replay's own error (reported
as `fidelity`); a transform edits durations and gaps, and the prediction is the measured step
time × replay(transformed) / replay(untouched), so the replay's bias cancels. Each transform is
declared as data in `whatif.yaml` (which knob change it models, its parameters and their plausible
ranges), loaded and validated here; the code has one small function per transform kind
(analyzer/whatif_transforms.py). A range parameter gives the predicted range: the low and high
ends of the speedup come from replays at the two ends of the parameter's range.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from functools import cache
from typing import Any

import polars as pl
from moetune.analyzer.episode import Episode, episode
from moetune.analyzer.replay import host_scale_for, replay, untouched
from moetune.analyzer.walls import recompute_launches
from moetune.analyzer.whatif_transforms import KIND_FUNCS, per_step_tail

from moetune.errors import UserError
from moetune.resources import data, schema
from moetune.schema_check import first_error
from moetune.yamlio import line_of, read_yaml

WHATIF_PATH = data("moetune.analyzer", "whatif.yaml")
# Relative error of a replayed gain when a transform states none: Daydream reports most
# predictions within 10-15 % of measured, Lumos 3 %; ours are cruder (no module names).
UNCERTAINTY = 0.25


SHIPPED_PATH = WHATIF_PATH


@cache
def transforms() -> dict[str, dict[str, Any]]:
    """The transform catalog (whatif.yaml), validated at every load (moetune.schema_check: no
    jsonschema import on the diagnosis path)."""
    doc, lines = read_yaml(WHATIF_PATH)
    validate_transforms(doc, WHATIF_PATH, lines)
    return dict(doc["transforms"])


def validate_transforms(doc: Any, path: Any, lines: Mapping[tuple, int] | None = None) -> None:
    """UserError naming the first place where `doc` breaks schemas/whatif.schema.json, whose
    `kind` enum tests/test_extension_points.py holds equal to `KIND_FUNCS`."""
    err = first_error(doc, json.loads(schema("whatif").read_text()))
    for tid, spec in doc["transforms"].items() if err is None else ():
        if spec["kind"] not in KIND_FUNCS:  # the schema's enum ran ahead of the registry
            err = (("transforms", tid, "kind"),
                   f"{spec['kind']!r} has no function in KIND_FUNCS "
                   "(analyzer/whatif_transforms.py)")
            break
    if err:
        at, message = err
        line = line_of(lines or {}, at)
        raise UserError(f"{'/'.join(map(str, at))}: {message}",
                        path=f"{path}:{line}" if line else path)


# --------------------------------------------------------------------------- estimates


def _params_at(spec: Mapping[str, Any], end: int) -> dict[str, float]:
    """Parameter values at one end of their ranges (0 = the low-gain end, 1 = the high-gain one)."""
    return {k: (v[end] if isinstance(v, list) else v) for k, v in (spec.get("params") or {}).items()}


def estimate(ep: Episode, tid: str, spec: Mapping[str, Any], ctx: Mapping[str, Any],
             base_ns: float, host_scale: float = 1.0, reference_s: float | None = None
             ) -> dict[str, Any] | None:
    """Predicted speedup range and step time of one transform; the step it starts from is the
    run's unprofiled one when known (`reference_s`), else the profiled one."""
    fn = KIND_FUNCS[spec["kind"]]
    times = []
    for end in (0, 1):
        edit = fn(ep, _params_at(spec, end), ctx)
        if edit is None:
            return None
        times.append(replay(ep, edit, host_scale))
    t = reference_s * 1e9 if reference_s else ep.measured_ns
    new = sorted(t * x / base_ns for x in times)  # [fastest, slowest]
    lo, hi = t / new[1] - 1, t / new[0] - 1
    mid = (lo + hi) / 2
    # the replay's own error: ± `uncertainty` of the replayed gain (calibrated by measured A/Bs)
    u = float(spec.get("uncertainty", UNCERTAINTY))
    lo, hi = lo - u * abs(lo), hi + u * abs(hi)
    return {
        "knob": spec["knob"], "to": ctx.get("to", spec.get("to")),
        "speedup": {"low": round(lo, 4), "mid": round(mid, 4), "high": round(hi, 4)},
        "step_time_s": {"before": round(t / 1e9, 6), "low": round(t / (1 + hi) / 1e9, 6),
                        "high": round(t / (1 + lo) / 1e9, 6)},
        "basis": spec["basis"],
    }


def contract_context(tid: str, spec: Mapping[str, Any], contract: Mapping[str, Any] | None
                     ) -> dict[str, Any] | None:
    """What a transform needs from the contract (e.g. the number of experts); None when it does
    not apply to this run."""
    con = contract or {}
    margs = con.get("megatron_args") or {}
    model = con.get("model") or {}
    shape = con.get("shape") or {}
    kind = spec["kind"]
    if "from" in spec:
        if not con:
            return None  # nothing states the value the change starts from
        # here, not at import: `diagnose` without a contract does not load the contract module
        from moetune.analyzer.contract import effective_args

        if effective_args(con).get(spec["knob"]) != spec["from"]:
            return None  # a change from another value
    if kind == "fold_micro_batches":
        mbs = shape.get("micro_batch_size") or margs.get("micro_batch_size") or 1
        gbs = shape.get("global_batch_size") or margs.get("global_batch_size")
        dp = (con.get("parallelism") or {}).get("dp") or 1
        k = int(spec["params"].get("factor", 2))
        if gbs is not None and (gbs // dp) % (mbs * k):
            return None  # the larger micro-batch no longer divides the global batch per DP rank
        return {"factor": k, "to": mbs * k}
    if kind == "group_expert_gemms":
        experts = model.get("num_experts") or margs.get("num_experts")
        ep_size = (con.get("parallelism") or {}).get("ep") or 1
        if not experts:
            return None
        layers = model.get("num_layers") or margs.get("num_layers")
        mbs = shape.get("micro_batch_size") or margs.get("micro_batch_size")
        gbs = shape.get("global_batch_size") or margs.get("global_batch_size")
        dp = (con.get("parallelism") or {}).get("dp") or 1
        # MoE layer passes of one step (forward and backward of each micro-batch): kernels of the
        # expert loop occur about E times per pass
        passes = layers * max(gbs // (mbs * dp), 1) if layers and mbs and gbs else 0
        return {"experts": int(experts) // int(ep_size), "passes": passes}
    return {}


def _passes_end_ns(events: pl.DataFrame, rank: int, start_ns: int, end_ns: int) -> int | None:
    """End of the step's last autograd backward node (the last micro-batch's backward), None when
    the trace has no such ops (e.g. an nsys export without PyTorch ops)."""
    last = events.filter((pl.col("rank") == rank) & (pl.col("kind") == "cpu_op")
                         & pl.col("name").str.starts_with("autograd::engine::evaluate_function")
                         & (pl.col("ts_ns") >= start_ns) & (pl.col("ts_ns") < end_ns)
                         ).select((pl.col("ts_ns") + pl.col("dur_ns")).max()).item()
    return int(last) if last is not None else None


def whatif_section(trace: Any, steps: Any, ctx: Any) -> dict[str, Any]:
    """`diagnose` section: one estimate per applicable transform on the median step."""


    med = ctx.median.sort("rank")
    if med.height == 0:
        return {}
    row = med.row(0, named=True)
    table = steps.table if hasattr(steps, "table") else steps
    win = table.filter((pl.col("rank") == row["rank"]) & (pl.col("step") == row["step"]))
    if win.height == 0:
        return {}
    cols = win.columns
    lo_col, hi_col = ("win_start_ns", "win_end_ns") if "win_start_ns" in cols else ("start_ns", "end_ns")
    start, end = int(win[lo_col][0]), int(win[hi_col][0])
    ep = episode(trace, ctx.events, int(row["rank"]), start, end,
                 recompute_corr=ctx.recompute if ctx.recompute is not None
                 else recompute_launches(ctx.events))
    if ep is None:
        return {}
    base = replay(ep, untouched(ep))
    fidelity = round(base / ep.measured_ns, 4) if ep.measured_ns else None
    ref = getattr(ctx, "reference_step_s", None)
    scale = 1.0
    if ref:
        scale = host_scale_for(ep, ref * 1e9, base)
        base = replay(ep, untouched(ep), scale)
    out: dict[str, Any] = {}
    # one mask for every micro-batch transform and both ends of its range
    tail = per_step_tail(ep, _passes_end_ns(ctx.events, int(row["rank"]), start, end))
    # no contract: the run's log states the arguments (micro-batch, global batch, experts) a
    # transform needs; without them MBS 4 read as 1 and ×2 "went" to 2
    con = ctx.contract if ctx.contract is not None else (
        {"megatron_args": ctx.run_log["args"]} if (ctx.run_log or {}).get("args") else None)
    for tid, spec in transforms().items():
        c = contract_context(tid, spec, con)
        if c is None:
            continue
        if spec["kind"] == "fold_micro_batches":
            c = {**c, "per_step_tail": tail}
        est = estimate(ep, tid, spec, c, base, scale, ref)
        if est is not None:
            out[tid] = est
    return {"whatif": {
        "rank": int(row["rank"]), "step": int(row["step"]),
        "fidelity": fidelity,
        "reference_step_s": ref,
        "host_scale": round(scale, 4),
        "nodes": len(ep.ids),
        "transforms": out,
    }}
