"""A progress line on stderr for long reads: shown only on a terminal, only after a second.

Readers do not report how far they are, so the line says what is being read (files, size) and
how long it has taken, refreshed four times a second, and is erased when the work ends. Never on
stdout (so `--json` stays clean), never when stderr is a pipe or a file (logs stay clean).
"""

from __future__ import annotations

import sys
import threading
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import TextIO

DELAY_S = 1.0
TICK_S = 0.25
SPIN = "|/-\\"


def describe(paths: Sequence[str | Path]) -> str:
    """'2 files, 1.1 MB' for the trace files `paths` name (directories expanded as the readers
    do); the paths alone when they cannot be listed (the read itself then says why)."""
    from moetune.analyzer.readers import expand
    from moetune.errors import UserError

    try:
        files = expand(paths)
        size = sum(f.stat().st_size for f in files)
    except (UserError, OSError):
        return " ".join(map(str, paths))
    return f"{len(files)} file{'s' if len(files) != 1 else ''}, {size / 1e6:,.1f} MB"


@contextmanager
def progress(label: str, *, enabled: bool = True, stream: TextIO | None = None,
             delay_s: float | None = None) -> Iterator[None]:
    """While the body runs: after `delay_s` (default `DELAY_S`), `label … 3.2 s` on stderr, if
    it is a terminal."""
    err = stream or sys.stderr
    delay = DELAY_S if delay_s is None else delay_s
    if not enabled or not getattr(err, "isatty", lambda: False)():
        yield
        return
    done = threading.Event()
    shown = threading.Event()
    start = time.monotonic()

    def tick() -> None:
        if done.wait(delay):
            return
        i = 0
        while not done.is_set():
            err.write(f"\r{SPIN[i % len(SPIN)]} {label} … {time.monotonic() - start:,.1f} s ")
            err.flush()
            shown.set()
            i += 1
            done.wait(TICK_S)

    t = threading.Thread(target=tick, name="moetune-progress", daemon=True)
    t.start()
    try:
        yield
    finally:
        done.set()
        t.join()
        if shown.is_set():
            err.write("\r\033[K")  # erase the line
            err.flush()
