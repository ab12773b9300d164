"""SQLite ledger of every run and every verdict: what ran, exactly, and what it measured.

WAL journal, one `BEGIN IMMEDIATE` transaction per write, so a killed `tune` leaves either the
whole record or none of it, and readers (`moetune ledger`) never block the writer. A run is
recorded `running` before it starts and `done`/`failed` when it ends; a `running` row found on
restart was interrupted: it is kept (marked `interrupted`) and the run is redone under the same
key. Disk full or an unwritable path is a UserError naming the file; nothing written is lost.
"""

from __future__ import annotations

import json
import math
import sqlite3
import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from functools import cache
from pathlib import Path
from typing import Any

from moetune.errors import UserError
from moetune.resources import schema

SCHEMA_VERSION = 1
RUN_RECORD_SCHEMA_ID = "https://moetune.dev/schemas/ledger/1"

_DDL = """
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS sessions (
    id TEXT PRIMARY KEY,
    created_at REAL NOT NULL,
    state TEXT NOT NULL,             -- running | done
    command TEXT NOT NULL,           -- JSON argv of the starting baseline
    env TEXT NOT NULL,               -- JSON
    contract TEXT,                   -- JSON (the measurement contract as loaded)
    options TEXT NOT NULL            -- JSON (budget, window, repeats, launcher, …)
);
CREATE TABLE IF NOT EXISTS runs (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    session TEXT NOT NULL REFERENCES sessions(id),
    key TEXT NOT NULL,               -- deterministic plan position: round:role:label:repeat
    attempt INTEGER NOT NULL DEFAULT 1,
    role TEXT NOT NULL,              -- profile | baseline | candidate (older ledgers: confirm…)
    label TEXT NOT NULL,             -- knob=value, or `baseline`
    status TEXT NOT NULL,            -- running | done | failed | interrupted
    command TEXT NOT NULL,           -- JSON argv exactly as launched
    env TEXT NOT NULL,               -- JSON environment additions
    diff TEXT NOT NULL,              -- JSON diff from the session's baseline
    log_path TEXT,
    log_tail TEXT,
    returncode INTEGER,
    timed_out INTEGER,
    metrics TEXT,                    -- JSON (step time, TFLOPS, loss, memory, …)
    cause TEXT,                      -- why it failed (oom, crash, usage, hang, nan, …)
    started_at REAL NOT NULL,
    finished_at REAL
);
CREATE INDEX IF NOT EXISTS runs_key ON runs(session, key);
CREATE TABLE IF NOT EXISTS decisions (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    session TEXT NOT NULL REFERENCES sessions(id),
    key TEXT NOT NULL,               -- round:label
    label TEXT NOT NULL,
    change TEXT NOT NULL,            -- JSON {knob, value}
    source TEXT,                     -- rule id or `user`
    predicted_gain REAL,
    measured_gain REAL,
    noise REAL,
    verdict TEXT NOT NULL,           -- accepted | rejected
    cause TEXT,
    evidence TEXT,                   -- JSON (the A/B pairs, judgement, loss health, audit)
    created_at REAL NOT NULL,
    UNIQUE(session, key)
);
"""


def _dumps(v: Any) -> str:
    return json.dumps(v, sort_keys=True, default=str)


def _loads(s: str | None) -> Any:
    return json.loads(s) if s else None


@cache
def _columns() -> dict[str, frozenset[str]]:
    """The columns `_DDL` gives each record table (what reading a ledger needs)."""
    conn = sqlite3.connect(":memory:")
    try:
        for stmt in _DDL.split(";"):
            if stmt.strip():
                conn.execute(stmt)
        return {t: frozenset(r[1] for r in conn.execute(f"PRAGMA table_info({t})"))
                for t in ("sessions", "runs", "decisions")}
    finally:
        conn.close()


@cache
def _validator() -> Any:
    import jsonschema

    return jsonschema.Draft202012Validator(json.loads(schema("ledger").read_text()))


