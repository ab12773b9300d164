"""The recommendation engine: evaluate every rule on (diagnosis, contract, audit), drop illegal
changes, predict the step-time gain, rank, and emit a recommendations document
(schemas/recommendation.schema.json).

A recommendation is always one knob (plus that knob's own sub-settings): the engine asserts it.
Legality is checked on the configuration after the change against every knob constraint of
rules/knobs.yaml; a change is illegal when it breaks a constraint that held before.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, replace
from typing import Any

from moetune.analyzer.contract import MISSING as CONTRACT_MISSING
from moetune.analyzer.contract import effective_args, field_value, thaw
from moetune.rules.load import WINDOW, Catalog, Knob, Rule, load_catalog

from moetune import __version__
from moetune import conditions as expr
from moetune.conditions import MISSING, UNKNOWN
from moetune.errors import UserError
from moetune.knobs import render_bridge, render_flags

SCHEMA_ID = "moetune.recommendations/1"
_CONFIDENCE = {"high": 1.0, "medium": 0.6, "low": 0.3}
_RISK = {"low": 0, "medium": 1, "high": 2}


@dataclass(frozen=True)
class Options:
    top: int | None = None
    show_quiet: bool = False
    allow_non_equivalent: bool = False


# ----------------------------------------------------------------------------- inputs


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
    return t * len(steps) * len(ranks) if _num(t) and steps else MISSING


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
class _Inputs:
    diagnosis: Mapping[str, Any]
    contract: Mapping[str, Any]
    args: Mapping[str, Any]
    verdicts: Mapping[str, str]
    facts: Mapping[str, Any]
    catalog: Catalog

    def value(self, name: str, overrides: Mapping[str, Any] | None = None) -> Any:
        return knob_value(self.catalog.knobs[name], self.contract, overrides, self.args)[0]


def _resolver(inp: _Inputs, overrides: Mapping[str, Any] | None = None) -> expr.Resolver:
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


# ----------------------------------------------------------------------------- legality


def contract_value(contract: Mapping[str, Any], path: str) -> Any:
    """A contract field, or the `megatron_args` value it mirrors (analyzer.contract.field_value);
    MISSING when the contract has neither."""
    value = field_value(contract, path)
    return MISSING if value is CONTRACT_MISSING else value


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


def _changed(rule: Rule) -> dict[str, Any]:
    change = rule.spec["change"]
    return {change["knob"]: change["to"], **(change.get("with") or {})}


def assert_single_change(rule: Rule, catalog: Catalog) -> None:
    """Never two knobs at once: the change is one knob plus that knob's own scope."""
    change = rule.spec["change"]
    knob = catalog.knobs[change["knob"]]
    extra = set(change.get("with") or {}) - set(knob.scope)
    if extra:
        raise AssertionError(f"{rule.id}: change touches {sorted(extra)} besides {knob.name}")


def _mentions(cond: expr.Condition, names: set[str]) -> bool:
    return any(p.source == "knob" and p.path in names for p in expr.predicates(cond))


def legality(rule: Rule, inp: _Inputs) -> tuple[list[str], list[str]]:
    """(reasons the change is illegal, caveats that could not be checked)."""
    changed = _changed(rule)
    names = set(changed)
    before = _resolver(inp)
    after = _resolver(inp, changed)
    blocked: list[str] = []
    caveats: list[str] = []
    for knob in inp.catalog.knobs.values():
        for c in knob.requires:
            touched = knob.name in names or _mentions(c.when, names) or _mentions(c.then, names)
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


def _memory_caveat(rule: Rule, inp: _Inputs) -> list[str]:
    """Expandable segments (about zero cost) before any memory-expensive change (the order of the
    Megatron-Bridge memory-tuning skill)."""
    env = "PYTORCH_CUDA_ALLOC_CONF"
    if not rule.spec.get("memory_cost") or "expandable_segments:True" in str(inp.value(env) or ""):
        return []
    flag = render_flags(inp.catalog.knobs[env], "expandable_segments:True")[0][0]
    return [f"raises memory use: if it runs out of memory, first set {flag} (about zero cost)"]


