"""The real-trainer grid as data: NVIDIA Megatron-LM's own `pretrain_gpt.py` at a pinned commit, two
MoE shapes, the knobs, the mis-tuned start, and how a point's command is spelled (issue #27 item 6).

Shared by the device driver (`bench/mlm_grid.py run`, under `bench/gpu/mlm_grid.sh`) and the
analysis here (`bench/mlm_grid.py report`). Standard library only: the device has no polars.

Megatron-LM runs there without Transformer Engine or Apex, so every point carries the flags a
TE-less local-spec run needs (`NO_TE_FLAGS`, each one named in `docs/executor.md`).

A point is a dict of knob values (KNOBS); its id spells them, e.g. `mbs1_seq_rcfull_a2a_eager`.
Protocol of a grid run: the run shape `moetune tune` uses (executor/runner.py `RunShape`, 2 warm-up +
12 measured iterations + the profiler's 3): `--train-iters 17 --log-interval 1`, Megatron's PyTorch
profiler on iteration 16 (`--profile-step-start 16 --profile-step-end 17`: Megatron's schedule is
wait 15, warm-up 1, active 1, `ProfilerStep#16`; the trace is written at the top of iteration 17).
A run's step time is moetune's own definition (executor/validate.py `run_metrics` over iterations
3-14: their median, or their later half's when the run drifted), computed here from the logs
(`mlm_grid.py report`); `parse_log` below is the device's quick look. Calls 1-2 ran 11-12
iterations with the profiler on 10-11 and the window 3-8; their records carry their commands.
"""

from __future__ import annotations

import re
import statistics
from typing import Any

MEGATRON_COMMIT = "d98e8a64ddf34856e74b24714e3bedb2f5a39553"  # NVIDIA/Megatron-LM, 2026-08-22
MEGATRON_TAR = ".mlm/megatron-lm-d98e8a6.tar.gz"  # git archive of megatron/ + the entry scripts

# What a local-spec run needs without TE/Apex: persistent LN, masked-softmax and gradient-
# accumulation fusions import absent CUDA extensions; GELU-with-bias experts need TE's fusions.
NO_TE_FLAGS = ["--transformer-impl", "local", "--no-persist-layer-norm",
               "--no-masked-softmax-fusion", "--no-gradient-accumulation-fusion",
               "--swiglu", "--disable-bias-linear"]
COMMON_FLAGS = ["--bf16", "--mock-data", "--tokenizer-type", "NullTokenizer",
                "--vocab-size", "32768", "--eval-iters", "0", "--eval-interval", "1000",
                "--log-interval", "1", "--log-throughput", "--lr", "1e-4", "--seed", "1234"]

SHAPES: dict[str, dict[str, Any]] = {
    # host/launch-bound at its start: many small experts run one by one (SequentialMLP: 48 experts
    # x 3 GEMMs per layer and micro-batch), 8 micro-batches of one sequence each
    "host": {
        "desc": "3 layers, hidden 512, 8 heads, 48 experts top-6 (expert FFN 512), seq 1024, "
                "GBS 8, vocab 32768",
        "flags": ["--num-layers", "3", "--hidden-size", "512", "--num-attention-heads", "8",
                  "--ffn-hidden-size", "2048", "--num-experts", "48", "--moe-router-topk", "6",
                  "--moe-ffn-hidden-size", "512", "--seq-length", "1024",
                  "--max-position-embeddings", "1024", "--global-batch-size", "8"],
    },
    # memory-tight: seq 4096 through the local spec's unfused attention (16 heads x 4096^2 scores
    # per sample and layer, kept for backward unless recomputed), ~2.6 B parameters (~47 GB of
    # bf16 weights, fp32 gradients, fp32 main weights and Adam states)
    "mem": {
        "desc": "6 layers, hidden 2048, 16 heads, 16 experts top-2 (expert FFN 4096), seq 4096, "
                "GBS 8, vocab 32768",
        "flags": ["--num-layers", "6", "--hidden-size", "2048", "--num-attention-heads", "16",
                  "--ffn-hidden-size", "8192", "--num-experts", "16", "--moe-router-topk", "2",
                  "--moe-ffn-hidden-size", "4096", "--seq-length", "4096",
                  "--max-position-embeddings", "4096", "--global-batch-size", "8"],
    },
}

# knob -> values, in the order a neighbour search tries them
KNOBS: dict[str, list[Any]] = {
    "mbs": [1, 2, 4, 8],
    "grouped": [False, True],
    "recompute": ["full", "selective", "none"],
    "dispatcher": ["alltoall", "allgather"],
    "graphs": ["eager", "local"],   # + "local_layer", "local_droppad" as EXTRA points
}
START: dict[str, Any] = {"mbs": 1, "grouped": False, "recompute": "full", "dispatcher": "alltoall",
                         "graphs": "eager"}

