"""Build a large synthetic nsys export by replicating the steps of a real one (all in SQL).

The step window of the source export (its NVTX `iteration N` ranges) is copied N times, every
activity row shifted by whole windows in time and by whole id ranges in correlationId, so
launches still pair with their kernels. Copies are dealt round-robin to `--ranks` simulated
ranks (pid + r in globalPid/globalTid, deviceId + r), as in a multi-process capture of one node.
Each copy's window becomes ONE step (`iteration k`, the source's iterations merged), so the shape
is a few long steps per rank with tens of thousands of kernels each, like a real Megatron
profile, rather than a thousand tiny steps. Rows outside the window (warm-up) stay once.

    python bench/make_large_nsys.py fixtures/nsys/h200_eager_2steps.sqlite.gz \
        /tmp/large.sqlite --target-mb 1000 --ranks 8

Never commit the output.
"""

from __future__ import annotations

import argparse
import gzip
import shutil
import sqlite3
import sys
import time
from pathlib import Path

# Time-ordered activity tables and the id columns shifted per copy.
TABLES = {
    "CUPTI_ACTIVITY_KIND_KERNEL": ("correlationId",),
    "CUPTI_ACTIVITY_KIND_RUNTIME": ("correlationId",),
    "CUPTI_ACTIVITY_KIND_MEMCPY": ("correlationId",),
    "CUPTI_ACTIVITY_KIND_MEMSET": ("correlationId",),
    "CUPTI_ACTIVITY_KIND_SYNCHRONIZATION": ("correlationId",),
    "CUPTI_ACTIVITY_KIND_GRAPH_TRACE": ("correlationId",),
    "NVTX_EVENTS": (),
}
STEP = r"iteration %"


def _columns(conn: sqlite3.Connection, table: str) -> list[str]:
    return [r[1] for r in conn.execute(f'PRAGMA table_info("{table}")')]


def _window(conn: sqlite3.Connection) -> tuple[int, int, int]:
    """(start, end, steps) of the source's iteration ranges."""
    row = conn.execute(
        "SELECT min(start), max(\"end\"), count(*) FROM NVTX_EVENTS WHERE text LIKE ?", (STEP,)
    ).fetchone()
    if not row or row[2] == 0:
        sys.exit("source export has no NVTX 'iteration N' ranges to replicate")
    return int(row[0]), int(row[1]), int(row[2])


def _add_step(conn: sqlite3.Connection, n: int, start: int, end: int, gtid: int) -> None:
    """One NVTX push/pop range `iteration n` (eventType 59) on the source's iteration thread."""
    conn.execute(
        'INSERT INTO NVTX_EVENTS (start, "end", eventType, text, globalTid) VALUES (?, ?, 59, ?, ?)',
        (start, end, f"iteration {n}", gtid),
    )


def build(src: Path, out: Path, target_mb: float, ranks: int = 8) -> dict:
    t0 = time.perf_counter()
    if out.exists():
        out.unlink()
    opener = gzip.open if src.read_bytes()[:2] == b"\x1f\x8b" else open
    with opener(src, "rb") as fin, out.open("wb") as fout:
        shutil.copyfileobj(fin, fout, length=4 << 20)
    conn = sqlite3.connect(out)
    conn.execute("PRAGMA journal_mode=OFF")
    conn.execute("PRAGMA synchronous=OFF")
    start, end, _ = _window(conn)
    kernels = conn.execute(
        f"SELECT count(*) FROM CUPTI_ACTIVITY_KIND_KERNEL WHERE start >= {start} AND start < {end}"
    ).fetchone()[0]  # per merged step
    span = end - start + 1
    present = {r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type='table'")}
    tables = {t: ids for t, ids in TABLES.items() if t in present}
    corr_span = 1 + max(
        conn.execute(f"SELECT coalesce(max(correlationId), 0) FROM {t}").fetchone()[0]
        for t, ids in tables.items() if ids
    )
    base_mb = out.stat().st_size / 1e6
    in_window = sum(
        conn.execute(f'SELECT count(*) FROM "{t}" WHERE start >= ? AND start < ?', (start, end))
        .fetchone()[0]
        for t in tables
    )
    total = sum(conn.execute(f'SELECT count(*) FROM "{t}"').fetchone()[0] for t in tables)
    # File size grows about in proportion to the activity rows copied.
    copies = max(1, round((target_mb / base_mb - 1) * total / max(in_window, 1)))
    # Copies go after everything in the source, so they never interleave with its teardown rows.
    last = max(
        conn.execute(f'SELECT coalesce(max(coalesce("end", start)), 0) FROM "{t}"').fetchone()[0]
        for t in tables
    )
    shift0 = last - start + 1
    iter_tid = conn.execute(
        "SELECT globalTid FROM NVTX_EVENTS WHERE text LIKE ? LIMIT 1", (STEP,)
    ).fetchone()[0]
    # The source's own iterations become one step too (`iteration 0`, rank 0 only).
    conn.execute("DELETE FROM NVTX_EVENTS WHERE text LIKE ?", (STEP,))
    _add_step(conn, 0, start, end, iter_tid)
    for j in range(copies):
        k = j + 1  # correlation block (0 is the source's)
        r, slot = j % ranks, j // ranks
        dt = shift0 + slot * span  # every rank's copy `slot` runs at the same time
        dpid = r << 24  # pid + r inside globalPid / globalTid
        for table, ids in tables.items():
            cols = _columns(conn, table)
            sel = []
            for c in cols:
                if c in ("start", "end"):
                    sel.append(f'"{c}" + {dt}')
                elif c in ids:
                    sel.append(f'"{c}" + {k * corr_span}')
                elif c in ("globalPid", "globalTid", "endGlobalTid"):
                    sel.append(f'"{c}" + {dpid}')
                elif c == "deviceId":
                    sel.append(f'"{c}" + {r}')
                else:
                    sel.append(f'"{c}"')
            quoted = ", ".join(f'"{c}"' for c in cols)
            # Only the source's rows fall in [start, end): copies lie after `last`.
            conn.execute(
                f'INSERT INTO "{table}" ({quoted}) SELECT {", ".join(sel)} FROM "{table}" '
                f"WHERE start >= {start} AND start < {end}"
            )
        _add_step(conn, slot + 1, start + dt, end + dt, iter_tid + dpid)
        conn.commit()
    conn.close()
    return {
        "source": str(src),
        "output": str(out),
        "copies": copies,
        "ranks": ranks,
        "steps_per_rank": -(-copies // ranks),
        "kernels_per_step": kernels,
        "mb": round(out.stat().st_size / 1e6, 1),
        "build_s": round(time.perf_counter() - t0, 1),
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("source", type=Path, help="real nsys export (.sqlite or .sqlite.gz) with NVTX 'iteration N' ranges")
    ap.add_argument("output", type=Path, help="where to write the large .sqlite")
    ap.add_argument("--target-mb", type=float, default=1000.0)
    ap.add_argument("--ranks", type=int, default=8, help="simulated ranks the copies are dealt to")
    args = ap.parse_args(argv)
    print(build(args.source, args.output, args.target_mb, max(1, args.ranks)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
