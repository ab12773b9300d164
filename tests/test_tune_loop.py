"""The closed loop on the CPU workload, as a user runs it: `moetune tune` / `moetune run` in real
subprocesses, a real SQLite ledger, a candidate that crashes, and a tune killed mid-run and
resumed without redoing or losing a finished run."""

from __future__ import annotations

import json
import math
import os
import shlex
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
WORKLOAD = ("python -m moetune.executor.workloads.moe_gpt --num-layers 1 --hidden-size 32 "
            "--num-attention-heads 2 --num-experts 4 --seq-length 16 --vocab-size 64 "
            "--micro-batch-size 1 --global-batch-size 16")
FAST = ["--run-iters", "6"]


def moetune(*args: str, **kw) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "moetune", *args], capture_output=True,
                          text=True, cwd=ROOT, timeout=900, **kw)


def test_cli_usage_errors_are_one_line(tmp_path: Path) -> None:
    for args in (["run", "--change", "micro_batch_size"],
                 ["run", "--change", "micro_batch_size=2", "--run-iters", "2"],
                 ["tune", "--max-pairs", "0"],
                 ["tune", "--noise-prior", "2"],
                 ["run", "--change", "micro_batch_size=2", "--contract", str(tmp_path / "none.yaml")]):
        r = moetune(*args, "--ledger", str(tmp_path / "l.db"), "--workdir", str(tmp_path))
        assert r.returncode == 2, (args, r.stderr)
        assert r.stderr.startswith("moetune: ") and r.stderr.count("\n") == 1


@pytest.mark.slow
def test_tune_accepts_a_win_and_rejects_a_crash(tmp_path: Path) -> None:
    pytest.importorskip("torch")
    r = moetune("tune", "--cmd", WORKLOAD, "--budget", "2", "--try", "micro_batch_size=16",
                "--try", "moe_bogus_knob=1", *FAST, "--ledger", str(tmp_path / "l.db"),
                "--workdir", str(tmp_path / "runs"), "--json")
    assert r.returncode == 0, r.stderr[-3000:]
    res = json.loads(r.stdout)
    by = {d["label"]: d for d in res["decisions"]}
    win, crash = by["micro_batch_size=16"], by["moe_bogus_knob=1"]
    assert win["verdict"] == "accepted" and win["measured_gain"] > win["noise"] > 0
    ev = win["evidence"]
    # +300 % and more: one pair decides; its baseline is the round's profile run, measured
    assert [(p["a_run"], p["b_run"]) for p in ev["pairs"]] == [
        ("r0:profile:baseline:0", "r0:cand:micro_batch_size=16:0")]
    assert ev["judgement"]["low"] > 0.02 and ev["judgement"]["pairs"] == 1
    assert ev["loss_rel_diff"] < 1e-3  # same samples per global batch: same loss
    assert crash["verdict"] == "rejected" and crash["cause"] == "usage"
    assert "--micro-batch-size" in res["final_command"]
    with sqlite3.connect(tmp_path / "l.db") as c:
        walls = c.execute("SELECT finished_at - started_at FROM runs").fetchall()
    assert res["run_time_s"] > 0
    assert res["run_time_s"] == pytest.approx(sum(w for (w,) in walls), abs=0.1)
    assert res["final_command"][res["final_command"].index("--micro-batch-size") + 1] == "16"
    with sqlite3.connect(tmp_path / "l.db") as c:
        rows = c.execute("SELECT key, status, cause, log_tail, command FROM runs ORDER BY id"
                         ).fetchall()
    keys = [k for k, *_ in rows]
    # round 1 profiles nothing: the accepted candidate's first run carries its trace
    assert keys == ["r0:profile:baseline:0", "r0:cand:micro_batch_size=16:0",
                    "r1:cand:moe_bogus_knob=1:0"]
    # every run has the same iterations (the same schedule); the profile run and each
    # candidate's first run carry the profiler, after the measured window (iterations 3-8)
    cmds = [json.loads(c) for *_, c in rows]
    assert {cmd[cmd.index("--train-iters") + 1] for cmd in cmds} == {"11"}
    assert all(cmd[cmd.index("--profile-step-start") + 1] == "10" for cmd in cmds)
    failed = [row for row in rows if row[1] == "failed"]
    assert len(failed) == 1 and failed[0][2] == "usage"
    assert "unrecognized arguments: --moe-bogus-knob 1" in failed[0][3]  # log tail kept
    ledger = moetune("ledger", "--ledger", str(tmp_path / "l.db"))
    assert "micro_batch_size=16: accepted" in ledger.stdout


