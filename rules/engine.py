"""The recommendation engine: evaluate every rule on (diagnosis, contract, audit), drop illegal
changes, predict the step-time gain and the memory verdict, rank, and emit a recommendations
document (schemas/recommendation.schema.json).

A recommendation is always one knob (plus that knob's own sub-settings): the engine asserts it.
Legality (rules/legality.py) is checked on the configuration after the change against every knob
constraint of rules/knobs.yaml. Every change that costs memory carries the one memory verdict
(rules/memory_advice.py → analyzer/planner/verdict.py): `does not fit` is never ranked (it is
listed as considered, with the prediction that ruled it out), `tight` is ranked with a caveat.

A gate (`gate: true`: a change worth nothing alone, such as expandable segments) is judged by what
it unlocks in the same call: the rules that stay quiet only because the gate is not set are
evaluated with it set, and the gate is shown with those changes (their gain and memory) and ranked
by gate-then-change; a gate that unlocks nothing is not recommended.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from moetune.analyzer.contract import thaw
from moetune.analyzer.planner.verdict import DOES_NOT_FIT
from moetune.rules.gain import predict_gain as predict_gain
from moetune.rules.gain import recoverable_s as recoverable_s
from moetune.rules.inputs import Inputs, num, resolver
from moetune.rules.inputs import Inputs as _Inputs  # noqa: F401  (the older name, for callers)
from moetune.rules.inputs import audit_verdicts as audit_verdicts
from moetune.rules.inputs import contract_value as contract_value
from moetune.rules.inputs import facts as facts
from moetune.rules.inputs import knob_value as knob_value
from moetune.rules.inputs import lookup as lookup
from moetune.rules.inputs import megatron_args as megatron_args
from moetune.rules.inputs import window_s as window_s
from moetune.rules.legality import assert_single_change as assert_single_change
from moetune.rules.legality import changed, environment_reasons, equivalence, legality
from moetune.rules.legality import scaled_target as scaled_target
from moetune.rules.load import Catalog, Knob, Rule, load_catalog
from moetune.rules.memory_advice import (
    best_variant,
    change_memory,
    memory_caveats,
    needs_room_but_unknown,
)
from moetune.rules.phase_targets import targeted_phases

from moetune import __version__
from moetune import conditions as expr
from moetune.conditions import MISSING, UNKNOWN
from moetune.knob_flags import render_bridge as render_bridge
from moetune.knob_flags import render_flags as render_flags

SCHEMA_ID = "moetune.recommendations/1"
_CONFIDENCE = {"high": 1.0, "medium": 0.6, "low": 0.3}
_RISK = {"low": 0, "medium": 1, "high": 2}


@dataclass(frozen=True)
class Options:
    top: int | None = None
    show_quiet: bool = False
    allow_non_equivalent: bool = False


@dataclass
class _Outcome:
    """One rule's evaluation: where it goes in the document."""

    kind: str  # quiet | prerequisite | blocked | no_room | fired
    entry: dict[str, Any]
    rule: Rule
    failed: list[expr.Observation] = field(default_factory=list)  # quiet: top-level false ones


# ----------------------------------------------------------------------------- one rule


