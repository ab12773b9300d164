"""What one run measured and whether it is healthy: the run's step time over its measured window
(and whether it drifted inside it), its losses, its failure cause, the loss health of a candidate
against its baseline, and the audit of the changed knob on the candidate's trace.

- step time: the median `elapsed time per iteration` over the run's measured window (never the
  warm-up iterations, never a profiled one);
- drift: the median of the window's second half against its first half; beyond `DRIFT_LIMIT` the
  run is `drifting`, and its step time is the second half's median, not averaged over the drift.
  On Megatron-LM's host-bound runs (bench/grid_mlm) the first 5-7 iterations kept recompiling its
  `torch.compile` fusions for new per-expert token counts (MBS 8: 652, 569, 358 ms, then 240-320
  ms); a run can also slow down inside one process. The A/B counts a quarter of the drift as that
  run's remaining uncertainty (executor/ab.py);
- health: every run must finish (crash, hang/timeout, OOM, NaN, skipped iterations → rejected with
  that cause); the candidate's loss over the window must be finite and within `loss_tolerance`
  (relative) of the baseline's over the same iterations;
- proof: the candidate's trace is audited (analyzer.audit) for the changed knob: `contradicted`
  rejects; `unobservable` is reported but never counted as proof.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from moetune.analyzer.flops import num_floating_point_operations
from moetune.executor.launchers.base import RunResult
from moetune.executor.logparse import ParsedLog, steady

from moetune.errors import UserError


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


DRIFT_LIMIT = 0.10  # a run whose window's halves differ by more is drifting


@dataclass(frozen=True, slots=True)
class Policy:
    """How a candidate is judged (executor/ab.py): runs of `warmup` + `measured` iterations (and
    a profile tail), at most `max_pairs` A/B pairs, a win only when the gain's lower bound (z ·
    standard error under the run-to-run noise) clears `min_gain`."""

    warmup: int = 2
    measured: int = 12
    max_pairs: int = 4
    min_gain: float = 0.02
    loss_tolerance: float = 0.05
    timeout_s: float | None = 900.0
    noise_prior: float = 0.10  # log-σ of a run's median between fresh processes, a prior
    z: float = 1.645           # one-sided 95 %


def run_metrics(parsed: ParsedLog, result: RunResult, window: Window,
                *, expected_iters: int | None = None) -> dict[str, Any]:
    """What one run measured, and whether it failed (`cause` is None for a healthy run)."""
    it = parsed.iterations
    win = steady(it, first=window.first, last=window.last)
    losses = {int(r["iteration"]): r["lm_loss"] for r in win.iter_rows(named=True)}
    last_it = int(it.get_column("iteration").max()) if it.height else 0  # type: ignore[arg-type]
    skipped = int(it.get_column("skipped_iterations").fill_null(0).sum()) if it.height else 0
    nans = int(it.get_column("nan_iterations").fill_null(0).sum()) if it.height else 0
    peak = parsed.memory.get_column("max_allocated_mb").max() if parsed.memory.height else None
    if peak is None and parsed.memory.height:
        peak = parsed.memory.get_column("allocated_mb").max()
    times = win.get_column("elapsed_ms").to_list()
    step_ms, window_ms, drift, drifting = run_level(times)
    tflops = _model_tflops(parsed, window_ms)
    m: dict[str, Any] = {
        "window": str(window),
        "step_ms": step_ms,
        "window_median_ms": window_ms,
        "step_ms_all": times,
        "drift": drift,
        "drifting": drifting,
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


def run_level(times: Sequence[float | None]) -> tuple[float | None, float | None,
                                                      float | None, bool]:
    """(step ms, window median ms, drift, drifting) of a measured window's step times: the
    window's median, or its later half's when the halves differ by more than DRIFT_LIMIT (the
    run's level once the drift is behind it)."""
    window_ms = _median([x for x in times if x is not None])
    drift = _drift(times)
    drifting = drift is not None and abs(drift) > DRIFT_LIMIT
    step_ms = _median([x for x in times[len(times) - len(times) // 2:] if x is not None]) \
        if drifting else window_ms
    return step_ms, window_ms, drift, drifting


def _drift(times: Sequence[float | None]) -> float | None:
    """Median of the window's second half over its first half, minus one (None under 4 values)."""
    xs = [x for x in times if x is not None and math.isfinite(x)]
    if len(xs) < 4:
        return None
    h = len(xs) // 2
    a, b = statistics.median(xs[:h]), statistics.median(xs[-h:])
    return b / a - 1.0 if a else None


def _median(xs: Sequence[float]) -> float | None:
    vals = [x for x in xs if x is not None and math.isfinite(x)]
    return float(statistics.median(vals)) if vals else None


def _model_tflops(parsed: ParsedLog, step_ms: float | None) -> float | None:
    """Model TFLOP/s/GPU from the run's own arguments (analyzer.flops), not from the log field."""
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


def run_log_contract(path: str | Path) -> Any:
    """The contract a run's own log states (Megatron's argument dump; {} when it states none),
    None when the log cannot be read or the analyzer is not installed."""
    try:
        from moetune.analyzer.megatron_args import contract_from_log

        return contract_from_log(Path(path).read_text(errors="replace"))
    except (ImportError, OSError, UserError):
        return None


def audit_change(trace_paths: Sequence[str], knob: str, value: Any, contract: Any = None,
                 log_path: str | Path | None = None) -> dict[str, Any]:
    """Verdict of the colleague's audit for the changed knob on the candidate's trace.

    confirmed = proof the change ran; contradicted = it did not (reject); unobservable = the
    trace cannot tell (reported, not proof); unavailable = no trace or no audit module. Without
    a contract the candidate's own log (`log_path`: Megatron's argument dump) states the rest of
    the run (global batch, DP …), which some signatures need to tell what ran."""
    if not trace_paths:
        return {"verdict": "unavailable", "reason": "no candidate trace"}
    try:
        from moetune.analyzer.contract import contract_from_doc, with_args

        from moetune.analysis import analyze
    except ImportError:
        return {"verdict": "unavailable", "reason": "moetune.analyzer.audit not installed"}
    try:
        if contract is None and log_path:
            contract = run_log_contract(log_path) or None
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