@pytest.mark.slow
def test_tune_killed_mid_run_resumes_without_redoing(tmp_path: Path) -> None:
    pytest.importorskip("torch")
    db = tmp_path / "l.db"
    args = [sys.executable, "-m", "moetune", "tune", "--cmd", WORKLOAD, "--no-rules",
            "--no-profile", "--budget", "2", "--try", "micro_batch_size=16",
            "--try", "micro_batch_size=8", *FAST,
            "--ledger", str(db), "--workdir", str(tmp_path / "runs"), "--json"]
    p = subprocess.Popen(args, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                         start_new_session=True)
    deadline = time.monotonic() + 600
    done_before: list[tuple] = []
    while time.monotonic() < deadline:
        time.sleep(0.3)
        if not db.exists():
            continue
        try:
            with sqlite3.connect(db) as c:
                rows = c.execute("SELECT id, key, status FROM runs ORDER BY id").fetchall()
        except sqlite3.OperationalError:  # the file exists a moment before its schema commits
            continue
        if sum(1 for r in rows if r[2] == "done") >= 2 and rows[-1][2] == "running":
            os.killpg(p.pid, signal.SIGKILL)  # mid-run: the 3rd run is in flight
            p.wait()
            done_before = [r for r in rows if r[2] == "done"]
            break
    assert done_before, "the tune finished before it could be interrupted"
    r = subprocess.run(args, cwd=ROOT, capture_output=True, text=True, timeout=900)
    assert r.returncode == 0, r.stderr[-3000:]
    res = json.loads(r.stdout)
    assert res["runs_reused"] >= len(done_before)
    with sqlite3.connect(db) as c:
        rows = c.execute("SELECT id, key, status, attempt FROM runs ORDER BY id").fetchall()
    for rid, key, _ in done_before:  # kept, same row, never redone
        same = [row for row in rows if row[1] == key]
        assert [(row[0], row[2]) for row in same] == [(rid, "done")]
    interrupted = [row for row in rows if row[2] == "interrupted"]
    assert len(interrupted) == 1  # the run in flight is kept, marked, and redone once
    redo = [row for row in rows if row[1] == interrupted[0][1] and row[2] == "done"]
    assert len(redo) == 1 and redo[0][3] == 2
    # a first baseline run, then each pair's new runs, each done exactly once
    new_runs = 1 + sum(2 * len(d["evidence"]["pairs"]) - 1 for d in res["decisions"])
    assert len({row[1] for row in rows}) == new_runs
    assert res["decisions"][0]["verdict"] == "accepted"


def _rec(rule: str, knob: str, value, mid: float, scope=None, memory=None):
    from moetune.analysis import Recommendation

    entry = {"rule": rule, "wall": "host", "change": {"knob": knob, "to": value,
                                                      "with": scope or {}},
             "gain": {"speedup": {"mid": mid}}, "memory": memory}
    return Recommendation.from_entry(entry)


