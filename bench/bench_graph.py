"""Timeline-graph build and critical-path time on 1×/4×/16× a real trace.

The trace is read once; N× copies are tiled in time on the same rank (each copy shifted by the
trace span and its correlation / external ids offset, so launches, syncs and waits link only
within their copy). Times are wall seconds of `build_graph` and of `critical_path_section`
(given that graph), best of `--repeat`. Peak RSS comes from `resource` (whole process).

    python bench/bench_graph.py [TRACE] [--factors 1 4 16] [--repeat 1]

Default trace: `hta_a100_alltoall_rank3of8.json.gz` of the trace corpus beside the checkout (bench/README.md,
"Inputs"), a copy of HTA's `tests/data/trace_diff/control/control.json.gz`; any Kineto trace can be
given instead.
"""

from __future__ import annotations

import argparse
import resource
import sys
import time
import warnings
from pathlib import Path

import polars as pl

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from moetune.analyzer.critical_path import critical_path_section  # noqa: E402
from moetune.analyzer.frames import Trace  # noqa: E402
from moetune.analyzer.graph import build_graph  # noqa: E402
from moetune.analyzer.readers import load_trace  # noqa: E402
from moetune.analyzer.steps import find_steps  # noqa: E402

DEFAULT = ROOT.parent / "shared/corpus/public/kineto/hta_a100_alltoall_rank3of8.json.gz"


def tile(trace: Trace, n: int) -> Trace:
    """`n` copies of the trace back to back in time on the same rank."""
    ev = trace.events
    span = int((ev["ts_ns"] + ev["dur_ns"]).max() - ev["ts_ns"].min()) + 1_000_000
    corr = int(ev["correlation"].max() or 0) + 1
    ext = int(ev["external_id"].max() or 0) + 1
    shift = lambda c, k, by: pl.col(c) + k * by  # noqa: E731

    def copy(df: pl.DataFrame, k: int, cols: dict[str, int]) -> pl.DataFrame:
        present = {c: by for c, by in cols.items() if c in df.columns}
        out = df.with_columns(*[shift(c, k, by) for c, by in present.items()])
        if "name" in df.columns:  # ProfilerStep#N → #(N + k·100000): distinct steps per copy
            n = pl.col("name").str.extract(r"^ProfilerStep#(\d+)$", 1).cast(pl.Int64)
            out = out.with_columns(name=pl.when(n.is_not_null()).then(
                pl.format("ProfilerStep#{}", n + k * 100_000)).otherwise(pl.col("name")))
        return out

    evc = {"ts_ns": span, "correlation": corr, "external_id": ext, "wait_correlation": corr}
    cmc = {"ts_ns": span, "correlation": corr, "external_id": ext}
    return Trace(
        events=pl.concat([copy(ev, k, evc) for k in range(n)]),
        comms=pl.concat([copy(trace.comms, k, cmc) for k in range(n)]),
        ranks=trace.ranks,
    )


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("trace", nargs="?", default=str(DEFAULT))
    ap.add_argument("--factors", type=int, nargs="+", default=[1, 4, 16])
    ap.add_argument("--repeat", type=int, default=1)
    a = ap.parse_args()
    warnings.filterwarnings("ignore")
    base = load_trace([a.trace])
    print(f"trace {Path(a.trace).name}: {base.events.height:,} events")
    print("factor | events | graph nodes | edges | aggregated | build s | critical path s | steps")
    print("---:|---:|---:|---:|:---:|---:|---:|---:")
    for n in a.factors:
        tr = tile(base, n)
        steps = find_steps(tr.events).table
        lo, hi = int(steps["win_start_ns"].min()), int(steps["win_end_ns"].max())
        build = cp = float("inf")
        for _ in range(a.repeat):
            t0 = time.perf_counter()
            g = build_graph(tr, window=(lo, hi))
            t1 = time.perf_counter()
            critical_path_section(tr, steps, graph=g)
            t2 = time.perf_counter()
            build, cp = min(build, t1 - t0), min(cp, t2 - t1)
        print(f"{n}× | {tr.events.height:,} | {g.n_nodes:,} | "
              f"{g.n_edges:,} | {'yes' if g.aggregated else 'no'} | {build:.2f} | "
              f"{cp:.2f} | {steps.height}")
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(f"peak RSS {rss:.0f} MiB")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
