"""The H200 grid benchmark as data: two MoE shapes, the knobs, the mis-tuned start, the extra points,
the workload command of a point and the parsing of its log (issue #16 item 5).

Shared by the device driver (bench/grid_run.py run, under bench/gpu/grid.sh) and the analysis here
(bench/grid_run.py report). Standard library only: the device has no polars and no moetune install.

A point is a dict of knob values (KNOBS); its id spells them, e.g. `mbs1_seq_rcfull_a2a_eager`.
Every run is the workload `python -m moetune.executor.workloads.moe_gpt` with the shape's flags,
the knob flags and COMMON: 12 iterations, Kineto profile of iterations 11-12 (ProfilerStep#10, #11;
iteration 10 is the profiler's warm-up step), step time = median of iterations STEADY (4-9).
"""

from __future__ import annotations

import re
import statistics
from typing import Any

WORKLOAD = ["python3", "-m", "moetune.executor.workloads.moe_gpt"]

SHAPES: dict[str, dict[str, Any]] = {
    # host/launch-bound at its start: small hidden, many small experts (48 x top-6, per-expert GEMMs
    # of 128 tokens each at MBS 1), 8 micro-batches of one sequence each
    "host": {
        "desc": "3 layers, hidden 512, 8 heads, 48 experts top-6 (expert FFN 512), seq 1024, "
                "GBS 8, vocab 32000",
        "flags": ["--num-layers", "3", "--hidden-size", "512", "--num-attention-heads", "8",
                  "--ffn-hidden-size", "2048", "--num-experts", "48", "--moe-router-topk", "6",
                  "--moe-ffn-hidden-size", "512", "--seq-length", "1024",
                  "--global-batch-size", "8", "--vocab-size", "32000"],
    },
    # memory-tight: seq 4096 with the local spec's unfused attention (24 heads x 4096^2 scores per
    # sample and layer), ~1.38 B parameters (~23 GiB of weights, fp32 grads and Adam states)
    "mem": {
        "desc": "8 layers, hidden 1536, 24 heads, 16 experts top-2 (expert FFN 3072), seq 4096, "
                "GBS 8, vocab 32000",
        "flags": ["--num-layers", "8", "--hidden-size", "1536", "--num-attention-heads", "24",
                  "--ffn-hidden-size", "6144", "--num-experts", "16", "--moe-router-topk", "2",
                  "--moe-ffn-hidden-size", "3072", "--seq-length", "4096",
                  "--global-batch-size", "8", "--vocab-size", "32000"],
    },
}

# knob -> values, in the order a neighbour search tries them
KNOBS: dict[str, list[Any]] = {
    "mbs": [1, 2, 4, 8],
    "grouped": [False, True],
    "recompute": ["full", "selective", "none"],
    "graphs": ["eager", "local"],      # + "local_droppad" in EXTRA points only (two changes)
    "dispatcher": ["alltoall", "allgather"],
}
# the deliberately mis-tuned start of both shapes
START: dict[str, Any] = {"mbs": 1, "grouped": False, "recompute": "full", "graphs": "eager",
                         "dispatcher": "alltoall"}
# `--cuda-graph-impl local` as the grid runs it: megatron-core's partial MoE-layer graphs (router +
# preprocess, postprocess), dropless MoE unchanged (bench/grid/README.md: why not whole layers)
GRAPH_FLAGS = ["--cuda-graph-impl", "local", "--cuda-graph-modules", "moe_router", "moe_preprocess"]

