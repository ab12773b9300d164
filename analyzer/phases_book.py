"""The phase vocabulary and its signatures as data: `analyzer/phases.yaml` → `PhaseBook`, and the
signatures turned into labels of host ranges and GPU rows (on the distinct names).

A label is a signature's index (its phases, definite when one); `analyzer/phases_sequence.py`
decides between the labels of a launch and resolves the ambiguous ones by the layer pass's order.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import Any

from moetune.errors import UserError
from moetune.resources import data, schema
from moetune.schema_check import first_error
from moetune.yamlio import read_catalog

PHASES_PATH = data("moetune.analyzer", "phases.yaml")
SCHEMA_PATH = schema("phases")

# Where a label came from, strongest first (`source` of a phase row)
SOURCES: tuple[str, ...] = ("nvtx", "scope", "stack", "kernel", "sequence")
NONE = -1  # no signature


@dataclass(frozen=True, slots=True)
class Phase:
    phase: str
    title: str
    part: str
    flops: str | None
    spreads: bool


@dataclass(frozen=True, slots=True)
class Signature:
    phases: tuple[str, ...]
    ranges: dict[str, list[str]] | None
    kernels: dict[str, Any] | None
    boundary: bool
    marker: bool
    weak: bool = False
    closes: bool = False

    @property
    def definite(self) -> bool:
        """One phase and not weak; a weak one-phase signature is read like an ambiguous one."""
        return len(self.phases) == 1 and not self.weak

    @property
    def ambiguous(self) -> bool:
        return len(self.phases) > 1 or (len(self.phases) == 1 and self.weak)


@dataclass(frozen=True, slots=True)
class Block:
    kind: str
    when: frozenset[str]
    sequence: tuple[str, ...]
    requires: tuple[tuple[str, frozenset[str]], ...] = ()


@dataclass(frozen=True, slots=True)
class PhaseBook:
    """Validated phases.yaml: the vocabulary in pass order, signatures, blocks, layer ranges."""

    phases: tuple[Phase, ...]
    signatures: tuple[Signature, ...]
    blocks: tuple[Block, ...]
    layers: dict[str, list[str]] | None
    source: str
    groups: dict[str, tuple[str, ...]] = field(default_factory=dict)
    targets: dict[str, tuple[str, ...]] = field(default_factory=dict)

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(p.phase for p in self.phases)

    def phase(self, name: str) -> Phase:
        return next(p for p in self.phases if p.phase == name)


def load_phases(path: str | Path | None = None) -> PhaseBook:
    """Read and validate a phases YAML (the shipped one by default)."""
    return _load(str(Path(path) if path else PHASES_PATH))


@lru_cache(maxsize=4)
def _load(path: str) -> PhaseBook:
    doc = read_catalog(path, "phases")
    validate_phases(doc, path)  # every load, the shipped file too (moetune.schema_check: ~1 ms)
    book = PhaseBook(
        phases=tuple(Phase(p["phase"], p["title"], p["part"], p.get("flops"), p.get("spreads", True))
                     for p in doc["phases"]),
        signatures=tuple(Signature(tuple(s["phases"]), s.get("ranges"), s.get("kernels"),
                                   bool(s.get("boundary")), bool(s.get("marker")), bool(s.get("weak")),
                                   bool(s.get("closes")))
                         for s in doc["signatures"]),
        blocks=tuple(Block(b["kind"], frozenset(b["when"]), tuple(b["sequence"]),
                           tuple((k, frozenset(v)) for k, v in (b.get("requires") or {}).items()))
                     for b in doc["blocks"]),
        layers=doc.get("layers"),
        source=Path(path).name,
        groups={k: tuple(v) for k, v in (doc.get("groups") or {}).items()},
        targets={k: tuple(v) for k, v in (doc.get("targets") or {}).items()},
    )
    named = {p for s in book.signatures for p in s.phases} | {
        p for b in book.blocks for p in (*b.when, *b.sequence)} | {
        p for b in book.blocks for k, v in b.requires for p in (k, *v)} | {
        p for v in (*book.groups.values(), *book.targets.values()) for p in v}
    unknown = sorted(named - set(book.names))
    if unknown:
        raise UserError(f"phases named but not in the vocabulary: {', '.join(unknown)}", path=path)
    return book


def validate_phases(doc: Any, path: str | Path) -> None:
    """UserError naming the first place where `doc` breaks schemas/phases.schema.json."""
    err = first_error(doc, json.loads(SCHEMA_PATH.read_text()))
    if err:
        where = "/".join(str(x) for x in err[0]) or "(top)"
        raise UserError(f"invalid phases at {where}: {err[1]}", path=path)


def _scoped(rx: str) -> str:
    """A pattern as one alternative of a larger one (a leading `(?i)` scoped to it)."""
    return f"(?i:{rx[4:]})" if rx.startswith("(?i)") else f"(?:{rx})"


def _alternatives(match: dict[str, list[str]] | None) -> list[str]:
    if not match:
        return []
    alts = [f"^{re.escape(s)}" for s in match.get("prefix", ())]
    alts += [re.escape(s) for s in match.get("contains", ())]
    alts += [f"(?i:{re.escape(s)})" for s in match.get("icontains", ())]
    return alts + [_scoped(r) for r in match.get("regex", ())]


def matcher(match: dict[str, list[str]] | None) -> Callable[[str], bool]:
    """The Python predicate of a match list (prefix / contains / icontains / regex), as
    `classify.match_expr` reads one, as one compiled pattern: the distinct names of one trace
    are few, and polars' fixed cost per expression would be most of their time."""
    alts = _alternatives(match)
    search = re.compile("|".join(alts)).search if alts else None
    return (lambda name: search(name) is not None) if search else (lambda name: False)


