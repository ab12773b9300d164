"""executor/ledger.py on real SQLite files: WAL, atomic records, interruption, full disk."""

from __future__ import annotations

import json
import sqlite3
import subprocess
import sys
from pathlib import Path

import jsonschema
import pytest
from moetune.executor.ledger import Ledger

from moetune.errors import UserError

ROOT = Path(__file__).resolve().parents[1]

SCHEMA = json.loads((Path(__file__).resolve().parents[1] / "schemas" / "ledger.schema.json").read_text())


def _fill(led: Ledger, sid: str = "s1") -> int:
    led.start_session(sid, command=["python", "-m", "w"], env={"A": "1"}, contract={"label": "x"},
                      options={"budget": 1})
    rid = led.begin_run(sid, "r0:screen:k=v:0", role="candidate", label="k=v",
                        command=["python", "-m", "w", "--k", "v"], env={},
                        diff={"removed": [], "added": ["--k", "v"], "env": {}}, log_path="l.log")
    led.end_run(rid, status="done", returncode=0, timed_out=False,
                metrics={"window": "2-3", "step_ms": 12.5, "cause": None}, cause=None,
                log_tail="tail")
    led.record_decision(sid, "r0:k=v", label="k=v", change={"knob": "k", "value": "v"},
                        source="user", predicted_gain=0.1, measured_gain=0.2, noise=0.05,
                        verdict="accepted", cause=None, evidence={"screen": {}})
    return rid


def test_records_round_trip_and_validate(tmp_path: Path) -> None:
    with Ledger.open(tmp_path / "l.db") as led:
        _fill(led)
        doc = led.document()
        mode = led.conn.execute("PRAGMA journal_mode").fetchone()[0]
    assert mode == "wal"
    jsonschema.validate(doc, SCHEMA)
    run = doc["runs"][0]
    assert run["command"][-2:] == ["--k", "v"] and run["metrics"]["step_ms"] == 12.5
    assert doc["decisions"][0]["measured_gain"] == 0.2


def test_interrupted_run_is_kept_and_redone(tmp_path: Path) -> None:
    path = tmp_path / "l.db"
    # a separate process starts a run and dies without finishing it (as a killed tune would)
    code = (
        "import os; from executor.ledger import Ledger\n"
        f"led = Ledger.open({str(path)!r})\n"
        "led.start_session('s', command=['x'], env={}, contract=None, options={})\n"
        "led.begin_run('s', 'k1', role='baseline', label='baseline', command=['x'], env={}, "
        "diff={}, log_path='a')\n"
        "os._exit(9)\n"
    )
    rc = subprocess.run([sys.executable, "-c", code], cwd=Path(__file__).resolve().parents[1]).returncode
    assert rc == 9
    with Ledger.open(path) as led:
        assert led.finished_run("s", "k1") is None
        rid = led.begin_run("s", "k1", role="baseline", label="baseline", command=["x"], env={},
                            diff={}, log_path="a")
        led.end_run(rid, status="done", returncode=0, timed_out=False, metrics=None, cause=None,
                    log_tail="")
        runs = led.runs("s")
    assert [(r["attempt"], r["status"]) for r in runs] == [(1, "interrupted"), (2, "done")]


def test_disk_full_loses_nothing(tmp_path: Path) -> None:
    path = tmp_path / "l.db"
    with Ledger.open(path) as led:
        _fill(led)
        before = led.document()
        pages = led.conn.execute("PRAGMA page_count").fetchone()[0]
        led.conn.execute(f"PRAGMA max_page_count={pages}")  # SQLite's own "disk full"
        with pytest.raises(UserError, match="disk full"):
            for i in range(50):
                led.start_session(f"big{i}", command=["x" * 20000], env={}, contract=None,
                                  options={})
        after = led.document()
    assert after["runs"] == before["runs"] and after["decisions"] == before["decisions"]
    assert {s["id"] for s in after["sessions"]} >= {"s1"}
    with sqlite3.connect(path) as c:  # the file is intact for any other reader
        assert c.execute("PRAGMA integrity_check").fetchone()[0] == "ok"