class Ledger:
    """One SQLite file; open with `Ledger.open(path)`, use as a context manager."""

    def __init__(self, conn: sqlite3.Connection, path: Path) -> None:
        self.conn, self.path = conn, path

    @classmethod
    def open(cls, path: str | Path) -> Ledger:
        p = Path(path)
        try:
            if p.parent and not p.parent.exists():
                p.parent.mkdir(parents=True, exist_ok=True)
            conn = sqlite3.connect(p, timeout=30.0, isolation_level=None)
            conn.row_factory = sqlite3.Row
            conn.execute("PRAGMA journal_mode=WAL")
            conn.execute("PRAGMA synchronous=FULL")
            conn.execute("PRAGMA foreign_keys=ON")
            led = cls(conn, p)
            with led._tx():
                for stmt in _DDL.split(";"):  # executescript would COMMIT our transaction
                    if stmt.strip():
                        conn.execute(stmt)
                conn.execute("INSERT OR IGNORE INTO meta VALUES ('schema_version', ?)",
                             (str(SCHEMA_VERSION),))
            led._check_columns()  # a ledger from an older or edited file: refuse before writing
        except sqlite3.DatabaseError as exc:
            raise UserError(f"cannot open ledger: {_why(exc)}", path=p) from None
        except OSError as exc:
            raise UserError(f"cannot open ledger: {exc.strerror or exc}", path=p) from None
        return led

    @classmethod
    def open_readonly(cls, path: str | Path) -> Ledger:
        """For reading only (`moetune ledger`): no WAL switch, no schema, no lock, so a ledger
        someone hands over stays byte for byte as it was, with no side files left next to it.
        A `-wal` file beside it may hold records a running (or killed) tune has not checkpointed:
        then read through the WAL (`mode=ro`); without one the file is complete and is read as
        `immutable`, which creates nothing."""
        p = Path(path)
        last = ""
        wal = p.with_name(p.name + "-wal").exists()
        for flags in (("mode=ro", "immutable=1") if wal else ("immutable=1",)):
            try:
                conn = sqlite3.connect(f"{p.resolve().as_uri()}?{flags}", uri=True, timeout=30.0,
                                       isolation_level=None)
                conn.row_factory = sqlite3.Row
                names = {r[0] for r in conn.execute("SELECT name FROM sqlite_master")}
            except sqlite3.OperationalError as exc:
                last = str(exc)
                continue
            except sqlite3.DatabaseError as exc:
                raise UserError(f"not a readable ledger ({_why(exc)})", path=p) from None
            if not {"sessions", "runs", "decisions"} <= names:
                conn.close()
                raise UserError("is an SQLite database but not a moetune ledger (no sessions, "
                                "runs and decisions tables)", path=p)
            led = cls(conn, p)
            led._check_columns()
            return led
        raise UserError(f"cannot open the ledger read-only ({last})", path=p)

    def close(self) -> None:
        self.conn.close()

    def _check_columns(self) -> None:
        """A ledger someone hands over must have every column a record is read from."""
        for table, want in _columns().items():
            have = {r[1] for r in self._fetch(f"PRAGMA table_info({table})", (), tuple)}
            if missing := sorted(want - have):
                self.close()
                raise UserError(f"not a ledger moetune can read: table {table} lacks column(s) "
                                f"{', '.join(missing)}", path=self.path)

    def _fetch(self, sql: str, args: tuple, convert: Callable[[Any], Any]) -> list[Any]:
        """Rows of a query, each through `convert`; a damaged file or a record that does not
        parse (a JSON column edited by hand, a truncated copy) is a UserError naming the file."""
        try:
            return [convert(r) for r in self.conn.execute(sql, args).fetchall()]
        except sqlite3.DatabaseError as exc:
            raise UserError(f"not a readable ledger ({_why(exc)})", path=self.path) from None
        except ValueError as exc:  # json.JSONDecodeError and UnicodeDecodeError are ValueErrors
            raise UserError(f"not a readable ledger: a record's JSON does not parse ({exc})",
                            path=self.path) from None

    def __enter__(self) -> Ledger:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @contextmanager
    def _tx(self) -> Iterator[sqlite3.Connection]:
        """BEGIN IMMEDIATE … COMMIT, rolled back whole on any error."""
        try:
            self.conn.execute("BEGIN IMMEDIATE")
        except sqlite3.DatabaseError as exc:
            raise UserError(f"cannot write ledger: {_why(exc)}", path=self.path) from None
        try:
            yield self.conn
            self.conn.execute("COMMIT")
        except sqlite3.DatabaseError as exc:
            self._rollback()
            raise UserError(f"cannot write ledger: {_why(exc)}; nothing was lost, the last "
                            "complete record is kept", path=self.path) from None
        except BaseException:
            self._rollback()
            raise

    def _rollback(self) -> None:
        # SQLite may already have rolled back (SQLITE_FULL does): only roll back what is open
        if self.conn.in_transaction:
            self.conn.execute("ROLLBACK")

    # ---------------------------------------------------------------- sessions
    def session(self, session_id: str) -> dict[str, Any] | None:
        rows = self._fetch("SELECT * FROM sessions WHERE id = ?", (session_id,), _session_dict)
        return rows[0] if rows else None

    def start_session(self, session_id: str, *, command: list[str], env: Mapping[str, str],
                      contract: Any, options: Mapping[str, Any]) -> dict[str, Any]:
        """Create the session, or return the existing one of that id (a resumed tune)."""
        with self._tx() as c:
            c.execute(
                "INSERT OR IGNORE INTO sessions VALUES (?, ?, 'running', ?, ?, ?, ?)",
                (session_id, time.time(), _dumps(command), _dumps(dict(env)),
                 _dumps(contract) if contract is not None else None, _dumps(dict(options))),
            )
        s = self.session(session_id)
        assert s is not None
        return s

    def finish_session(self, session_id: str) -> None:
        with self._tx() as c:
            c.execute("UPDATE sessions SET state = 'done' WHERE id = ?", (session_id,))

    def sessions(self) -> list[dict[str, Any]]:
        return self._fetch("SELECT * FROM sessions ORDER BY created_at", (), _session_dict)

    # ---------------------------------------------------------------- runs
    def finished_run(self, session_id: str, key: str) -> dict[str, Any] | None:
        """The completed record under a key (done or failed), if any: it is never redone."""
        rows = self._fetch(
            "SELECT * FROM runs WHERE session = ? AND key = ? AND status IN ('done', 'failed') "
            "ORDER BY id DESC LIMIT 1", (session_id, key), _run_dict)
        return rows[0] if rows else None

    def begin_run(self, session_id: str, key: str, *, role: str, label: str,
                  command: list[str], env: Mapping[str, str], diff: Mapping[str, Any],
                  log_path: str) -> int:
        with self._tx() as c:
            stale = c.execute("SELECT COUNT(*) FROM runs WHERE session = ? AND key = ?",
                              (session_id, key)).fetchone()[0]
            c.execute("UPDATE runs SET status = 'interrupted', cause = 'interrupted' "
                      "WHERE session = ? AND key = ? AND status = 'running'", (session_id, key))
            cur = c.execute(
                "INSERT INTO runs (session, key, attempt, role, label, status, command, env, "
                "diff, log_path, started_at) VALUES (?, ?, ?, ?, ?, 'running', ?, ?, ?, ?, ?)",
                (session_id, key, stale + 1, role, label, _dumps(command), _dumps(dict(env)),
                 _dumps(diff), log_path, time.time()),
            )
            return int(cur.lastrowid or 0)

    def end_run(self, run_id: int, *, status: str, returncode: int | None, timed_out: bool,
                metrics: Mapping[str, Any] | None, cause: str | None, log_tail: str) -> None:
        with self._tx() as c:
            c.execute(
                "UPDATE runs SET status = ?, returncode = ?, timed_out = ?, metrics = ?, "
                "cause = ?, log_tail = ?, finished_at = ? WHERE id = ?",
                (status, returncode, int(timed_out), _dumps(metrics) if metrics else None, cause,
                 log_tail, time.time(), run_id),
            )

    def runs(self, session_id: str | None = None) -> list[dict[str, Any]]:
        q, args = "SELECT * FROM runs", ()
        if session_id:
            q, args = q + " WHERE session = ?", (session_id,)
        return self._fetch(q + " ORDER BY id", args, _run_dict)

    # ---------------------------------------------------------------- decisions
    def decision(self, session_id: str, key: str) -> dict[str, Any] | None:
        rows = self._fetch("SELECT * FROM decisions WHERE session = ? AND key = ?",
                           (session_id, key), _decision_dict)
        return rows[0] if rows else None

    def record_decision(self, session_id: str, key: str, *, label: str,
                        change: Mapping[str, Any], source: str | None,
                        predicted_gain: float | None, measured_gain: float | None,
                        noise: float | None, verdict: str, cause: str | None,
                        evidence: Mapping[str, Any]) -> None:
        with self._tx() as c:
            c.execute(
                "INSERT OR REPLACE INTO decisions (session, key, label, change, source, "
                "predicted_gain, measured_gain, noise, verdict, cause, evidence, created_at) "
                "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                (session_id, key, label, _dumps(dict(change)), source, predicted_gain,
                 measured_gain, noise, verdict, cause, _dumps(dict(evidence)), time.time()),
            )

    def decisions(self, session_id: str | None = None) -> list[dict[str, Any]]:
        q, args = "SELECT * FROM decisions", ()
        if session_id:
            q, args = q + " WHERE session = ?", (session_id,)
        return self._fetch(q + " ORDER BY id", args, _decision_dict)

    def document(self) -> dict[str, Any]:
        """Everything, as the JSON document `moetune ledger --json` prints
        (schemas/ledger.schema.json); a record that breaks the schema is a UserError naming it."""
        doc = {"schema": RUN_RECORD_SCHEMA_ID, "ledger": str(self.path),
               "sessions": self.sessions(), "runs": self.runs(), "decisions": self.decisions()}
        import jsonschema

        err = jsonschema.exceptions.best_match(_validator().iter_errors(doc))
        where = _record(doc, list(err.absolute_path)) if err is not None else None
        if err is not None:
            raise UserError(f"not a valid ledger: {where}: {err.message[:200]}", path=self.path)
        if (bad := _non_finite(doc)) is not None:
            raise UserError(f"not a valid ledger: {_record(doc, bad)}: not a finite number",
                            path=self.path)
        return doc


