"""The diagnosis' `throughput` section: model FLOPs per step → TFLOP/s per GPU and MFU, per GEMM
phase achieved TFLOP/s, and the run's log as a cross-check.

Model FLOPs per step are Megatron-LM's own count (`num_floating_point_operations`, transcribed in
analyzer/flops.py) over the global batch, from the model the contract (or the run's log) states;
TFLOP/s per GPU = FLOPs / (median step time · world size · 1e12), exactly Megatron's `throughput
per GPU`. MFU = that over the GPU's dense peak for the dtype its GEMMs run in (analyzer/gpus.yaml):
FP8 where the contract or the trace says FP8 GEMMs ran, else the parameters' dtype (BF16 when
nothing says, and the section says it assumed so). A GEMM phase's achieved TFLOP/s is the model
FLOPs of its part of the formula (per GPU) over its forward and backward GPU busy time in the
median step: everything the phase runs counts (the attention's norms and softmax too), so it is
what the phase achieves, not a kernel's rate. The log's iterations each imply the FLOPs per step
Megatron counted (its TFLOP/s × elapsed × world size); at the trace's step time those give the
log's TFLOP/s, and a disagreement beyond `AGREEMENT` is reported (a model the contract describes
otherwise than the run, a world size that differs).
"""

from __future__ import annotations

import statistics
from collections.abc import Mapping, Sequence
from typing import Any

import polars as pl
from moetune.analyzer.flops import UnsupportedModel, flops_by_part
from moetune.analyzer.gpus import gpu_model

AGREEMENT = 0.10  # relative: the log's and this section's TFLOP/s per GPU
FORMULA = "Megatron-LM megatron/training/training.py num_floating_point_operations"
NEEDED = ("num_layers", "hidden_size", "num_attention_heads", "seq_length")


def diagnosis_section(trace: Any, steps: Any, ctx: Any) -> dict[str, Any]:
    """`diagnose.Section`: `throughput`, after the `phases` section (it reads their busy times)."""
    return {"throughput": throughput_document(
        ctx.doc, ranks=trace.ranks, contract=ctx.contract, run_log=getattr(ctx, "run_log", None))}


def model_args(contract: Mapping[str, Any] | None, run_log: Mapping[str, Any] | None
               ) -> tuple[dict[str, Any], str | None]:
    """Megatron arguments describing the model, and where they came from."""
    if contract:
        from moetune.analyzer.contract import effective_args

        args = effective_args(contract)
        if all(args.get(k) is not None for k in NEEDED):
            return args, "contract"
    if run_log and run_log.get("args"):
        args = dict(run_log["args"])
        if all(args.get(k) is not None for k in NEEDED):
            return args, "log"
    return {}, None


def _world(args: Mapping[str, Any], ranks: pl.DataFrame) -> tuple[int | None, str | None]:
    w = args.get("world_size")
    if isinstance(w, int) and w > 0:
        return w, "model"
    ws = ranks.get_column("world_size").drop_nulls().unique().to_list() if ranks.height else []
    if len(ws) == 1 and ws[0] > 0:
        return int(ws[0]), "trace"
    return None, None


def _dtype(args: Mapping[str, Any], observed: Mapping[str, Any]) -> tuple[str, str]:
    # `fp8` is the format (e4m3 / hybrid) when FP8 runs, None otherwise; fp8_recipe and its kin
    # keep their defaults in every argument dump, FP8 or not
    if args.get("fp8") or args.get("fp8_format"):
        return "fp8", "model"
    if observed.get("fp8_gemm"):
        return "fp8", "trace"
    if args.get("bf16"):
        return "bf16", "model"
    if args.get("fp16"):
        return "fp16", "model"
    return "bf16", "assumed"


def _device(ranks: pl.DataFrame, contract: Mapping[str, Any] | None) -> str | None:
    names = ranks.get_column("device_name").drop_nulls().to_list() if ranks.height else []
    if names:
        return str(names[0])
    hw = (contract or {}).get("hardware") or {}
    return str(hw["gpu_model"]) if hw.get("gpu_model") else None