def equivalence(rule: Rule, catalog: Catalog) -> tuple[bool, str]:
    notes = []
    equivalent = True
    for name, value in _changed(rule).items():
        spec = catalog.knobs[name].spec
        if not spec["training_equivalent"] and value not in spec.get("equivalent_values", []):
            equivalent = False
            notes.append(spec.get("equivalence_note") or f"{name} changes training semantics")
        elif spec.get("equivalence_note"):
            notes.append(spec["equivalence_note"])
    return equivalent, " ".join(notes) or "Training-equivalent: same model, data and numerics."


# ----------------------------------------------------------------------------- gain


def recoverable_s(spec: Mapping[str, Any], diagnosis: Mapping[str, Any]) -> tuple[float, str] | None:
    """R (seconds per step) and the path it came from, or None when the diagnosis lacks it."""
    t = diagnosis.get("step_time_s")
    if "metric" in spec:
        v = lookup(diagnosis, spec["metric"])
        if not _num(v):
            return None
        unit = spec.get("unit", "s")
        if unit == "step_fraction":
            return v * t, f"{spec['metric']} × step_time_s"
        if unit == "window_total":
            w = window_s(diagnosis)
            return (v / w * t, f"{spec['metric']} ÷ window_s × step_time_s") if _num(w) and w else None
        return v, spec["metric"]
    wall = spec["wall"]
    v = lookup(diagnosis, f"critical_path.recoverable_s.{wall}")
    if _num(v):
        return v, f"critical_path.recoverable_s.{wall}"
    g = lookup(diagnosis, f"critical_path.gain_ceiling.{wall}")
    if _num(g) and _num(t):
        return t * g / (1 + g), f"critical_path.gain_ceiling.{wall}"
    v = lookup(diagnosis, f"wall_detail.{wall}.exposed_s")
    if _num(v):
        return v, f"wall_detail.{wall}.exposed_s"
    return None


def _num(x: Any) -> bool:
    return isinstance(x, int | float) and not isinstance(x, bool)


def predict_gain(rule: Rule, diagnosis: Mapping[str, Any]) -> dict[str, Any]:
    """Speedup range T/T' − 1 and the predicted step time; ceiling T/(T−R) − 1."""
    spec = rule.spec["expected_gain"]
    t = float(diagnosis["step_time_s"])
    est = lookup(diagnosis, f"whatif.transforms.{spec['whatif']}") if "whatif" in spec else None
    if isinstance(est, Mapping) and _num(lookup(est, "speedup.mid")):
        sp, st = est["speedup"], est["step_time_s"]
        return {
            "speedup": {"low": sp["low"], "high": sp["high"], "mid": sp["mid"]},
            "step_time_s": {"before": st["before"], "low": st["low"], "high": st["high"]},
            "ceiling": None, "recoverable_s": None, "recoverable_from": f"whatif.{spec['whatif']}",
            "basis": f"{est['basis']} (what-if replay, fidelity {lookup(diagnosis, 'whatif.fidelity')})",
        }
    if "fixed" in spec:
        lo, hi = spec["fixed"]
        return {
            "speedup": {"low": lo, "high": hi, "mid": (lo + hi) / 2},
            "step_time_s": {"before": t, "low": t / (1 + hi), "high": t / (1 + lo)},
            "ceiling": None, "recoverable_s": None, "recoverable_from": None,
            "basis": spec["basis"],
        }
    found = recoverable_s(spec["recoverable"], diagnosis)
    e_lo, e_hi = spec["efficiency"]
    if found is None or t <= 0:
        return {
            "speedup": {"low": 0.0, "high": 0.0, "mid": 0.0},
            "step_time_s": {"before": t, "low": t, "high": t},
            "ceiling": None, "recoverable_s": None, "recoverable_from": None,
            "basis": spec["basis"] + " (no recoverable time in this diagnosis: gain not quantified)",
        }
    r, source = found
    r = min(max(r, 0.0), 0.99 * t)  # R ≥ T would promise infinite speedup
    lo, hi = t / (t - e_lo * r) - 1, t / (t - e_hi * r) - 1
    return {
        "speedup": {"low": lo, "high": hi, "mid": (lo + hi) / 2},
        "step_time_s": {"before": t, "low": t - e_hi * r, "high": t - e_lo * r},
        "ceiling": t / (t - r) - 1,
        "recoverable_s": r,
        "recoverable_from": source,
        "efficiency": [e_lo, e_hi],
        "basis": spec["basis"],
    }