def test_candidate_order_round_contract_and_session_id(tmp_path: Path) -> None:
    from moetune.executor.loop import TuneOptions, _round_contract, candidate_changes, session_id

    recs = [_rec("host.cuda-graphs", "cuda_graph_impl", "transformer_engine", 1.69,
                 {"cuda_graph_modules": ["moe_router", "moe_preprocess"]}),
            _rec("host.larger-micro-batch", "micro_batch_size", 2, 0.5)]
    cands = candidate_changes(recs, ["moe_grouped_gemm=true"])
    assert [c["label"] for c in cands] == ["moe_grouped_gemm=true", "cuda_graph_impl=transformer_engine",
                                           "micro_batch_size=2"]
    assert [ch.knob.name for ch in cands[1]["changes"]] == ["cuda_graph_impl", "cuda_graph_modules"]
    assert cands[0]["source"] == "user" and cands[0]["predicted_gain"] is None
    # a --try that a rule also proposes carries the rule's prediction and is tried once
    both = candidate_changes(recs, ["micro_batch_size=2"])
    assert [c["label"] for c in both] == ["micro_batch_size=2", "cuda_graph_impl=transformer_engine"]
    assert both[0]["source"] == "user (host.larger-micro-batch)" and both[0]["predicted_gain"] == 0.5
    con = {"megatron_args": {"micro_batch_size": 1}}
    accepted = [{"change": {"knob": "micro_batch_size", "value": 8, "with": {}}}]
    assert _round_contract(con, accepted)["megatron_args"]["micro_batch_size"] == 8
    assert con["megatron_args"]["micro_batch_size"] == 1  # the user's contract is not modified
    # the section field mirroring the argument moves with it: the contract still agrees with itself
    mirrored = _round_contract({"megatron_args": {"micro_batch_size": 1},
                                "shape": {"micro_batch_size": 1, "global_batch_size": 8}}, accepted)
    assert mirrored["shape"] == {"micro_batch_size": 8, "global_batch_size": 8}
    o = TuneOptions(workdir=tmp_path, ledger=tmp_path / "l.db")
    assert session_id(["a"], {}, con, o) == session_id(["a"], {}, con, o)
    assert session_id(["a"], {}, con, o) != session_id(["a", "b"], {}, con, o)


def test_calibration_reorders_and_non_fitting_changes_go_last() -> None:
    """A rule whose A/Bs this session measured a quarter of its prediction drops behind one that
    held; a change predicted not to fit comes after every change that fits, whatever it
    promises."""
    from moetune.executor.loop import candidate_changes, session_calibration

    decisions = [{"source": "host.cuda-graphs", "predicted_gain": 1.6, "measured_gain": 0.4,
                  "verdict": "rejected"},
                 {"source": "host.larger-micro-batch", "predicted_gain": 0.5,
                  "measured_gain": 0.55, "verdict": "accepted"}]
    cal = session_calibration(decisions)
    assert cal == {"host.cuda-graphs": 0.25, "host.larger-micro-batch": 1.1}
    recs = [_rec("host.cuda-graphs", "cuda_graph_impl", "local", 1.69),
            _rec("host.larger-micro-batch", "micro_batch_size", 2, 0.5),
            _rec("memory.recompute-off", "recompute_granularity", None, 3.0,
                 memory={"peak_gib": 150.0, "capacity_gib": 139.8, "fits": False,
                         "basis": "model only"})]
    cands = candidate_changes(recs, [], cal)
    assert [c["source"] for c in cands] == ["host.larger-micro-batch", "host.cuda-graphs",
                                           "memory.recompute-off"]
    assert cands[1]["predicted_gain"] == pytest.approx(1.69 * 0.25)
    assert cands[2]["memory"]["fits"] is False


def test_an_enabler_is_ordered_by_what_it_unlocks() -> None:
    from moetune.executor.loop import candidate_changes

    graphs = {"rule": "host.cuda-graphs-local", "change": {"knob": "cuda_graph_impl"},
              "gain": {"speedup": {"mid": 0.25}}}
    enabler = _rec("memory.recompute-off", "recompute_granularity", None, 0.05)
    enabler.entry["unlocks"] = [graphs]  # type: ignore[index]
    other = _rec("host.manual-gc", "manual_gc", True, 0.2)
    out = candidate_changes([other, enabler], [])
    assert [c["source"] for c in out] == ["memory.recompute-off", "host.manual-gc"]
    assert out[0]["value"] == pytest.approx(1.05 * 1.25 - 1)
    assert out[0]["predicted_gain"] == pytest.approx(0.05)  # its own, for calibration
    assert out[0]["unlocks"] == ["host.cuda-graphs-local"]


