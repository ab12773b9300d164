"""`moetune tune`: profile → diagnose → recommend → A/B → accept, resumable; `moetune run`: one
change against the baseline.

A round: the baseline's profile (its latest run that carries a trace: the round's profile run, or
the accepted candidate's first run, profiled at its end), the rules' ranked changes on it (and the
user's `--try` ones first), then one candidate at a time through the sequential A/B of
executor/ab.py, until one is accepted (it becomes the baseline: its runs are the new baseline's
measured runs, its trace the next round's profile) or none is left worth its cost.

What it costs is the budget (`--max-run-time`: machine seconds, start-up included) and the
candidates it may judge (`--budget`). The loop stops, and says why (`stopped`), when no candidate
is left, when the best remaining prediction cannot be told from the run-to-run noise within
`--max-pairs` pairs (except a change an accepted enabler unlocked, which is tried), or when the
next run would pass the time budget — then with what the remaining seconds would have bought.

Runs, keys, resumption and the run shape: executor/runner.py. Trainers: executor/trainer.py.
"""

from __future__ import annotations

import hashlib
import json
import statistics
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from moetune.executor.ab import ab, noise_dof, pairs_needed, run_noise
from moetune.executor.candidate import Change, Launch, apply, parse_change
from moetune.executor.ledger import Ledger
from moetune.executor.runner import BudgetSpent, Runner, RunShape, log, run_time_s, speaking_as
from moetune.executor.trainer import can_profile, dialect_of
from moetune.executor.validate import Policy, run_log_contract

from moetune.errors import UserError
from moetune.knobs import knob

if TYPE_CHECKING:
    from moetune.analysis import Recommendation


@dataclass(frozen=True)
class TuneOptions:
    workdir: Path
    ledger: Path
    budget: int = 4                       # candidates judged, at most
    policy: Policy = field(default_factory=Policy)
    launcher: str = "local"
    nproc_per_node: int = 1
    nodes: int = 1
    tries: tuple[str, ...] = ()           # user candidates, `knob=value`
    use_rules: bool = True
    profile: bool = True
    profile_args: str | None = None       # the user's profiler template; None: the trainer's own
    slurm_options: Mapping[str, str] = field(default_factory=dict)
    env_profile: str | None = None        # launchers/base.py ENV_PROFILES, applied to every run
    max_run_time_s: float | None = None   # machine time the session's runs may take, in all


def session_id(argv: Sequence[str], env: Mapping[str, str], contract: Any,
               opts: TuneOptions, kind: str = "tune") -> str:
    key = {"argv": list(argv), "env": dict(env), "contract": contract, "kind": kind,
           "budget": opts.budget, "tries": list(opts.tries), "rules": opts.use_rules,
           "policy": {k: str(v) for k, v in asdict(opts.policy).items()}}
    digest = hashlib.sha256(json.dumps(key, sort_keys=True, default=str).encode()).hexdigest()
    return f"{kind}-{digest[:12]}"


def _runner(led: Ledger, sid: str, opts: TuneOptions, base: Launch) -> Runner:
    pol = opts.policy
    template = (opts.profile_args or None) if opts.profile_args is not None else None
    return Runner(led, sid, workdir=opts.workdir, dialect=dialect_of(base.argv, template),
                  shape=RunShape(pol.warmup, pol.measured), base0=base, launcher=opts.launcher,
                  timeout_s=pol.timeout_s, nproc_per_node=opts.nproc_per_node, nodes=opts.nodes,
                  slurm_options=opts.slurm_options, env_profile=opts.env_profile,
                  max_run_time_s=opts.max_run_time_s)


def _profiling(argv: Sequence[str], opts: TuneOptions) -> bool:
    if not opts.profile or opts.profile_args == "":
        return False
    return can_profile(argv, opts.profile_args)


Recommender = Callable[..., "list[Recommendation]"]


def rules_recommender(traces: list[str], contract: Any, contract_path: Path | None, *,
                      reference_step_s: Any = None) -> list[Recommendation]:
    """The one pipeline (moetune.analysis) on the profile traces: the rules' ranked changes.
    Raises UserError when the run cannot be diagnosed (the caller decides what that means)."""
    from moetune.analysis import analyze

    analysis = analyze(traces, contract if contract else None, reference_step_s=reference_step_s)
    return list(analysis.advise().recommendations)