# ----------------------------------------------------------------------------- rendering


def _evidence(observations: Iterable[expr.Observation]) -> list[dict[str, Any]]:
    out = []
    for o in observations:
        p = o.predicate
        item = {"source": p.source, "path": p.path, "op": p.op, "actual": _jsonable(o.actual),
                "held": o.result}
        if p.op not in ("exists", "missing"):
            item["value"] = p.value
        if p.of:
            item["of"] = p.of
        out.append(item)
    return out


def _jsonable(x: Any) -> Any:
    if x is MISSING or x is UNKNOWN:
        return None
    if isinstance(x, float):
        return round(x, 6)
    return x


# ----------------------------------------------------------------------------- engine


def recommend(
    rules: Mapping[str, Rule],
    diagnosis: Mapping[str, Any],
    contract: Mapping[str, Any] | None = None,
    audit: Any = None,
    *,
    options: Options | None = None,
    catalog: Catalog | None = None,
) -> dict[str, Any]:
    """Evaluate all rules and return the recommendations document."""
    catalog = catalog or load_catalog()
    options = options or Options()
    contract = thaw(contract or {})
    inp = _Inputs(diagnosis, contract, megatron_args(contract), audit_verdicts(audit),
                  facts(contract, catalog), catalog)
    resolve = _resolver(inp)
    label = contract.get("label")
    fired: list[dict[str, Any]] = []
    blocked: list[dict[str, Any]] = []
    quiet: list[dict[str, Any]] = []
    prerequisites: list[dict[str, Any]] = []
    failed: dict[str, list[expr.Observation]] = {}  # quiet rules' false predicates, for none_because
    fired_rules: list[tuple[Rule, dict[str, Any]]] = []
    blocked_rules: list[tuple[Rule, dict[str, Any]]] = []
    env_only = environment_reasons(catalog)
    for rule in rules.values():
        assert_single_change(rule, catalog)
        spec = rule.spec
        head = {"rule": rule.id, "wall": rule.wall, "title": spec["title"], "status": spec["status"]}
        verdict, observations = expr.evaluate(rule.when, resolve)
        if verdict is not True:
            unknown = sorted({o.predicate.describe() for o in observations if o.result is None})
            reason = "condition not met" if verdict is False else "inputs missing: " + ", ".join(unknown)
            quiet.append({**head, "quiet": spec["quiet"], "reason": reason})
            if verdict is False:  # the top-level predicates that failed (not those in an `any`)
                top = rule.when.children if isinstance(rule.when, expr.Node) else (rule.when,)
                failed[rule.id] = [o for o in observations
                                   if o.result is False and any(o.predicate is c for c in top)]
            continue
        change = spec["change"]
        knob = catalog.knobs[change["knob"]]
        current, current_from = knob_value(knob, contract, args=inp.args)
        reasons: list[str] = []
        if "from" in change and expr._norm(current) != expr._norm(change["from"]):
            quiet.append({**head, "quiet": spec["quiet"],
                          "reason": f"{knob.name} is {current!r}, rule applies from {change['from']!r}"})
            continue
        target, why_not, scale_caveat = scaled_target(change, current, contract)
        if why_not:
            quiet.append({**head, "quiet": spec["quiet"], "reason": why_not})
            continue
        if target != change["to"]:  # every later step sees the concrete change
            rule = replace(rule, spec={**spec, "change": {**change, "to": target}})
            change = rule.spec["change"]
        rule = best_variant(rule, diagnosis, contract)
        change, spec = rule.spec["change"], rule.spec
        if all(expr._norm(inp.value(n)) == expr._norm(v) for n, v in _changed(rule).items()):
            reasons.append(f"{knob.name} is already {change['to']!r}")
        illegal, caveats = legality(rule, inp)
        caveats += _memory_caveat(rule, inp) + ([scale_caveat] if scale_caveat else [])
        if current_from == "default":
            caveats.append(f"current {knob.name} = {current!r} is the Megatron default: the "
                           "contract's megatron_args do not state it")
        reasons += illegal
        equivalent, eq_note = equivalence(rule, catalog)
        if reasons and set(reasons) <= env_only:
            # only the environment stands in the way: say what to install and what it unlocks
            gain = predict_gain(rule, diagnosis)
            prerequisites.append({**head, "change": _change_doc(rule, knob, current),
                                  "needs": reasons, "gain": _round(gain),
                                  "score": round(gain["speedup"]["mid"], 6)})
            continue
        if not equivalent and label == "training-equivalent" and not options.allow_non_equivalent:
            reasons.append("contract label training-equivalent forbids a semantics-changing knob "
                           "(pass --allow-non-equivalent to see it)")
        if reasons:
            blocked.append({**head, "change": _change_doc(rule, knob, current), "reasons": reasons})
            blocked_rules.append((rule, blocked[-1]))
            continue
        rec = _recommendation(rule, knob, current, current_from, catalog, diagnosis,
                              observations, caveats, equivalent, eq_note, inp.verdicts)
        rec["memory"] = memory_prediction(rule, diagnosis, contract)
        if rec["memory"] and rec["memory"]["fits"] is False:
            rec["caveats"].append(f"predicted not to fit: {rec['memory']['basis']}; peak "
                                  f"{rec['memory']['peak_gib']} GiB of {rec['memory']['capacity_gib']}")
        fired.append(rec)
        fired_rules.append((rule, rec))
    _link_unlocks(fired_rules, blocked_rules, inp, diagnosis)
    # changes predicted not to fit go below those that fit (shown, never dropped)
    fired.sort(key=lambda r: ((r["memory"] or {}).get("fits") is False, -r["score"],
                              _RISK[r["risk"]["level"]], r["rule"]))
    if options.top is not None:
        fired = fired[: options.top]
    for i, r in enumerate(fired, 1):
        r["rank"] = i
    prerequisites.sort(key=lambda r: (-r["score"], r["rule"]))
    doc: dict[str, Any] = {
        "schema": SCHEMA_ID,
        "tool": {"name": "moetune", "version": __version__},
        "diagnosis": {
            "step_time_s": diagnosis.get("step_time_s"),
            "dominant_wall": diagnosis.get("dominant_wall"),
            "walls": diagnosis.get("walls"),
        },
        "contract_label": label,
        "rules_checked": len(rules),
        "recommendations": fired,
        "prerequisites": prerequisites,
        "blocked": blocked,
        "quiet_count": len(quiet),
    }
    if not fired:
        doc["none_because"] = _none_because(diagnosis, quiet, blocked, prerequisites, failed,
                                            inp.verdicts)
    if options.show_quiet:
        doc["quiet"] = quiet
    return doc


