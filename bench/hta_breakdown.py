"""HTA side of the benchmark: parse one trace directory and run the temporal breakdown.

    bench/.venv-hta/bin/python bench/hta_breakdown.py TRACE_DIR

Runs in HTA's own venv (bench_kineto.py creates it); prints one JSON object on stdout:
parse_s (TraceAnalysis construction = parsing), breakdown_s, and per-rank idle / compute /
non-compute / kernel time in µs as HTA's `get_temporal_breakdown()` reports them.
"""

from __future__ import annotations

import json
import logging
import sys
import time


def main() -> int:
    trace_dir = sys.argv[1]
    logging.disable(logging.WARNING)  # HTA logs per-file progress at INFO/WARNING
    t0 = time.perf_counter()
    from hta.trace_analysis import TraceAnalysis

    t1 = time.perf_counter()
    analysis = TraceAnalysis(trace_dir=trace_dir)
    t2 = time.perf_counter()
    df = analysis.get_temporal_breakdown(visualize=False)
    t3 = time.perf_counter()
    rows = [
        {
            "rank": int(r["rank"]),
            "idle_us": float(r["idle_time(us)"]),
            "compute_us": float(r["compute_time(us)"]),
            "non_compute_us": float(r["non_compute_time(us)"]),
            "kernel_us": float(r["kernel_time(us)"]),
        }
        for r in df.to_dict("records")
    ]
    out = {"import_s": t1 - t0, "parse_s": t2 - t1, "breakdown_s": t3 - t2, "ranks": rows}
    print(json.dumps(out))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
