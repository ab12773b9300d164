"""What the rules read: the diagnosis, the contract (and the Megatron arguments it states), the
audit's verdicts and derived facts, resolved for the condition language (`moetune.conditions`).
A knob's value is read from a change under evaluation first (`overrides`), then the contract."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from moetune.analyzer.contract import MISSING as CONTRACT_MISSING
from moetune.analyzer.contract import effective_args, field_value
from moetune.rules.load import WINDOW, Catalog, Knob

from moetune import conditions as expr
from moetune.conditions import MISSING, UNKNOWN


def audit_verdicts(audit: Any) -> dict[str, str]:
    """Megatron argument -> confirmed/contradicted/unobservable, from the audit's shapes."""
    if not audit:
        return {}
    if isinstance(audit, Mapping):
        for key in ("verdicts", "claims", "results"):
            if key in audit:
                return audit_verdicts(audit[key])
        out = {}
        for arg, v in audit.items():
            verdict = v.get("verdict", v.get("status")) if isinstance(v, Mapping) else v
            if isinstance(verdict, str):
                out[str(arg)] = verdict
        return out
    out = {}
    for item in audit:
        if not isinstance(item, Mapping):
            continue
        arg = next((item[k] for k in ("arg", "megatron_arg", "knob", "claim") if k in item), None)
        verdict = item.get("verdict", item.get("status"))
        if isinstance(arg, str) and isinstance(verdict, str):
            out[arg] = verdict
    return out


def lookup(doc: Any, path: str) -> Any:
    """Dotted path into nested mappings; MISSING when absent. Keys may contain dots
    (`evidence.classes.comm.ep.deepep.time_s`): the longest matching key is tried first."""
    return _lookup(doc, path.split("."))


def _lookup(node: Any, parts: list[str]) -> Any:
    if not parts:
        return node
    if isinstance(node, Mapping):
        for j in range(len(parts), 0, -1):
            key = ".".join(parts[:j])
            if key in node:
                found = _lookup(node[key], parts[j:])
                if found is not MISSING:
                    return found
        return MISSING
    if isinstance(node, list) and parts[0].isdigit() and int(parts[0]) < len(node):
        return _lookup(node[int(parts[0])], parts[1:])
    return MISSING


def window_s(diagnosis: Mapping[str, Any]) -> Any:
    """Seconds of analyzed GPU window: evidence.classes times are totals over it, not per step."""
    rows = diagnosis.get("per_step") or []
    total = sum(r.get("wall_s", 0.0) for r in rows if isinstance(r, Mapping))
    if total > 0:
        return total
    t = diagnosis.get("step_time_s")
    steps = diagnosis.get("steps") or []
    ranks = diagnosis.get("ranks_analyzed") or [0]
    return t * len(steps) * len(ranks) if num(t) and steps else MISSING


def facts(contract: Mapping[str, Any], catalog: Catalog) -> dict[str, Any]:
    """Derived topology/hardware facts; absent inputs stay absent (unknown)."""
    hw = contract.get("hardware") or {}
    par = contract.get("parallelism") or {}
    out: dict[str, Any] = {}
    model = str(hw.get("gpu_model") or "")
    if model:
        out["gpu_arch"] = next(
            (arch for pat, arch in catalog.gpus if pat.lower() in model.lower()), "unknown"
        )
    domain = hw.get("nvlink_domain_size") or hw.get("gpus_per_node")
    if domain:
        out["nvlink_domain_size"] = domain
        out["nvl72"] = domain >= 36
    if hw.get("gpus_per_node") and hw.get("nodes"):
        out["world_size"] = hw["gpus_per_node"] * hw["nodes"]
    ep = par.get("ep")
    if ep and domain:
        etp = par.get("etp") or par.get("tp") or 1
        out["ep_cross_node"] = ep * etp > domain
    model_sec = contract.get("model")
    if isinstance(model_sec, Mapping):
        shared = model_sec.get("moe_shared_expert_intermediate_size")
        out["has_shared_experts"] = bool(shared)
    return out


def megatron_args(contract: Mapping[str, Any]) -> dict[str, Any]:
    """`megatron_args` plus the arguments contract sections mirror (analyzer/contract.py)."""
    return effective_args(contract)


def knob_value(
    knob: Knob,
    contract: Mapping[str, Any],
    overrides: Mapping[str, Any] | None = None,
    args: Mapping[str, Any] | None = None,
) -> tuple[Any, str]:
    """A knob's value and where it came from: change, megatron_args/env, contract, default."""
    if overrides and knob.name in overrides:
        return overrides[knob.name], "change"
    if knob.kind == "env":
        env = contract.get("env") or {}
        return (env[knob.name], "env") if knob.name in env else (knob.default, "default")
    args = megatron_args(contract) if args is None else args
    if knob.name in args:
        return args[knob.name], "megatron_args"
    cpath = knob.spec.get("contract_path")
    if cpath and (v := lookup(contract, cpath)) is not MISSING:
        return v, cpath
    return knob.default, "default"


@dataclass(frozen=True)
class Inputs:
    diagnosis: Mapping[str, Any]
    contract: Mapping[str, Any]
    args: Mapping[str, Any]
    verdicts: Mapping[str, str]
    facts: Mapping[str, Any]
    catalog: Catalog
    # the rule set being evaluated: a rule's `weigh_with` names others (rules/memory_advice.py)
    rules: Mapping[str, Any] = field(default_factory=dict)

    def value(self, name: str, overrides: Mapping[str, Any] | None = None) -> Any:
        return knob_value(self.catalog.knobs[name], self.contract, overrides, self.args)[0]


def resolver(inp: Inputs, overrides: Mapping[str, Any] | None = None) -> expr.Resolver:
    def resolve(source: str, path: str) -> Any:
        if source == "metric":
            return window_s(inp.diagnosis) if path == WINDOW else lookup(inp.diagnosis, path)
        if source == "contract":
            if (value := contract_value(inp.contract, path)) is not MISSING:
                return value
            if path.split(".")[0] not in inp.contract:
                return UNKNOWN  # the contract is silent about this section
            return lookup(inp.contract, path)
        if source == "audit":
            return inp.verdicts.get(path, MISSING)
        if source == "fact":
            return inp.facts.get(path, MISSING)
        if source == "knob":
            return inp.value(path, overrides)
        raise AssertionError(source)

    return resolve



def contract_value(contract: Mapping[str, Any], path: str) -> Any:
    """A contract field, or the `megatron_args` value it mirrors (analyzer.contract.field_value);
    MISSING when the contract has neither."""
    value = field_value(contract, path)
    return MISSING if value is CONTRACT_MISSING else value


def num(x: Any) -> bool:
    """A real number (bool excluded)."""
    return isinstance(x, int | float) and not isinstance(x, bool)
