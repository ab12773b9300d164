"""The phases, rank_breakdown and throughput sections' own cost against the whole diagnosis, side
by side: each repeat reads the trace, diagnoses it with every section, and diagnoses it again
without those two sections (the order alternates between repeats); the sections' own time is
measured inside the full run (their `diagnose.Section` functions timed), and the difference of
the two runs checks it.

    python bench/bench_phases.py TRACE... [--repeat 3] [--json out.json]

Also the whole process a user waits for (`python -m moetune diagnose --json TRACE` in a fresh
interpreter: start-up, imports, read, every section, the JSON), the fastest of `--repeat` runs,
and the sections' share of it.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("traces", nargs="+", type=Path)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--json", type=Path)
    a = ap.parse_args(argv)
    from moetune.analyzer import diagnose as diag
    from moetune.analyzer.readers import load_trace

    names = ("phases", "throughput")
    mine = [s for s in diag.SECTIONS if s[0] in names]
    rest = [s for s in diag.SECTIONS if s[0] not in names]
    spent = [0.0]

    def timed(fn):
        def run(*args, **kw):
            t = time.perf_counter()
            try:
                return fn(*args, **kw)
            finally:
                spent[0] += time.perf_counter() - t
        return run

    full = rest + [(n, timed(f)) for n, f in mine]
    rows = []
    for path in a.traces:
        read_s, full_s, without_s, section_s = [], [], [], []
        for i in range(a.repeat):
            t0 = time.perf_counter()
            trace = load_trace([path])
            read_s.append(time.perf_counter() - t0)
            runs = [("full", full), ("without", rest)]
            for kind, sections in (runs if i % 2 == 0 else runs[::-1]):
                spent[0] = 0.0
                t = time.perf_counter()
                diag.diagnose_trace(trace, files=[path], sections=sections)
                d = time.perf_counter() - t
                if kind == "full":
                    full_s.append(d)
                    section_s.append(spent[0])
                else:
                    without_s.append(d)
            del trace
        r, f, w, s = (statistics.median(x) for x in (read_s, full_s, without_s, section_s))
        proc = []
        for _ in range(a.repeat):
            t = time.perf_counter()
            subprocess.run([sys.executable, "-m", "moetune", "diagnose", "--json", str(path)],
                           check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            proc.append(time.perf_counter() - t)
        pr = min(proc)
        row = {"trace": path.name, "bytes": path.stat().st_size if path.is_file() else None,
               "read_s": r, "diagnose_s": f, "without_s": w, "sections_s": s,
               "whole_s": r + f, "share": s / (r + f), "difference_s": f - w,
               "process_s": pr, "process_share": s / pr}
        rows.append(row)
        print(f"{path.name}: read + diagnose {r + f:.3f} s (read {r:.3f}); phases + throughput "
              f"{s:.3f} s = {s / (r + f):.1%} of it (full − without: {f - w:+.3f} s); whole "
              f"process {pr:.3f} s: {s / pr:.1%}", flush=True)
    if a.json:
        a.json.write_text(json.dumps(rows, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