def _record(doc: Mapping[str, Any], at: list[Any]) -> str:
    """`runs id 7: metrics.step_ms` for a path into the document (records named by their id)."""
    if len(at) >= 2 and isinstance(at[1], int):
        rec = doc[at[0]][at[1]]
        rid = rec.get("id") if isinstance(rec, Mapping) else None
        rest = ".".join(map(str, at[2:]))
        return f"{at[0]} id {rid}" + (f": {rest}" if rest else "")
    return ".".join(map(str, at)) or "(top)"


def _non_finite(doc: Any) -> list[Any] | None:
    """Path of the first NaN/Infinity in the document (strict JSON has neither), or None."""
    stack: list[tuple[Any, list[Any]]] = [(doc, [])]
    while stack:
        node, at = stack.pop()
        if isinstance(node, float) and not math.isfinite(node):
            return at
        if isinstance(node, Mapping):
            stack.extend((v, [*at, k]) for k, v in node.items())
        elif isinstance(node, list):
            stack.extend((v, [*at, i]) for i, v in enumerate(node))
    return None


def _why(exc: sqlite3.DatabaseError) -> str:
    text = str(exc)
    if "full" in text:
        return "disk full (database or disk is full)"
    if "readonly" in text or "unable to open" in text:
        return f"path not writable ({text})"
    return text