def candidate_changes(recs: Sequence[Recommendation], tries: Sequence[str],
                      calibration: Mapping[str, float] | None = None) -> list[dict[str, Any]]:
    """The user's `--try` list first (what they asked for), then the rules' recommendations by
    predicted gain, each scaled by its rule's measured/predicted ratio so far (`calibration`);
    one knob each (a rule's scope knobs come with it)."""
    cal = calibration or {}
    out: list[dict[str, Any]] = []
    for t in tries:
        ch = parse_change(t)
        # a rule proposing the very same change lends its prediction (predicted vs measured)
        same = next((r for r in recs if _change(r.knob, r.value).label == ch.label), None)
        out.append({"changes": [ch], "label": ch.label,
                    "source": f"user ({same.rule})" if same else "user",
                    "predicted_gain": _calibrated(same, cal) if same else None,
                    "memory": same.entry.get("memory") if same else None})
    tried = {c["label"] for c in out}
    ruled = []
    for r in recs:
        changes = [_change(k, v) for k, v in r.changes]
        if changes[0].label in tried:  # already first in line as the user's --try
            continue
        # the engine's memory verdict: a change that does not fit is never ranked; should one
        # come through (an older document), it goes last; tight keeps its place by value
        verdict = (r.entry.get("memory") or {}).get("verdict")
        fits = False if verdict == "does not fit" else (r.entry.get("memory") or {}).get("fits")
        own = _calibrated(r, cal)
        unlocks = r.entry.get("unlocks") or []
        # an enabler is worth its own gain and the best change it unlocks, one after the other
        best = max((((u.get("gain") or {}).get("speedup") or {}).get("mid") or 0.0
                    for u in unlocks), default=0.0)
        value = (1 + (own or 0.0)) * (1 + best) - 1 if unlocks else own
        ruled.append({"changes": changes, "label": changes[0].label, "source": r.rule,
                      "predicted_gain": own, "value": value, "memory": r.entry.get("memory"),
                      "unlocks": [u["rule"] for u in unlocks], "_fits": fits is not False})
    # the engine's order, re-sorted once calibration has moved a rule's predictions (an enabler
    # by what it unlocks too); changes predicted not to fit stay last
    ruled.sort(key=lambda c: (not c["_fits"], -(c["value"] or 0.0)))
    for c in ruled:
        c.pop("_fits")
    return out + ruled


def _change(name: str, value: Any) -> Change:
    return Change(knob(name), value)


def _calibrated(rec: Recommendation, cal: Mapping[str, float]) -> float | None:
    if rec.predicted_speedup is None:
        return None
    return rec.predicted_speedup * cal.get(rec.rule, 1.0)


def session_calibration(decisions: Sequence[Mapping[str, Any]]) -> dict[str, float]:
    """Per rule, the median measured/predicted ratio of this session's decisions (clamped to
    ×¼…×4: one odd A/B must not silence a rule)."""
    from moetune.executor.calibration import by_rule

    out = {}
    for row in by_rule(decisions):
        ratio = row.get("measured_over_predicted")
        if ratio is not None and row["measured"] >= 1:
            out[row["rule"]] = min(max(float(ratio), 0.25), 4.0)
    return out


def _text(v: Any) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, list):
        return ",".join(map(str, v))
    return str(v)