def _link_unlocks(fired: list[tuple[Rule, dict[str, Any]]],
                  blocked: list[tuple[Rule, dict[str, Any]]], inp: _Inputs,
                  diagnosis: Mapping[str, Any]) -> None:
    """A recommended change that lifts every constraint blocking another rule's change (e.g.
    recompute off, which local CUDA graphs require) names it under `unlocks`, with the gain the
    unlocked change is predicted to bring; the blocked entry names it under `unlocked_by`. The
    loop then values the enabler for what it makes possible, not only for its own gain."""
    for b_rule, b_entry in blocked:
        for f_rule, f_rec in fired:
            both = {**_changed(f_rule), **(b_rule.spec["change"].get("with") or {})}
            combined = replace(b_rule, spec={**b_rule.spec, "change": {
                **b_rule.spec["change"], "with": both}})
            reasons, _ = legality(combined, inp)
            if reasons:
                continue
            gain = _round(predict_gain(b_rule, diagnosis))
            f_rec.setdefault("unlocks", []).append(
                {"rule": b_rule.id, "change": b_entry["change"], "gain": gain})
            b_entry.setdefault("unlocked_by", []).append(f_rule.id)


def best_variant(rule: Rule, diagnosis: Mapping[str, Any], contract: Mapping[str, Any]) -> Rule:
    """A rule whose gain names several what-if transforms (e.g. micro-batch ×2, ×4, ×8) becomes
    the variant of the best replayed gain among those predicted to fit in memory, its change's
    target the one that transform modelled. The first (smallest) step is always a candidate; a
    larger one only when the memory model prices it as fitting (unknown is not a licence to
    jump). Without estimates, the first transform names the fallback."""
    gain = rule.spec["expected_gain"]
    ids = gain.get("whatif")
    if not isinstance(ids, list):
        return rule
    variants = []
    for i, tid in enumerate(ids):
        est = lookup(diagnosis, f"whatif.transforms.{tid}")
        if not isinstance(est, Mapping) or not _num(lookup(est, "speedup.mid")) \
                or est.get("to") is None:
            continue
        v = replace(rule, spec={**rule.spec, "change": {**rule.spec["change"], "to": est["to"]},
                                "expected_gain": {**gain, "whatif": tid}})
        mem = memory_prediction(v, diagnosis, contract)
        fits = (mem or {}).get("fits") is not False if i == 0 else bool(mem and mem["fits"])
        variants.append((fits, est["speedup"]["mid"] if fits else -i, v))
    if not variants:
        return replace(rule, spec={**rule.spec, "expected_gain": {**gain, "whatif": ids[0]}})
    return max(variants, key=lambda x: (x[0], x[1]))[2]


