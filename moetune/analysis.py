"""The one pipeline every command calls: trace files and a contract → diagnosis, audit, advice.

`diagnose`, `audit`, `recommend`, `report`, `diff` and the `tune` loop all go through `analyze`: the
trace is read once, and when the contract makes claims the audit's probes run as a section of the
same diagnosis pass, so the recommendations always see the audit's verdicts (a claim the trace
contradicts is fixed before a knob is tuned).

The run's own outputs beside its trace are its *reference inputs* (`Reference`, read once by
`read_reference` for every command that takes `--log` / `--memory-snapshot`): the Megatron log's
steady unprofiled step time, which the what-if estimates start from, and the device memory its
memory lines or memory snapshots show where the trace has no allocator events. `apply_reference`
writes them into the diagnosis (`reference`, `memory`), so every command reads the same numbers.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeAlias

from moetune.errors import UserError

if TYPE_CHECKING:  # the contract module (yaml, the knob catalog) loads only when a contract is given
    import polars as pl

    from moetune.analyzer.contract import Contract
    from moetune.executor.logparse import ReferenceStep

ContractInput: TypeAlias = "str | Path | Mapping[str, Any] | Contract | None"
ReferenceInput: TypeAlias = "Reference | float | None"


@dataclass(frozen=True)
class Analysis:
    """What one pass over a run's traces established."""

    files: tuple[Path, ...]
    contract: Contract | None
    diagnosis: dict[str, Any] | None  # None only for an audit-only pass with nothing to probe
    audit: dict[str, Any] | None      # None without a contract (nothing claimed)
    reference: Reference | None = None  # the run's log and memory snapshots, when given

    @property
    def contract_doc(self) -> dict[str, Any]:
        """The contract as plain data ({} without one), as the rules read it."""
        if self.contract is None:
            return {}
        from moetune.analyzer.contract import thaw

        return thaw(self.contract)

    def advise(self, rules: Mapping[str, Any] | None = None, *, options: Any = None,
               ) -> Advice:
        """The rules' ranked recommendations for this run."""
        from moetune.rules.engine import recommend
        from moetune.rules.load import load_rules

        if self.diagnosis is None:
            raise UserError("no diagnosis to advise on")
        doc = recommend(rules if rules is not None else load_rules(), self.diagnosis,
                        self.contract_doc, self.audit, options=options)
        return Advice.from_document(doc)


@dataclass(frozen=True)
class Recommendation:
    """One ranked change: the knob, its new value and the scope knobs it needs (`with`)."""

    rule: str
    wall: str
    knob: str
    value: Any
    scope: Mapping[str, Any]
    predicted_speedup: float | None  # the midpoint, e.g. 0.25 = +25 %
    entry: Mapping[str, Any]         # the recommendation as the document prints it

    @property
    def changes(self) -> tuple[tuple[str, Any], ...]:
        """(knob, value) pairs: the change itself first, then its scope."""
        return ((self.knob, self.value), *self.scope.items())

    @classmethod
    def from_entry(cls, entry: Mapping[str, Any]) -> Recommendation:
        ch = entry["change"]
        mid = ((entry.get("gain") or {}).get("speedup") or {}).get("mid")
        return cls(rule=entry["rule"], wall=entry["wall"], knob=ch["knob"], value=ch["to"],
                   scope=dict(ch.get("with") or {}), predicted_speedup=mid, entry=entry)


@dataclass(frozen=True)
class Advice:
    recommendations: tuple[Recommendation, ...]
    document: dict[str, Any]  # schemas/recommendation.schema.json

    @classmethod
    def from_document(cls, doc: dict[str, Any]) -> Advice:
        return cls(tuple(Recommendation.from_entry(r) for r in doc.get("recommendations", [])), doc)