# points beyond the start's neighbours and the greedy path: the likely optimum and the OOM probes
EXTRA: dict[str, list[dict[str, Any]]] = {
    "host": [
        {"mbs": 8, "grouped": True, "recompute": "none", "graphs": "local"},
        {"mbs": 8, "grouped": True, "recompute": "none", "graphs": "eager"},
        {"mbs": 4, "grouped": True, "recompute": "none", "graphs": "local"},
        {"mbs": 8, "grouped": True, "recompute": "selective", "graphs": "local"},
    ],
    "mem": [
        {"mbs": 4, "recompute": "none"},   # OOM probes (MBS 4 measured 121.5 GiB: it fits)
        {"mbs": 8, "recompute": "none"},
        {"mbs": 8, "recompute": "selective"},
        {"mbs": 2, "grouped": True, "recompute": "none"},       # likely optimum
        {"mbs": 4, "grouped": True, "recompute": "selective"},
        {"mbs": 2, "grouped": True, "recompute": "none", "graphs": "local"},
    ],
}

# whole-layer local graphs (static shapes: drop-and-pad MoE) - two changes, not a one-knob neighbour
WHOLE_DROPPAD_FLAGS = ["--cuda-graph-impl", "local", "--moe-expert-capacity-factor", "1.0",
                       "--moe-pad-expert-input-to-capacity"]

TRAIN_ITERS = 12
PROFILE_START, PROFILE_END = 10, 12      # ProfilerStep#10, #11 = iterations 11, 12
STEADY = range(4, 10)                     # iterations 4-9: the step-time median
COMMON = ["--bf16", "--train-iters", str(TRAIN_ITERS),
          "--profile", "--profile-step-start", str(PROFILE_START),
          "--profile-step-end", str(PROFILE_END)]


# a repeat of a point (one more fresh process, the same steady window, no profile): a point's step
# time is the median over its runs, since host-bound points move ±15-30 % between processes
REPEAT = ["--bf16", "--train-iters", str(TRAIN_ITERS)]

# a trace-only re-run (used where a grid run's trace could not come back): 5 iterations,
# iterations 4-5 profiled (ProfilerStep#3, #4); its step time is not the grid's
TRACE_RERUN = ["--bf16", "--train-iters", "5", "--profile", "--profile-step-start", "3",
               "--profile-step-end", "5"]


def parse_id(pid: str) -> dict[str, Any]:
    """Inverse of point_id."""
    mbs, grp, rc, disp, graphs = pid.split("_", 4)
    return {"mbs": int(mbs[3:]), "grouped": grp == "grp", "recompute": rc[2:],
            "dispatcher": "alltoall" if disp == "a2a" else "allgather", "graphs": graphs}


def full_point(p: dict[str, Any]) -> dict[str, Any]:
    return {**START, **p}


def point_id(p: dict[str, Any]) -> str:
    p = full_point(p)
    return (f"mbs{p['mbs']}_{'grp' if p['grouped'] else 'seq'}_rc{p['recompute']}_"
            f"{'a2a' if p['dispatcher'] == 'alltoall' else 'ag'}_{p['graphs']}")


def knob_flags(p: dict[str, Any]) -> list[str]:
    p = full_point(p)
    f = ["--micro-batch-size", str(p["mbs"]), "--moe-token-dispatcher-type", p["dispatcher"]]
    if p["grouped"]:
        f.append("--moe-grouped-gemm")
    if p["recompute"] != "none":
        f += ["--recompute-granularity", p["recompute"]]
    if p["graphs"] == "local":
        f += GRAPH_FLAGS
    elif p["graphs"] == "local_droppad":  # whole-layer graphs: drop-and-pad MoE at capacity 1.0
        f += WHOLE_DROPPAD_FLAGS
    return f


def command(shape: str, p: dict[str, Any], profile_dir: str, trace_rerun: bool = False,
            repeat: bool = False) -> list[str]:
    proto = TRACE_RERUN if trace_rerun else REPEAT if repeat else COMMON
    return [*WORKLOAD, *SHAPES[shape]["flags"], *knob_flags(p), *proto,
            "--profile-dir", profile_dir]


