"""A/B of the whole program, as users run it: `python -m moetune diagnose --json FILE`.

    python bench/ab_whole.py --base DIR FILE [--rounds 2]

Each side runs from its own tree with PYTHONPATH (`--base DIR` is the other copy, e.g. `git
archive <commit> | tar -x -C DIR`; a copy needs `moetune/analyzer`, `rules`, `executor` and
`schemas` linked into its `moetune/` as `analyzer -> ../analyzer` …, and its built extensions,
since the editable install maps those packages to this checkout). Sides alternate, one fresh
process each per round. Per side: median / best wall s, peak RSS as `ru_maxrss` from `wait4` (the
largest process of the tree, the nsys reader's worker included) and as the tree's summed RSS
sampled every 10 ms (`bench_kineto.measure`), CPU s of the tree, and the digest of every document (they must be equal).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

from bench_kineto import measure  # one process measurement for every bench (this folder)

ROOT = Path(__file__).resolve().parents[1]


def run_once(root: Path, trace: Path) -> tuple[float, float, float, float, str]:
    """(wall s, ru_maxrss MB, tree peak MB, CPU s, document digest) of one fresh process; run
    outside the checkout, where `-m` would put this tree's `moetune/` folder first on the path."""
    try:
        got = measure([sys.executable, "-m", "moetune", "diagnose", "--json", str(trace.resolve())],
                      parse=False, env=dict(os.environ, PYTHONPATH=str(root)),
                      cwd=Path(tempfile.gettempdir()))
    except RuntimeError as e:  # the failed run's own message, one line per line it wrote
        print(f"{root}: {str(e).splitlines()[-1]}", file=sys.stderr)
        raise SystemExit(2) from None
    return (got["process_wall_s"], got["maxrss_mb"], got["tree_peak_mb"], got["cpu_s"],
            got["stdout_sha256"][:12])


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("trace", type=Path)
    ap.add_argument("--base", type=Path, required=True, help="the other tree")
    ap.add_argument("--rounds", type=int, default=2)
    args = ap.parse_args()
    sides = {"base": args.base.resolve(), "this": ROOT}
    runs: dict[str, list[tuple[float, float, float, float, str]]] = {k: [] for k in sides}
    load = lambda: " ".join(Path("/proc/loadavg").read_text().split()[:3])  # noqa: E731
    print(f"{time.strftime('%H:%M', time.gmtime())} UTC, load average {load()}")
    for r in range(args.rounds):
        for name in (list(sides) if r % 2 == 0 else list(sides)[::-1]):
            got = run_once(sides[name], args.trace)
            runs[name].append(got)
            print(f"  {name}: {got[0]:.2f} s, ru_maxrss {got[1]:,.0f} MB, tree {got[2]:,.0f} MB, "
                  f"CPU {got[3]:.1f} s, {got[4]}", flush=True)
    print(f"{time.strftime('%H:%M', time.gmtime())} UTC, load average {load()}")
    mb = args.trace.stat().st_size / 1e6
    for name, v in runs.items():
        wall = [x[0] for x in v]
        print(f"{name}: median {statistics.median(wall):.2f} s, best {min(wall):.2f} s, "
              f"{mb / statistics.median(wall):.0f} MB/s, ru_maxrss median "
              f"{statistics.median(x[1] for x in v):,.0f} MB, tree peak median "
              f"{statistics.median(x[2] for x in v):,.0f} MB, CPU median "
              f"{statistics.median(x[3] for x in v):.1f} s, documents {sorted({x[4] for x in v})}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
