"""The hand check of the phase table (tests/test_phases.py): each MoE phase's forward GPU time in
one step of a Megatron-Core trace, by a rule written down from reading Megatron-Core's MoE code,
applied with the standard library alone (no moetune code, no phases.yaml).

How: the forward pass's top-level ops on the main thread (depth 1 under `ProfilerStep#N`) were
printed and read against megatron/core/transformer/moe/ (router.py TopKRouter.forward,
token_dispatcher.py MoEAlltoAllTokenDispatcher, moe_utils.py permute / sort_chunks_by_idxs /
unpermute, experts.py). A MoE layer's forward is, in that order:

- router: from `RouterGatingLinearFunction` (the gating GEMM) through `MoEAuxLossAutoScaler`
  (top-k, softmax, the aux loss) inclusive;
- permute: dispatch_preprocess, from the op after `MoEAuxLossAutoScaler` (tokens per expert, their
  copy to the host, routing_map.T, argsort, index_select) up to the first `_AllToAll`;
- dispatch: the `_AllToAll`s and dispatch_postprocess's sort_chunks_by_idxs (split_with_sizes +
  cat, once for the tokens and once for the probs) up to the second `aten::cat`;
- experts: everything after that up to the `aten::split_with_sizes` that comes last before the
  next `_AllToAll` (combine_preprocess's sort_chunks_by_idxs);
- combine: from that split through the `_AllToAll`;
- unpermute: combine_postprocess (zeros, scatter_add_, …) up to the next `aten::layer_norm`
  (the next layer's input norm, or the final norm).

Each kernel of the step (launched in its host range, starting on the GPU after the profiler's
GPU range for the step begins) counts for the phase of the top-level op its launch is inside (by
correlation); GPU time is the sum of kernel durations (the traces run one compute stream: no
overlap to union).
Run: `python tests/hand_phases.py TRACE STEP` → ms per phase.
"""

from __future__ import annotations

import bisect
import collections
import gzip
import json
import sys

ALL_TO_ALL = "_AllToAll"


def forward_phase_ms(path: str, step: int) -> dict[str, float]:
    with gzip.open(path) as f:
        ev = json.load(f)["traceEvents"]
    xs = [e for e in ev if e.get("ph") == "X"]
    ann = next(e for e in xs if e.get("cat") == "user_annotation" and e["name"] == f"ProfilerStep#{step}")
    h0, h1, main = ann["ts"], ann["ts"] + ann["dur"], ann["tid"]
    # the step's GPU side starts where the profiler's GPU range for it does
    g0 = next(e["ts"] for e in xs if e.get("cat") == "gpu_user_annotation"
              and e["name"] == f"ProfilerStep#{step}")
    ops = sorted((e for e in xs if e.get("cat") == "cpu_op" and e["tid"] == main
                  and h0 <= e["ts"] < h1), key=lambda e: (e["ts"], -e["dur"]))
    top, end = [], -1.0
    for o in ops:  # depth 1: not inside an earlier op
        if o["ts"] >= end:
            top.append(o)
            end = o["ts"] + o["dur"]
    names = [o["name"] for o in top]
    phase: list[str | None] = [None] * len(top)
    i = 0
    while i < len(top):
        if names[i] != "RouterGatingLinearFunction":
            i += 1
            continue
        j = names.index("MoEAuxLossAutoScaler", i)
        for k in range(i, j + 1):
            phase[k] = "router"
        a2a = names.index(ALL_TO_ALL, j)
        for k in range(j + 1, a2a):
            phase[k] = "permute"
        cats, k = 0, a2a
        while cats < 2:
            phase[k] = "dispatch"
            cats += names[k] == "aten::cat"
            k += 1
        a2a2 = names.index(ALL_TO_ALL, k)
        split = max(x for x in range(k, a2a2) if names[x] == "aten::split_with_sizes")
        for x in range(k, split):
            phase[x] = "experts"
        for x in range(split, a2a2 + 1):
            phase[x] = "combine"
        x = a2a2 + 1
        while x < len(top) and names[x] != "aten::layer_norm":
            phase[x] = "unpermute"
            x += 1
        i = x
    spans = [(o["ts"], o["ts"] + o["dur"], p) for o, p in zip(top, phase, strict=True) if p]
    starts = [s for s, _, _ in spans]
    launch = {e["args"].get("correlation"): e["ts"] for e in xs
              if e.get("cat") in ("cuda_runtime", "cuda_driver") and e["tid"] == main
              and h0 <= e["ts"] < h1}
    out: collections.Counter[str] = collections.Counter()
    for k in xs:
        if k.get("cat") != "kernel":
            continue
        t = launch.get(k["args"].get("correlation"))
        if t is None or k["ts"] < g0:
            continue
        at = bisect.bisect_right(starts, t) - 1
        if at >= 0 and spans[at][0] <= t < spans[at][1]:
            out[spans[at][2]] += k["dur"]
    return {p: v / 1e3 for p, v in sorted(out.items())}


if __name__ == "__main__":
    print({p: round(v, 3) for p, v in forward_phase_ms(sys.argv[1], int(sys.argv[2])).items()})
