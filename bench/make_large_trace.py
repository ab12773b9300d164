"""Replicate a real Kineto trace N times along time to make a bigger, still realistic trace.

    python bench/make_large_trace.py SRC.json.gz N OUT.json [--gz]

Copy i (0-based) of every timed event is shifted by i × (span + 1 ms), `ProfilerStep#K` becomes
`ProfilerStep#(K + i × steps)`, and the ids that link events (`correlation`, `External id`, the
Stream-Wait-Event record correlation and flow `id`) are offset by i × (their max + 1), so links
stay one-to-one across copies. Metadata rows (`ph: M`) and the top-level keys are kept once; the
profiler span (`cat: Trace`) is stretched to cover all copies; `Record Window End` is emitted once,
at the end. Used by bench/bench_kineto.py for the linearity rows.
"""

from __future__ import annotations

import argparse
import gzip
import json
import re
import sys
from pathlib import Path
from typing import Any

import msgspec

STEP = re.compile(r"^ProfilerStep#(\d+)$")
ID_ARGS = ("correlation", "External id", "wait_on_cuda_event_record_corr_id")


def load(path: Path) -> dict[str, Any]:
    raw = path.read_bytes()
    if raw[:2] == b"\x1f\x8b":
        raw = gzip.decompress(raw)
    return msgspec.json.decode(raw)


def replicate(doc: dict[str, Any], n: int) -> dict[str, Any]:
    events = doc["traceEvents"]
    timed = [e for e in events if e.get("ph") != "M" and isinstance(e.get("ts"), int | float)]
    t0 = min(e["ts"] for e in timed)
    t1 = max(
        e["ts"] + (e.get("dur") or 0) for e in timed if isinstance(e.get("dur") or 0, int | float)
    )
    shift = int(t1 - t0) + 1000  # whole µs keeps integer-µs traces integer
    steps = [int(m.group(1)) for e in timed if (m := STEP.match(str(e.get("name", ""))))]
    nsteps = (max(steps) - min(steps) + 1) if steps else 0
    max_id = 0
    for e in timed:
        a = e.get("args") or {}
        for k in ID_ARGS:
            if isinstance(a.get(k), int):
                max_id = max(max_id, a[k])
        if isinstance(e.get("id"), int):
            max_id = max(max_id, e["id"])
    id_step = max_id + 1

    out: list[dict[str, Any]] = [e for e in events if e.get("ph") == "M"]
    window_end = None
    for i in range(n):
        dt, did = i * shift, i * id_step
        for e in timed:
            if e.get("cat") == "Trace":
                if i == 0:
                    out.append({**e, "dur": e.get("dur", 0) + (n - 1) * shift})
                continue
            if str(e.get("name", "")).startswith("Iteration Start") and i:
                continue
            if e.get("name") == "Record Window End":
                window_end = e
                continue
            c = dict(e)
            ts = e["ts"] + dt
            c["ts"] = round(ts, 3) if isinstance(ts, float) else ts
            if did:
                if isinstance(c.get("id"), int):
                    c["id"] = c["id"] + did
                a = c.get("args")
                if a:
                    a = dict(a)
                    for k in ID_ARGS:
                        if isinstance(a.get(k), int):
                            a[k] = a[k] + did
                    c["args"] = a
            if nsteps and (m := STEP.match(str(c.get("name", "")))):
                c["name"] = f"ProfilerStep#{int(m.group(1)) + i * nsteps}"
            out.append(c)
    if window_end is not None:
        out.append({**window_end, "ts": window_end["ts"] + (n - 1) * shift})
    return {**{k: v for k, v in doc.items() if k != "traceEvents"}, "traceEvents": out}


def dump(doc: dict[str, Any]) -> bytes:
    """Kineto's own layout (`", "` / `": "` separators, one event per line), so MB/s compare
    across scales; a compact encoder's output would hold ~20% fewer bytes per event."""
    head = {k: v for k, v in doc.items() if k != "traceEvents"}
    parts = [json.dumps(head)[:-1], ', "traceEvents": [\n  ']
    parts.append(",\n  ".join(json.dumps(e, ensure_ascii=False) for e in doc["traceEvents"]))
    parts.append("\n]}\n")
    return "".join(parts).encode()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("src", type=Path)
    ap.add_argument("n", type=int)
    ap.add_argument("out", type=Path)
    ap.add_argument("--gz", action="store_true", help="also write OUT.gz")
    args = ap.parse_args(argv)
    doc = replicate(load(args.src), args.n)
    data = dump(doc)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_bytes(data)
    if args.gz:
        Path(f"{args.out}.gz").write_bytes(gzip.compress(data, compresslevel=6))
    print(
        f"{args.out}: {len(data) / 1e6:.1f} MB, {len(doc['traceEvents'])} events", file=sys.stderr
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