def throughput_document(doc: Mapping[str, Any], *, ranks: pl.DataFrame,
                        contract: Mapping[str, Any] | None,
                        run_log: Mapping[str, Any] | None) -> dict[str, Any]:
    args, source = model_args(contract, run_log)
    step = float(doc.get("step_time_s") or 0.0)
    out: dict[str, Any] = {
        "formula": FORMULA, "model_source": source, "flops_per_step": None,
        "global_batch_size": None, "world_size": None, "world_size_source": None,
        "step_time_s": step, "tflops_per_gpu": None, "gpu": _device(ranks, contract),
        "dtype": None, "dtype_source": None, "peak_tflops": None, "peak_source": None, "mfu": None,
        "phases": [], "by_phase": {}, "log": None, "notes": [],
    }
    notes: list[str] = out["notes"]
    if source is None:
        notes.append("no model stated: a contract (or the run's log with its argument dump) gives the FLOPs")
        return out
    gbs = args.get("global_batch_size")
    if not isinstance(gbs, int) or gbs < 1:
        notes.append("the model states no global batch size: FLOPs per step unknown")
        return out
    try:
        parts = flops_by_part(args, gbs)
    except (UnsupportedModel, KeyError, TypeError, ValueError) as exc:
        notes.append(f"FLOPs not counted: {exc}")
        return out
    flops = float(sum(parts.values()))
    world, wsrc = _world(args, ranks)
    dtype, dsrc = _dtype(args, doc.get("observed") or {})
    out.update(flops_per_step=flops, global_batch_size=gbs, world_size=world,
               world_size_source=wsrc, dtype=dtype, dtype_source=dsrc)
    if world is None:
        notes.append("world size unknown (neither the model nor the trace states it)")
        return out
    if step > 0:
        out["tflops_per_gpu"] = flops / (step * world * 1e12)
    gpu = gpu_model(out["gpu"])
    peak = gpu.peak_tflops.get(dtype) if gpu is not None else None
    if peak:
        out.update(peak_tflops=float(peak), peak_source=gpu.source)
        if out["tflops_per_gpu"] is not None:
            out["mfu"] = out["tflops_per_gpu"] / peak
    else:
        notes.append(f"no {dtype} peak for GPU {out['gpu'] or 'unknown'} in analyzer/gpus.yaml: "
                     "MFU unknown")
    out["phases"] = _phase_rates(doc.get("phases") or {}, parts, world)
    out["by_phase"] = {p["phase"]: {"tflops": p["tflops"],
                                    "mfu": p["tflops"] / peak if p["tflops"] is not None and peak
                                    else None} for p in out["phases"]}
    if run_log and run_log.get("iterations"):
        out["log"] = log_check(run_log, flops=flops, world=world, step_s=step,
                               tflops=out["tflops_per_gpu"])
        if out["log"]["agrees"] is False:
            notes.append(f"the log's TFLOP/s/GPU differs by {out['log']['ratio'] - 1:+.0%} from this "
                         "count: the model or world size the log ran with is not the one given")
    return out


def _phase_rates(phases: Mapping[str, Any], parts: Mapping[str, float], world: int
                 ) -> list[dict[str, Any]]:
    """Achieved TFLOP/s of the phases that own a part of the formula."""
    from moetune.analyzer.phases_book import load_phases

    owner = {p.phase: p.flops for p in load_phases().phases if p.flops}
    rows = []
    for r in phases.get("rows") or []:
        part = owner.get(r["phase"])
        if not part or not parts.get(part):
            continue
        d = r.get("busy_by_direction_s") or {}
        busy = float(d.get("forward", 0.0)) + float(d.get("backward", 0.0))
        f = parts[part] / world
        rows.append({"phase": r["phase"], "flops": f, "busy_s": busy,
                     "tflops": f / busy / 1e12 if busy > 0 else None})
    return rows