def memory_prediction(rule: Rule, diagnosis: Mapping[str, Any], contract: Mapping[str, Any]
                      ) -> dict[str, Any] | None:
    """The change's predicted peak memory (analyzer/planner/predict.py: the measured peak plus the
    memory model's delta for the change), or None when the contract does not describe the model
    well enough to price it."""
    if not rule.spec.get("memory_cost"):
        return None
    from moetune.analyzer.planner.predict import measured_from_diagnosis, predict_peak

    measured, device = measured_from_diagnosis(diagnosis)
    try:
        pred = predict_peak(contract, _changed(rule), measured_peak_bytes=measured,
                            gpu_memory_bytes=device)
    except (UserError, KeyError, TypeError, ValueError, ZeroDivisionError):
        return None  # the model section is missing or partial: the peak is unknown, not zero
    gib = 1024 ** 3
    return {
        "peak_gib": round(pred.peak_bytes / gib, 2),
        "capacity_gib": round(pred.capacity_bytes / gib, 2) if pred.capacity_bytes else None,
        "fits": pred.fits,
        "basis": pred.basis,
    }


def _none_because(diagnosis: Mapping[str, Any], quiet: list[dict[str, Any]],
                  blocked: list[dict[str, Any]], prerequisites: list[dict[str, Any]],
                  failed: Mapping[str, list[expr.Observation]] | None = None,
                  verdicts: Mapping[str, str] | None = None) -> str:
    """Why no change is recommended, from the rules of the wall that dominates the step: each
    quiet rule by the first measured fact that kept it quiet; and first, claims the audit
    contradicts (the rules read the contract's settings, which the trace then disproves)."""
    wall = diagnosis.get("dominant_wall")
    share = lookup(diagnosis, f"walls.{wall}") if wall else None
    head = f"the step is {share:.0%} {wall}" if _num(share) else "no dominant wall is known"
    false_claims = sorted(a for a, v in (verdicts or {}).items() if v == "contradicted")
    if false_claims:
        head += (f"; the audit contradicts the contract's {', '.join(false_claims)}: fix the claim "
                 "(or the launch, so that it runs) first, since the rules read the contract's "
                 "settings")
    if prerequisites:
        return f"{head}; every change that applies needs the environment changed first (prerequisites)"
    if blocked:
        return f"{head}; the changes that apply are blocked (see blocked)"
    mine = [q for q in quiet if q["wall"] == wall]
    reasons = [f"{q['rule']}: {_quiet_fact((failed or {}).get(q['rule'], []), q['reason'])}"
               for q in mine][:4]
    if not reasons:
        return f"{head}; no rule in the catalog targets it"
    return f"{head}; its rules do not apply: " + "; ".join(reasons)