def test_one_pair_decides_only_a_clear_win() -> None:
    """The sequential A/B's judgement: the mean log ratio of the pairs against the run-to-run
    noise σ (the prior 10 % until repeated runs measure it), z = 1.645."""
    from moetune.executor.ab import judge, pairs_needed, run_noise
    from moetune.executor.validate import Policy

    pol = Policy()
    pair = lambda a, b, **kw: {"log_ratio": math.log(a / b), **kw}  # noqa: E731
    sigma = run_noise([], pol)
    assert sigma == pytest.approx(0.10)
    se = math.sqrt(2) * 0.10
    clear = judge([pair(100, 50)], sigma, pol)
    assert clear["state"] == "win" and clear["low"] == pytest.approx(
        math.exp(math.log(2) - 1.645 * se) - 1)
    assert judge([pair(100, 80)], sigma, pol)["state"] == "undecided"  # +25 %: one more pair
    assert judge([pair(100, 80)] * 2, sigma, pol)["state"] == "win"    # se shrinks by √2
    assert judge([pair(100, 150)], sigma, pol)["state"] == "no-win"
    # a run that drifted inside its window counts its drift as extra uncertainty
    drifted = judge([pair(100, 50, a_drift=0.4, a_drifting=True, b_drift=0.0)], sigma, pol)
    assert drifted["se"] == pytest.approx(math.sqrt(2 * 0.01 + 0.1 ** 2))
    # an enabler is kept unless measurably slower
    assert judge([pair(100, 105)], sigma, pol, enabler=True)["state"] == "kept"
    assert judge([pair(100, 200)], sigma, pol, enabler=True)["state"] == "slower"
    # the noise from repeated runs, shrunk toward the prior while they are few
    noisy = run_noise([[100, 130, 80, 120]], pol)
    assert noisy > 0.15
    assert run_noise([[100, 100.5, 99.5, 100.2, 99.9, 100.1]], pol) < 0.07
    assert pairs_needed(0.5, 0.10, pol) == 1 and pairs_needed(0.01, 0.10, pol) is None
    assert pairs_needed(0.08, 0.10, pol) > 4


def test_a_prediction_the_prior_hides_is_tried_until_noise_is_measured() -> None:
    """Megatron-LM's memory shape (bench/grid_mlm, tune3): expandable segments unlocking selective
    recompute, +10.3 %, needs 9 pairs at the 10 % prior. With no configuration run twice the prior
    is a guess and the pairs measure the noise, so the loop judges it; once repeated runs measure a
    noise that hides it, the loop stops and says why."""
    from moetune.executor.loop import _not_worth
    from moetune.executor.validate import Policy

    pol = Policy()
    cand = {"label": "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True", "source":
            "memory.expandable-segments", "predicted_gain": 0.0, "value": 0.103}
    unmeasured = {"baseline": [1637.4], "micro_batch_size=8": [932.2]}
    assert _not_worth(cand, [], set(), None, unmeasured, pol, "baseline") is None  # type: ignore[arg-type]
    noisy = {"baseline": [900.0, 1000.0, 1100.0, 950.0], "micro_batch_size=8": [500.0]}
    why = _not_worth(cand, [], set(), None, noisy, pol, "baseline")  # type: ignore[arg-type]
    assert why is not None and "cannot be told from the run-to-run noise" in why
    # a gain under --min-gain is never tried, measured noise or not
    small = {**cand, "value": 0.015}
    assert _not_worth(small, [], set(), None, unmeasured, pol, "baseline") is not None  # type: ignore[arg-type]


