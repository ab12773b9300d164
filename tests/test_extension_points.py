"""Each extension point has one registry, and everything that names its entries elsewhere is
derived from it or checked against it here (docs/extending.md walks adding to each):

- launchers: executor/launchers/__init__.py `LAUNCHERS` ← the modules beside it, the CLI's
  `--launcher` choices of `run` and `tune`, the launchers docs/executor.md names;
- what-if transform kinds: analyzer/whatif_transforms.py `KIND_FUNCS` ← the `kind` enum of
  schemas/whatif.schema.json, the kinds whatif.yaml uses, the knobs its transforms model;
- kernel classes: analyzer/kernel_classes.yaml ← tests/test_classify.py's examples (every entry
  the first fit of one: test_every_entry_claims_an_example);
- rules: rules/catalog/ ← their fixtures (tests/test_rules_check.py), docs/rules.md
  (tests/test_rules_catalog.py);
- phase signatures: analyzer/phases.yaml ← the kernel classes and process-group roles its
  signatures name (analyzer/kernel_classes.yaml), the knobs its targets name (rules/knobs.yaml),
  the vocabulary docs/phases.md describes; validated at every load (tests/test_schema_check.py).
"""

from __future__ import annotations

import inspect
import json
from pathlib import Path

from moetune.analyzer import whatif, whatif_transforms
from moetune.analyzer.classify import load_classes
from moetune.analyzer.phases_book import load_phases
from moetune.executor import launchers

from moetune.cli import build_parser
from moetune.knobs import load as load_knobs

ROOT = Path(__file__).resolve().parents[1]


def _choices(command: str, option: str) -> tuple[str, ...]:
    sub = next(a for a in build_parser([command])._actions if a.dest == "command")
    action = next(a for a in sub.choices[command]._actions if option in a.option_strings)
    return tuple(action.choices)


def test_every_launcher_module_is_registered_and_the_cli_offers_exactly_those() -> None:
    modules = {p.stem for p in (ROOT / "executor" / "launchers").glob("*.py")} - {"__init__", "base"}
    assert {m for m, _ in launchers.LAUNCHERS.values()} == modules, (
        "a launcher module is not in LAUNCHERS (executor/launchers/__init__.py)")
    for name in launchers.NAMES:
        cls = launchers.launcher_class(name)
        assert callable(getattr(cls, "command", None)) and callable(getattr(cls, "launch", None)), name
    for command in ("run", "tune"):
        assert _choices(command, "--launcher") == launchers.NAMES
    doc = (ROOT / "docs" / "executor.md").read_text()
    assert not [n for n in launchers.NAMES if f"`{n}`" not in doc], (
        "name each launcher in docs/executor.md's module map")


def test_what_if_kinds_schema_and_catalog_follow_the_registry() -> None:
    schema = json.loads((ROOT / "schemas" / "whatif.schema.json").read_text())
    enum = schema["properties"]["transforms"]["additionalProperties"]["properties"]["kind"]["enum"]
    assert enum == list(whatif_transforms.KIND_FUNCS), (
        "schemas/whatif.schema.json's kind enum must list analyzer/whatif_transforms.py's KIND_FUNCS, "
        "in order")
    for kind, fn in whatif_transforms.KIND_FUNCS.items():
        assert list(inspect.signature(fn).parameters)[:1] == ["ep"] and len(
            inspect.signature(fn).parameters) == 3, f"{kind}: a kind is fn(ep, params, ctx) -> Edit | None"
    specs = whatif.transforms()
    assert {s["kind"] for s in specs.values()} == set(whatif_transforms.KIND_FUNCS), (
        "a kind no transform uses")
    knobs = load_knobs().knobs
    for tid, spec in specs.items():
        assert spec["knob"] in knobs, f"whatif.yaml {tid}: knob {spec['knob']!r} not in rules/knobs.yaml"
    # the old unread tuple stays gone
    assert not hasattr(whatif, "KINDS") and not hasattr(whatif_transforms, "KINDS")


def test_phase_signatures_name_only_what_exists() -> None:
    book, classes = load_phases(), load_classes()
    roles = {g["role"] for g in classes.process_groups}
    for i, sig in enumerate(book.signatures):
        k = sig.kernels or {}
        assert set(k.get("kclass", ())) <= set(classes.kclasses), (
            f"phases.yaml signature {i} names a kernel class not in analyzer/kernel_classes.yaml")
        assert set(k.get("pg_roles", ())) <= roles, (
            f"phases.yaml signature {i} names a process-group role kernel_classes.yaml lacks")
    assert set(book.targets) <= set(load_knobs().knobs), "a phases.yaml target names no knob"
    doc = (ROOT / "docs" / "phases.md").read_text()
    assert not [p for p in book.names if f"`{p}`" not in doc], (
        "docs/phases.md's vocabulary must name each phase of analyzer/phases.yaml")
