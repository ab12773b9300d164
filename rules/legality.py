"""Whether a change may be made: one knob at a time (plus that knob's own scope), legal against
every knob constraint of rules/knobs.yaml on the configuration after it (a change is illegal when it
breaks a constraint that held before), scaled targets within their bounds, and whether it keeps
training equivalent. Constraints only the environment can satisfy (a package to install) make a
change a prerequisite, not a blocked one."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from moetune.rules.inputs import Inputs, contract_value, resolver
from moetune.rules.load import Catalog, Rule

from moetune import conditions as expr


def scaled_target(change: Mapping[str, Any], current: Any, contract: Mapping[str, Any]
                  ) -> tuple[Any, str | None, str | None]:
    """(concrete target, why it does not apply, caveat). A `scale` rule multiplies the current
    value (`to` when that is unknown), bounded by `at_most`: contract path `of` / `per`, which
    the target must also divide (Megatron asserts GBS % (MBS × DP) == 0)."""
    if "scale" not in change or not isinstance(current, int) or isinstance(current, bool):
        return change["to"], None, None
    target = current * change["scale"]
    lim = change.get("at_most")
    if not lim:
        return target, None, None
    of = contract_value(contract, lim["of"])
    per = contract_value(contract, lim["per"]) if lim.get("per") else 1
    bound = f"{lim['of']} / {lim.get('per', '1')}"
    if not all(isinstance(v, int) and not isinstance(v, bool) and v > 0 for v in (of, per)):
        return target, None, f"unverified: {change['knob']} {target} must divide {bound} (not in the contract)"
    cap = of // per
    if target > cap or cap % target:
        return None, (f"{change['knob']} {current} × {change['scale']} = {target} does not fit "
                      f"{bound} = {cap}"), None
    return target, None, None


def changed(rule: Rule) -> dict[str, Any]:
    change = rule.spec["change"]
    return {change["knob"]: change["to"], **(change.get("with") or {})}


def assert_single_change(rule: Rule, catalog: Catalog) -> None:
    """Never two knobs at once: the change is one knob plus that knob's own scope."""
    change = rule.spec["change"]
    knob = catalog.knobs[change["knob"]]
    extra = set(change.get("with") or {}) - set(knob.scope)
    if extra:
        raise AssertionError(f"{rule.id}: change touches {sorted(extra)} besides {knob.name}")


def mentions(cond: expr.Condition, names: set[str]) -> bool:
    return any(p.source == "knob" and p.path in names for p in expr.predicates(cond))


def legality(rule: Rule, inp: Inputs, base: Mapping[str, Any] | None = None
             ) -> tuple[list[str], list[str]]:
    """(reasons the change is illegal, caveats that could not be checked). `base`: changes
    already made before this one (a gate's, when the change it unlocks is judged)."""
    after_change = {**(base or {}), **changed(rule)}
    names = set(after_change)
    before = resolver(inp, base)
    after = resolver(inp, after_change)
    blocked: list[str] = []
    caveats: list[str] = []
    for knob in inp.catalog.knobs.values():
        for c in knob.requires:
            touched = knob.name in names or mentions(c.when, names) or mentions(c.then, names)
            if not touched:
                continue  # untouched constraints cannot change verdict
            w_after, _ = expr.evaluate(c.when, after)
            if w_after is not True:
                continue
            t_after, obs = expr.evaluate(c.then, after)
            if t_after is None:
                unknown = sorted({o.predicate.describe() for o in obs if o.result is None})
                caveats.append(f"unverified: {c.reason} (missing: {', '.join(unknown)})")
                continue
            if t_after:
                continue
            w_before, _ = expr.evaluate(c.when, before)
            t_before, _ = expr.evaluate(c.then, before)
            if w_before is True and t_before is False:
                caveats.append(f"already violated before this change: {c.reason}")
            else:
                blocked.append(c.reason)
    return blocked, caveats


def equivalence(rule: Rule, catalog: Catalog) -> tuple[bool, str]:
    notes = []
    equivalent = True
    for name, value in changed(rule).items():
        spec = catalog.knobs[name].spec
        if not spec["training_equivalent"] and value not in spec.get("equivalent_values", []):
            equivalent = False
            notes.append(spec.get("equivalence_note") or f"{name} changes training semantics")
        elif spec.get("equivalence_note"):
            notes.append(spec["equivalence_note"])
    return equivalent, " ".join(notes) or "Training-equivalent: same model, data and numerics."


def environment_reasons(catalog: Catalog) -> frozenset[str]:
    """Constraint reasons that only the environment can satisfy: every predicate of the
    constraint's `then` reads a `versions.*` field of the contract (a package to install)."""
    out = set()
    for knob in catalog.knobs.values():
        for c in knob.requires:
            preds = expr.predicates(c.then)
            if preds and all(p.source == "contract" and p.path.startswith("versions.")
                             for p in preds):
                out.add(c.reason)
    return frozenset(out)