@dataclass(frozen=True)
class Reference:
    """What the run's own outputs say beside its trace: the Megatron log's steady unprofiled step
    time (`step`) and memory lines, and memory snapshots. `given_step_s`: a step time measured
    elsewhere (the tune loop's unprofiled runs), with or without the log's memory."""

    log: Path | None = None
    step: ReferenceStep | None = None
    log_memory: pl.DataFrame | None = None  # the log's memory lines (executor/logparse.py)
    snapshots: tuple[dict[str, Any], ...] = ()  # memory_evidence.snapshot_summary, one per file
    snapshot_ranks: tuple[int, ...] = ()
    given_step_s: float | None = None
    # the contract the log's own argument dump states (`contract from-log`): what stands in for
    # a contract the user did not give, as `tune` reads its profile run's log
    log_contract: Mapping[str, Any] | None = None

    @property
    def step_s(self) -> float | None:
        return self.step.step_s if self.step is not None else self.given_step_s

    def with_step_s(self, step_s: float | None) -> Reference:
        """This reference with a step time measured elsewhere (the tune loop's unprofiled runs)
        instead of the log's median, its memory evidence kept."""
        if step_s is None:
            return self
        return replace(self, step=None, given_step_s=float(step_s))

    def section(self) -> dict[str, Any]:
        """The diagnosis' `reference` section: where the what-if estimates start from."""
        st = self.step
        if st is None:
            return {"source": "given" if self.given_step_s else None, "file": None,
                    "step_s": self.given_step_s, "iterations": [], "warmup": [], "profiled": [],
                    "profile_steps": None, "profile_source": None,
                    "text": (f"a measured step of {self.given_step_s:.4g} s"
                             if self.given_step_s else None)}
        return {"source": "log", "file": self.log.name if self.log else None,
                "step_s": round(st.step_s, 6), "iterations": list(st.iterations),
                "warmup": list(st.warmup), "profiled": list(st.profiled),
                "profile_steps": list(st.profile_steps) if st.profile_steps else None,
                "profile_source": st.profile_source,
                "text": st.describe() + (f" of {self.log.name}" if self.log else "")}


def read_reference(log: str | Path | None = None, snapshots: Sequence[str | Path] = (), *,
                   profiled: tuple[int, int] | None = None, require_step: bool = True
                   ) -> Reference | None:
    """The reference inputs every command takes, read once: a Megatron log (`--log`) and memory
    snapshots (`--memory-snapshot`). None when neither is given. A log without one unprofiled
    iteration time is a UserError when `require_step` (the what-if estimates would start from
    nothing). `profiled`: the profiler span the caller asked for, over the log's own."""
    if log is None and not snapshots:
        return None
    step, lines, path, log_contract = None, None, None, None
    if log is not None:
        from moetune.executor.logparse import parse_text, read_log, reference_step

        path = Path(log)
        text = read_log(path)  # once: its iterations, its memory lines and its arguments
        parsed = parse_text(text)
        step = reference_step(parsed, profiled=profiled)
        if step is None and require_step:
            raise UserError("no iteration time outside warm-up and the profiled iterations "
                            "(`elapsed time per iteration (ms)` lines)", path=path)
        lines = parsed.memory
        log_contract = _log_contract(text)
    summaries, ranks = [], []
    if snapshots:
        from moetune.analyzer.memory_evidence import (
            read_snapshot,
            snapshot_rank,
            snapshot_summary,
        )

        for i, f in enumerate(snapshots):
            summaries.append(snapshot_summary(read_snapshot(f), file=Path(f).name))
            ranks.append(snapshot_rank(f) if snapshot_rank(f) is not None else i)
        if len(set(ranks)) != len(ranks):
            ranks = list(range(len(summaries)))  # names that do not tell ranks apart: the order
    return Reference(path, step, lines, tuple(summaries), tuple(ranks),
                     log_contract=log_contract)


def _log_contract(text: str) -> dict[str, Any] | None:
    """The contract a log's argument dump states, when it validates (else None: a log without
    its arguments still gives its step time and memory)."""
    from moetune.analyzer.megatron_args import contract_from_log

    try:
        found = contract_from_log(text)
        if found and found.get("megatron_args"):
            read_contract(found)  # validates
            return found
    except UserError:
        pass
    return None