def test_unwritable_path_is_a_user_error(tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("not a directory")
    with pytest.raises(UserError, match="cannot open ledger"):
        Ledger.open(blocker / "ledger.sqlite")


def test_cli_ledger_lists_and_json(tmp_path: Path) -> None:
    path = tmp_path / "l.db"
    with Ledger.open(path) as led:
        _fill(led)
    root = Path(__file__).resolve().parents[1]
    out = subprocess.run([sys.executable, "-m", "moetune", "ledger", "--ledger", str(path), "--json"],
                         capture_output=True, text=True, cwd=root)
    assert out.returncode == 0, out.stderr
    jsonschema.validate(json.loads(out.stdout), SCHEMA)
    txt = subprocess.run([sys.executable, "-m", "moetune", "ledger", "--ledger", str(path)],
                         capture_output=True, text=True, cwd=root)
    assert "r0:screen:k=v:0" in txt.stdout and "accepted (gain +20.0%, predicted +10.0% by user, band ±5.0%)" in txt.stdout
    missing = subprocess.run([sys.executable, "-m", "moetune", "ledger", "--ledger",
                              str(tmp_path / "none.db")], capture_output=True, text=True, cwd=root)
    assert missing.returncode == 2 and missing.stderr.count("\n") == 1


def _sha(p: Path) -> str:
    import hashlib

    return hashlib.sha256(p.read_bytes()).hexdigest()


def test_by_rule_pools_the_real_h200_ledgers_without_touching_them(tmp_path: Path) -> None:
    """The two H200 tune sessions' ledgers (fixtures/ledgers): three rule-sourced decisions, all
    accepted, measured above the prediction. Listing writes nothing: same bytes, no side files."""
    import shutil

    src = Path(__file__).resolve().parents[1] / "fixtures" / "ledgers"
    a, b = (shutil.copy(src / f"h200_tune_session_{x}.sqlite", tmp_path) for x in "ab")
    a, b = Path(a), Path(b)
    before = {p: _sha(p) for p in (a, b)}
    r = subprocess.run([sys.executable, "-m", "moetune", "ledger", "--ledger", str(a), "--ledger",
                        str(b), "--by-rule", "--json"], capture_output=True, text=True, cwd=ROOT)
    assert r.returncode == 0, r.stderr
    rows = json.loads(r.stdout)
    assert [(x["rule"], x["decisions"], x["accepted"], x["measured"]) for x in rows] == [
        ("host.larger-micro-batch", 3, 3, 3)]
    row = rows[0]
    assert row["measured_gain_median"] == pytest.approx(0.7963, abs=1e-4)
    assert row["predicted_gain_median"] == pytest.approx(0.4851, abs=1e-4)
    assert 1.4 < row["measured_over_predicted"] < 1.8
    assert {p: _sha(p) for p in (a, b)} == before
    assert sorted(x.name for x in tmp_path.iterdir()) == [a.name, b.name]
    r = subprocess.run([sys.executable, "-m", "moetune", "ledger", "--ledger", str(b)],
                       capture_output=True, text=True, cwd=ROOT)
    assert "decision tune-885bbeba759f micro_batch_size=4: accepted (gain +79.6%, predicted " \
           "+47.8% by host.larger-micro-batch, band ±25.8%)" in r.stdout


def test_by_rule_counts_unmeasured_and_lends_user_tries_their_rule() -> None:
    from moetune.executor.calibration import by_rule

    rows = by_rule([
        {"source": "user (host.x)", "predicted_gain": 0.5, "measured_gain": 1.0, "verdict": "accepted"},
        {"source": "host.x", "predicted_gain": 0.3, "measured_gain": None, "verdict": "rejected",
         "cause": "oom"},
        {"source": "user", "predicted_gain": None, "measured_gain": 0.2, "verdict": "accepted"},
        {"source": "comm.y", "predicted_gain": 0.2, "measured_gain": -0.1, "verdict": "rejected",
         "cause": "no gain"},
    ])
    assert rows == [
        {"rule": "comm.y", "decisions": 1, "accepted": 0, "measured": 1, "predicted_gain_median": 0.2,
         "measured_gain_median": -0.1, "measured_over_predicted": -0.5, "causes": ["no gain"]},
        {"rule": "host.x", "decisions": 2, "accepted": 1, "measured": 1, "predicted_gain_median": 0.4,
         "measured_gain_median": 1.0, "measured_over_predicted": 2.0, "causes": ["oom"]},
    ]


def test_ledger_cli_on_a_database_that_is_not_a_ledger(tmp_path: Path) -> None:
    db = tmp_path / "other.sqlite"
    sqlite3.connect(db).execute("CREATE TABLE t (x)").connection.commit()
    r = subprocess.run([sys.executable, "-m", "moetune", "ledger", "--ledger", str(db)],
                       capture_output=True, text=True, cwd=ROOT)
    assert r.returncode == 2 and r.stderr.count("\n") == 1
    assert "not a moetune ledger" in r.stderr and "Traceback" not in r.stderr