def evaluate(rule: Rule, inp: Inputs, options: Options, env_only: frozenset[str],
             base: Mapping[str, Any] | None = None) -> _Outcome:
    """Where one rule's change lands. `base`: changes made before it (a gate's), seen by its
    condition, its legality and its memory verdict."""
    catalog, contract, diagnosis = inp.catalog, inp.contract, inp.diagnosis
    assert_single_change(rule, catalog)
    spec = rule.spec
    head = {"rule": rule.id, "wall": rule.wall, "title": spec["title"], "status": spec["status"]}
    verdict, observations = expr.evaluate(rule.when, resolver(inp, base))
    if verdict is not True:
        unknown = sorted({o.predicate.describe() for o in observations if o.result is None})
        reason = "condition not met" if verdict is False else "inputs missing: " + ", ".join(unknown)
        failed: list[expr.Observation] = []
        if verdict is False:  # the top-level predicates that failed (not those in an `any`)
            top = rule.when.children if isinstance(rule.when, expr.Node) else (rule.when,)
            failed = [o for o in observations
                      if o.result is False and any(o.predicate is c for c in top)]
        return _Outcome("quiet", {**head, "quiet": spec["quiet"], "reason": reason}, rule, failed)
    change = spec["change"]
    knob = catalog.knobs[change["knob"]]
    current, current_from = knob_value(knob, contract, base, args=inp.args)
    reasons: list[str] = []
    if "from" in change and expr._norm(current) != expr._norm(change["from"]):
        return _Outcome("quiet", {**head, "quiet": spec["quiet"], "reason":
                                  f"{knob.name} is {current!r}, rule applies from "
                                  f"{change['from']!r}"}, rule)
    target, why_not, scale_caveat = scaled_target(change, current, contract)
    if why_not:
        return _Outcome("quiet", {**head, "quiet": spec["quiet"], "reason": why_not}, rule)
    if target != change["to"]:  # every later step sees the concrete change
        rule = replace(rule, spec={**spec, "change": {**change, "to": target}})
        change = rule.spec["change"]
    rule = best_variant(rule, inp, base)
    change, spec = rule.spec["change"], rule.spec
    if all(expr._norm(inp.value(n, base)) == expr._norm(v) for n, v in changed(rule).items()):
        reasons.append(f"{knob.name} is already {change['to']!r}")
    illegal, caveats = legality(rule, inp, base)
    if spec.get("choice"):  # a smaller step than the best alone, for what it leaves possible
        caveats.insert(0, spec["choice"])
    if scale_caveat:
        caveats.append(scale_caveat)
    if current_from == "default":
        now = "is unset (the Megatron default)" if current is None else \
            f"= {current!r} is the Megatron default"
        caveats.append(f"current {knob.name} {now}: the contract's megatron_args do not state it")
    reasons += illegal
    memory = change_memory(rule, inp, base)
    if reasons and set(reasons) <= env_only:
        # only the environment stands in the way: say what to install and what it unlocks
        gain = predict_gain(rule, diagnosis)
        return _Outcome("prerequisite", {**head, "change": _change_doc(rule, knob, current),
                                         "needs": reasons, "gain": _round(gain),
                                         "memory": memory,
                                         "score": round(gain["speedup"]["mid"], 6)}, rule)
    equivalent, eq_note = equivalence(rule, catalog)
    if not equivalent and contract.get("label") == "training-equivalent" \
            and not options.allow_non_equivalent:
        reasons.append("contract label training-equivalent forbids a semantics-changing knob "
                       "(pass --allow-non-equivalent to see it)")
    if reasons:
        return _Outcome("blocked", {**head, "change": _change_doc(rule, knob, current),
                                    "reasons": reasons}, rule)
    if memory is not None and memory["verdict"] == DOES_NOT_FIT:
        return _Outcome("no_room", {**head, "change": _change_doc(rule, knob, current),
                                    "reasons": [f"predicted not to fit in memory: "
                                                f"{memory['why']} ({memory['basis']})"],
                                    "gain": _round(predict_gain(rule, diagnosis)),
                                    "memory": memory}, rule)
    if (why := needs_room_but_unknown(rule, memory)) is not None:
        return _Outcome("quiet", {**head, "quiet": spec["quiet"], "reason": why}, rule)
    rec = _recommendation(rule, knob, current, current_from, catalog, diagnosis, observations,
                          caveats + memory_caveats(memory, inp, base), equivalent, eq_note,
                          inp.verdicts)
    rec["memory"] = memory
    return _Outcome("fired", rec, rule)


# ----------------------------------------------------------------------------- the catalog


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
    inp = Inputs(diagnosis, contract, megatron_args(contract), audit_verdicts(audit),
                 facts(contract, catalog), catalog, rules)
    env_only = environment_reasons(catalog)
    out = [evaluate(rule, inp, options, env_only) for rule in rules.values()]
    fired = [o for o in out if o.kind == "fired"]
    quiet = [o for o in out if o.kind == "quiet"]
    _judge_gates(fired, quiet, inp, options, env_only)
    fired = [o for o in fired if o.kind == "fired"]  # a gate that unlocks nothing left
    quiet = [o for o in out if o.kind == "quiet"]
    blocked = [o for o in out if o.kind in ("blocked", "no_room")]
    _link_unlocks(fired, [o for o in blocked if o.kind == "blocked"], inp)
    recs = sorted((o.entry for o in fired),
                  key=lambda r: (-r["score"], _RISK[r["risk"]["level"]], r["rule"]))
    if options.top is not None:
        recs = recs[: options.top]
    for i, r in enumerate(recs, 1):
        r["rank"] = i
    prerequisites = sorted((o.entry for o in out if o.kind == "prerequisite"),
                           key=lambda r: (-r["score"], r["rule"]))
    doc: dict[str, Any] = {
        "schema": SCHEMA_ID,
        "tool": {"name": "moetune", "version": __version__},
        "diagnosis": {
            "step_time_s": diagnosis.get("step_time_s"),
            "dominant_wall": diagnosis.get("dominant_wall"),
            "walls": diagnosis.get("walls"),
            "reference": diagnosis.get("reference"),
            "memory": _memory_summary(diagnosis.get("memory")),
        },
        "contract_label": contract.get("label"),
        "rules_checked": len(rules),
        "recommendations": recs,
        "prerequisites": prerequisites,
        "blocked": [o.entry for o in blocked],
        "quiet_count": len(quiet),
    }
    if not recs:
        doc["none_because"] = _none_because(diagnosis, [o.entry for o in quiet],
                                            doc["blocked"], prerequisites,
                                            {o.rule.id: o.failed for o in quiet}, inp.verdicts)
    if options.show_quiet:
        doc["quiet"] = [o.entry for o in quiet]
    return doc


