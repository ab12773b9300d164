"""The kinds of what-if transform: one function per `kind` of analyzer/whatif.yaml, each turning
an Episode and the transform's parameters into the Edit its knob change makes (None: it does not
apply to this step), and `KIND_FUNCS`, the registry that maps a kind to its function.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np
from moetune.analyzer.episode import Episode
from moetune.analyzer.replay import Edit, untouched

_US = 1_000
# Non-GEMM ops between two GEMMs of one expert loop: Megatron-Core's SequentialMLP runs up to ~9
# (token slicing, activation and its backward, bias and probability products) per expert.
MAX_BETWEEN = 12


def drop_recompute(ep: Episode, params: Mapping[str, float], _ctx: Mapping[str, Any]) -> Edit | None:
    """Recompute off: the forward work re-run inside backward, its launches and its CPU time go,
    and its syncs (the token dispatcher's, in a re-run MoE layer) no longer drain the GPU queue.
    `share` < 1 (selective recompute): that share of it goes, the rest is still re-run;
    `drop_syncs` 0: the syncs still block."""
    if not ep.recompute.any():
        return None
    kept = 1.0 - float(params.get("share", 1.0))
    host = ep.recompute & ~ep.is_gpu
    e = untouched(ep)
    e.dur[ep.recompute] *= kept
    e.gap[host] = kept
    if params.get("drop_syncs", 1):
        e.no_wait = host
    return e


def _affine(dur: np.ndarray, fixed_ns: float, k: float) -> np.ndarray:
    """Each op's share of a k× larger op: its fixed part is paid once for k of them."""
    fixed = np.minimum(dur, fixed_ns)
    return fixed / k + (dur - fixed)


def _fold(ep: Episode, mask: np.ndarray, k: float, fixed_us: float) -> Edit:
    """k repetitions of the masked work become one k× larger: host calls and the CPU time before
    them ÷ k, each GPU op a k-th of a k× larger op."""
    e = untouched(ep)
    host = mask & ~ep.is_gpu
    e.dur[host] /= k
    e.gap[host] /= k
    gpu = mask & ep.is_gpu
    e.dur[gpu] = _affine(e.dur[gpu], fixed_us * _US, k)
    return e


def fold_micro_batches(ep: Episode, params: Mapping[str, float], ctx: Mapping[str, Any]
                       ) -> Edit | None:
    """Micro-batch × k at the same global batch: k× fewer micro-batches, each k× larger. Outside
    the optimizer, host calls and the CPU time between them shrink k×, and every GPU op becomes a
    k-th of a k× larger op (its fixed cost, e.g. launch and tail effects, amortised over k)."""
    k = float(ctx.get("factor") or params.get("factor") or 2)
    if k <= 1:
        return None
    tail = ctx.get("per_step_tail")
    body = ~ep.opt if tail is None else ~ep.opt & ~tail
    return _fold(ep, body, k, params["fixed_us"])


def per_step_tail(ep: Episode, passes_end_ns: int | None) -> np.ndarray:
    """Work after the last micro-batch's backward (gradient sync and norm, the optimizer, the
    training loop's own Python): paid once per step whatever the micro-batch size, so it does not
    fold. Host calls from `passes_end_ns` on, and the GPU ops they launched."""
    tail = np.zeros(len(ep.ids), dtype=bool)
    if passes_end_ns is None:
        return tail
    tail[~ep.is_gpu & (ep.ts >= passes_end_ns)] = True
    for i in np.nonzero(ep.is_gpu)[0]:
        if any(k == "launch" and tail[p] for p, k in ep.preds[i]):
            tail[i] = True
    return tail


def group_expert_gemms(ep: Episode, params: Mapping[str, float], ctx: Mapping[str, Any]
                       ) -> Edit | None:
    """Grouped GEMM: the per-expert GEMM loop becomes one grouped kernel per GEMM. The expert
    loop's ops (the GEMMs of the E experts and the small ops between them on their stream) and
    their launches run once instead of E times: host time ÷ E, each GPU op a share of one E× larger
    op."""
    experts = int(ctx.get("experts") or 0)
    if experts <= 1:
        return None
    gemm = np.array([k.startswith("compute.gemm") and k != "compute.gemm.grouped_cutlass"
                     for k in ep.kclass]) & ep.is_gpu & ~ep.opt
    if gemm.sum() < 2 * experts:
        return None
    passes = int(ctx.get("passes") or 0)
    loop = _per_expert_ops(ep, experts, passes) if passes else _expert_loop(ep, gemm, experts)
    if not loop.any():
        return None
    return _fold(ep, loop, experts, params["fixed_us"])


def _per_expert_ops(ep: Episode, experts: int, passes: int) -> np.ndarray:
    """Ops the expert loop runs once per expert: kernels that occur at least a quarter of the
    experts' times per MoE layer pass (the dense parts of a layer run a few kernels of a kind per
    pass, the loop E of each), plus their launch calls."""
    from collections import Counter

    body = ep.is_gpu & ~ep.opt
    # a GEMM's kernel is picked per shape, and the experts' token counts differ: count GEMMs by
    # class, other kernels by name
    keys = [k if k.startswith("compute.gemm") else n
            for k, n in zip(ep.kclass, ep.names, strict=True)]
    count = Counter(key for key, b in zip(keys, body, strict=True) if b)
    least = max(experts / 4, 2) * passes
    flags = np.array([bool(b) and count[key] >= least for key, b in zip(keys, body, strict=True)])
    return _with_launches(ep, flags)


def _with_launches(ep: Episode, flags: np.ndarray) -> np.ndarray:
    """The flagged GPU ops and the host calls that launched them."""
    out = flags.copy()
    for i in np.nonzero(flags & ep.is_gpu)[0]:
        for p, k in ep.preds[i]:
            if k == "launch":
                out[p] = True
    return out


def _expert_loop(ep: Episode, gemm: np.ndarray, experts: int) -> np.ndarray:
    """Positions of the per-expert loop: runs of GEMMs (in time order, at most MAX_BETWEEN other
    ops apart) holding at least half the experts' worth of GEMMs, the ops between them and their
    launch calls. Without module names this is the shape the loop leaves: the same few kernels
    once per expert, back to back."""
    order = np.argsort(ep.ts, kind="stable")
    gpu_pos = [i for i in order if ep.is_gpu[i]]
    names = [ep.kclass[i] for i in gpu_pos]
    flags = np.zeros(len(ep.ids), dtype=bool)
    # experts that got no tokens launch nothing: half the experts' GEMMs in a run is a loop; a
    # dense block (attention, router: 2-6 GEMMs per layer and pass) is shorter
    least = max(4, experts // 2)
    # windows of consecutive GPU ops (time order) holding ≥ E GEMMs, at most MAX_BETWEEN other
    # ops apart: the expert loop interleaves its GEMMs with a few small ops
    run: list[int] = []
    since = 0
    n_gemm = 0
    for i, _name in zip(gpu_pos, names, strict=True):
        if gemm[i]:
            run.append(i)
            n_gemm += 1
            since = 0
        elif run:
            since += 1
            run.append(i)
            if since > MAX_BETWEEN:
                if n_gemm >= least:
                    flags[run[:len(run) - since]] = True
                run, n_gemm, since = [], 0, 0
    if run and n_gemm >= least:
        flags[run[:len(run) - since]] = True
    return _with_launches(ep, flags)


def capture_launches(ep: Episode, params: Mapping[str, float], _ctx: Mapping[str, Any]
                     ) -> Edit | None:
    """CUDA graphs: outside the optimizer, ops replay from a graph: no launch waits, their launch
    calls go, and only `host_kept` of the CPU time between calls remains (the Python of the
    captured layers does not run on replay; the rest of the step still does). A scoped capture
    (`captured` < 1, e.g. only the MoE router and token preprocess) graphs that share of the
    launches, spread evenly over the step: a trace names no modules, and the scopes recur in
    every layer and pass."""
    body = ~ep.opt
    share = float(params.get("captured", 1.0))
    gpu = np.nonzero(body & ep.is_gpu)[0]
    if share < 1.0:
        gpu = gpu[np.argsort(ep.ts[gpu], kind="stable")]
        j = np.arange(len(gpu))
        gpu = gpu[np.floor((j + 1) * share) > np.floor(j * share)]
    launched = np.zeros(len(ep.ids), dtype=bool)
    for i in gpu:
        for p, k in ep.preds[i]:
            if k == "launch":
                launched[p] = True
    if not launched.any():
        return None
    e = untouched(ep)
    e.no_launch[gpu] = True
    e.dur[launched] = 0.0
    e.gap[launched] = params["host_kept"]
    return e


# The registry of transform kinds: a whatif.yaml `kind` names one of these functions. The kind enum
# of schemas/whatif.schema.json is checked against it (tests/test_extension_points.py);
# docs/extending.md walks adding one.
KIND_FUNCS = {
    "drop_recompute": drop_recompute,
    "fold_micro_batches": fold_micro_batches,
    "group_expert_gemms": group_expert_gemms,
    "capture_launches": capture_launches,
}
