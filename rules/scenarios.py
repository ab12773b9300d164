"""Scenario fixtures of rules: a diagnosis, a contract and audit verdicts, as one YAML file.

A rule names them in `fixtures: {fires, quiet, blocked}`; `moetune rules check` runs the rule on
each (rules/check.py). The format (fixtures/diagnoses/README.md): a file `<name>.yaml` holds
`description`, `diagnosis`, `contract` and `audit`; it `extends:` another scenario (default
`_base`) and states only what differs — mappings merge recursively, anything else replaces —
and `drop:` lists dotted paths to remove (`contract.versions.deepep`: "not installed").

Scenarios are looked up by name along a search path of folders, first folder first: a user's
rule folder keeps its own in `<DIR>/fixtures/` and may extend ours (fixtures/diagnoses/ of a
source checkout: the wheel does not ship them).
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path
from typing import Any

import yaml
from moetune.rules.load import FIXTURES_FOLDER

from moetune.errors import UserError
from moetune.resources import data

BASE = "_base"


def repository_fixtures() -> Path | None:
    """fixtures/diagnoses/ of the source checkout moetune runs from (editable install or tree);
    None for an installed wheel."""
    here = data("moetune.rules").resolve().parent / "fixtures" / "diagnoses"
    return here if here.is_dir() else None


def search_path(rule_folder: Path | None = None, extra: Iterable[Path] = ()) -> tuple[Path, ...]:
    """Where a rule folder's scenarios are found: `extra` folders, the folder's own `fixtures/`,
    then the repository's fixtures/diagnoses/ when there is one."""
    out = [Path(p) for p in extra]
    if rule_folder is not None and (Path(rule_folder) / FIXTURES_FOLDER).is_dir():
        out.append(Path(rule_folder) / FIXTURES_FOLDER)
    if (repo := repository_fixtures()) is not None:
        out.append(repo)
    return tuple(dict.fromkeys(p.resolve() for p in out))


class Scenarios:
    """The scenarios of a search path, by name (the first folder holding `<name>.yaml` wins)."""

    def __init__(self, folders: Iterable[Path]) -> None:
        self.folders = tuple(Path(f) for f in folders)

    def path(self, name: str) -> Path | None:
        for folder in self.folders:
            p = folder / f"{name}.yaml"
            if p.is_file():
                return p
        return None

    def names(self) -> list[str]:
        """Every scenario name (the `_`-prefixed bases are not scenarios of their own)."""
        return sorted({p.stem for f in self.folders for p in f.glob("*.yaml")
                       if not p.stem.startswith("_")})

    def load(self, name: str) -> dict[str, Any]:
        """{'description', 'diagnosis', 'contract', 'audit'} of scenario `name`, merged; a fresh
        copy every call. UserError naming the file for a missing, unreadable or broken one."""
        return self._load(name, ())

    def _load(self, name: str, seen: tuple[str, ...]) -> dict[str, Any]:
        path = self.path(name)
        if path is None:
            where = ", ".join(str(f) for f in self.folders) or "no folder"
            via = f" (extended by {seen[-1]!r})" if seen else ""
            raise UserError(f"no scenario {name!r}{via} in {where}")
        if name in seen:
            raise UserError(f"extends itself through {' → '.join((*seen, name))}", path=path)
        try:
            raw = yaml.safe_load(path.read_text(encoding="utf-8")) or {}
        except (OSError, UnicodeDecodeError, yaml.YAMLError) as exc:
            raise UserError(f"cannot read scenario: {' '.join(str(exc).split())}", path=path) from None
        if not isinstance(raw, dict):
            raise UserError("a scenario is a mapping (description, diagnosis, contract, audit)",
                            path=path)
        parent = raw.pop("extends", None if name == BASE else BASE)
        base = (self._load(parent, (*seen, name)) if parent else
                {"diagnosis": {}, "contract": {}, "audit": {}})
        drops = raw.pop("drop", []) or []
        out = _merge(base, raw)
        for dotted in drops:
            *head, last = str(dotted).split(".")
            node = out
            for part in head:
                node = node.get(part) if isinstance(node, dict) else None
            if not isinstance(node, dict) or last not in node:
                raise UserError(f"drop: {dotted!r} is not in the scenario it extends", path=path)
            del node[last]
        return out


def _merge(a: Any, b: Any) -> Any:
    if isinstance(a, dict) and isinstance(b, dict):
        out = {k: _copy(v) for k, v in a.items()}
        for k, v in b.items():
            out[k] = _merge(a[k], v) if k in a else _copy(v)
        return out
    return _copy(b)


def _copy(x: Any) -> Any:
    if isinstance(x, dict):
        return {k: _copy(v) for k, v in x.items()}
    if isinstance(x, list):
        return [_copy(v) for v in x]
    return x