def _memory_summary(mem: Mapping[str, Any] | None) -> dict[str, Any] | None:
    """The run's measured memory as the verdicts read it, with its source."""
    if not mem:
        return None
    return {k: mem.get(k) for k in ("source", "scope", "peak_allocated_gib", "peak_reserved_gib",
                                    "device_gib", "fragmentation", "iteration")} | {
        "files": list(mem.get("files") or [])}


def _judge_gates(fired: list[_Outcome], quiet: list[_Outcome], inp: Inputs, options: Options,
                 env_only: frozenset[str]) -> None:
    """Each fired gate is re-judged by the quiet rules its change lets fire (evaluated with it
    set): they go under its `unlocks` with their gain, flags and memory verdict, and the gate's
    score becomes gate-then-best-change; a gate that unlocks nothing ranked turns quiet."""
    for g in fired:
        if not g.rule.spec.get("gate"):
            continue
        base = changed(g.rule)
        unlocked = []
        for q in quiet:
            again = evaluate(q.rule, inp, options, env_only, base)
            if again.kind == "fired":
                r = again.entry
                unlocked.append({"rule": r["rule"], "change": r["change"], "gain": r["gain"],
                                 "memory": r["memory"], "megatron_flags": r["megatron_flags"],
                                 "remove_flags": r["remove_flags"], "caveats": r["caveats"],
                                 "score": r["score"]})
            elif again.kind == "no_room":
                g.entry.setdefault("considered", []).append(
                    {"rule": again.entry["rule"], "change": again.entry["change"],
                     "reasons": again.entry["reasons"], "memory": again.entry["memory"]})
        if not unlocked:
            g.kind = "quiet"
            g.entry = {"rule": g.rule.id, "wall": g.rule.wall, "title": g.rule.spec["title"],
                       "status": g.rule.spec["status"], "quiet": g.rule.spec["quiet"],
                       "reason": "a gate (no gain alone) and no change it unlocks applies here"}
            quiet.append(g)
            continue
        unlocked.sort(key=lambda u: -u["score"])
        g.entry["gate"] = True
        g.entry["unlocks"] = [{k: v for k, v in u.items() if k != "score"} for u in unlocked]
        own = g.entry["score"]
        g.entry["score"] = round((1 + own) * (1 + unlocked[0]["score"]) - 1, 6)


def _link_unlocks(fired: list[_Outcome], blocked: list[_Outcome], inp: Inputs) -> None:
    """A recommended change that lifts every constraint blocking another rule's change (e.g.
    recompute off, which local CUDA graphs require) names it under `unlocks`, with the gain the
    unlocked change is predicted to bring and its memory verdict after both; the blocked entry
    names it under `unlocked_by`. The loop then values the enabler for what it makes possible,
    not only for its own gain."""
    for b in blocked:
        for f in fired:
            both = {**changed(f.rule), **(b.rule.spec["change"].get("with") or {})}
            combined = replace(b.rule, spec={**b.rule.spec, "change": {
                **b.rule.spec["change"], "with": both}})
            reasons, _ = legality(combined, inp)
            if reasons:
                continue
            gain = _round(predict_gain(b.rule, inp.diagnosis))
            f.entry.setdefault("unlocks", []).append(
                {"rule": b.rule.id, "change": b.entry["change"], "gain": gain,
                 "memory": change_memory(b.rule, inp, changed(f.rule))})
            b.entry.setdefault("unlocked_by", []).append(f.rule.id)


# ----------------------------------------------------------------------------- why nothing


def _none_because(diagnosis: Mapping[str, Any], quiet: list[dict[str, Any]],
                  blocked: list[dict[str, Any]], prerequisites: list[dict[str, Any]],
                  failed: Mapping[str, list[expr.Observation]] | None = None,
                  verdicts: Mapping[str, str] | None = None) -> str:
    """Why no change is recommended, from the rules of the wall that dominates the step: each
    quiet rule by the first measured fact that kept it quiet; and first, claims the audit
    contradicts (the rules read the contract's settings, which the trace then disproves)."""
    wall = diagnosis.get("dominant_wall")
    share = lookup(diagnosis, f"walls.{wall}") if wall else None
    head = f"the step is {share:.0%} {wall}" if num(share) else "no dominant wall is known"
    false_claims = sorted(a for a, v in (verdicts or {}).items() if v == "contradicted")
    if false_claims:
        head += (f"; the audit contradicts the contract's {', '.join(false_claims)}: fix the claim "
                 "(or the launch, so that it runs) first, since the rules read the contract's "
                 "settings")
    if prerequisites:
        return f"{head}; every change that applies needs the environment changed first (prerequisites)"
    if blocked:
        return f"{head}; the changes that apply are blocked or predicted not to fit (see blocked)"
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


# ----------------------------------------------------------------------------- the document


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
    for name, value in changed(rule).items():
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
    } | ({"targets": tg} if (tg := targeted_phases(knob.name, diagnosis, gain)) else {})


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


def _round(x: Any) -> Any:
    if isinstance(x, float):
        return round(x, 6)
    if isinstance(x, dict):
        return {k: _round(v) for k, v in x.items()}
    if isinstance(x, list):
        return [_round(v) for v in x]
    return x