RECOMPUTE_FLAGS = {
    "full": ["--recompute-granularity", "full", "--recompute-method", "uniform",
             "--recompute-num-layers", "1"],
    "selective": ["--recompute-granularity", "selective"],
    "none": [],
}
# Megatron-LM's local CUDA graphs as the rules propose them without TE: the MoE router and
# preprocess scopes (the dispatcher's host copy then happens outside the graph); whole layers
# (`local_layer`) fail under capture for dropless MoE (token_dispatcher.py: d2h_event.synchronize()
# -> cudaErrorCapturedEvent), which the grid records
GRAPH_FLAGS = {"eager": [],
               "local": ["--cuda-graph-impl", "local", "--cuda-graph-modules", "moe_router",
                         "moe_preprocess"],
               "local_layer": ["--cuda-graph-impl", "local"],
               # static shapes: drop-and-pad at capacity 1.0 (two changes, an EXTRA point only)
               "local_droppad": ["--cuda-graph-impl", "local", "--moe-expert-capacity-factor",
                                 "1.0", "--moe-pad-expert-input-to-capacity"]}

TRAIN_ITERS = 17
PROFILE_START, PROFILE_END = 16, 17
STEADY = range(3, 15)
PROTOCOL = ["--train-iters", str(TRAIN_ITERS), "--profile", "--use-pytorch-profiler",
            "--profile-step-start", str(PROFILE_START), "--profile-step-end", str(PROFILE_END)]
