"""A/B validation of one change: matched screens, a noise band, a confirm run, health checks.

Protocol (the validate phase of Megatron-Bridge's MoE optimization workflow,
`docs/training/moe-optimization.md`):
- screens: A (baseline) and B (candidate) run alternately, A B A B A B (≥3 repeats each), same
  seed, data and iteration count; each run's step time is the median `elapsed time per iteration`
  over its post-warmup window (unprofiled runs only);
- noise: the relative spread of the repeats of each arm, (max − min) / median, the larger of the
  two; the screen gain is median(A)/median(B) − 1 and a change survives only if gain > noise
  (and > `min_gain`);
- confirm: the winner and the baseline re-run ≥50 iterations and are compared over a declared
  steady window (e.g. 41–50); the confirm gain must again exceed the screen noise band;
- health: every run must finish (crash, hang/timeout, OOM, NaN, skipped iterations → rejected
  with that cause); the candidate's loss over the window must be finite and within
  `loss_tolerance` (relative) of the baseline's over the same iterations;
- proof: the candidate's trace is audited (analyzer.audit) for the changed knob: `contradicted`
  rejects; `unobservable` is reported but never counted as proof.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import polars as pl
from moetune.executor.flops import num_floating_point_operations
from moetune.executor.launchers.base import RunResult
from moetune.executor.logparse import ParsedLog, steady


@dataclass(frozen=True, slots=True)
class Window:
    first: int
    last: int

    @classmethod
    def parse(cls, text: str) -> Window:
        a, _, b = text.partition("-")
        return cls(int(a), int(b or a))

    @classmethod
    def tail(cls, iters: int, *, warmup_frac: float = 0.5, size: int | None = None) -> Window:
        """The post-warmup window of a run of `iters` iterations (last `size` ones, or the
        second half)."""
        first = iters - size + 1 if size else max(2, int(iters * warmup_frac) + 1)
        return cls(max(first, 2), iters)  # iteration 1 carries start-up: never in a window

    def __str__(self) -> str:
        return f"{self.first}-{self.last}"


@dataclass(frozen=True, slots=True)
class Policy:
    repeats: int = 3
    screen_iters: int = 12
    confirm_iters: int = 50
    confirm_window: Window = field(default_factory=lambda: Window(41, 50))
    min_gain: float = 0.02
    loss_tolerance: float = 0.05
    timeout_s: float | None = 900.0


def run_metrics(parsed: ParsedLog, result: RunResult, window: Window,
                *, expected_iters: int | None = None) -> dict[str, Any]:
    """What one run measured, and whether it failed (`cause` is None for a healthy run)."""
    it = parsed.iterations
    win = steady(it, first=window.first, last=window.last)
    step_ms = _median(win.get_column("elapsed_ms").drop_nulls().to_list())
    losses = {int(r["iteration"]): r["lm_loss"] for r in win.iter_rows(named=True)}
    last_it = int(it.get_column("iteration").max()) if it.height else 0  # type: ignore[arg-type]
    skipped = int(it.get_column("skipped_iterations").fill_null(0).sum()) if it.height else 0
    nans = int(it.get_column("nan_iterations").fill_null(0).sum()) if it.height else 0
    peak = parsed.memory.get_column("max_allocated_mb").max() if parsed.memory.height else None
    if peak is None and parsed.memory.height:
        peak = parsed.memory.get_column("allocated_mb").max()
    tflops = _model_tflops(parsed, step_ms)
    m: dict[str, Any] = {
        "window": str(window),
        "step_ms": step_ms,
        "step_ms_all": win.get_column("elapsed_ms").to_list(),
        "tflops_per_gpu": tflops,
        "tflops_per_gpu_logged": _median(win.get_column("tflops_per_gpu").drop_nulls().to_list()),
        "lm_loss": {str(k): v for k, v in losses.items()},
        "last_loss": it.get_column("lm_loss").drop_nulls().to_list()[-1]
        if it.height and it.get_column("lm_loss").drop_nulls().len() else None,
        "last_iteration": last_it,
        "skipped_iterations": skipped,
        "nan_iterations": nans,
        "peak_memory_mb": peak,
        "completed": parsed.completed,
        "implementation": parsed.implementation,
        "returncode": result.returncode,
        "wall_s": round(result.wall_s, 3),
    }
    m["cause"] = failure_cause(parsed, result, m, expected_iters=expected_iters)
    return m


def failure_cause(parsed: ParsedLog, result: RunResult, m: Mapping[str, Any],
                  *, expected_iters: int | None) -> str | None:
    """hang | oom | usage | nccl | killed | crash | nan | skipped | incomplete | no-iterations."""
    if result.timed_out:
        return "hang"
    if parsed.failure == "oom":
        return "oom"
    if result.returncode not in (0, None):
        return parsed.failure or "crash"
    if m["nan_iterations"] or any(v is not None and not math.isfinite(v)
                                  for v in m["lm_loss"].values()):
        return "nan"
    if m["skipped_iterations"]:
        return "skipped"
    if not parsed.iterations.height:
        return "no-iterations"
    if expected_iters and m["last_iteration"] < expected_iters:
        return "incomplete"
    if m["step_ms"] is None:
        return "no-iterations"
    return None


def _median(xs: Sequence[float]) -> float | None:
    vals = [x for x in xs if x is not None and math.isfinite(x)]
    return float(statistics.median(vals)) if vals else None


def _model_tflops(parsed: ParsedLog, step_ms: float | None) -> float | None:
    """Model TFLOP/s/GPU from the run's own arguments (executor.flops), not from the log field."""
    a = parsed.args
    need = ("num_layers", "hidden_size", "num_attention_heads", "seq_length", "global_batch_size")
    if not step_ms or not all(k in a for k in need):
        return None
    world = int(a.get("world_size") or 1)
    try:
        flops = num_floating_point_operations(a, int(a["global_batch_size"]))
    except (KeyError, TypeError, ValueError):
        return None
    return flops / (step_ms / 1e3 * 1e12 * world)


