"""The fit planner's knowledge as data: `planner.yaml` (schemas/planner.schema.json), optionally
with a user file merged over it (`moetune fit --planner-config FILE`).

Formulas stay in memory.py / plan.py; the numbers they assume come from here. The merged
document is validated by the closed schema, so a misspelt key is an error naming the file and the
key rather than a silently ignored override.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any

from moetune.errors import UserError
from moetune.resources import data, schema
from moetune.yamlio import line_of, read_yaml

BUILTIN_PATH = data("moetune.analyzer.planner", "planner.yaml")
SCHEMA_PATH = schema("planner")
GIB = float(1 << 30)


@dataclass(frozen=True, slots=True)
class RungSpec:
    """One declared step of the fit ladder (plan.fit_ladder turns the list into rungs)."""

    name: str | None
    set: tuple[tuple[str, Any], ...]  # FitOptions fields, or () for a recompute module
    recompute_module: str | None
    when: frozenset[str]
    cost: float
    why: str


@dataclass(frozen=True, kw_only=True, slots=True)
class PlannerConfig:
    """Typed, hashable view of a validated planner document (bytes, fractions, weights)."""

    source: str  # the file(s) it came from, for messages
    # memory
    cuda_context_bytes: float
    fragmentation_expandable: float
    fragmentation_default: float
    verdict_margin: float  # verdict.py: `fits` leaves this fraction of the GPU free
    model_error: float  # the model alone: ± this fraction of its allocated peak
    vocab_divisible_by: int
    moe_imbalance_natural: float
    # bytes per element
    param_bytes: tuple[tuple[str, int], ...]  # precision -> bytes
    main_grad_bytes: tuple[tuple[str, int], ...]  # dtype -> bytes
    master_param_bytes: int
    adam_moment_bytes: int
    adam_moment_bytes_precision_aware: int
    torch_adam_step_temporary: int  # bytes per optimizer parameter of torch Adam's step
    # activations, bytes per element
    linear_input_fp8: int
    linear_input_bf16: int
    router_per_expert: int
    softmax_stats_per_head: int
    unfused_attention_per_score: int
    token_id: int
    final_norm_output: int
    cross_entropy_per_vocab_unfused: int
    cross_entropy_per_vocab_fused: int
    # fit
    headroom_wanted: float
    ladder: tuple[RungSpec, ...]
    # ranking weights, keyed as in planner.yaml `ranking`
    ranking: tuple[tuple[str, float], ...]
    max_vpp: int

    def fragmentation(self, expandable_segments: bool) -> float:
        return self.fragmentation_expandable if expandable_segments else self.fragmentation_default

    def weight(self, name: str) -> float:
        return dict(self.ranking)[name]

    def param_bytes_for(self, precision: str) -> int:
        return dict(self.param_bytes).get(precision, dict(self.param_bytes)["bf16"])

    def main_grad_bytes_for(self, dtype: str | None) -> int:
        return dict(self.main_grad_bytes).get(dtype or "fp32", dict(self.main_grad_bytes)["fp32"])


def load_planner_config(override: str | Path | None = None) -> PlannerConfig:
    """The built-in planner knowledge, with `override` (a user YAML) merged over it; cached."""
    if override is None:
        return _load(None, 0.0)
    p = Path(override)
    try:
        mtime = p.stat().st_mtime
    except OSError as exc:
        raise UserError(f"cannot read planner config: {exc.strerror}", path=override) from None
    return _load(str(p), mtime)


def builtin() -> PlannerConfig:
    return _load(None, 0.0)


@lru_cache(maxsize=16)
def _load(override: str | None, _mtime: float) -> PlannerConfig:
    base, base_lines = _read(BUILTIN_PATH)
    _validate(base, BUILTIN_PATH, base_lines)
    if override is None:
        return _typed(base, BUILTIN_PATH.name)
    user, lines = _read(Path(override))
    merged = merge(base, user)
    _validate(merged, Path(override), lines)  # errors lie in the user's keys: name that file
    return _typed(merged, f"{BUILTIN_PATH.name} + {override}")


def _read(path: Path) -> tuple[dict[str, Any], Mapping[tuple, int]]:
    """Plain YAML only (no tags, no duplicate keys), with key path -> line for messages."""
    doc, lines = read_yaml(path)
    if not isinstance(doc, dict):
        raise UserError(f"planner config must be a mapping, got {type(doc).__name__}", path=path)
    return doc, lines


def merge(base: Mapping[str, Any], over: Mapping[str, Any]) -> dict[str, Any]:
    """`over` merged into a copy of `base`: mappings key by key, lists and scalars replaced; a bare
    scalar over a {value, why, source} entry replaces only `value` (why/source stay built-in)."""
    out = dict(base)
    for key, val in over.items():
        old = base.get(key)
        if isinstance(old, Mapping) and isinstance(val, Mapping):
            out[key] = merge(old, val)
        elif isinstance(old, Mapping) and "value" in old and not isinstance(val, list | Mapping):
            out[key] = {**old, "value": val}
        else:
            out[key] = val
    return out


@lru_cache(maxsize=1)
def _validator() -> Any:
    import jsonschema

    return jsonschema.Draft202012Validator(json.loads(SCHEMA_PATH.read_text()))


def _validate(doc: Mapping[str, Any], path: Path, lines: Mapping[tuple, int]) -> None:
    errors = sorted(_validator().iter_errors(doc), key=lambda e: (list(e.absolute_path), e.message))
    if not errors:
        return
    # report the deepest error of the first location: oneOf/allOf wrap the useful message
    e = errors[0]
    while e.context:
        e = min(e.context, key=lambda c: (-len(c.absolute_path), c.message))
    where = ".".join(str(p) for p in e.absolute_path) or "(top)"
    line = line_of(lines, e.absolute_path)
    at = f"{path}:{line}" if line else str(path)
    if e.validator == "additionalProperties":
        allowed = set(e.schema.get("properties") or {})
        extra = sorted(k for k in e.instance if k not in allowed)
        keys = ", ".join((f"{where}." if e.absolute_path else "") + k for k in extra)
        line = line_of(lines, [*e.absolute_path, extra[0]]) if extra else None
        at = f"{path}:{line}" if line else at
        raise UserError(f"unknown key {keys} in planner config (allowed at {where}: "
                        f"{', '.join(sorted(allowed))})", path=at)
    raise UserError(f"invalid planner config at {where}: {e.message}", path=at)


def _typed(doc: Mapping[str, Any], source: str) -> PlannerConfig:
    def v(section: str, key: str) -> Any:
        return doc[section][key]["value"]

    bpe, act = doc["bytes_per_element"], "activations"
    ladder = tuple(
        RungSpec(name=r.get("name"), set=tuple(sorted((r.get("set") or {}).items())),
                 recompute_module=r.get("recompute_module"), when=frozenset(r.get("when") or ()),
                 cost=float(r["cost"]), why=str(r["why"]))
        for r in doc["fit"]["ladder"])
    return PlannerConfig(
        source=source,
        cuda_context_bytes=float(v("memory", "cuda_context_gib")) * GIB,
        fragmentation_expandable=float(v("memory", "fragmentation_expandable_segments")),
        fragmentation_default=float(v("memory", "fragmentation_default_allocator")),
        verdict_margin=float(v("memory", "verdict_margin")),
        model_error=float(v("memory", "model_error")),
        vocab_divisible_by=int(v("memory", "make_vocab_size_divisible_by")),
        moe_imbalance_natural=float(v("memory", "moe_imbalance_natural")),
        param_bytes=tuple((k, int(e["value"])) for k, e in sorted(bpe["param"].items())),
        main_grad_bytes=tuple((k, int(e["value"])) for k, e in sorted(bpe["main_grad"].items())),
        master_param_bytes=int(v("bytes_per_element", "master_param")),
        adam_moment_bytes=int(v("bytes_per_element", "adam_moments")),
        adam_moment_bytes_precision_aware=int(v("bytes_per_element",
                                                "adam_moments_precision_aware")),
        torch_adam_step_temporary=int(v("bytes_per_element", "torch_adam_step_temporary")),
        linear_input_fp8=int(v(act, "linear_input_fp8")),
        linear_input_bf16=int(v(act, "linear_input_bf16")),
        router_per_expert=int(v(act, "router_per_expert")),
        softmax_stats_per_head=int(v(act, "softmax_stats_per_head")),
        unfused_attention_per_score=int(v(act, "unfused_attention_per_score")),
        token_id=int(v(act, "token_id")),
        final_norm_output=int(v(act, "final_norm_output")),
        cross_entropy_per_vocab_unfused=int(v(act, "cross_entropy_per_vocab_unfused")),
        cross_entropy_per_vocab_fused=int(v(act, "cross_entropy_per_vocab_fused")),
        headroom_wanted=float(v("fit", "headroom_wanted")),
        ladder=ladder,
        ranking=tuple((k, float(e["value"])) for k, e in sorted(doc["ranking"].items())),
        max_vpp=int(v("layouts", "max_vpp")),
    )
