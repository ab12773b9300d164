"""One candidate against its baseline, decided sequentially: pairs of runs until the evidence
decides, every measured run reused.

Built for what a real trainer costs (docs/executor.md): tens of seconds of start-up per process,
run-to-run levels that move ±25 % between fresh processes of the same command, and drift inside
one run. So:
- a pair is one baseline run (A) and one candidate run (B) of the session's run shape; the first
  A is the baseline's latest run already measured (the round's profile run, or the runs that made
  it the baseline), so a clear win costs one new run;
- a run's evidence is its step time (the median of its measured window, or of the window's later
  half when it drifted: executor/validate.py); its uncertainty is the run-to-run noise σ (log
  units) of fresh processes, estimated from the session's own repeated runs of one configuration
  and shrunk toward `Policy.noise_prior` while they are few (`run_noise`), plus, for a run that
  drifted inside its window, a quarter of that drift;
- after each pair: the mean log ratio r̄ of the pairs and its standard error se; a win when
  r̄ − z·se clears ln(1 + min_gain), no win when r̄ + z·se does not, else one more pair, up to
  `max_pairs` (undecided then: rejected, and said so);
- an enabler (a change that lifts what blocks others) is kept when it is not measurably slower;
- the first candidate run is profiled at its end: its trace is the audit's proof, and, when the
  candidate is accepted, the next round's profile.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Mapping, Sequence
from typing import Any

from moetune.executor.candidate import Launch
from moetune.executor.runner import Runner
from moetune.executor.validate import Policy, audit_change, loss_health

from moetune.errors import UserError

PRIOR_WEIGHT = 2.0  # the prior counts as this many degrees of freedom of the noise estimate


def run_noise(groups: Sequence[Sequence[float]], policy: Policy) -> float:
    """σ of ln(run median) between fresh processes: the pooled spread of repeated runs of one
    configuration (`groups`: step times per configuration), shrunk toward the prior."""
    ss, dof = _pooled(groups)
    return math.sqrt((PRIOR_WEIGHT * policy.noise_prior ** 2 + ss) / (PRIOR_WEIGHT + dof))


def noise_dof(groups: Sequence[Sequence[float]]) -> int:
    """Degrees of freedom the session's own repeated runs lend `run_noise` (0: the prior alone)."""
    return _pooled(groups)[1]


def _pooled(groups: Sequence[Sequence[float]]) -> tuple[float, int]:
    """(sum of squared deviations of ln(step) from each configuration's mean, degrees of freedom)
    over the configurations run at least twice."""
    ss, dof = 0.0, 0
    for g in groups:
        xs = [math.log(x) for x in g if x and x > 0]
        if len(xs) >= 2:
            m = statistics.fmean(xs)
            ss += sum((x - m) ** 2 for x in xs)
            dof += len(xs) - 1
    return ss, dof


def judge(pairs: Sequence[Mapping[str, Any]], sigma: float, policy: Policy, *,
          enabler: bool = False) -> dict[str, Any]:
    """The state of the evidence after `pairs`: `win`, `no-win`, `kept` (an enabler not
    measurably slower), `slower` (an enabler that is) or `undecided`."""
    k = len(pairs)
    rs = [p["log_ratio"] for p in pairs]
    var = sum(2 * sigma ** 2 + _drift_var(p) for p in pairs)
    mean = statistics.fmean(rs)
    se = math.sqrt(var) / k
    lo, hi = mean - policy.z * se, mean + policy.z * se
    floor = math.log1p(policy.min_gain)
    if enabler:
        state = "slower" if hi < -floor else "kept"
    elif lo > floor:
        state = "win"
    elif hi < floor:
        state = "no-win"
    else:
        state = "undecided"
    return {"state": state, "pairs": k, "gain": math.expm1(mean), "band": math.expm1(policy.z * se),
            "low": math.expm1(lo), "high": math.expm1(hi), "sigma": sigma, "se": se}


def pairs_needed(gain: float, sigma: float, policy: Policy) -> int | None:
    """Pairs that resolve a true gain `gain` against `min_gain` at this noise (None: never)."""
    margin = math.log1p(gain) - math.log1p(policy.min_gain)
    if margin <= 0:
        return None
    return max(1, math.ceil(2 * (policy.z * sigma / margin) ** 2))


def _drift_var(p: Mapping[str, Any]) -> float:
    """A drifting run's remaining uncertainty: a quarter of its drift, as a standard deviation."""
    return sum((d / 4) ** 2 for d, on in ((p.get("a_drift"), p.get("a_drifting")),
                                          (p.get("b_drift"), p.get("b_drifting")))
               if d is not None and on)


def _pair(a: Mapping[str, Any], b: Mapping[str, Any]) -> dict[str, Any]:
    ma, mb = _metrics(a), _metrics(b)
    return {"a_run": a.get("key"), "b_run": b.get("key"), "a_ms": ma["step_ms"],
            "b_ms": mb["step_ms"], "a_drift": ma.get("drift"), "b_drift": mb.get("drift"),
            "a_drifting": bool(ma.get("drifting")), "b_drifting": bool(mb.get("drifting")),
            "log_ratio": math.log(ma["step_ms"] / mb["step_ms"])}