def screen_stats(a_ms: Sequence[float | None], b_ms: Sequence[float | None]) -> dict[str, Any]:
    """Gain of B over A and the noise band from the repeats (all relative, 0.1 = 10 %)."""
    a = [x for x in a_ms if x]
    b = [x for x in b_ms if x]
    if not a or not b:
        return {"gain": None, "noise": None, "a_ms": list(a_ms), "b_ms": list(b_ms)}
    ma, mb = statistics.median(a), statistics.median(b)

    def spread(xs: list[float], med: float) -> float:
        return (max(xs) - min(xs)) / med if len(xs) > 1 else float("inf")

    return {"gain": ma / mb - 1.0, "noise": max(spread(a, ma), spread(b, mb)),
            "a_median_ms": ma, "b_median_ms": mb, "a_ms": list(a_ms), "b_ms": list(b_ms)}


def screen_verdict(stats: Mapping[str, Any], policy: Policy, unlocks: Sequence[str] = ()
                   ) -> tuple[bool, str | None]:
    """Whether a screen winner goes on to confirm: a gain above the noise band, or, for a change
    that `unlocks` others (an enabler), not measurably slower."""
    gain, noise = stats.get("gain"), stats.get("noise")
    if gain is None:
        return False, "no-measurement"
    if unlocks and noise is not None and _not_slower(gain, noise, policy):
        return True, None
    if gain <= policy.min_gain:
        return False, f"no gain ({gain:+.1%} ≤ {policy.min_gain:.0%})"
    if gain <= noise:
        return False, f"within noise ({gain:+.1%} ≤ noise band {noise:.1%})"
    return True, None


def loss_health(base: Mapping[str, Any], cand: Mapping[str, Any], tol: float
                ) -> tuple[bool, str | None, float | None]:
    """Candidate loss finite and within `tol` (relative) of the baseline over the same steps."""
    common = sorted(set(base["lm_loss"]) & set(cand["lm_loss"]), key=int)
    if not common:
        return False, "loss: no common iterations to compare", None
    b = [base["lm_loss"][k] for k in common]
    c = [cand["lm_loss"][k] for k in common]
    if any(v is None or not math.isfinite(v) for v in c):
        return False, "nan", None
    mb, mc = statistics.fmean(b), statistics.fmean(c)
    rel = abs(mc - mb) / abs(mb) if mb else abs(mc - mb)
    if rel > tol:
        return False, f"loss diverged ({mc:.4g} vs {mb:.4g}, {rel:.1%} > {tol:.0%})", rel
    return True, None, rel