def _session_dict(r: sqlite3.Row) -> dict[str, Any]:
    return {"id": r["id"], "created_at": r["created_at"], "state": r["state"],
            "command": _loads(r["command"]), "env": _loads(r["env"]),
            "contract": _loads(r["contract"]), "options": _loads(r["options"])}


def _run_dict(r: sqlite3.Row) -> dict[str, Any]:
    return {"id": r["id"], "session": r["session"], "key": r["key"], "attempt": r["attempt"],
            "role": r["role"], "label": r["label"], "status": r["status"],
            "command": _loads(r["command"]), "env": _loads(r["env"]), "diff": _loads(r["diff"]),
            "log_path": r["log_path"], "log_tail": r["log_tail"], "returncode": r["returncode"],
            "timed_out": bool(r["timed_out"]) if r["timed_out"] is not None else None,
            "metrics": _loads(r["metrics"]), "cause": r["cause"],
            "started_at": r["started_at"], "finished_at": r["finished_at"]}


def _decision_dict(r: sqlite3.Row) -> dict[str, Any]:
    return {"id": r["id"], "session": r["session"], "key": r["key"], "label": r["label"],
            "change": _loads(r["change"]), "source": r["source"],
            "predicted_gain": r["predicted_gain"], "measured_gain": r["measured_gain"],
            "noise": r["noise"], "verdict": r["verdict"], "cause": r["cause"],
            "evidence": _loads(r["evidence"]), "created_at": r["created_at"]}