def tune(argv: Sequence[str], *, env: Mapping[str, str] | None = None, contract: Any = None,
         contract_path: Path | None = None, opts: TuneOptions,
         recommender: Recommender | None = None) -> dict[str, Any]:
    """Run the closed loop; returns a summary (session, accepted changes, final command)."""
    base = Launch(tuple(argv), dict(env or {}))
    sid = session_id(argv, base.env, contract, opts)
    recommender = recommender or (rules_recommender if opts.use_rules else None)
    profiling = _profiling(argv, opts)
    pol = opts.policy
    with Ledger.open(opts.ledger) as led:
        led.start_session(sid, command=list(argv), env=base.env, contract=contract,
                          options={"budget": opts.budget, "launcher": opts.launcher,
                                   "tries": list(opts.tries), "policy": asdict(pol)})
        log(f"session {sid} · ledger {opts.ledger} · trainer {dialect_of(argv).name}")
        runner = _runner(led, sid, opts, base)
        decided: set[str] = set()
        accepted: list[dict[str, Any]] = []
        pool: list[dict[str, Any]] = []      # measured runs of the current baseline, newest last
        groups: dict[str, list[float]] = {}  # step times per configuration: the run noise
        base_label = "baseline"
        profile: Mapping[str, Any] | None = None  # the accepted candidate's profiled run
        owed: set[str] = set()  # rules an accepted enabler unlocked: tried whatever the noise
        spent = 0
        rnd = 0
        stopped: str | None = None
        try:
            while spent < opts.budget:
                con = _round_contract(contract, accepted)
                recs: list[Recommendation] = []
                if profiling and recommender is not None:
                    recs = _profile_and_recommend(runner, rnd, base, base_label, con,
                                                  contract_path, recommender, pool, groups,
                                                  reuse=profile, tries=opts.tries)
                cal = session_calibration(led.decisions(sid))
                pending = [c for c in candidate_changes(recs, opts.tries, cal)
                           if c["label"] not in decided and _changes(base, c, runner)]
                if not pending:
                    stopped = "no candidate left to try" + (
                        "" if profiling or opts.tries else
                        ": without a profile (--no-profile, or a command moetune cannot profile) "
                        "only --try candidates are judged; add --try KNOB=VALUE (e.g. --try "
                        "moe_grouped_gemm=true; `moetune rules list` shows the knobs)")
                    log(stopped)
                    break
                progressed = False
                for i, cand in enumerate(pending):
                    if spent >= opts.budget:
                        break
                    why_not = _not_worth(cand, pending[i + 1:], owed, runner, groups, pol,
                                         base_label)
                    if why_not == "skip":
                        continue
                    if why_not is not None:
                        stopped = why_not
                        log(f"stopping: {stopped}")
                        break
                    spent += 1
                    label = cand["label"]
                    decided.add(label)
                    key = f"r{rnd}:{label}"
                    prior = led.decision(sid, key)
                    if prior is None:
                        ch0 = cand["changes"][0]
                        res = ab(runner, f"r{rnd}", base=base,
                                 cand=apply_all(base, cand["changes"], runner), label=label,
                                 base_label=base_label, pool=pool, noise_groups=groups,
                                 policy=pol, knob=ch0.knob.name, value=ch0.value,
                                 contract=con, unlocks=cand.get("unlocks") or ())
                        # the memory prediction that allowed the change, beside what it measured
                        res["predicted_memory"] = cand.get("memory")
                        led.record_decision(
                            sid, key, label=label,
                            change={"knob": ch0.knob.name, "value": ch0.value,
                                    "with": {c.knob.name: c.value for c in cand["changes"][1:]}},
                            source=cand["source"], predicted_gain=cand["predicted_gain"],
                            measured_gain=res.get("measured_gain"), noise=res.get("noise"),
                            verdict=res["verdict"], cause=res.get("cause"), evidence=res)
                        prior = led.decision(sid, key)
                    else:  # read back: the pool and the noise as that A/B left them
                        _replay(runner, prior, pool, groups, base_label, label)
                    assert prior is not None
                    log(f"{label}: {prior['verdict']}"
                        + (f" ({prior['cause']})" if prior["cause"] else "")
                        + (f", gain {prior['measured_gain']:+.1%}"
                           if prior["measured_gain"] is not None else ""))
                    if prior["verdict"] == "accepted":
                        base = apply_all(base, cand["changes"], runner)
                        accepted.append(prior)
                        owed = set(cand.get("unlocks") or ())
                        ev = prior.get("evidence") or {}
                        # its runs are the new baseline's measured runs, its trace the profile
                        pool = [r for k in ev.get("candidate_runs") or []
                                if (r := led.finished_run(sid, k)) is not None]
                        base_label, profile = label, ev.get("profile")
                        progressed = True
                        break
                if not progressed:
                    if stopped is None and spent < opts.budget:
                        stopped = "no candidate of the round was accepted"
                    break
                rnd += 1
        except BudgetSpent as e:  # the candidate in flight stays undecided: a re-run resumes it
            stopped = f"time budget: {e}; " + _what_budget_buys(runner, groups, pol, base_label)
            log(f"stopping: {stopped}")
        led.finish_session(sid)
        return {"session": sid, "ledger": str(opts.ledger), "accepted": accepted,
                "decisions": led.decisions(sid), "final_command": list(base.argv),
                "final_env": dict(base.env), "runs_executed": runner.executed,
                "runs_reused": runner.reused, "run_time_s": run_time_s(led.runs(sid)),
                "run_noise": run_noise(list(groups.values()), pol),
                "trainer": runner.dialect.name,
                "stopped": stopped or f"{opts.budget} candidates judged (--budget)"}