def stand_in_contract(contract: ContractInput, reference: Reference | None) -> ContractInput:
    """The contract given, else the one the reference log's arguments state (None with
    neither): every command reads a run's log the same way."""
    if contract is not None or reference is None or reference.log_contract is None:
        return contract
    return reference.log_contract


def apply_reference(diagnosis: dict[str, Any], reference: Reference | None, *,
                    device_bytes: Mapping[int, int] | int | None = None,
                    contract: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """The diagnosis with its `reference` section, and its `memory` section filled from the log's
    memory lines (else the snapshots) when the trace holds no allocator events (`source: none`, or
    the driver's reserved-only view). The other sources' figures stay beside it
    (`memory.other_sources`), each saying where it came from; snapshots add their largest live
    allocations (`memory.largest`). `device_bytes`: the GPU's memory (the trace's device
    properties), else the contract's `hardware.gpu_memory_gb` (GiB)."""
    if reference is None:
        return diagnosis
    from moetune.analyzer.memory_evidence import GIB, log_section, snapshot_section

    diagnosis["reference"] = reference.section()
    mem = diagnosis.get("memory") or {}
    if device_bytes is None or device_bytes == {}:
        if mem.get("device_gib"):
            device_bytes = round(mem["device_gib"] * GIB)
        else:
            gb = ((contract or {}).get("hardware") or {}).get("gpu_memory_gb")
            device_bytes = round(float(gb) * GIB) if gb else None
    found = []
    if reference.log_memory is not None:
        sec = log_section(reference.log_memory, device_bytes=device_bytes,
                          file=reference.log.name if reference.log else None)
        if sec:
            found.append(sec["memory"])
    if reference.snapshots:
        found.append(snapshot_section(reference.snapshots, device_bytes=device_bytes,
                                      ranks=reference.snapshot_ranks)["memory"])
    if not found:
        return diagnosis
    trace_has = mem.get("source") == "allocator_events"
    primary = mem if trace_has else found[0]
    others = [m for m in ([mem] if not trace_has and mem.get("peak_reserved_gib") else []) + found
              if m is not primary]
    out = dict(primary)
    if not trace_has and mem.get("source") not in (None, "none"):
        out.setdefault("notes", []).append(
            f"the trace's {mem['source']} view (reserved only) is kept under other_sources")
    out["other_sources"] = [_brief(m) for m in others]
    snap = next((m for m in found if m["source"] == "snapshot"), None)
    if snap is not None:
        out["largest"] = snap.get("largest") or []
    if out.get("device_gib") is None and device_bytes:
        out["device_gib"] = round((device_bytes if isinstance(device_bytes, int)
                                   else max(device_bytes.values())) / GIB, 4)
    diagnosis["memory"] = out
    return diagnosis


def _brief(m: Mapping[str, Any]) -> dict[str, Any]:
    """One memory source's headline figures, as `memory.other_sources` lists them."""
    return {k: m.get(k) for k in ("source", "scope", "peak_allocated_gib", "peak_reserved_gib",
                                  "fragmentation", "iteration")} | {"files": list(m.get("files") or [])}


def as_reference(value: ReferenceInput) -> Reference | None:
    """A `Reference`, a bare step time in seconds (wrapped), or None."""
    if value is None or isinstance(value, Reference):
        return value
    return Reference(given_step_s=float(value))


def read_contract(contract: ContractInput) -> Contract | None:
    """A validated contract from a file, a plain mapping (e.g. `contract from-log`'s) or as is."""
    if contract is None:
        return None
    from moetune.analyzer.contract import Contract, contract_from_doc, load_contract

    if isinstance(contract, Contract):
        return contract
    if isinstance(contract, Mapping):
        return contract_from_doc(contract)
    return load_contract(contract)


def analyze(
    paths: Sequence[str | Path] | str | Path,
    contract: ContractInput = None,
    *,
    window: str | None = None,
    step_range: str | None = None,
    full: bool = True,
    audit: bool = True,
    reference_step_s: ReferenceInput = None,
    allow_mixed_runs: bool = False,
    extra_sections: Sequence[Any] = (),
) -> Analysis:
    """Read the traces once; diagnose them and, when the contract claims anything, audit it.

    `full=False` runs only what the audit needs (steps and its probes), not the timeline graph:
    what `moetune audit` asks for. `audit=False` reads the contract for its window only.
    `reference_step_s`: the run's reference inputs (`read_reference`: its log's steady unprofiled
    step time, which the what-if estimates start from since a profiled step runs slower, and its
    memory evidence), or a bare step time in seconds. `allow_mixed_runs`: analyse files that are
    not ranks of one run together (`moetune.analyzer.run_identity`) instead of refusing them.
    `extra_sections`: more `moetune.analyzer.diagnose.Section`s to run in the same pass (e.g. the
    `--top` tables), after the standard ones.
    """
    from moetune.analyzer import diagnose as diag
    from moetune.analyzer.readers import expand, load_trace

    plist = [paths] if isinstance(paths, str | Path) else list(paths)
    if not plist:
        raise UserError("no trace given")
    con = read_contract(contract)
    files = expand(plist)
    diag.digest_later(files)
    trace = load_trace(plist, allow_mixed_runs=allow_mixed_runs)
    return analyze_trace(trace, con, files=files, window=window,
                         step_range=step_range, full=full, audit=audit,
                         reference_step_s=reference_step_s, extra_sections=extra_sections)


def analyze_trace(
    trace: Any,
    contract: ContractInput = None,
    *,
    files: Sequence[Path] = (),
    window: str | None = None,
    step_range: str | None = None,
    full: bool = True,
    audit: bool = True,
    reference_step_s: ReferenceInput = None,
    extra_sections: Sequence[Any] = (),
) -> Analysis:
    """`analyze` for an already-read Trace (analyzer/frames.py)."""
    from moetune.analyzer import diagnose as diag

    ref = as_reference(reference_step_s)
    con = read_contract(stand_in_contract(contract, ref))
    # the diagnosis reads the log as the log (its sections name it as their source); the
    # stand-in contract serves the audit and the advice
    doc = _plain(read_contract(contract)) if contract is not None else None
    run = None
    if con is not None and audit:
        from moetune.analyzer.audit import AuditRun

        run = AuditRun(con, trace)
    sections = [*diag.SECTIONS, *extra_sections] if full else list(extra_sections)
    classes = None
    if run is not None and run.todo and run.gpu_rows:
        sections.append(("audit", run.section))
        classes = run.classes
    elif run is not None and not full:  # nothing to probe: the audit needs no diagnosis
        return Analysis(tuple(files), con, None, run.document(None, files=files), ref)
    diagnosis = diag.diagnose_trace(trace, files=files, window=window, contract=doc,
                                    step_range=step_range, sections=sections, classes=classes,
                                    reference_step_s=ref.step_s if ref else None,
                                    run_log=_run_log(ref))
    apply_reference(diagnosis, ref, device_bytes=trace_device_bytes(trace), contract=doc)
    report = None
    if run is not None:
        report = run.document(diagnosis if classes is not None else None, files=files)
    return Analysis(tuple(files), con, diagnosis, report, ref)


def trace_device_bytes(trace: Any) -> dict[int, int]:
    """Rank -> the GPU's total memory, from the trace's device properties ({} when absent)."""
    ranks = getattr(trace, "ranks", None)
    if ranks is None or "device_memory_bytes" not in ranks.columns:
        return {}
    return {int(r): int(v) for r, v in ranks.select("rank", "device_memory_bytes").iter_rows()
            if r is not None and v}


def _run_log(ref: Reference | None) -> dict[str, Any] | None:
    """The reference log's iterations and model arguments, as the throughput section cross-checks
    its FLOPs against them (moetune/runlog.py)."""
    if ref is None or ref.log is None:
        return None
    from moetune.runlog import read_run_log

    # the iterations the reference step is the median of: one steady window in every command
    return read_run_log(ref.log, ref.step.iterations if ref.step is not None else None)


def _plain(con: Contract | None) -> dict[str, Any] | None:
    if con is None:
        return None
    from moetune.analyzer.contract import thaw

    return thaw(con)
