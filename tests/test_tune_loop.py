"""The closed loop on the CPU workload, as a user runs it: `moetune tune` / `moetune run` in real
subprocesses, a real SQLite ledger, a candidate that crashes, and a tune killed mid-run and
resumed without redoing or losing a finished run."""

from __future__ import annotations

import json
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
FAST = ["--screen-iters", "6", "--confirm-iters", "8", "--window", "5-8"]


def moetune(*args: str, **kw) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "moetune", *args], capture_output=True,
                          text=True, cwd=ROOT, timeout=900, **kw)


def test_cli_usage_errors_are_one_line(tmp_path: Path) -> None:
    for args in (["run", "--change", "micro_batch_size"],
                 ["run", "--change", "micro_batch_size=2", "--repeats", "2"],
                 ["tune", "--window", "9-3"],
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
    pairs = len(ev["screen"]["a_ms"])
    assert len(ev["screen"]["b_ms"]) == pairs == (1 if ev["screen"].get("early") else 3)
    assert ev["loss_rel_diff"] < 1e-3  # same samples per global batch: same loss
    assert ev["confirm"]["window"] == "5-8"
    assert crash["verdict"] == "rejected" and crash["cause"] == "usage"
    assert "--micro-batch-size" in res["final_command"]
    with sqlite3.connect(tmp_path / "l.db") as c:
        walls = c.execute("SELECT finished_at - started_at FROM runs").fetchall()
    assert res["run_time_s"] > 0
    assert res["run_time_s"] == pytest.approx(sum(w for (w,) in walls), abs=0.1)
    assert res["final_command"][res["final_command"].index("--micro-batch-size") + 1] == "16"
    with sqlite3.connect(tmp_path / "l.db") as c:
        rows = c.execute("SELECT key, status, cause, log_tail FROM runs ORDER BY id").fetchall()
    keys = [k for k, *_ in rows]
    assert keys[0] == "r0:profile:baseline:0"
    assert [k.split(":")[1] for k in keys[1:1 + 2 * pairs]] == ["screen-base", "screen"] * pairs
    # round 1 profiles nothing: the accepted candidate's confirm trace is its profile
    assert "r1:profile:baseline:0" not in keys
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
            "--no-profile", "--budget", "1", "--try", "micro_batch_size=16", *FAST,
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
        if sum(1 for r in rows if r[2] == "done") >= 3 and rows[-1][2] == "running":
            os.killpg(p.pid, signal.SIGKILL)  # mid-run: the 4th run is in flight
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
    pairs = len(res["decisions"][0]["evidence"]["screen"]["a_ms"])
    # the screens (3 pairs, or 1 when it decides alone) + 2 confirms, each done exactly once
    assert len({row[1] for row in rows}) == 2 * pairs + 2
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


def test_one_screen_pair_decides_only_a_clear_win() -> None:
    from moetune.executor.loop import _separated

    a = {"step_ms": 100.0, "step_ms_all": [98.0, 100.0, 103.0, 100.0]}
    clear = {"step_ms": 50.0, "step_ms_all": [49.0, 50.0, 52.0, 50.0]}
    # twice the standard error of the medians' ratio: IQRs 3.75 % and 4.5 % of the medians, n 4
    se = [1.2533 * iqr / 1.349 / 2 for iqr in (0.0375, 0.045)]
    assert _separated(a, clear) == pytest.approx(2 * (se[0] ** 2 + se[1] ** 2) ** 0.5)
    overlap = {"step_ms": 60.0, "step_ms_all": [55.0, 60.0, 99.0, 60.0]}
    small = {"step_ms": 90.0, "step_ms_all": [89.0, 90.0, 91.0, 90.0]}
    slower = {"step_ms": 150.0, "step_ms_all": [149.0, 150.0, 151.0, 150.0]}
    assert _separated(a, overlap) is None   # one candidate iteration as slow as the baseline's
    assert _separated(a, small) is None     # separated, but +11 %: the repeats decide
    assert _separated(a, slower) is None    # losses are never decided early
    assert _separated(a, {"step_ms": 50.0, "step_ms_all": [50.0]}) is None  # too few iterations


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


def test_an_accepted_confirm_run_is_the_next_confirm_baseline(tmp_path: Path) -> None:
    """After MBS 1 → 4 is accepted, its confirm run (a confirm-length run of the new baseline) is
    the baseline of MBS 4 → 32's confirm pair: no baseline run is repeated for it."""
    pytest.importorskip("torch")
    # GBS 32 makes both steps ≥ 2× faster (32 → 8 → 1 micro-batches): with GBS 16 the second
    # step's +90 % fell inside a loaded CI machine's 3-repeat noise band and never confirmed
    workload = WORKLOAD.replace("--global-batch-size 16", "--global-batch-size 32")
    r = moetune("tune", "--cmd", workload, "--no-rules", "--no-profile", "--budget", "2",
                "--try", "micro_batch_size=4", "--try", "micro_batch_size=32", *FAST,
                "--ledger", str(tmp_path / "l.db"), "--workdir", str(tmp_path / "runs"),
                "--json")
    assert r.returncode == 0, r.stderr[-3000:]
    res = json.loads(r.stdout)
    first, second = res["decisions"]
    assert first["label"] == "micro_batch_size=4" and first["verdict"] == "accepted"
    assert first["evidence"]["confirm_run"] == "r0:confirm:micro_batch_size=4:0"
    assert "confirm_base_run" not in first["evidence"]
    with sqlite3.connect(tmp_path / "l.db") as c:
        keys = [k for (k,) in c.execute("SELECT key FROM runs ORDER BY id")]
    assert "r0:confirm-base:micro_batch_size=4:0" in keys
    assert "confirm" in second["evidence"], second  # its screens won: a confirm pair ran
    assert second["evidence"]["confirm_base_run"] == "r0:confirm:micro_batch_size=4:0"
    assert not any(k.startswith("r1:confirm-base") for k in keys)
    assert "r1:confirm:micro_batch_size=32:0" in keys


def test_what_an_accepted_enabler_unlocked_is_tried_inside_the_noise_band(tmp_path: Path) -> None:
    """Round 0 accepts MBS 4, which the rules rank for the change it unlocks; round 1's only
    candidate is that change, predicted +0 % (inside any noise band): it is still A/B'd, not
    stopped at, since the enabler was kept for it. Real profile runs, real A/Bs, the loop's own
    recommender hook standing in for the rules' judgement of the CPU workload."""
    pytest.importorskip("torch")
    from moetune.executor.loop import TuneOptions, tune
    from moetune.executor.validate import Policy, Window

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
                       policy=Policy(screen_iters=6, confirm_iters=12,
                                     confirm_window=Window(9, 12)))
    res = tune(shlex.split(workload), opts=opts, recommender=recommender)
    by = {d["label"]: d for d in res["decisions"]}
    assert by["micro_batch_size=4"]["verdict"] == "accepted"
    assert "micro_batch_size=16" in by, res["stopped"]  # tried, whatever its verdict
    assert by["micro_batch_size=16"]["source"] == "test.unlocked"
    assert seen[:2] == [1, 4]