def _changes(base: Launch, cand: Mapping[str, Any], runner: Runner) -> bool:
    """Whether a candidate changes the command; one this trainer cannot take (a knob without a
    Megatron-Bridge override, on a Bridge recipe) is left out and said so."""
    try:
        return apply_all(base, cand["changes"], runner) != base
    except UserError as exc:
        log(f"{cand['label']}: left out: {exc.message}")
        return False


def _not_worth(cand: Mapping[str, Any], rest: Sequence[Mapping[str, Any]], owed: set[str],
               runner: Runner, groups: Mapping[str, list[float]], pol: Policy,
               base_label: str) -> str | None:
    """None: judge this candidate; "skip": a later one comes first; else why the loop stops.
    Candidates come best predicted first, so a prediction the noise hides ends the round, unless
    an unlocked change is still to be tried."""
    pred = cand.get("value", cand["predicted_gain"])
    if cand["source"].startswith("user") or pred is None or cand["source"] in owed:
        return None
    sigma = run_noise(list(groups.values()), pol)
    need = pairs_needed(pred, sigma, pol)
    # no configuration run twice yet: σ is the prior alone, a guess that may overstate this run's
    # noise twofold (Megatron-LM's memory-shape runs repeated within 3-9 %, bench/grid_mlm), and
    # the pairs themselves measure it; the sequential A/B still stops at max_pairs
    limit = pol.max_pairs if noise_dof(list(groups.values())) else 4 * pol.max_pairs
    if need is not None and need <= limit:
        return None
    if any(c["source"] in owed for c in rest):
        return "skip"
    return (f"the best remaining prediction ({cand['label']} {pred:+.1%}) cannot be told from "
            f"the run-to-run noise (σ {sigma:.1%}) in {pol.max_pairs} pairs"
            + (f" (it would need {need})" if need else ""))


def _what_budget_buys(runner: Runner, groups: Mapping[str, list[float]], pol: Policy,
                      base_label: str) -> str:
    left = max((runner.max_run_time_s or 0.0) - runner.spent_s(), 0.0)
    run_s = runner.estimate_s(base_label) or 1.0
    sigma = run_noise(list(groups.values()), pol)
    smallest = next((g for g in (0.5, 0.25, 0.1, 0.05)
                     if 2 * (pairs_needed(g, sigma, pol) or 99) - 1 > left / run_s), None)
    what = (f"the {left:.0f} s left buy about {int(left // run_s)} run(s) of {run_s:.0f} s"
            + (f": too few to resolve a gain of {smallest:.0%} at run noise σ {sigma:.1%}"
               if smallest else ""))
    return what


def _replay(runner: Runner, decision: Mapping[str, Any], pool: list[dict[str, Any]],
            groups: dict[str, list[float]], base_label: str, label: str) -> None:
    """A decision read back from the ledger: its runs rejoin the pool and the noise groups, and
    count as read back."""
    seen = {r.get("key") for r in pool}
    for p in (decision.get("evidence") or {}).get("pairs") or []:
        a = runner.ledger.finished_run(runner.session, p.get("a_run") or "")
        if a is not None and a.get("key") not in seen:
            seen.add(a.get("key"))
            pool.append(a)
            groups.setdefault(base_label, []).append(p["a_ms"])
            runner.reused += 1
        if p.get("b_ms"):
            groups.setdefault(label, []).append(p["b_ms"])
            runner.reused += 1


