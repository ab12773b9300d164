"""The memory side of a rule's change: the one verdict (analyzer/planner/verdict.py) of every change
that costs memory (`memory_cost: true`), and the step of a knob with several what-if steps (micro-
batch ×2, ×4, ×8) chosen by it.

A change whose verdict is `does not fit` is never ranked (the engine lists it as considered, with
the prediction that ruled it out); `tight` is ranked with a caveat; `unknown` too, unless the rule
exists to use room the run has (`memory_needs_room: true`, recompute or offload off), which then
stays quiet: without evidence of room it has no case.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace
from typing import Any, NamedTuple

from moetune.analyzer.planner.verdict import DOES_NOT_FIT, FITS, TIGHT, UNKNOWN, judge
from moetune.rules.inputs import Inputs, lookup, num, resolver
from moetune.rules.legality import changed
from moetune.rules.load import Rule

from moetune import conditions as expr
from moetune.knob_flags import render_flags

ALLOC_CONF = "PYTORCH_CUDA_ALLOC_CONF"


def change_memory(rule: Rule, inp: Inputs, base: Mapping[str, Any] | None = None
                  ) -> dict[str, Any] | None:
    """The verdict document of the rule's change (with `base`: changes made before it, such as a
    gate's), or None when the rule's change costs no memory."""
    if not rule.spec.get("memory_cost"):
        return None
    changes = {**(base or {}), **changed(rule)}
    return judge(inp.contract, changes, inp.diagnosis.get("memory")).document()


def memory_caveats(memory: Mapping[str, Any] | None, inp: Inputs,
                   base: Mapping[str, Any] | None = None) -> list[str]:
    """What a ranked change's verdict asks of the user: nothing when it fits; for `tight` and
    `unknown`, the prediction and expandable segments first when they are off (about zero cost,
    the Megatron-Bridge memory-tuning order)."""
    if not memory or memory["verdict"] == FITS:
        return []
    on = "expandable_segments:True"
    first = ""
    if on not in str(inp.value(ALLOC_CONF, base) or ""):
        flag = render_flags(inp.catalog.knobs[ALLOC_CONF], on)[0][0]
        first = f"; if it runs out of memory, first set {flag} (about zero cost)"
    if memory["verdict"] == TIGHT:
        return [f"memory tight: {memory['why']}{first}"]
    return [f"memory not predicted: {memory['why']}{first}"]


def needs_room_but_unknown(rule: Rule, memory: Mapping[str, Any] | None) -> str | None:
    """Why a rule that exists to use the run's free memory stays quiet: no verdict shows room.
    Room is shown by `fits`, or by `tight` on a measured peak; the model alone (±its error) must
    say `fits`."""
    if not rule.spec.get("memory_needs_room") or memory is None:
        return None
    ask = ("give the run's log with --log, a memory snapshot, or profile with "
           "profile_memory=True")
    if memory["verdict"] == UNKNOWN:
        return (f"memory unknown ({memory['why']}): no evidence that the run has room for what "
                f"this change keeps ({ask})")
    if memory["verdict"] == TIGHT and memory["evidence"] == "model":
        return (f"no measured peak, and the model alone leaves no clear room ({memory['why']}; "
                f"{ask})")
    return None


def best_variant(rule: Rule, inp: Inputs, base: Mapping[str, Any] | None = None) -> Rule:
    """A rule whose gain names several what-if transforms (e.g. micro-batch ×2, ×4, ×8) becomes
    the variant of the best replayed gain among those whose memory verdict is `fits`, its change's
    target the one that transform modelled. The first (smallest) step is always a candidate
    unless it does not fit; a larger one only when it fits (tight or unknown is not a licence to
    jump). Without estimates, the first transform names the fallback.

    A step is weighed with what it leaves possible (`expected_gain.weigh_with`: rules such as
    recompute off, whose change costs memory): its gain chained with the best of those that fire
    now and still fit after it. On Megatron-LM's memory shape MBS ×8 alone (+109 %) ruled out
    recompute off, where ×4 and then recompute off chain to +181 % (measured +204 % in one call
    against +77 % for ×8 in another, bench/grid_mlm)."""
    gain = rule.spec["expected_gain"]
    ids = gain.get("whatif")
    if not isinstance(ids, list):
        return rule
    follow = _follow_ups(rule, inp, base)
    now = inp.value(rule.spec["change"]["knob"], base)
    variants = []
    for i, tid in enumerate(ids):
        est = lookup(inp.diagnosis, f"whatif.transforms.{tid}")
        if not isinstance(est, Mapping) or not num(lookup(est, "speedup.mid")) \
                or est.get("to") is None or est["to"] == now:  # not a step from here
            continue
        v = replace(rule, spec={**rule.spec, "change": {**rule.spec["change"], "to": est["to"]},
                                "expected_gain": {**gain, "whatif": tid}})
        verdict = (change_memory(v, inp, base) or {}).get("verdict", UNKNOWN)
        ok = verdict != DOES_NOT_FIT if i == 0 else verdict == FITS
        own = est["speedup"]["mid"]
        after = [(g, rid) for rid, g, ch in follow
                 if judge(inp.contract, {**(base or {}), **changed(v), **ch},
                          inp.diagnosis.get("memory")).verdict == FITS]
        g_after, rid_after = max(after, default=(0.0, None))
        # a step that may not be taken ranks below every one that may, the smallest first
        variants.append(_Step(ok, (1 + own) * (1 + g_after) - 1 if ok else -i,
                              own if ok else -i, rid_after, v))
    if not variants:
        return replace(rule, spec={**rule.spec, "expected_gain": {**gain, "whatif": ids[0]}})
    best = max(variants, key=lambda x: (x.ok, x.chained))
    alone = max(variants, key=lambda x: (x.ok, x.own))
    if best is alone or not follow:
        return best.rule
    knob, to_b, to_a = (rule.spec["change"]["knob"], best.rule.spec["change"]["to"],
                        alone.rule.spec["change"]["to"])
    then_a = (f"after {to_a} {best.then} would not fit, so {to_a} is worth its +{alone.own:.0%} "
              "alone" if alone.then is None else
              f"{to_a} then {alone.then} chain to +{alone.chained:.0%}")
    why = (f"{knob} {to_b} rather than {to_a}: {to_b} then {best.then} chain to "
           f"+{best.chained:.0%} (the two what-if estimates multiplied, a chained estimate); "
           f"{then_a}")
    return replace(best.rule, spec={**best.rule.spec, "choice": why})


class _Step(NamedTuple):
    """One step of a multi-step change: may it be taken (memory), its gain chained with the best
    follow-up that still fits after it, its own gain, that follow-up's rule, the step as a rule."""

    ok: bool
    chained: float
    own: float
    then: str | None
    rule: Rule


def _follow_ups(rule: Rule, inp: Inputs, base: Mapping[str, Any] | None
                ) -> list[tuple[str, float, dict[str, Any]]]:
    """(rule id, its what-if gain, its change) of each `weigh_with` rule that fires now."""
    out = []
    for rid in rule.spec["expected_gain"].get("weigh_with") or ():
        other = inp.rules.get(rid)
        if other is None:
            continue
        tid = other.spec["expected_gain"].get("whatif")
        mid = lookup(inp.diagnosis, f"whatif.transforms.{tid}.speedup.mid") \
            if isinstance(tid, str) else None
        if not num(mid) or mid <= 0:
            continue
        if expr.evaluate(other.when, resolver(inp, base))[0] is not True:
            continue
        out.append((rid, float(mid), changed(other)))
    return out
