"""The GPU table (`analyzer/gpus.yaml`): a device name → its architecture and dense peak TFLOP/s.

A leaf: it imports nothing of moetune but the error type and the data-file lookup, so the knob
catalog (moetune/knobs.py, the rules' `gpu_arch` fact) and the throughput section read one table.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path
from types import MappingProxyType
from typing import Any

import yaml

from moetune.errors import UserError
from moetune.resources import data, schema
from moetune.schema_check import first_error

GPUS_PATH = data("moetune.analyzer", "gpus.yaml")
SCHEMA_PATH = schema("gpus")


@dataclass(frozen=True, slots=True)
class GpuModel:
    match: str
    arch: str
    peak_tflops: MappingProxyType = field(default_factory=lambda: MappingProxyType({}))
    source: str | None = None


@cache
def gpu_table(path: str | None = None) -> tuple[GpuModel, ...]:
    """The table in file order (first match wins), validated against schemas/gpus.schema.json
    at every load (moetune.schema_check: no jsonschema import)."""
    p = Path(path) if path else GPUS_PATH
    try:
        doc = yaml.safe_load(p.read_text())
    except (OSError, yaml.YAMLError) as exc:
        raise UserError(f"cannot read the GPU table: {exc}", path=p) from None
    validate_gpus(doc, p)
    return tuple(GpuModel(g["match"], g["arch"], MappingProxyType(dict(g.get("peak_tflops") or {})),
                          g.get("source")) for g in doc["gpus"])


def validate_gpus(doc: Any, path: str | Path) -> None:
    """UserError naming the first place where `doc` breaks schemas/gpus.schema.json."""
    err = first_error(doc, json.loads(SCHEMA_PATH.read_text()))
    if err:
        where = "/".join(str(x) for x in err[0]) or "(top)"
        raise UserError(f"invalid GPU table at {where}: {err[1]}", path=path)


def gpu_model(name: str | None) -> GpuModel | None:
    """The first table entry whose `match` is in `name` (case-insensitive); None when none is."""
    if not name:
        return None
    low = name.lower()
    return next((g for g in gpu_table() if g.match.lower() in low), None)