def log_check(run_log: Mapping[str, Any], *, flops: float, world: int, step_s: float,
              tflops: float | None) -> dict[str, Any]:
    """The log's iterations against this count (module doc). `run_log`: `file` and `iterations`
    ({iteration, elapsed_s, tflops_per_gpu}); `steady: True` when those are already the run's
    steady unprofiled iterations (the reference step's), else the first third is warm-up."""
    its: Sequence[Mapping[str, Any]] = sorted(
        (i for i in run_log["iterations"] if i.get("elapsed_s") and i.get("tflops_per_gpu")),
        key=lambda i: i.get("iteration") or 0)
    steady = its if run_log.get("steady") else its[len(its) // 3:] or its
    out: dict[str, Any] = {"file": run_log.get("file"), "iterations": len(steady),
                           "tflops_per_gpu_median": None, "step_time_s_median": None,
                           "flops_per_step": None, "tflops_at_trace_step": None, "ratio": None,
                           "agrees": None}
    if not steady:
        return out
    implied = [i["tflops_per_gpu"] * 1e12 * i["elapsed_s"] * world for i in steady]
    f_log = statistics.median(implied)
    # the lower median, as the reference step is (executor/logparse.py): one logged iteration
    out.update(tflops_per_gpu_median=statistics.median(i["tflops_per_gpu"] for i in steady),
               step_time_s_median=statistics.median_low(i["elapsed_s"] for i in steady),
               flops_per_step=f_log)
    if step_s > 0 and f_log > 0:
        at = f_log / (step_s * world * 1e12)
        out["tflops_at_trace_step"] = at
        if tflops is not None:
            out["ratio"] = tflops / at
            out["agrees"] = abs(tflops / at - 1) <= AGREEMENT
    return out


def summary_lines(doc: Mapping[str, Any]) -> list[str]:
    """Terminal lines of the section."""
    t = doc.get("throughput")
    if not t:
        return []
    if t.get("tflops_per_gpu") is None:
        return [f"throughput: unknown ({'; '.join(t.get('notes') or ['no model'])})"]
    mfu = (f", MFU {t['mfu'] * 100:.1f} % of {t['peak_tflops']:,.0f} {t['dtype']} TFLOP/s "
           f"({t['gpu']}{'; dtype assumed' if t['dtype_source'] == 'assumed' else ''})"
           if t.get("mfu") is not None else "")
    lines = [f"throughput: {t['tflops_per_gpu']:,.1f} TFLOP/s per GPU{mfu} · "
             f"{t['flops_per_step'] / 1e12:,.2f} TFLOP per step (Megatron's count, model from "
             f"the {t['model_source']}, {t['world_size']} GPU{'s' if t['world_size'] != 1 else ''})"]
    rates = [f"{p['phase']} {p['tflops']:,.1f}" for p in t.get("phases") or [] if p.get("tflops")]
    if rates:
        lines.append("  achieved TFLOP/s per GEMM phase (model FLOPs over its busy time): "
                     + " · ".join(rates))
    if (said := log_words(t.get("log"))) is not None:
        lines.append(f"  {said}")
    lines += [f"  note: {n}" for n in t.get("notes") or []]
    return lines


def log_words(log: Mapping[str, Any] | None) -> str | None:
    """What the log's cross-check says, in the terminal's and the page's words: what agrees
    with what (the FLOPs per step), and the log's own TFLOP/s beside this step's."""
    if not log or log.get("ratio") is None:
        return None
    verdict = "agrees" if log["agrees"] else "DISAGREES"
    return (f"log {log['file']}: the FLOPs per step it implies (its TFLOP/s × iteration time, "
            f"median of {log['iterations']} steady iteration{'s' if log['iterations'] != 1 else ''}"
            f") {log['flops_per_step'] / 1e12:,.2f} TFLOP: this count {verdict} "
            f"({(log['ratio'] - 1) * 100:+.1f} %) · its TFLOP/s per GPU "
            f"{log['tflops_per_gpu_median']:,.1f} at its {log['step_time_s_median']:,.3f} s step, "
            f"{log['tflops_at_trace_step']:,.1f} at this profiled step")
