"""The phase vocabulary and its signatures as data: `analyzer/phases.yaml` → `PhaseBook`, and the
signatures turned into labels of host ranges and GPU rows (polars, on the distinct names).

A label is a signature's index (its phases, definite when one); `analyzer/phases_sequence.py`
decides between the labels of a launch and resolves the ambiguous ones by the layer pass's order.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any

import polars as pl
import yaml
from moetune.analyzer.classify import match_expr

from moetune.errors import UserError
from moetune.resources import data, schema

PHASES_PATH = data("moetune.analyzer", "phases.yaml")
SCHEMA_PATH = schema("phases")
_YAML_LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)

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
    try:
        doc = yaml.load(Path(path).read_text(), Loader=_YAML_LOADER)
    except (OSError, yaml.YAMLError) as exc:
        raise UserError(f"cannot read phases: {exc}", path=path) from None
    # the shipped file is validated by the tests (tests/test_phases.py), a user's here: importing
    # jsonschema costs a small diagnosis a tenth of a second
    if Path(path).resolve() != PHASES_PATH.resolve():
        validate_phases(doc, path)
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
    )
    named = {p for s in book.signatures for p in s.phases} | {
        p for b in book.blocks for p in (*b.when, *b.sequence)} | {
        p for b in book.blocks for k, v in b.requires for p in (k, *v)}
    unknown = sorted(named - set(book.names))
    if unknown:
        raise UserError(f"phases named but not in the vocabulary: {', '.join(unknown)}", path=path)
    return book


def validate_phases(doc: Any, path: str | Path) -> None:
    """UserError naming the first place where `doc` breaks schemas/phases.schema.json."""
    import jsonschema

    errors = sorted(jsonschema.Draft202012Validator(json.loads(SCHEMA_PATH.read_text()))
                    .iter_errors(doc), key=str)
    if errors:
        e = errors[0]
        where = "/".join(str(x) for x in e.absolute_path) or "(top)"
        raise UserError(f"invalid phases at {where}: {e.message}", path=path)


def _first(conds: list[tuple[int, pl.Expr]]) -> pl.Expr:
    """Index of the first true condition, else NONE."""
    if not conds:
        return pl.lit(NONE, dtype=pl.Int32)
    return pl.coalesce([pl.when(c).then(pl.lit(i, dtype=pl.Int32)) for i, c in conds]
                       + [pl.lit(NONE, dtype=pl.Int32)])


def range_labels(names: pl.DataFrame, book: PhaseBook) -> pl.DataFrame:
    """Distinct host-range names (column `name`) → `def_sig` (first definite signature),
    `amb_sig` (first ambiguous one), `boundary`, `marker` (its labelling signature marks a phase
    without GPU work) and `layer` (the index a layer range names, else null)."""
    sigs = [(i, s) for i, s in enumerate(book.signatures) if s.ranges]
    hit = {i: match_expr(s.ranges) for i, s in sigs}
    out = names.with_columns(
        _first([(i, hit[i]) for i, s in sigs if s.definite]).alias("def_sig"),
        _first([(i, hit[i]) for i, s in sigs if s.ambiguous]).alias("amb_sig"),
        (pl.any_horizontal([hit[i] for i, s in sigs if s.boundary])
         if any(s.boundary for _, s in sigs) else pl.lit(False)).alias("boundary"),
    )
    marks = [i for i, s in enumerate(book.signatures) if s.marker]
    out = out.with_columns(
        (pl.col("def_sig").is_in(marks) | pl.col("amb_sig").is_in(marks)).alias("marker"))
    regs = (book.layers or {}).get("regex") or []
    layer = (pl.coalesce([pl.col("name").str.extract(r, 1) for r in regs]).cast(pl.Int32, strict=False)
             if regs else pl.lit(None, dtype=pl.Int32))
    return out.with_columns(layer.alias("layer"))


def kernel_labels(keys: pl.DataFrame, book: PhaseBook) -> pl.DataFrame:
    """Distinct GPU keys (`kclass`, `name`, `pg_role`) → `def_sig`, `amb_sig`, `boundary`."""
    conds: list[tuple[int, pl.Expr]] = []
    for i, s in enumerate(book.signatures):
        k = s.kernels
        if not k:
            continue
        parts: list[pl.Expr] = []
        if k.get("kclass"):
            parts.append(pl.col("kclass").is_in(k["kclass"]).fill_null(False))
        if k.get("match"):
            parts.append(match_expr(k["match"]))
        roles = k.get("pg_roles")
        if roles:
            parts.append(pl.col("pg_role").is_in(roles).fill_null(False))
        cond = pl.any_horizontal(parts)
        if roles:  # a collective of a known group this signature does not name never fits it
            cond = cond & (pl.col("pg_role").is_null() | pl.col("pg_role").is_in(roles))
        conds.append((i, cond))
    sig = book.signatures
    return keys.with_columns(
        _first([(i, c) for i, c in conds if sig[i].definite]).alias("def_sig"),
        _first([(i, c) for i, c in conds if sig[i].ambiguous]).alias("amb_sig"),
        (pl.any_horizontal([c for i, c in conds if sig[i].boundary])
         if any(sig[i].boundary for i, _ in conds) else pl.lit(False)).alias("boundary"),
    )
