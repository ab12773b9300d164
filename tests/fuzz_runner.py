"""Run `moetune.cli.main(argv)` in a long-lived worker process, one case at a time, under a
wall-clock limit (tests/test_fuzz.py).

A worker process, not `signal.alarm`: a hang inside native code (polars, SQLite, the C scanner) never
returns to the interpreter to see an alarm, and a stack overflow or an out-of-memory kill must be
reported as a finding, not take the test process down. The worker imports moetune once (spawn, not
fork: polars' thread pool does not survive a fork) and is restarted only after a hang or a crash.
"""

from __future__ import annotations

import contextlib
import io
import multiprocessing as mp
import traceback
from dataclasses import dataclass
from multiprocessing.connection import Connection

# An address-space cap: a mutated size that makes the product allocate without bound is a finding
# (MemoryError, reported as an escaped exception), not a machine brought down. Generous, because
# polars' and SQLite's threads reserve virtual memory they never touch.
ADDRESS_SPACE_BYTES = 8 << 30


@dataclass(frozen=True, slots=True)
class Outcome:
    """What one CLI invocation did. `crash` names a hang, a dead worker or an escaped exception."""

    rc: int | None
    stdout: str
    stderr: str
    crash: str | None = None


def _serve(conn: Connection) -> None:
    """Worker loop: receive argv lists, run the CLI in-process, send back an `Outcome` tuple."""
    import resource

    _soft, hard = resource.getrlimit(resource.RLIMIT_AS)
    cap = ADDRESS_SPACE_BYTES if hard == resource.RLIM_INFINITY else min(hard, ADDRESS_SPACE_BYTES)
    resource.setrlimit(resource.RLIMIT_AS, (cap, hard))
    from moetune.cli import main

    while True:
        try:
            argv = conn.recv()
        except EOFError:
            return
        if argv is None:
            return
        out, err = io.StringIO(), io.StringIO()
        rc: int | None = None
        crash = None
        try:
            with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
                rc = main(argv)
        except SystemExit as exc:  # argparse's own exit (usage errors): a code, not an escape
            rc = exc.code if isinstance(exc.code, int) else 2
        except BaseException:
            crash = "exception escaped main():\n" + traceback.format_exc(limit=-12)
        conn.send((rc, out.getvalue(), err.getvalue(), crash))


class Runner:
    """One worker process; `run(argv, timeout)` gives the `Outcome` and never raises for the
    product's sake (hangs and crashes come back as `Outcome.crash`)."""

    def __init__(self) -> None:
        self._ctx = mp.get_context("spawn")
        self._proc: mp.process.BaseProcess | None = None
        self._conn: Connection | None = None

    def _start(self) -> None:
        parent, child = self._ctx.Pipe()
        self._proc = self._ctx.Process(target=_serve, args=(child,), daemon=True)
        self._proc.start()
        child.close()
        self._conn = parent

    def _kill(self) -> None:
        if self._proc is not None:
            self._proc.kill()
            self._proc.join(10)
        if self._conn is not None:
            self._conn.close()
        self._proc = self._conn = None

    def run(self, argv: list[str], timeout: float) -> Outcome:
        if self._proc is None or not self._proc.is_alive():
            self._kill()
            self._start()
        assert self._conn is not None and self._proc is not None
        self._conn.send(list(argv))
        if not self._conn.poll(timeout):
            self._kill()
            return Outcome(None, "", "", f"hang: no answer within {timeout:g} s")
        try:
            rc, out, err, crash = self._conn.recv()
        except (EOFError, ConnectionResetError):
            self._proc.join(10)
            code = self._proc.exitcode
            self._kill()
            return Outcome(None, "", "", f"worker died (exit code {code}: a crash or an OOM kill)")
        return Outcome(rc, out, err, crash)

    def close(self) -> None:
        if self._conn is not None and self._proc is not None and self._proc.is_alive():
            with contextlib.suppress(OSError):
                self._conn.send(None)
            self._proc.join(10)
        self._kill()