def _quiet_fact(observations: list[expr.Observation], reason: str) -> str:
    """The first false predicate of a quiet rule with the value it saw (`walls.compute is 0.63,
    needs >= 0.75`), else the engine's reason (inputs missing, from-value mismatch)."""
    for o in observations:
        p = o.predicate
        if p.source in ("metric", "knob", "contract", "fact", "audit") and o.actual is not None:
            lhs = p.path + (f"/{p.of}" if p.of else "")
            seen = round(o.actual, 4) if isinstance(o.actual, float) else o.actual
            return f"{lhs} is {seen!r}, needs {p.op} {p.value!r}"
    return reason


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


def _change_doc(rule: Rule, knob: Knob, current: Any) -> dict[str, Any]:
    change = rule.spec["change"]
    out = {"knob": knob.name, "from": current, "to": change["to"]}
    if change.get("with"):
        out["with"] = dict(change["with"])
    return out


def _recommendation(
    rule: Rule,
    knob: Knob,
    current: Any,
    current_from: str,
    catalog: Catalog,
    diagnosis: Mapping[str, Any],
    observations: list[expr.Observation],
    caveats: list[str],
    equivalent: bool,
    eq_note: str,
    verdicts: Mapping[str, str],
) -> dict[str, Any]:
    spec = rule.spec
    flags: list[str] = []
    remove: list[str] = []
    bridge: list[str] = []
    for name, value in _changed(rule).items():
        k = catalog.knobs[name]
        f, r = render_flags(k, value)
        flags += f
        remove += r
        if (b := render_bridge(k, value)) is not None:
            bridge.append(b)
    gain = predict_gain(rule, diagnosis)
    verify = dict(spec["verify"])
    verify["expect"] = "confirmed" if "audit" in verify else None
    if "audit" in verify:
        verify["verdict_now"] = verdicts.get(verify["audit"])
    now = lookup(diagnosis, verify["metric"])
    verify["metric_now"] = _jsonable(now)
    return {
        "rank": 0,
        "rule": rule.id,
        "status": spec["status"],
        "wall": rule.wall,
        "title": spec["title"],
        "change": {**_change_doc(rule, knob, current), "from_source": current_from},
        "megatron_flags": flags,
        "remove_flags": remove,
        "bridge_overrides": bridge,
        "gain": _round(gain),
        # a replayed estimate is ranked by itself; a rule's fixed range by its stated confidence
        "score": round(gain["speedup"]["mid"] * (1.0 if str(gain.get("recoverable_from") or "")
                                                .startswith("whatif.")
                                                else _CONFIDENCE[spec["confidence"]]), 6),
        "confidence": spec["confidence"],
        "risk": dict(spec["risk"]),
        "evidence": _evidence(observations),
        "training_equivalent": equivalent,
        "equivalence_note": eq_note,
        "caveats": caveats,
        "verify": verify,
        "why": spec["why"],
        "sources": list(spec["sources"]),
    }


def _round(x: Any) -> Any:
    if isinstance(x, float):
        return round(x, 6)
    if isinstance(x, dict):
        return {k: _round(v) for k, v in x.items()}
    if isinstance(x, list):
        return [_round(v) for v in x]
    return x
