"""`moetune tune`: profile → diagnose → recommend → screen → confirm → accept/reject, resumable.

Every run is keyed by its position in a deterministic plan (`r<round>:<role>:<label>:<repeat>`)
inside a session whose id hashes the starting command, contract and options. Re-running the
same `tune` after an interruption replays the plan: a run finished in the ledger is read back,
never redone; a run left `running` was interrupted and is redone (its old row is kept, marked
`interrupted`). Accepting a candidate makes it the baseline of the next round.

Harness flags are set identically on every run of a comparison (they are not the change):
`--train-iters`, `--log-interval 1`, and on profile runs the profiler flags.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import math
import statistics
import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from moetune.executor.candidate import Change, Knob, Launch, apply, diff, parse_change
from moetune.executor.launchers import RunSpec, get_launcher
from moetune.executor.ledger import Ledger
from moetune.executor.logparse import median_step_s, parse_file
from moetune.executor.validate import (
    Policy,
    Window,
    audit_change,
    decide,
    run_metrics,
    screen_stats,
    screen_verdict,
)

from moetune.errors import UserError
from moetune.knobs import knob

if TYPE_CHECKING:
    from moetune.analysis import Recommendation

TRAIN_ITERS = Knob("train_iters", type="int", flag="--train-iters")
LOG_INTERVAL = Knob("log_interval", type="int", flag="--log-interval")
TAIL_CHARS = 4000
# A screen pair whose iterations do not overlap and whose gain is at least this large decides
# alone (sequential testing: the remaining repeats would not change the verdict).
EARLY_GAIN = 0.2

# How to ask for a torch-profiler trace, by what the command runs ({dir}, {start}, {end}).
PROFILE_ARGS = {
    "moe_gpt": "--profile --profile-step-start {start} --profile-step-end {end} "
               "--profile-dir {dir} --nvtx-ranges",
    "megatron": "--profile --use-pytorch-profiler --profile-step-start {start} "
                "--profile-step-end {end} --tensorboard-dir {dir}",
}


@dataclass(frozen=True)
class TuneOptions:
    workdir: Path
    ledger: Path
    budget: int = 4                       # candidates screened, at most
    policy: Policy = field(default_factory=Policy)
    launcher: str = "local"
    nproc_per_node: int = 1
    nodes: int = 1
    tries: tuple[str, ...] = ()           # user candidates, `knob=value`
    use_rules: bool = True
    profile: bool = True
    profile_args: str | None = None       # template; None: chosen from the command
    slurm_options: Mapping[str, str] = field(default_factory=dict)
    env_profile: str | None = None        # launchers/base.py ENV_PROFILES, applied to every run
    max_run_time_s: float | None = None   # machine time the session's runs may take, in all


class BudgetSpent(Exception):
    """The next run would take the session past `max_run_time_s`."""


def log(msg: str) -> None:
    print(f"moetune tune: {msg}", file=sys.stderr, flush=True)


def session_id(argv: Sequence[str], env: Mapping[str, str], contract: Any,
               opts: TuneOptions, kind: str = "tune") -> str:
    key = {"argv": list(argv), "env": dict(env), "contract": contract, "kind": kind,
           "budget": opts.budget, "tries": list(opts.tries), "rules": opts.use_rules,
           "policy": {k: str(v) for k, v in asdict(opts.policy).items()}}
    digest = hashlib.sha256(json.dumps(key, sort_keys=True, default=str).encode()).hexdigest()
    return f"{kind}-{digest[:12]}"


def _harness(launch: Launch, iters: int) -> Launch:
    launch = apply(launch, Change(TRAIN_ITERS, iters))
    return apply(launch, Change(LOG_INTERVAL, 1))


def _profile_template(argv: Sequence[str], opts: TuneOptions) -> str | None:
    if opts.profile_args is not None:
        return opts.profile_args or None
    text = " ".join(argv)
    if "moetune.executor.workloads.moe_gpt" in text or "moe_gpt.py" in text:
        return PROFILE_ARGS["moe_gpt"]
    if "pretrain_gpt" in text or "pretrain_mamba" in text:
        return PROFILE_ARGS["megatron"]
    return None


class Runner:
    """Runs (or reads back from the ledger) one keyed run of the session."""

    def __init__(self, ledger: Ledger, session: str, opts: TuneOptions, base0: Launch) -> None:
        self.ledger, self.session, self.opts, self.base0 = ledger, session, opts, base0
        self.launcher = get_launcher(opts.launcher)
        self.reused = 0
        self.executed = 0

    def run(self, key: str, *, role: str, label: str, launch: Launch, iters: int,
            window: Window) -> dict[str, Any]:
        done = self.ledger.finished_run(self.session, key)
        if done is not None:
            self.reused += 1
            return done
        self._check_budget(iters)
        safe = key.replace(":", "_").replace("/", "_").replace("=", "-")
        log_path = self.opts.workdir / self.session / f"{safe}.log"
        if log_path.exists():
            log_path.unlink()  # a redone run starts a fresh log
        run_id = self.ledger.begin_run(
            self.session, key, role=role, label=label, command=list(launch.argv),
            env=dict(launch.env), diff=diff(self.base0, launch), log_path=str(log_path))
        spec = RunSpec(argv=launch.argv, env=launch.env, log_path=log_path,
                       timeout_s=self.opts.policy.timeout_s,
                       nproc_per_node=self.opts.nproc_per_node, nodes=self.opts.nodes,
                       name=safe, slurm_options=self.opts.slurm_options,
                       env_profile=self.opts.env_profile)
        log(f"{key}: running ({self.launcher.name})")
        result = self.launcher.launch(spec).wait()
        self.executed += 1
        parsed = parse_file(log_path) if log_path.exists() else None
        if parsed is None:
            from moetune.executor.logparse import parse_text

            parsed = parse_text("")
        metrics = run_metrics(parsed, result, window, expected_iters=iters)
        cause = metrics["cause"]
        tail = log_path.read_text(errors="replace")[-TAIL_CHARS:] if log_path.exists() else ""
        self.ledger.end_run(run_id, status="failed" if cause else "done",
                            returncode=result.returncode, timed_out=result.timed_out,
                            metrics=metrics, cause=cause, log_tail=tail)
        log(f"{key}: {cause or 'ok'}, step {_fmt_ms(metrics['step_ms'])}")
        rec = self.ledger.finished_run(self.session, key)
        assert rec is not None
        return rec


    def _check_budget(self, iters: int) -> None:
        """Refuse a run that would end past the time budget: its length is estimated as the
        longer of the session's last two finished runs at the same iteration count (else of
        any count): the latest runs are of the configurations the loop has reached, which can
        be many times faster than the start. The session's first run always starts."""
        cap = self.opts.max_run_time_s
        if cap is None:
            return
        runs = [r for r in self.ledger.runs(self.session)
                if r.get("finished_at") and r.get("started_at")]
        spent = run_time_s(runs)
        same = [r["finished_at"] - r["started_at"] for r in runs if _iters_of(r) == iters]
        est = max((same or [r["finished_at"] - r["started_at"] for r in runs])[-2:] or [0.0])
        if spent + est > cap:
            raise BudgetSpent(f"runs took {spent:.0f} s of the {cap:.0f} s budget and the next "
                              f"would take about {est:.0f} s")