def _metrics(rec: Mapping[str, Any]) -> dict[str, Any]:
    return dict(rec.get("metrics") or {"cause": rec.get("cause") or "no-metrics",
                                       "step_ms": None, "lm_loss": {}})


def ab(runner: Runner, prefix: str, *, base: Launch, cand: Launch, label: str, base_label: str,
       pool: list[dict[str, Any]], noise_groups: Mapping[str, list[float]], policy: Policy,
       knob: str, value: Any, contract: Any = None, unlocks: Sequence[str] = ()
       ) -> dict[str, Any]:
    """Decide one candidate. `pool`: the baseline's measured runs, newest last (new baseline runs
    are appended); `noise_groups`: step times per configuration label so far (updated here)."""
    if not pool:
        pool.append(runner.run(f"{prefix}:base:{label}:first", role="baseline", label=base_label,
                               launch=base))
        _ok_baseline(pool[-1])
        noise_groups.setdefault(base_label, []).append(_metrics(pool[-1])["step_ms"])
    a = pool[-1]
    pairs: list[dict[str, Any]] = []
    cand_runs: list[dict[str, Any]] = []
    out: dict[str, Any] = {}
    for k in range(policy.max_pairs):
        if k:
            a = runner.run(f"{prefix}:base:{label}:{k}", role="baseline", label=base_label,
                           launch=base)
            _ok_baseline(a)
            pool.append(a)
            noise_groups.setdefault(base_label, []).append(_metrics(a)["step_ms"])
        b = runner.run(f"{prefix}:cand:{label}:{k}", role="candidate", label=label,
                       launch=cand, profile=k == 0)
        mb = _metrics(b)
        if mb.get("cause"):
            return {**out, "verdict": "rejected", "cause": mb["cause"], "measured_gain": None,
                    "noise": None, "failed_run": b.get("log_path"), "pairs": pairs}
        cand_runs.append(b)
        noise_groups.setdefault(label, []).append(mb["step_ms"])
        if k == 0:
            healthy, why, rel = loss_health(_metrics(a), mb, policy.loss_tolerance)
            out["loss_rel_diff"] = rel
            if not healthy:
                return {**out, "verdict": "rejected", "cause": why, "measured_gain": None,
                        "noise": None, "pairs": [_pair(a, b)]}
            audit = audit_change(b.get("traces") or [], knob, value, contract, b.get("log_path"))
            out["audit"] = audit
            if audit.get("verdict") == "contradicted":
                return {**out, "verdict": "rejected", "cause": "audit: the change did not run",
                        "measured_gain": None, "noise": None, "pairs": [_pair(a, b)]}
        pairs.append(_pair(a, b))
        sigma = run_noise(list(noise_groups.values()), policy)
        j = judge(pairs, sigma, policy, enabler=bool(unlocks))
        if j["state"] != "undecided":
            break
    proof = (out.get("audit") or {}).get("verdict", "unavailable")
    out["proof"] = PROOF.get(proof, f"{proof}: not counted as proof that the change ran")
    return {**out, **_verdict(j, policy, unlocks), "measured_gain": j["gain"],
            "noise": j["band"], "pairs": pairs, "judgement": j,
            "candidate_runs": [r.get("key") for r in cand_runs],
            "profile": {"traces": cand_runs[0].get("traces") or [],
                        "log_path": cand_runs[0].get("log_path"),
                        "step_s": statistics.median(_metrics(r)["step_ms"] for r in cand_runs)
                        / 1e3}}


# What the audit of the candidate's own trace (executor/validate.py) says of the change, in
# words: only `confirmed` proves it ran
PROOF = {
    "confirmed": "confirmed: the audit saw the change run in the candidate's trace",
    "unobservable": "unobservable: the candidate's trace cannot show whether the change ran "
                    "(not counted as proof)",
    "unavailable": "unavailable: no candidate trace was audited (not counted as proof)",
}


def _verdict(j: Mapping[str, Any], policy: Policy, unlocks: Sequence[str]) -> dict[str, Any]:
    band = f"{j['gain']:+.1%} (95 % lower bound {j['low']:+.1%}, {j['pairs']} pair(s), run noise " \
           f"σ {j['sigma']:.1%})"
    if j["state"] == "win":
        return {"verdict": "accepted", "cause": None, "why": f"win: {band}"}
    if j["state"] == "kept":
        return {"verdict": "accepted", "cause": None, "enables": list(unlocks),
                "why": f"enabler, not measurably slower: {band}; it unlocks {', '.join(unlocks)}"}
    if j["state"] == "slower":
        return {"verdict": "rejected", "cause": f"enabler measurably slower: {band}"}
    if j["state"] == "no-win":
        return {"verdict": "rejected",
                "cause": f"no gain of {policy.min_gain:.0%} or more: {j['gain']:+.1%} (95 % upper "
                         f"bound {j['high']:+.1%}, {j['pairs']} pair(s))"}
    return {"verdict": "rejected",
            "cause": f"undecided after {j['pairs']} pairs (--max-pairs): {band}"}


def _ok_baseline(rec: Mapping[str, Any]) -> None:
    m = _metrics(rec)
    if m.get("cause"):
        raise UserError(f"the baseline itself failed ({m['cause']}): see {rec.get('log_path')}")
