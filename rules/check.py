"""`moetune rules check DIR`: a rule folder validated, then each rule run on its own fixtures.

Validation is rules/load.py's (schema, knob names, metric paths, id = file stem). Then every
scenario a rule names in `fixtures` must exist (rules/scenarios.py: the folder's `fixtures/`,
then the repository's fixtures/diagnoses/), be a valid diagnosis and contract, and give the
outcome it is listed under when the engine runs the rules as `recommend --rules DIR` would
(the built-in catalog, the folder's rules over it):

- `fires`: the rule is recommended;
- `quiet`: the rule is quiet (its condition does not hold, or its change does not apply);
- `blocked`: the condition holds but the change is illegal here (blocked, or waiting on a
  prerequisite only the environment can meet), never recommended.

Each broken expectation is one `file:line: message` problem, at the fixture's line in the rule.
The built-in catalog is checked the same way (tests/test_rules_check.py), so a user's rules meet
the bar ours do.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any

from moetune.rules.load import CATALOG, Problem, Rule, check_rules, load_catalog, schema
from moetune.rules.scenarios import Scenarios, search_path

from moetune.errors import UserError
from moetune.knobs import Catalog
from moetune.yamlio import line_of

EXPECTATIONS = ("fires", "quiet", "blocked")


@dataclass(frozen=True)
class Checked:
    rules: dict[str, Rule]     # the folder's valid rules
    problems: list[Problem]
    runs: int                  # rule × fixture outcomes checked
    fixtures: tuple[Path, ...]  # the scenario search path used


def check_folder(folder: Path, fixture_dirs: Iterable[Path] = (),
                 catalog: Catalog | None = None) -> Checked:
    """Validate every rule file of `folder`, then run each valid rule on its fixtures."""
    catalog = catalog or load_catalog()
    rules, problems = check_rules(folder, catalog)
    scenarios = Scenarios(search_path(folder, fixture_dirs))
    engine_rules = dict(rules)
    if folder.resolve() != Path(CATALOG).resolve():
        builtin, _ = check_rules(Path(CATALOG), catalog)
        engine_rules = dict(sorted({**builtin, **rules}.items()))
    outcomes = _Outcomes(scenarios, engine_rules, catalog)
    runs = 0
    for rule in rules.values():
        for kind in EXPECTATIONS:
            for i, name in enumerate(rule.spec["fixtures"].get(kind, [])):
                at = f"{rule.path}:{line_of(rule.lines, ('fixtures', kind, i))}"
                if scenarios.path(name) is None:
                    problems.append(_problem(at, f"fixtures.{kind}: no fixture {name!r} (looked in "
                                             f"{', '.join(map(str, scenarios.folders)) or 'no folder'})"))
                    continue
                doc = outcomes.get(name)
                if isinstance(doc, Problem):
                    if doc not in problems:
                        problems.append(doc)
                    continue
                runs += 1
                if bad := _expectation_problem(rule.id, kind, doc):
                    problems.append(_problem(at, f"fixtures.{kind}: {bad} on {name!r}"))
    return Checked(rules, problems, runs, scenarios.folders)


def _problem(at: str, message: str) -> Problem:
    path, _, line = at.rpartition(":")
    return Problem(path, int(line) if line.isdigit() else None, message)


def _expectation_problem(rid: str, kind: str, doc: Mapping[str, Any]) -> str | None:
    """What went wrong, in a clause; None when the rule behaved as listed."""
    got = _outcome(rid, doc)
    if kind == "fires" and got[0] != "fires":
        return f"the rule did not fire ({got[1]})"
    if kind == "quiet" and got[0] != "quiet":
        return f"the rule is not quiet ({got[1]})"
    if kind == "blocked" and got[0] not in ("blocked", "prerequisite"):
        return f"the rule is not blocked ({got[1]})"
    return None


def _outcome(rid: str, doc: Mapping[str, Any]) -> tuple[str, str]:
    """(fires | blocked | prerequisite | quiet | absent, what the engine said)."""
    for key, label in (("recommendations", "fires"), ("blocked", "blocked"),
                       ("prerequisites", "prerequisite"), ("quiet", "quiet")):
        for entry in doc.get(key) or []:
            if entry.get("rule") == rid:
                return label, _said(label, entry)
    return "absent", "the engine did not evaluate it"


def _said(label: str, entry: Mapping[str, Any]) -> str:
    if label == "fires":
        return f"it fires, rank {entry.get('rank')}"
    if label == "blocked":
        return "blocked: " + "; ".join(entry.get("reasons") or [])
    if label == "prerequisite":
        return "waits on a prerequisite: " + "; ".join(entry.get("needs") or [])
    return f"quiet: {entry.get('reason')}"


class _Outcomes:
    """The engine's document per scenario (each scenario loaded, validated and run once)."""

    def __init__(self, scenarios: Scenarios, rules: Mapping[str, Rule], catalog: Catalog) -> None:
        self.scenarios, self.rules, self.catalog = scenarios, rules, catalog
        self.done: dict[str, dict[str, Any] | Problem] = {}

    def get(self, name: str) -> dict[str, Any] | Problem:
        if name not in self.done:
            self.done[name] = self._run(name)
        return self.done[name]

    def _run(self, name: str) -> dict[str, Any] | Problem:
        from moetune.rules.engine import Options, recommend

        path = self.scenarios.path(name)
        try:
            s = self.scenarios.load(name)
        except UserError as exc:
            return Problem(str(path), None, exc.message.removeprefix(f"{path}: "))
        if bad := _document_problem(s):
            return Problem(str(path), None, bad)
        try:
            return recommend(self.rules, s["diagnosis"], s["contract"], s["audit"],
                             options=Options(show_quiet=True), catalog=self.catalog)
        except UserError as exc:
            return Problem(str(path), None, f"the engine refused it: {exc.message}")


def _document_problem(s: Mapping[str, Any]) -> str | None:
    """The first way a scenario is not a diagnosis and contract moetune could have written."""
    import jsonschema
    from moetune.analyzer.contract import check_contract

    err = jsonschema.exceptions.best_match(_diagnosis_validator().iter_errors(s.get("diagnosis")))
    if err is not None:
        where = ".".join(map(str, err.absolute_path))
        return f"diagnosis{'.' + where if where else ''}: {' '.join(err.message.split())[:200]}"
    errors = [p for p in check_contract(s.get("contract") or {}) if p.severity == "error"]
    if errors:
        return f"contract: {errors[0]}"
    return None


@cache
def _diagnosis_validator() -> Any:
    import jsonschema

    return jsonschema.Draft202012Validator(schema("diagnosis"))


__all__ = ["EXPECTATIONS", "Checked", "check_folder"]