def test_tune_that_cannot_diagnose_says_so(tmp_path: Path) -> None:
    """A CPU run's profile has no GPU events: with no --try the loop has nothing to go on, and
    says so in one line with exit 2 instead of recommending nothing."""
    pytest.importorskip("torch")
    r = moetune("tune", "--cmd", WORKLOAD, "--budget", "1", *FAST, "--ledger",
                str(tmp_path / "l.db"), "--workdir", str(tmp_path / "runs"))
    assert r.returncode == 2, r.stderr[-2000:]
    last = r.stderr.strip().splitlines()[-1]
    assert last.startswith("moetune: tune cannot work on this run") and "no GPU events" in last


def test_time_budget_stops_before_a_run_that_would_pass_it(tmp_path: Path) -> None:
    pytest.importorskip("torch")
    args = ["tune", "--cmd", WORKLOAD, "--no-rules", "--no-profile", "--budget", "1",
            "--try", "micro_batch_size=16", *FAST, "--ledger", str(tmp_path / "l.db"),
            "--workdir", str(tmp_path / "runs")]
    r = moetune(*args, "--max-run-time", "1", "--json")
    assert r.returncode == 0, r.stderr[-3000:]
    res = json.loads(r.stdout)
    # the first run always starts; it took more than the 1 s budget, so nothing else did
    assert res["runs_executed"] == 1 and res["run_time_s"] > 1
    assert res["stopped"].startswith("time budget: runs took")
    assert "left buy about 0 run(s)" in res["stopped"]
    assert res["decisions"] == [] and res["accepted"] == []
    assert res["final_command"] == shlex.split(WORKLOAD)  # nothing accepted
    # a re-run counts the finished run against the same budget: it reads it back, runs nothing
    again = moetune(*args, "--max-run-time", "1")
    assert again.returncode == 0, again.stderr[-3000:]
    assert "0 runs executed, 1 read back" in again.stdout
    assert "stopped: time budget" in again.stdout
    bad = moetune(*args, "--max-run-time", "0")
    assert bad.returncode == 2 and bad.stderr.strip().count("\n") == 0
    assert "--max-run-time" in bad.stderr


def test_an_accepted_candidates_runs_are_the_next_baseline(tmp_path: Path) -> None:
    """After MBS 1 → 4 is accepted, its measured run is the baseline of MBS 4 → 32's first pair:
    no baseline run is repeated for it."""
    pytest.importorskip("torch")
    # GBS 32 makes both steps ≥ 2× faster (32 → 8 → 1 micro-batches)
    workload = WORKLOAD.replace("--global-batch-size 16", "--global-batch-size 32")
    r = moetune("tune", "--cmd", workload, "--no-rules", "--no-profile", "--budget", "2",
                "--try", "micro_batch_size=4", "--try", "micro_batch_size=32", *FAST,
                "--ledger", str(tmp_path / "l.db"), "--workdir", str(tmp_path / "runs"),
                "--json")
    assert r.returncode == 0, r.stderr[-3000:]
    res = json.loads(r.stdout)
    first, second = res["decisions"]
    assert first["label"] == "micro_batch_size=4" and first["verdict"] == "accepted"
    assert first["evidence"]["pairs"][0]["a_run"] == "r0:base:micro_batch_size=4:first"
    # its baseline is the accepted candidate's latest run (one pair, or more on a loaded machine)
    assert second["evidence"]["pairs"][0]["a_run"] == first["evidence"]["candidate_runs"][-1]
    assert first["evidence"]["candidate_runs"][0] == "r0:cand:micro_batch_size=4:0"
    with sqlite3.connect(tmp_path / "l.db") as c:
        keys = [k for (k,) in c.execute("SELECT key FROM runs ORDER BY id")]
    assert not any(k.startswith("r1:base:micro_batch_size=32:first") for k in keys)
    assert "r1:cand:micro_batch_size=32:0" in keys