def audit_change(trace_paths: Sequence[str], knob: str, value: Any, contract: Any = None
                 ) -> dict[str, Any]:
    """Verdict of the colleague's audit for the changed knob on the candidate's trace.

    confirmed = proof the change ran; contradicted = it did not (reject); unobservable = the
    trace cannot tell (reported, not proof); unavailable = no trace or no audit module."""
    if not trace_paths:
        return {"verdict": "unavailable", "reason": "no candidate trace"}
    try:
        from moetune.analyzer.contract import contract_from_doc, with_args

        from moetune.analysis import analyze
    except ImportError:
        return {"verdict": "unavailable", "reason": "moetune.analyzer.audit not installed"}
    try:
        # the candidate's claims: the baseline contract with the changed argument set
        claims = contract_from_doc(with_args(contract if isinstance(contract, Mapping) else None,
                                             {knob: value}))
        result = analyze(list(trace_paths), claims, full=False).audit or {}
    except Exception as exc:  # the audit is evidence about the run, never a crash of the loop
        return {"verdict": "unavailable", "reason": f"audit failed: {exc}"[:300]}
    entry = (result.get("verdicts") or {}).get(knob)
    if entry is None:
        return {"verdict": "unobservable", "reason": f"no signature audits {knob}"}
    return {"verdict": entry.get("verdict", "unobservable"), "reason": entry.get("reason"),
            "detail": {k: v for k, v in entry.items() if k not in ("verdict", "reason")}}


def _not_slower(gain: float, noise: float, policy: Policy) -> bool:
    """Not measurably slower: the gain is above minus the noise band."""
    return gain > -max(noise, policy.min_gain)


def decide(*, screen: Mapping[str, Any], confirm_base: Mapping[str, Any] | None,
           confirm_cand: Mapping[str, Any] | None, audit: Mapping[str, Any] | None,
           policy: Policy, unlocks: Sequence[str] = ()) -> dict[str, Any]:
    """Final verdict of one candidate from its screen stats, confirm runs and audit. A change
    that `unlocks` others (it lifts the constraints blocking them) is accepted as an enabler when
    it is healthy, ran, and is not measurably slower: its worth is what it makes possible."""
    out: dict[str, Any] = {"screen": dict(screen)}
    ok, why = screen_verdict(screen, policy, unlocks)
    if not ok:
        return {**out, "verdict": "rejected", "cause": why, "measured_gain": screen.get("gain"),
                "noise": screen.get("noise")}
    assert confirm_base is not None and confirm_cand is not None
    for role, m in (("baseline", confirm_base), ("candidate", confirm_cand)):
        if m.get("cause"):
            return {**out, "verdict": "rejected", "cause": f"confirm {role}: {m['cause']}",
                    "measured_gain": None, "noise": screen["noise"]}
    gain = confirm_base["step_ms"] / confirm_cand["step_ms"] - 1.0
    out["confirm"] = {"gain": gain, "baseline_ms": confirm_base["step_ms"],
                      "candidate_ms": confirm_cand["step_ms"], "window": confirm_cand["window"],
                      "tflops_per_gpu": [confirm_base.get("tflops_per_gpu"),
                                         confirm_cand.get("tflops_per_gpu")],
                      "peak_memory_mb": [confirm_base.get("peak_memory_mb"),
                                         confirm_cand.get("peak_memory_mb")]}
    healthy, why, rel = loss_health(confirm_base, confirm_cand, policy.loss_tolerance)
    out["loss_rel_diff"] = rel
    if not healthy:
        return {**out, "verdict": "rejected", "cause": why, "measured_gain": gain,
                "noise": screen["noise"]}
    if audit is not None:
        out["audit"] = dict(audit)
        if audit.get("verdict") == "contradicted":
            return {**out, "verdict": "rejected", "cause": "audit: the change did not run",
                    "measured_gain": gain, "noise": screen["noise"]}
    band = max(screen["noise"], policy.min_gain)
    if gain <= band and unlocks and _not_slower(gain, screen["noise"], policy):
        return {**out, "verdict": "accepted", "cause": None, "measured_gain": gain,
                "noise": screen["noise"], "enables": list(unlocks),
                "proof": f"enabler: not slower beyond the noise band ({gain:+.1%} against "
                         f"±{band:.1%}); it unlocks {', '.join(unlocks)}"}
    if gain <= band:
        return {**out, "verdict": "rejected",
                "cause": f"confirm gain {gain:+.1%} within noise band {screen['noise']:.1%}",
                "measured_gain": gain, "noise": screen["noise"]}
    proof = (audit or {}).get("verdict", "unavailable")
    return {**out, "verdict": "accepted", "cause": None, "measured_gain": gain,
            "noise": screen["noise"], "proof": proof if proof == "confirmed" else
            f"{proof} (not counted as proof)"}


def iterations_frame(metrics: Sequence[Mapping[str, Any]]) -> pl.DataFrame:
    """Step times of several runs as one frame (label, repeat, step_ms) for reports."""
    rows = [{"label": m.get("label"), "repeat": m.get("repeat"), "step_ms": m.get("step_ms")}
            for m in metrics]
    return pl.DataFrame(rows, schema={"label": pl.String, "repeat": pl.Int64,
                                      "step_ms": pl.Float64}, orient="row")