def _iters_of(run: Mapping[str, Any]) -> int | None:
    """The iteration count a run was launched with (`--train-iters N` in its command)."""
    cmd = run.get("command") or []
    for flag, val in itertools.pairwise(cmd):
        if flag == TRAIN_ITERS.flag:
            try:
                return int(val)
            except ValueError:
                return None
    return None


def _fmt_ms(x: float | None) -> str:
    return f"{x:.1f} ms" if x else "n/a"


def _metrics(rec: Mapping[str, Any]) -> dict[str, Any]:
    return dict(rec.get("metrics") or {"cause": rec.get("cause") or "no-metrics",
                                       "step_ms": None, "lm_loss": {}})


def validate_candidate(runner: Runner, prefix: str, base: Launch, cand: Launch, label: str,
                       *, profile_tpl: str | None, contract: Any, knob: str,
                       value: Any, unlocks: Sequence[str] = (),
                       base_confirm: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """Screens (A B A B …) then, for a screen winner, the confirm pair and the audit. A change
    that `unlocks` others goes on to confirm, and is kept, when it is not measurably slower.
    `base_confirm`: a finished confirm-length run of this baseline (the accepted candidate's
    confirm run, profiled only before its window), which stands for the confirm baseline."""
    pol = runner.opts.policy
    swin = Window.tail(pol.screen_iters)
    a_ms: list[float | None] = []
    b_ms: list[float | None] = []
    separated: float | None = None
    for rep in range(pol.repeats):
        ra = runner.run(f"{prefix}:screen-base:{label}:{rep}", role="baseline", label="baseline",
                        launch=_harness(base, pol.screen_iters), iters=pol.screen_iters,
                        window=swin)
        rb = runner.run(f"{prefix}:screen:{label}:{rep}", role="candidate", label=label,
                        launch=_harness(cand, pol.screen_iters), iters=pol.screen_iters,
                        window=swin)
        ma, mb = _metrics(ra), _metrics(rb)
        if ma.get("cause"):
            raise UserError(f"the baseline itself failed ({ma['cause']}): see {ra['log_path']}")
        if mb.get("cause"):
            stats = screen_stats([*a_ms, ma["step_ms"]], [])
            return {"verdict": "rejected", "cause": mb["cause"], "measured_gain": None,
                    "noise": None, "screen": stats, "failed_run": rb["log_path"]}
        a_ms.append(ma["step_ms"])
        b_ms.append(mb["step_ms"])
        separated = _separated(ma, mb) if rep == 0 and pol.repeats > 1 else None
        if separated is not None:
            break
    stats = screen_stats(a_ms, b_ms)
    if len(a_ms) == 1 and separated is not None:
        # one pair decided it: the noise band is the runs' own iteration spread
        stats = {**stats, "noise": separated, "early": "every candidate iteration faster than "
                 f"every baseline iteration and a gain ≥ {EARLY_GAIN:.0%}: one screen pair"}
    first = decide(screen=stats, confirm_base=None, confirm_cand=None, audit=None, policy=pol,
                   unlocks=unlocks) if not screen_verdict(stats, pol, unlocks)[0] else None
    if first is not None:
        return first
    n, cwin = pol.confirm_iters, pol.confirm_window
    reuse = base_confirm is not None and not _metrics(base_confirm).get("cause")
    cb = base_confirm if reuse else runner.run(
        f"{prefix}:confirm-base:{label}:0", role="confirm-baseline", label="baseline",
        launch=_harness(base, n), iters=n, window=cwin)
    assert cb is not None
    cand_run = _harness(cand, n)
    trace_dir = None
    if profile_tpl:
        trace_dir = runner.opts.workdir / runner.session / f"{prefix}-confirm-{_safe(label)}-trace"
        # profile just before the measured window: the profiler's cost stays out of it
        start = max(1, cwin.first - 6)
        end = max(start + 1, cwin.first - 2)
        cand_run = _with_args(cand_run, profile_tpl.format(dir=trace_dir, start=start, end=end))
    cc = runner.run(f"{prefix}:confirm:{label}:0", role="confirm", label=label,
                    launch=cand_run, iters=n, window=cwin)
    traces = sorted(str(p) for p in trace_dir.glob("*.json*")) if trace_dir and \
        trace_dir.is_dir() else []
    if contract is None and cc.get("log_path"):  # the candidate's own argument dump claims it
        contract = _contract_from_log(Path(cc["log_path"]))
    audit = audit_change(traces, knob, value, contract) if not _metrics(cc).get("cause") else None
    res = decide(screen=stats, confirm_base=_metrics(cb), confirm_cand=_metrics(cc),
                 audit=audit, policy=pol, unlocks=unlocks)
    if traces:  # an accepted candidate's profile serves as the next round's
        res["profile"] = {"traces": traces, "log_path": cc.get("log_path"),
                          "step_s": (_metrics(cc).get("step_ms") or 0) / 1e3 or None}
    if reuse:
        res["confirm_base_run"] = cb.get("key")
    res["confirm_run"] = cc.get("key")
    return res


def _separated(ma: Mapping[str, Any], mb: Mapping[str, Any]) -> float | None:
    """The noise band of one screen pair when it already decides (every candidate iteration
    faster than every baseline iteration, by at least EARLY_GAIN at the medians): twice the
    standard error of the ratio of the two runs' median iteration times, each from its
    iterations' interquartile range. A large win needs no more repeats; the confirm pair still
    measures it again."""
    a = [x for x in ma.get("step_ms_all") or [] if x]
    b = [x for x in mb.get("step_ms_all") or [] if x]
    if len(a) < 4 or len(b) < 4 or not ma.get("step_ms") or not mb.get("step_ms"):
        return None
    if max(b) >= min(a) or ma["step_ms"] / mb["step_ms"] - 1 < EARLY_GAIN:
        return None
    return 2 * math.hypot(_median_se(a), _median_se(b))


def _median_se(xs: Sequence[float]) -> float:
    """Relative standard error of a median: 1.2533 σ/√n, σ from the interquartile range."""
    q = statistics.quantiles(xs, n=4)
    return 1.2533 * (q[2] - q[0]) / 1.349 / math.sqrt(len(xs)) / statistics.median(xs)


def _safe(label: str) -> str:
    return "".join(c if c.isalnum() or c in "-_." else "-" for c in label)


def _with_args(launch: Launch, extra: str) -> Launch:
    import shlex

    return Launch(tuple(launch.argv) + tuple(shlex.split(extra)), dict(launch.env))


Recommender = Callable[..., "list[Recommendation]"]


def rules_recommender(traces: list[str], contract: Any, contract_path: Path | None, *,
                      reference_step_s: float | None = None) -> list[Recommendation]:
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
        fits = (r.entry.get("memory") or {}).get("fits")
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
    profile_tpl = _profile_template(argv, opts) if opts.profile else None
    with Ledger.open(opts.ledger) as led:
        led.start_session(sid, command=list(argv), env=base.env, contract=contract,
                          options={"budget": opts.budget, "launcher": opts.launcher,
                                   "tries": list(opts.tries), "policy": asdict(opts.policy)})
        log(f"session {sid} · ledger {opts.ledger}")
        runner = Runner(led, sid, opts, base)
        decided: set[str] = set()
        accepted: list[dict[str, Any]] = []
        spent = 0
        rnd = 0
        # the noise band of the current baseline: widened by each of its A/Bs, and set anew by
        # the A/B that made an accepted candidate the baseline (a noisy start does not make a
        # quieter configuration's small wins look like noise)
        noise = opts.policy.min_gain
        # rules whose changes the last accepted candidate unlocked: tried in the round after it
        # even inside the noise band, since the enabler was ranked (and kept) for them; set when
        # a candidate is accepted, which ends its round
        owed: set[str] = set()
        base_confirm: dict[str, Any] | None = None
        stopped: str | None = None  # why the loop ended, when not the candidate budget
        try:
            while spent < opts.budget:
                recs: list[Recommendation] = []
                con = _round_contract(contract, accepted)
                if profile_tpl and recommender is not None:
                    reuse = (accepted[-1].get("evidence") or {}).get("profile") if accepted else None
                    recs = _profile_and_recommend(runner, rnd, base, profile_tpl, con,
                                                  contract_path, recommender, reuse=reuse)
                cal = session_calibration(led.decisions(sid))
                pending = [c for c in candidate_changes(recs, opts.tries, cal)
                           if c["label"] not in decided and apply_all(base, c["changes"]) != base]
                if not pending:
                    stopped = "no candidate left to try"
                    log(stopped)
                    break
                progressed = False
                for i, cand in enumerate(pending):
                    if spent >= opts.budget:
                        break
                    pred = cand.get("value", cand["predicted_gain"])
                    inside = cand["source"] != "user" and pred is not None and pred <= noise
                    if inside and cand["source"] in owed:
                        log(f"{cand['label']}: tried inside the noise band ({pred:+.1%} ≤ "
                            f"{noise:.1%}): the accepted enabler unlocked it")
                    elif inside:
                        if any(c["source"] in owed for c in pending[i + 1:]):
                            continue  # an unlocked change is still to be tried
                        # candidates come best predicted first: the rest promise no more
                        stopped = (f"the best remaining prediction ({cand['label']} "
                                   f"{pred:+.1%}) is inside the noise band ({noise:.1%})")
                        log(f"stopping: {stopped}")
                        break
                    spent += 1
                    label = cand["label"]
                    decided.add(label)
                    key = f"r{rnd}:{label}"
                    prior = led.decision(sid, key)
                    if prior is None:
                        cl = apply_all(base, cand["changes"])
                        ch0 = cand["changes"][0]
                        res = validate_candidate(runner, f"r{rnd}", base, cl, label,
                                                 profile_tpl=profile_tpl, contract=con,
                                                 knob=ch0.knob.name, value=ch0.value,
                                                 unlocks=cand.get("unlocks") or (),
                                                 base_confirm=base_confirm)
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
                    assert prior is not None
                    if prior.get("noise") is not None and prior["verdict"] == "accepted":
                        noise = max(opts.policy.min_gain, float(prior["noise"]))
                    elif prior.get("noise") is not None:
                        noise = max(noise, float(prior["noise"]))
                    log(f"{label}: {prior['verdict']}"
                        + (f" ({prior['cause']})" if prior["cause"] else "")
                        + (f", gain {prior['measured_gain']:+.1%}"
                           if prior["measured_gain"] is not None else ""))
                    if prior["verdict"] == "accepted":
                        base = apply_all(base, cand["changes"])
                        accepted.append(prior)
                        owed = set(cand.get("unlocks") or ())
                        # its confirm run is a confirm-length run of the new baseline: the next
                        # rounds' confirm pairs use it instead of running the baseline again
                        ckey = (prior.get("evidence") or {}).get("confirm_run")
                        base_confirm = led.finished_run(sid, ckey) if ckey else None
                        progressed = True
                        break  # new baseline: profile and recommend again
                if not progressed:
                    if stopped is None and spent < opts.budget:
                        stopped = "no candidate of the round was accepted"
                    break
                rnd += 1
        except BudgetSpent as e:  # the candidate in flight stays undecided: a re-run resumes it
            stopped = f"time budget: {e}"
            log(f"stopping: {e}")
        led.finish_session(sid)
        return {"session": sid, "ledger": str(opts.ledger), "accepted": accepted,
                "decisions": led.decisions(sid), "final_command": list(base.argv),
                "final_env": dict(base.env), "runs_executed": runner.executed,
                "runs_reused": runner.reused, "run_time_s": run_time_s(led.runs(sid)),
                "stopped": stopped or f"{opts.budget} candidates validated (--budget)"}


def run_time_s(runs: Sequence[Mapping[str, Any]]) -> float:
    """Wall time of a session's finished runs (start to exit, each): what the loop cost in
    machine time, the figure to set against a grid of the same knobs."""
    return round(sum(r["finished_at"] - r["started_at"] for r in runs
                     if r.get("finished_at") and r.get("started_at")), 1)


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


def apply_all(launch: Launch, changes: Sequence[Change]) -> Launch:
    for ch in changes:
        launch = apply(launch, ch)
    return launch


def _profile_and_recommend(runner: Runner, rnd: int, base: Launch, tpl: str, contract: Any,
                           contract_path: Path | None, recommender: Recommender,
                           reuse: Mapping[str, Any] | None = None) -> list[Recommendation]:
    """Profile the baseline and ask the recommender. `reuse`: the accepted candidate's confirm
    run (this round's baseline command, profiled before its measured window), whose trace and
    unprofiled step time serve instead of a new profile run."""
    traces = [t for t in (reuse or {}).get("traces") or [] if Path(t).is_file()]
    if traces and reuse:
        log_path, ref_s = reuse.get("log_path"), reuse.get("step_s")
        log(f"round {rnd}: the accepted candidate's confirm trace is this round's profile")
    else:
        pol = runner.opts.policy
        iters = pol.screen_iters
        trace_dir = runner.opts.workdir / runner.session / f"r{rnd}-profile-trace"
        start, end = max(iters // 2, 1), iters
        launch = _with_args(_harness(base, iters), tpl.format(dir=trace_dir, start=start, end=end))
        rec = runner.run(f"r{rnd}:profile:baseline:0", role="profile", label="baseline",
                         launch=launch, iters=iters, window=Window.tail(iters))
        if rec.get("cause"):
            raise UserError(f"the baseline profile run failed ({rec['cause']}): "
                            f"see {rec['log_path']}")
        traces = sorted(str(p) for p in trace_dir.glob("*.json*")) if trace_dir.is_dir() else []
        if not traces:
            log(f"profile run wrote no trace under {trace_dir}")
            return []
        log_path = rec["log_path"]
        ref_s = _unprofiled_step_s(Path(log_path), start)
    if contract is None and log_path:  # no contract given: the run's own argument dump claims
        contract = _contract_from_log(Path(log_path))
    try:
        recs = recommender(traces, contract, contract_path, reference_step_s=ref_s)
    except UserError as exc:
        if runner.opts.tries:
            log(f"the profile cannot be diagnosed ({exc.message}); trying --try candidates only")
            return []
        raise UserError(f"tune cannot work on this run: its profile cannot be diagnosed "
                        f"({exc.message}); pass --try KNOB=VALUE to A/B changes without a "
                        "diagnosis") from None
    log("rules recommend: " + (", ".join(f"{r.knob}={_text(r.value)} ({r.rule})" for r in recs)
                               or "nothing"))
    return recs


def _unprofiled_step_s(log_path: Path, profile_start: int) -> float | None:
    """Median time of the profile run's iterations before the profiler started (after the first),
    the step time the what-if estimates start from: profiled steps run slower."""
    try:
        it = parse_file(log_path).iterations
    except (OSError, UserError):
        return None
    return median_step_s(it, first=2, last=profile_start - 1) if it.height else None


def _contract_from_log(path: Path) -> Any:
    try:
        from moetune.analyzer.megatron_args import contract_from_log

        return contract_from_log(path.read_text(errors="replace"))
    except (ImportError, OSError, UserError):
        return None


def run_one(argv: Sequence[str], change_texts: Sequence[str], *, env: Mapping[str, str] | None,
            contract: Any, opts: TuneOptions) -> dict[str, Any]:
    """`moetune run --change k=v`: one candidate against the baseline (screens + confirm)."""
    base = Launch(tuple(argv), dict(env or {}))
    changes = [parse_change(t) for t in change_texts]
    cand = apply_all(base, changes)
    if cand == base:
        raise UserError(f"{', '.join(change_texts)} does not change the command")
    label = changes[0].label
    o = replace(opts, tries=tuple(change_texts), use_rules=False)
    sid = session_id(argv, base.env, contract, o, kind="run")
    profile_tpl = _profile_template(argv, opts) if opts.profile else None
    with Ledger.open(opts.ledger) as led:
        led.start_session(sid, command=list(argv), env=base.env, contract=contract,
                          options={"change": list(change_texts), "launcher": opts.launcher})
        runner = Runner(led, sid, opts, base)
        key = f"r0:{label}"
        prior = led.decision(sid, key)
        if prior is None:
            res = validate_candidate(runner, "r0", base, cand, label, profile_tpl=profile_tpl,
                                     contract=contract, knob=changes[0].knob.name,
                                     value=changes[0].value)
            led.record_decision(sid, key, label=label,
                                change={"knob": changes[0].knob.name, "value": changes[0].value},
                                source="user", predicted_gain=None,
                                measured_gain=res.get("measured_gain"), noise=res.get("noise"),
                                verdict=res["verdict"], cause=res.get("cause"), evidence=res)
            prior = led.decision(sid, key)
        led.finish_session(sid)
        return {"session": sid, "decision": prior, "command": list(cand.argv),
                "runs_executed": runner.executed, "runs_reused": runner.reused}