REPEAT = ["--train-iters", str(TRAIN_ITERS)]  # one more fresh process, no profile
LAUNCH = ["python3", "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "1"]


def full_point(p: dict[str, Any]) -> dict[str, Any]:
    return {**START, **p}


def point_id(p: dict[str, Any]) -> str:
    p = full_point(p)
    return (f"mbs{p['mbs']}_{'grp' if p['grouped'] else 'seq'}_rc{p['recompute']}_"
            f"{'a2a' if p['dispatcher'] == 'alltoall' else 'ag'}_{p['graphs']}")


def parse_id(pid: str) -> dict[str, Any]:
    mbs, grp, rc, disp, graphs = pid.split("_", 4)
    return {"mbs": int(mbs[3:]), "grouped": grp == "grp", "recompute": rc[2:],
            "dispatcher": "alltoall" if disp == "a2a" else "allgather", "graphs": graphs}


def knob_flags(p: dict[str, Any]) -> list[str]:
    p = full_point(p)
    f = ["--micro-batch-size", str(p["mbs"]), "--moe-token-dispatcher-type", p["dispatcher"]]
    if p["grouped"]:
        f.append("--moe-grouped-gemm")
    return f + RECOMPUTE_FLAGS[p["recompute"]] + GRAPH_FLAGS[p["graphs"]]


def command(megatron: str, shape: str, p: dict[str, Any], tb_dir: str, *,
            repeat: bool = False, extra: list[str] | None = None) -> list[str]:
    """torchrun of pretrain_gpt.py for one point; its trace lands in `tb_dir/../torch_profile`."""
    proto = REPEAT if repeat else [*PROTOCOL, "--tensorboard-dir", tb_dir]
    return [*LAUNCH, f"{megatron}/pretrain_gpt.py",
            *NO_TE_FLAGS, *COMMON_FLAGS, *SHAPES[shape]["flags"], *knob_flags(p), *proto,
            *(extra or [])]


# flags every point carries whatever its knobs: not part of a point's id
_BASE_FLAGS = {f for f in [*NO_TE_FLAGS, *COMMON_FLAGS, *PROTOCOL, "--tensorboard-dir",
                           "--recompute-modules", "--cuda-graph-modules",
                           *(x for sh in SHAPES.values() for x in sh["flags"])]
               if f.startswith("--")}


def point_of(argv: list[str], env: dict[str, str] | None = None) -> tuple[dict[str, Any], list[str]]:
    """The grid point a command runs (`tune`'s final command), and what it sets beyond the
    grid's knobs (flags and environment the point ids cannot spell), as `--flag value` texts."""
    flags: dict[str, list[str]] = {}
    cur: str | None = None
    for a in argv[argv.index(next(x for x in argv if x.endswith("pretrain_gpt.py"))) + 1:]:
        if a.startswith("--"):
            cur = a
            flags[cur] = []
        elif cur is not None:
            flags[cur].append(a)
    one = {k: (v[0] if v else "") for k, v in flags.items()}
    rc = one.get("--recompute-granularity", "none")
    modules = flags.get("--recompute-modules")
    graphs = "eager"
    if one.get("--cuda-graph-impl") == "local":
        graphs = ("local" if sorted(flags.get("--cuda-graph-modules") or []) ==
                  ["moe_preprocess", "moe_router"] else "local_layer")
    p = {"mbs": int(one.get("--micro-batch-size", 1)), "grouped": "--moe-grouped-gemm" in flags,
         "recompute": rc, "dispatcher": one.get("--moe-token-dispatcher-type", "allgather"),
         "graphs": graphs}
    known = {f for f in knob_flags(p) if f.startswith("--")} | _BASE_FLAGS
    extra = [f"{k} {' '.join(v)}".strip() for k, v in flags.items()
             if k not in known]
    if rc == "selective" and modules not in (None, ["core_attn"]):
        extra.append("--recompute-modules " + " ".join(modules))  # the grid's is the default
    extra += [f"{k}={v}" for k, v in sorted((env or {}).items())]
    return p, extra


def neighbours(p: dict[str, Any]) -> list[dict[str, Any]]:
    p = full_point(p)
    return [{**p, k: v} for k, values in KNOBS.items() for v in values if v != p[k]]


# ---- Megatron-LM's log lines (megatron/training/training.py training_log, report_memory) ----
_IT = re.compile(r" iteration\s+(\d+)/\s*\d+ \|.*?elapsed time per iteration \(ms\): ([\d.]+)")
_TFLOPS = re.compile(r" iteration\s+(\d+)/.*?throughput per GPU \(TFLOP/s/GPU\): ([\d.]+)")
_MEM = re.compile(r"\(after (\d+) iterations\) memory \(MB\) \| allocated: ([\d.]+) \| "
                  r"max allocated: ([\d.]+) \| reserved: ([\d.]+) \| max reserved: ([\d.]+)")
_OOM = re.compile(r"CUDA out of memory|OutOfMemoryError|CUBLAS_STATUS_ALLOC_FAILED", re.I)
_LOSS = re.compile(r" iteration\s+(\d+)/.*? lm loss: ([\d.E+-]+)")
_STAMP = re.compile(r"\[(after [^\]]+|before [^\]]+)\] datetime: (\S+ \S+)")
_INIT = re.compile(r"time to initialize megatron \(seconds\): ([\d.]+)")


def parse_log(text: str, rc: int) -> dict[str, Any]:
    its = {int(i): float(ms) for i, ms in _IT.findall(text)}
    out: dict[str, Any] = {"iter_ms": [its[i] for i in sorted(its)], "iterations": len(its)}
    steady = [its[i] for i in STEADY if i in its]
    out["steady_n"] = len(steady)
    out["step_ms"] = round(statistics.median(steady), 2) if len(steady) >= 4 else None
    tf = {int(i): float(v) for i, v in _TFLOPS.findall(text)}
    st = [tf[i] for i in STEADY if i in tf]
    out["tflops_per_gpu"] = round(statistics.median(st), 2) if st else None
    mem = _MEM.findall(text)
    if mem:
        last = mem[-1]
        out["mem_after_iter"] = int(last[0])
        out["max_alloc_gib"] = round(float(last[2]) / 1024, 2)
        out["max_reserved_gib"] = round(float(last[4]) / 1024, 2)
    losses = {int(i): float(v) for i, v in _LOSS.findall(text)}
    if losses:
        out["loss_last"] = losses[max(losses)]
    m = _INIT.search(text)
    out["init_s"] = float(m.group(1)) if m else None
    out["stamps"] = dict(_STAMP.findall(text))
    if rc == 0 and its and len(its) == max(its):
        status = "ok"
    elif _OOM.search(text):
        status = "oom"
    elif rc in (124, 137):
        status = "timeout"
    elif "error: unrecognized arguments" in text or ("AssertionError" in text and not its):
        status = "refused"
    else:
        status = "crash"
    out["status"] = status
    if status != "ok":
        lines = [ln for ln in text.splitlines() if "Error" in ln or "error" in ln]
        out["error"] = (lines[-1] if lines else (text.strip().splitlines() or [""])[-1])[:300]
    return out


if __name__ == "__main__":  # the grid start's command, for `moetune tune --cmd` (bench/gpu/mlm_tune.sh)
    import shlex
    import sys

    shape, megatron = sys.argv[1], sys.argv[2]
    point = parse_id(sys.argv[3]) if len(sys.argv) > 3 else {}
    print(shlex.join(command(megatron, shape, point, "", repeat=True)))
