"""One memory decision for every candidate change: its predicted peak against the GPU.

**Allocated.** The measured peak allocated of this run (the diagnosis' `memory` section: the
trace's allocator events, the log's memory lines or a memory snapshot) plus the memory model's
delta for the change (predict.py `predict_peak`); without a measured peak, the model alone, ±
planner.yaml `model_error`.

**Reserved** (what an out-of-memory is about) is a range. Low: the allocated peak plus the caching
allocator's slack this run shows (measured reserved − allocated, kept as it is). High: the
allocated peak × the fragmentation this run shows (measured reserved / allocated: the slack grown
in proportion). On the H200 grid's memory-bound shape the measured reserved peak of every point
reached from another lay at or below the low end +9 % (the slack did not grow in proportion: 124.8
GiB reserved after turning recompute off at MBS 4, where ×1.205 says 146 GiB). Without a measured
reserved: low = allocated, high = allocated + planner.yaml's fragmentation of the changed
configuration's dynamic memory. A change that turns expandable segments on keeps little slack:
low = allocated, high = allocated + the expandable-segments fragmentation.

**Verdict.** With the CUDA context (planner.yaml `cuda_context_gib`, outside the allocator) added to
both ends, against the GPU's memory C (the trace's device properties, else the contract's
`hardware.gpu_memory_gb`):
`does not fit` when the low end is over C; `fits` when the high end is at most C × (1 − margin)
(planner.yaml `verdict_margin`); `tight` otherwise; `unknown` when C or the change's delta is
unknown (the contract does not describe the model).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from moetune.analyzer.planner.config import GIB, PlannerConfig, builtin

from moetune.errors import UserError

FITS, TIGHT, DOES_NOT_FIT, UNKNOWN = "fits", "tight", "does not fit", "unknown"
VERDICTS = (FITS, TIGHT, DOES_NOT_FIT, UNKNOWN)
EVIDENCE_WORDS = {"allocator_events": "the trace's allocator events",
                  "cuda_memory_usage": "the trace's driver allocations",
                  "log": "the run's log", "snapshot": "the memory snapshot"}
ALLOC_CONF = "PYTORCH_CUDA_ALLOC_CONF"


@dataclass(frozen=True, slots=True)
class Verdict:
    verdict: str  # fits | tight | does not fit | unknown
    allocated_gib: float | None  # predicted allocated peak
    reserved_gib: tuple[float, float] | None  # predicted reserved peak, low and high
    capacity_gib: float | None
    capacity_from: str | None  # "the trace's device properties" | "the contract's hardware"
    margin: float
    context_gib: float
    fragmentation: float | None  # measured reserved / allocated, the high end's factor
    evidence: str  # the measured peak's source (allocator_events | log | snapshot | …) or "model"
    basis: str  # the allocated peak's derivation
    why: str  # the verdict in words

    @property
    def fits(self) -> bool | None:
        """False only for `does not fit`; None when unknown (the older field's meaning)."""
        return None if self.verdict == UNKNOWN else self.verdict != DOES_NOT_FIT

    def document(self) -> dict[str, Any]:
        """The `memory` entry of a recommendation (schemas/recommendation.schema.json)."""
        r = self.reserved_gib
        return {
            "verdict": self.verdict,
            "fits": self.fits,
            "peak_gib": self.allocated_gib,
            "reserved_gib": None if r is None else {"low": r[0], "high": r[1]},
            "capacity_gib": self.capacity_gib,
            "capacity_from": self.capacity_from,
            "margin": self.margin,
            "context_gib": self.context_gib,
            "fragmentation": self.fragmentation,
            "evidence": self.evidence,
            "basis": self.basis,
            "why": self.why,
        }


def unknown(why: str, *, evidence: str = "model", cfg: PlannerConfig | None = None) -> Verdict:
    c = cfg or builtin()
    return Verdict(UNKNOWN, None, None, None, None, c.verdict_margin,
                   round(c.cuda_context_bytes / GIB, 2), None, evidence, why, why)


def judge(contract: Mapping[str, Any], changes: Mapping[str, Any],
          memory: Mapping[str, Any] | None, *, cfg: PlannerConfig | None = None) -> Verdict:
    """The verdict of `changes` (Megatron argument or environment knob → new value) on the run the
    contract and the diagnosis' `memory` section describe."""
    from moetune.analyzer.planner.predict import predict_peak

    c = cfg or builtin()
    mem = memory or {}
    alloc_m = mem.get("peak_allocated_gib")
    res_m = mem.get("peak_reserved_gib")
    source = str(mem.get("source") or "none")
    device = mem.get("device_gib")
    capacity, cap_from = (float(device), "the trace's device properties") if device else (None, None)
    if capacity is None:
        gb = (contract.get("hardware") or {}).get("gpu_memory_gb")
        if gb:
            capacity, cap_from = float(gb), "the contract's hardware.gpu_memory_gb"
    model_changes = {k: v for k, v in changes.items() if k != ALLOC_CONF}
    try:
        pred = predict_peak(contract, model_changes,
                            measured_peak_bytes=None if alloc_m is None else alloc_m * GIB,
                            gpu_memory_bytes=None, cfg=c)
    except (UserError, KeyError, TypeError, ValueError, ZeroDivisionError) as exc:
        why = exc.message if isinstance(exc, UserError) else f"{type(exc).__name__}: {exc}"
        return unknown(f"the memory model cannot price it: {why}",
                       evidence=source if source != "none" else "model", cfg=c)
    delta = pred.delta_bytes / GIB
    lazy = ""
    if alloc_m is not None and source == "log" and (mem.get("iteration") or 2) <= 1:
        # Megatron's line after iteration 1 can predate the optimizer's moments (built at its
        # first step, after that iteration's forward and backward): the anchor takes them on
        moments = pred.current.moments_bytes / GIB
        alloc_m = alloc_m + moments
        pred = predict_peak(contract, model_changes, measured_peak_bytes=alloc_m * GIB,
                            gpu_memory_bytes=None, cfg=c)
        lazy = f" (after iteration 1 only: + {moments:.1f} GiB of optimizer moments)"
    expandable_on = _turns_on_expandable(contract, changes)
    ctx = c.cuda_context_bytes / GIB
    dynamic = pred.changed.dynamic_bytes / GIB
    frag_default = c.fragmentation(expandable_on or pred.changed.options.expandable_segments)
    if alloc_m is not None:
        alloc = pred.peak_bytes / GIB  # measured + model delta
        a_lo = a_hi = alloc
        evidence = source
        basis = (f"measured peak allocated {alloc_m:.1f} GiB ({EVIDENCE_WORDS.get(source, source)})"
                 f"{lazy} + model delta {delta:+.1f} GiB for " + pred.basis.split(" for ", 1)[-1])
    elif res_m is not None:  # the driver's reserved only: anchor the reserved peak instead
        alloc = None
        a_lo = a_hi = None
        evidence = source
        basis = (f"measured peak reserved {res_m:.1f} GiB ({EVIDENCE_WORDS.get(source, source)}; "
                 f"allocated unknown) + model delta {delta:+.1f} GiB for "
                 + pred.basis.split("(", 1)[-1].rstrip(")"))
    else:
        alloc = pred.peak_bytes / GIB
        a_lo, a_hi = alloc * (1 - c.model_error), alloc * (1 + c.model_error)
        evidence = "model"
        basis = f"{pred.basis}, ±{c.model_error:.0%} (no measured peak)"
        now = pred.current.allocated_bytes / GIB * (1 - c.model_error)
        if capacity is not None and now + c.cuda_context_bytes / GIB > capacity:
            # the run as given ran, so a model that prices it over the GPU misreads the contract
            return unknown(f"the model alone prices the run as given at {now:.0f} GiB or more, "
                           f"over the {capacity:.1f} GiB GPU it ran on: the contract does not "
                           "describe the run well enough to price a change", cfg=c)
    frag: float | None = None
    if a_lo is not None and a_hi is not None:
        read = mem.get("peak_allocated_gib")  # the slack is the allocator's, as measured
        if res_m is not None and read and not expandable_on:
            frag = res_m / read
            lo, hi = a_lo + max(0.0, res_m - read), a_hi * frag
        else:
            lo, hi = a_lo, a_hi + frag_default * dynamic
    else:  # reserved-anchored
        lo = res_m + delta
        hi = res_m + delta * (1 + frag_default)
    hi = max(hi, lo)
    if capacity is None:
        return Verdict(UNKNOWN, _r(alloc), (_r(lo), _r(hi)), None, None, c.verdict_margin,
                       _r(ctx), _r(frag, 4), evidence, basis,
                       "GPU memory unknown (no device properties in the trace, no "
                       "hardware.gpu_memory_gb in the contract)")
    return _decide(alloc, lo, hi, capacity, cap_from, frag, evidence, basis, expandable_on, c)


def of_estimate(allocated_bytes: float, dynamic_bytes: float, *, expandable_segments: bool,
                capacity_gib: float, cfg: PlannerConfig | None = None) -> Verdict:
    """The verdict of the model alone on one configuration (`fit`'s plans): allocated ± the
    model's error, reserved up to the model's fragmentation of the dynamic memory, the same rule
    as `judge`'s."""
    c = cfg or builtin()
    alloc = allocated_bytes / GIB
    lo = alloc * (1 - c.model_error)
    hi = alloc * (1 + c.model_error) + c.fragmentation(expandable_segments) * dynamic_bytes / GIB
    return _decide(alloc, lo, hi, capacity_gib, "hardware.gpu_memory_gb", None, "model",
                   f"model only, ±{c.model_error:.0%} (no measured peak)", False, c)


def _decide(alloc: float | None, lo: float, hi: float, capacity: float, cap_from: str | None,
            frag: float | None, evidence: str, basis: str, expandable_on: bool,
            c: PlannerConfig) -> Verdict:
    """fits / tight / does not fit for a predicted reserved range (module docstring)."""
    ctx = c.cuda_context_bytes / GIB
    hi = max(hi, lo)
    usable = capacity * (1 - c.verdict_margin)
    span = f"{lo:.1f}" if f"{lo:.1f}" == f"{hi:.1f}" else f"{lo:.1f}–{hi:.1f}"
    words = f"predicted reserved {span} GiB + {ctx:.1f} GiB context"
    if lo + ctx > capacity:
        verdict, why = DOES_NOT_FIT, f"{words}: over the {capacity:.1f} GiB GPU even at the low end"
    elif hi + ctx <= usable:
        verdict, why = FITS, (f"{words}: within {usable:.1f} GiB ({capacity:.1f} GiB less the "
                              f"{c.verdict_margin:.0%} margin)")
    else:
        verdict, why = TIGHT, (f"{words}: the high end passes {usable:.1f} GiB ({capacity:.1f} "
                               f"GiB less the {c.verdict_margin:.0%} margin)")
    if expandable_on:
        why += "; with expandable segments the allocator keeps little slack"
    return Verdict(verdict, _r(alloc), (_r(lo), _r(hi)), _r(capacity), cap_from,
                   c.verdict_margin, _r(ctx), _r(frag, 4), evidence, basis, why)


def _turns_on_expandable(contract: Mapping[str, Any], changes: Mapping[str, Any]) -> bool:
    new = str(changes.get(ALLOC_CONF) or "")
    old = str((contract.get("env") or {}).get(ALLOC_CONF) or "")
    on = "expandable_segments:true"
    return on in new.replace(" ", "").lower() and on not in old.replace(" ", "").lower()


def _r(x: float | None, nd: int = 2) -> Any:
    return None if x is None else round(x, nd)


def describe(memory: Mapping[str, Any] | None) -> tuple[str, str] | None:
    """(headline, basis) of a verdict document, the words the terminal and the page print: `fits:
    predicted reserved 76.4–86.9 GiB + 1.5 GiB context: within 132.8 GiB (…)`, `measured peak
    allocated 37.2 GiB (the run's log) + model delta +34.8 GiB for …`."""
    if not memory:
        return None
    if memory["verdict"] == UNKNOWN:
        return f"unknown: {memory['why']}", memory["basis"]
    alloc = memory.get("peak_gib")
    head = f"{memory['verdict']}: " + (f"peak allocated {alloc:.1f} GiB, " if alloc is not None
                                       else "") + memory["why"]
    return head, memory["basis"]