_COMPILED: dict[int, tuple] = {}


def _compiled(book: PhaseBook) -> tuple:
    got = _COMPILED.get(id(book))
    if got is None or got[0] is not book:
        layer = [re.compile(r) for r in (book.layers or {}).get("regex", [])]
        every = [a for s in book.signatures for a in _alternatives(s.ranges)]
        anything = re.compile("|".join(every)).search if every else (lambda name: None)
        got = (book, [matcher(s.ranges) for s in book.signatures], layer, anything)
        _COMPILED[id(book)] = got
    return got


def range_labels(names: list[str], book: PhaseBook) -> dict[str, tuple[int, int, bool, bool, int | None]]:
    """Distinct host-range names → (def_sig: first definite signature, amb_sig: first ambiguous
    one, boundary, marker: its labelling signature marks a phase without GPU work, layer: the
    index a layer range names) for the names that carry any of them."""
    _, fits, layer_rx, anything = _compiled(book)
    sigs = book.signatures
    out = {}
    for name in names:
        lay = None
        for r in layer_rx:
            m = r.search(name)
            if m:
                lay = int(m.group(1))
                break
        if lay is None and anything(name) is None:  # most names fit no signature: one search
            continue
        d = a = NONE
        bnd = False
        for i, s in enumerate(sigs):
            if not s.ranges or (d != NONE and a != NONE and (bnd or not s.boundary)):
                continue
            if not fits[i](name):
                continue
            if s.definite and d == NONE:
                d = i
            elif s.ambiguous and a == NONE:
                a = i
            bnd = bnd or s.boundary
        if d != NONE or a != NONE or bnd or lay is not None:
            marker = (d != NONE and sigs[d].marker) or (a != NONE and sigs[a].marker)
            out[name] = (d, a, bnd, bool(marker), lay)
    return out


def _kernel_tests(book: PhaseBook) -> list[tuple[int, Signature, Callable[[tuple], bool]]]:
    """(index, signature, does it fit a GPU key (kclass, name, pg_role)) of the kernel signatures."""
    out = []
    for i, s in enumerate(book.signatures):
        k = s.kernels
        if not k:
            continue
        classes, fits = frozenset(k.get("kclass") or ()), matcher(k.get("match"))
        roles = frozenset(k.get("pg_roles") or ())

        def test(key: tuple, classes: frozenset = classes, fits: Callable = fits,
                 roles: frozenset = roles) -> bool:
            kclass, name, role = key
            if roles and role is not None and role not in roles:
                return False  # a collective of a known group this signature does not name
            return (kclass in classes) or (role is not None and role in roles) or fits(name or "")
        out.append((i, s, test))
    return out


def kernel_labels(keys: list[tuple[str | None, str | None, str | None]], book: PhaseBook
                  ) -> dict[tuple, tuple[int, int, bool]]:
    """Distinct GPU keys (kclass, name, pg_role) → (def_sig, amb_sig, boundary)."""
    tests = _kernel_tests(book)
    out = {}
    for key in keys:
        d = a = NONE
        bnd = False
        for i, s, fits in tests:
            if not fits(key):
                continue
            if s.definite and d == NONE:
                d = i
            elif s.ambiguous and a == NONE:
                a = i
            bnd = bnd or s.boundary
        out[key] = (d, a, bnd)
    return out


# ----------------------------------------------------------------------------- who claimed it


@dataclass(frozen=True, slots=True)
class PhaseClaim:
    """Which signatures of a phases YAML label one host-range name or one GPU key, by the rule
    `range_labels` / `kernel_labels` apply (the first definite and the first ambiguous that fit)."""

    fits: tuple[int, ...]       # every signature that fits, in file order
    definite: int | None
    ambiguous: int | None

    @property
    def claimant(self) -> int | None:
        """The signature whose label the work takes (its own definite one before an ambiguous
        one); for a name only boundaries fit, the first of them."""
        for i in (self.definite, self.ambiguous):
            if i is not None:
                return i
        return self.fits[0] if self.fits else None

    @property
    def hidden(self) -> tuple[int, ...]:
        """Signatures that fit too but whose label the work never takes."""
        return tuple(i for i in self.fits if i not in (self.definite, self.ambiguous))


def _claim(fits: list[int], book: PhaseBook) -> PhaseClaim:
    sigs = book.signatures
    return PhaseClaim(tuple(fits), next((i for i in fits if sigs[i].definite), None),
                      next((i for i in fits if sigs[i].ambiguous), None))


def claim_range(name: str, book: PhaseBook) -> PhaseClaim:
    """The signatures that label a host range named `name` (NVTX range, scope, op, frame)."""
    return _claim([i for i, s in enumerate(book.signatures)
                   if s.ranges and matcher(s.ranges)(name)], book)


def claim_kernel(kclass: str | None, name: str | None, role: str | None, book: PhaseBook
                 ) -> PhaseClaim:
    """The signatures that label GPU work of this kernel class, name and process-group role."""
    return _claim([i for i, _, fits in _kernel_tests(book) if fits((kclass, name, role))], book)


def signature_lines(path: str | Path | None = None) -> dict[int, int]:
    """Signature index → its line in the phases YAML (for saying which entry claimed a name)."""
    from moetune.yamlio import read_yaml

    _, lines = read_yaml(Path(path) if path else PHASES_PATH)
    return {at[1]: ln for at, ln in lines.items() if len(at) == 2 and at[0] == "signatures"}