def neighbours(p: dict[str, Any], adjacent_mbs: bool = False) -> list[dict[str, Any]]:
    """Every point one knob away, knobs in KNOBS order; `adjacent_mbs`: of the micro-batch sizes
    only the next smaller and larger one (the greedy path's steps after the start)."""
    p = full_point(p)
    out = []
    for k, values in KNOBS.items():
        for v in values:
            if v == p[k]:
                continue
            if k == "mbs" and adjacent_mbs and v not in (p[k] // 2, p[k] * 2):
                continue
            out.append({**p, k: v})
    return out


def changed(base: dict[str, Any], p: dict[str, Any]) -> dict[str, Any]:
    base, p = full_point(base), full_point(p)
    return {k: p[k] for k in KNOBS if p[k] != base[k]}


# ---- log parsing (Megatron-format lines the workload prints) ----
_IT = re.compile(r" iteration\s+(\d+)/\s*\d+ \|.*?elapsed time per iteration \(ms\): ([\d.]+)")
_MEM = re.compile(r"\(after (\d+) iterations\) memory \(MB\) \| allocated: ([\d.]+) \| "
                  r"max allocated: ([\d.]+) \| reserved: ([\d.]+) \| max reserved: ([\d.]+)")
_OOM = re.compile(r"CUDA out of memory|OutOfMemoryError|CUBLAS_STATUS_ALLOC_FAILED", re.I)
_OOM_DETAIL = re.compile(r"Tried to allocate ([\d.]+ [GMK]iB).*?of which ([\d.]+ [GMK]iB) is free"
                         r".*?this process has ([\d.]+ [GMK]iB) memory in use.*?"
                         r"([\d.]+ [GMK]iB) is allocated by PyTorch, and ([\d.]+ [GMK]iB) is "
                         r"reserved by PyTorch but unallocated", re.S)
_LOSS = re.compile(r" iteration\s+(\d+)/.*? lm loss: ([\d.E+-]+)")


def _gib(text: str) -> float:
    v, unit = text.split()
    return float(v) / {"GiB": 1, "MiB": 1024, "KiB": 1024 ** 2}[unit]


def parse_log(text: str, rc: int) -> dict[str, Any]:
    its = {int(i): float(ms) for i, ms in _IT.findall(text)}
    mem = _MEM.findall(text)
    out: dict[str, Any] = {"iter_ms": [its[i] for i in sorted(its)], "iterations": len(its)}
    steady = [its[i] for i in STEADY if i in its]
    out["steady_n"] = len(steady)
    out["step_ms"] = round(statistics.median(steady), 2) if len(steady) >= 4 else None
    out["step_ms_min"] = min(steady) if steady else None
    out["step_ms_max"] = max(steady) if steady else None
    if mem:
        last = mem[-1]
        out["mem_after_iter"] = int(last[0])
        out["max_alloc_gib"] = round(float(last[2]) / 1024, 2)
        out["max_reserved_gib"] = round(float(last[4]) / 1024, 2)
    losses = {int(i): float(v) for i, v in _LOSS.findall(text)}
    if losses:
        out["loss_last"] = losses[max(losses)]
    oom = bool(_OOM.search(text))
    if rc == 0 and len(its) == TRAIN_ITERS:
        status = "ok"
    elif oom:
        status = "oom"
    elif rc == 2 and "moe_gpt: error:" in text:
        status = "refused"
    elif rc in (124, 137):
        status = "timeout"
    else:
        status = "crash"
    out["status"] = status
    out["oom"] = status == "oom"
    if status == "oom":
        m = _OOM_DETAIL.search(text)
        if m:
            out["oom_tried_gib"] = round(_gib(m.group(1)), 2)
            out["oom_free_gib"] = round(_gib(m.group(2)), 2)
            out["oom_in_use_gib"] = round(_gib(m.group(3)), 2)
            out["oom_alloc_gib"] = round(_gib(m.group(4)), 2)
            out["oom_reserved_unalloc_gib"] = round(_gib(m.group(5)), 2)
    if status in ("refused", "crash", "timeout"):
        lines = [ln for ln in text.splitlines() if "error" in ln.lower() or "Error" in ln]
        out["error"] = lines[-1][:300] if lines else text.strip().splitlines()[-1][:300] \
            if text.strip() else ""
    return out