def _profile_and_recommend(runner: Runner, rnd: int, base: Launch, base_label: str,
                           contract: Any, contract_path: Path | None, recommender: Recommender,
                           pool: list[dict[str, Any]], groups: dict[str, list[float]],
                           reuse: Mapping[str, Any] | None = None,
                           tries: Sequence[str] = ()) -> list[Recommendation]:
    """The round's profile and the recommender's changes. `reuse`: the accepted candidate's
    profiled run, whose trace serves instead of a new profile run; else the baseline's profile
    run (measured too: it joins `pool`)."""
    traces = [t for t in (reuse or {}).get("traces") or [] if Path(t).is_file()]
    log_path = (reuse or {}).get("log_path")
    if traces:
        log(f"round {rnd}: the accepted candidate's trace is this round's profile")
    else:
        rec = runner.run(f"r{rnd}:profile:{base_label}:0", role="profile", label=base_label,
                         launch=base, profile=True)
        if rec.get("cause"):
            raise UserError(f"the baseline profile run failed ({rec['cause']}): "
                            f"see {rec['log_path']}")
        if all(rec.get("key") != r.get("key") for r in pool):
            pool.append(rec)
            groups.setdefault(base_label, []).append((rec.get("metrics") or {})["step_ms"])
        traces, log_path = rec["traces"], rec["log_path"]
        if not traces:
            log(f"the profile run wrote no trace under {runner.run_dir(rec['key'])}: "
                f"{runner.dialect.name} profile flags given, none came back")
            return []
    # the reference: the baseline's measured runs (unprofiled windows), their median
    steps = [(r.get("metrics") or {}).get("step_ms") for r in pool]
    ref_s = statistics.median([s for s in steps if s]) / 1e3 if any(steps) else None
    if contract is None and log_path:  # no contract given: the run's own argument dump claims
        contract = run_log_contract(log_path)
    ref: Any = ref_s
    if log_path and Path(log_path).is_file():  # the log's memory lines: what a change would fit
        from moetune.analysis import read_reference

        try:
            r = read_reference(log_path, require_step=False)
            ref = r.with_step_s(ref_s) if r is not None else ref_s
        except UserError as exc:
            log(f"the profile run's log gives no memory evidence ({exc.message})")
    try:
        recs = recommender(traces, contract, contract_path, reference_step_s=ref)
    except UserError as exc:
        if tries:
            log(f"the profile cannot be diagnosed ({exc.message}); trying --try candidates only")
            return []
        raise UserError(f"tune cannot work on this run: its profile cannot be diagnosed "
                        f"({exc.message}); pass --try KNOB=VALUE to A/B changes without a "
                        "diagnosis") from None
    log("rules recommend: " + (", ".join(f"{r.knob}={_text(r.value)} ({r.rule})" for r in recs)
                               or "nothing"))
    return recs


def _round_contract(contract: Any, accepted: Sequence[Mapping[str, Any]]) -> Any:
    """The user's contract with this session's accepted changes applied to its megatron_args
    (the rules read current knob values there); None when the user gave none."""
    if contract is None:
        return None
    from moetune.analyzer.contract import with_args

    doc = dict(contract)
    for d in accepted:
        ch = d["change"]
        doc = with_args(doc, {ch["knob"]: ch["value"], **(ch.get("with") or {})})
    return doc


def apply_all(launch: Launch, changes: Sequence[Change], runner: Runner | None = None) -> Launch:
    """The launch with `changes` applied in the trainer's dialect (flags, or Bridge overrides)."""
    for ch in changes:
        launch = runner.dialect.apply(launch, ch) if runner is not None else apply(launch, ch)
    return launch


def run_one(argv: Sequence[str], change_texts: Sequence[str], *, env: Mapping[str, str] | None,
            contract: Any, opts: TuneOptions) -> dict[str, Any]:
    """`moetune run --change k=v`: one candidate against the baseline (the sequential A/B)."""
    base = Launch(tuple(argv), dict(env or {}))
    changes = [parse_change(t) for t in change_texts]
    o = replace(opts, tries=tuple(change_texts), use_rules=False)
    sid = session_id(argv, base.env, contract, o, kind="run")
    with speaking_as("run"), Ledger.open(opts.ledger) as led:
        runner = _runner(led, sid, o, base)
        cand = apply_all(base, changes, runner)
        if cand == base:
            raise UserError(f"{', '.join(change_texts)} does not change the command")
        label = changes[0].label
        led.start_session(sid, command=list(argv), env=base.env, contract=contract,
                          options={"change": list(change_texts), "launcher": opts.launcher})
        key = f"r0:{label}"
        prior = led.decision(sid, key)
        if prior is None:
            res = ab(runner, "r0", base=base, cand=cand, label=label, base_label="baseline",
                     pool=[], noise_groups={}, policy=opts.policy, knob=changes[0].knob.name,
                     value=changes[0].value, contract=contract)
            led.record_decision(sid, key, label=label,
                                change={"knob": changes[0].knob.name, "value": changes[0].value},
                                source="user", predicted_gain=None,
                                measured_gain=res.get("measured_gain"), noise=res.get("noise"),
                                verdict=res["verdict"], cause=res.get("cause"), evidence=res)
            prior = led.decision(sid, key)
        led.finish_session(sid)
        return {"session": sid, "decision": prior, "command": list(cand.argv),
                "runs_executed": runner.executed, "runs_reused": runner.reused,
                "trainer": runner.dialect.name}
