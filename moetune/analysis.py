"""The one pipeline every command calls: trace files and a contract → diagnosis, audit, advice.

`diagnose`, `audit`, `recommend` and the `tune` loop all go through `analyze`: the trace is read
once, and when the contract makes claims the audit's probes run as a section of the same diagnosis
pass, so the recommendations always see the audit's verdicts (a claim the trace contradicts is
fixed before a knob is tuned).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeAlias

from moetune.errors import UserError

if TYPE_CHECKING:  # the contract module (yaml, the knob catalog) loads only when a contract is given
    from moetune.analyzer.contract import Contract

ContractInput: TypeAlias = "str | Path | Mapping[str, Any] | Contract | None"


@dataclass(frozen=True)
class Analysis:
    """What one pass over a run's traces established."""

    files: tuple[Path, ...]
    contract: Contract | None
    diagnosis: dict[str, Any] | None  # None only for an audit-only pass with nothing to probe
    audit: dict[str, Any] | None      # None without a contract (nothing claimed)

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
    reference_step_s: float | None = None,
    allow_mixed_runs: bool = False,
    extra_sections: Sequence[Any] = (),
) -> Analysis:
    """Read the traces once; diagnose them and, when the contract claims anything, audit it.

    `full=False` runs only what the audit needs (steps and its probes), not the timeline graph:
    what `moetune audit` asks for. `audit=False` reads the contract for its window only.
    `reference_step_s`: the run's unprofiled step time (its log's iterations), which the what-if
    estimates start from (a profiled step runs slower). `allow_mixed_runs`: analyse files that are
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
    reference_step_s: float | None = None,
    extra_sections: Sequence[Any] = (),
) -> Analysis:
    """`analyze` for an already-read Trace (analyzer/frames.py)."""
    from moetune.analyzer import diagnose as diag

    con = read_contract(contract)
    doc = _plain(con)
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
        return Analysis(tuple(files), con, None, run.document(None, files=files))
    diagnosis = diag.diagnose_trace(trace, files=files, window=window, contract=doc,
                                    step_range=step_range, sections=sections, classes=classes,
                                    reference_step_s=reference_step_s)
    report = None
    if run is not None:
        report = run.document(diagnosis if classes is not None else None, files=files)
    return Analysis(tuple(files), con, diagnosis, report)


def _plain(con: Contract | None) -> dict[str, Any] | None:
    if con is None:
        return None
    from moetune.analyzer.contract import thaw

    return thaw(con)
