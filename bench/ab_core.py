"""A/B of `diagnose` between two checkouts, interleaved so both see the same machine load.

    git worktree add /tmp/base <commit>          # the other side (build its extension too:
    cp analyzer/readers/*.so /tmp/base/analyzer/readers/   # or `pip install -e` there)
    python bench/ab_core.py --base /tmp/base TRACE [TRACE ...] [--repeat 5] [--rounds 3] [--full]
    python bench/ab_core.py --queries TRACE [...] [--base DIR]   # polars queries per diagnosis

Each round starts one fresh process per side; a process diagnoses the trace once (warm-up, not
counted) and then `--repeat` times. Best and median of all counted runs are printed (seconds of
wall time). `--full` adds the timeline-graph sections; without it the scope is `core` (read +
classify + steps + walls + observed), as in bench_kineto.py. `--queries` counts the polars
queries (eager and lazy collects) of one diagnosis by module: the fixed cost of a small trace is
~0.1–0.2 ms per query.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

CHILD = r"""
import json, sys, time
sys.path.insert(0, sys.argv[1])
from pathlib import Path
import moetune.analyzer.ranks, analyzer.readers.kineto  # imports outside the clock
from moetune.analyzer.diagnose import diagnose
paths, sections = [Path(sys.argv[2])], (None if sys.argv[4] == "full" else [])
diagnose(paths, sections=sections)
times = []
for _ in range(int(sys.argv[3])):
    t = time.perf_counter()
    diagnose(paths, sections=sections)
    times.append(time.perf_counter() - t)
print(json.dumps(times))
"""

QUERIES = r"""
import collections, json, sys, traceback
sys.path.insert(0, sys.argv[1])
from pathlib import Path
import polars as pl
from moetune.analyzer.diagnose import diagnose
paths, sections = [Path(sys.argv[2])], (None if sys.argv[3] == "full" else [])
diagnose(paths, sections=sections)
count = collections.Counter()
def counted(fn):
    def wrapper(self, *a, **k):
        where = next((f"{Path(f.filename).stem}.{f.name}" for f in reversed(traceback.extract_stack()[:-1])
                      if "/analyzer/" in f.filename), "?")
        count[where] += 1
        return fn(self, *a, **k)
    return wrapper
pl.LazyFrame._collect_eager = counted(pl.LazyFrame._collect_eager)
pl.LazyFrame.collect = counted(pl.LazyFrame.collect)
diagnose(paths, sections=sections)
print(json.dumps(dict(count)))
"""


def run(code: str, *args: str) -> object:
    out = subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True,
                         check=True)
    return json.loads(out.stdout)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("traces", nargs="+", type=Path)
    ap.add_argument("--base", type=Path, help="the other checkout (e.g. a git worktree)")
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--full", action="store_true", help="with the timeline-graph sections")
    ap.add_argument("--queries", action="store_true", help="count polars queries instead")
    args = ap.parse_args()
    scope = "full" if args.full else "core"
    for trace in args.traces:
        sides = {"base": args.base.resolve()} if args.base else {}
        sides["this"] = ROOT
        if args.queries:
            for name, root in sides.items():
                count = run(QUERIES, str(root), str(trace), scope)
                top = sorted(count.items(), key=lambda kv: -kv[1])[:8]
                print(f"{trace.name} ({scope}, {name}): {sum(count.values())} queries; "
                      + ", ".join(f"{k} {v}" for k, v in top))
            continue
        if args.base is None:
            ap.error("--base is needed for an A/B (or use --queries)")
        times: dict[str, list[float]] = {k: [] for k in sides}
        for _ in range(args.rounds):
            for name, root in sides.items():
                times[name] += run(CHILD, str(root), str(trace), str(args.repeat), scope)
        print(f"{trace.name} ({scope}): " + " · ".join(
            f"{k} best {min(v):.3f} s, median {statistics.median(v):.3f} s"
            for k, v in times.items()))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