def test_what_an_accepted_enabler_unlocked_is_tried_inside_the_noise_band(tmp_path: Path) -> None:
    """Round 0 accepts MBS 4, which the rules rank for the change it unlocks; round 1's only
    candidate is that change, predicted +0 % (inside any noise band): it is still A/B'd, not
    stopped at, since the enabler was kept for it. Real profile runs, real A/Bs, the loop's own
    recommender hook standing in for the rules' judgement of the CPU workload."""
    pytest.importorskip("torch")
    from moetune.executor.loop import TuneOptions, tune
    from moetune.executor.validate import Policy

    seen: list[int] = []

    def recommender(traces, contract, _path, *, reference_step_s=None):
        assert traces and all(Path(t).is_file() for t in traces)  # the round's real profile
        mbs = int(contract["megatron_args"]["micro_batch_size"])
        seen.append(mbs)
        if mbs == 1:
            enabler = _rec("test.enabler", "micro_batch_size", 4, 0.5)
            enabler.entry["unlocks"] = [{"rule": "test.unlocked",  # type: ignore[index]
                                         "gain": {"speedup": {"mid": 0.3}}}]
            return [enabler]
        return [_rec("test.unlocked", "micro_batch_size", 16, 0.0)] if mbs == 4 else []

    workload = WORKLOAD.replace("--global-batch-size 16", "--global-batch-size 32")
    opts = TuneOptions(workdir=tmp_path / "runs", ledger=tmp_path / "l.db", budget=3,
                       policy=Policy(measured=6))
    res = tune(shlex.split(workload), opts=opts, recommender=recommender)
    by = {d["label"]: d for d in res["decisions"]}
    assert by["micro_batch_size=4"]["verdict"] == "accepted"
    assert "micro_batch_size=16" in by, res["stopped"]  # tried, whatever its verdict
    assert by["micro_batch_size=16"]["source"] == "test.unlocked"
    assert seen[:2] == [1, 4]


def test_run_speaks_as_run_and_tune_without_a_profile_says_what_to_add(tmp_path: Path) -> None:
    """`moetune run`'s progress lines name `run`, not `tune`; `tune --no-profile` with no --try
    has nothing to judge and says how to give it something."""
    pytest.importorskip("torch")
    where = ["--ledger", str(tmp_path / "l.db"), "--workdir", str(tmp_path / "runs")]
    r = moetune("run", "--change", "micro_batch_size=16", "--cmd", WORKLOAD, "--no-profile",
                "--max-pairs", "1", *FAST, *where, "--json")
    assert r.returncode == 0, r.stderr[-3000:]
    _validator("run").validate(json.loads(r.stdout))
    progress = [ln for ln in r.stderr.splitlines() if ln.startswith("moetune ")]
    assert progress and all(ln.startswith("moetune run: ") for ln in progress), progress
    r = moetune("tune", "--cmd", WORKLOAD, "--no-profile", *FAST, *where)
    assert r.returncode == 0, r.stderr[-3000:]
    assert "0 runs executed" in r.stdout
    stopped = next(ln for ln in r.stdout.splitlines() if ln.startswith("stopped: "))
    assert stopped.endswith("only --try candidates are judged; add --try KNOB=VALUE (e.g. --try "
                            "moe_grouped_gemm=true; `moetune rules list` shows the knobs)")
    assert all(ln.startswith("moetune tune: ") for ln in r.stderr.splitlines())
    r = moetune("tune", "--cmd", WORKLOAD, "--budget", "1", "--no-rules", "--no-profile",
                "--try", "micro_batch_size=16", "--max-pairs", "1", *FAST, *where, "--json")
    assert r.returncode == 0, r.stderr[-3000:]
    res = json.loads(r.stdout)
    _validator("tune").validate(res)
    assert [d["label"] for d in res["decisions"]] == ["micro_batch_size=16"]


def _validator(name: str):
    import jsonschema
    from referencing import Registry, Resource

    schemas = [json.loads((ROOT / "schemas" / f"{n}.schema.json").read_text())
               for n in (name, "ledger")]
    registry = Registry().with_resources([(s["$id"], Resource.from_contents(s)) for s in schemas])
    return jsonschema.Draft202012Validator(schemas[0], registry=registry)
