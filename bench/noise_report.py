"""Summarise `bench/gpu/noise.sh`'s logs: per run, the median and spread of the logged iteration
times (iterations 5 on: past warm-up); per point and mode (free / bound to the GPU's first CPUs),
the run medians and how far apart they lie.

    python bench/noise_report.py bench/grid/noise/noise_logs.tar.gz
"""

from __future__ import annotations

import statistics as st
import sys
import tarfile
from collections import defaultdict

import grid_spec as gs  # the grid's own reading of the workload's log lines (this folder)


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1:
        print("usage: python bench/noise_report.py NOISE_LOGS.tar.gz", file=sys.stderr)
        return 2
    try:
        with tarfile.open(args[0]) as tar:
            logs = {m.name.rsplit("/", 1)[-1]: tar.extractfile(m).read().decode()
                    for m in tar.getmembers() if m.isfile()}
    except (OSError, tarfile.TarError) as e:
        why = " ".join(str(e).split())  # tarfile lists each method it tried, a line each
        print(f"{args[0]}: not a readable tar archive ({why})", file=sys.stderr)
        return 2
    runs: dict[tuple[str, str], list[float]] = defaultdict(list)
    print(f"{'point':18} {'mode':5} run  median    p10    p90  cv")
    for name, text in sorted(logs.items()):
        if not name.endswith(".log") or name.count("__") != 2:
            continue
        point, mode, rep = name[:-4].split("__")
        times = gs.parse_log(text, 0)["iter_ms"][4:]
        if len(times) < 3:
            print(f"{point:18} {mode:5} {rep:>3}  too few iterations ({len(times)})")
            continue
        q = sorted(times)
        med = st.median(times)
        runs[point, mode].append(med)
        print(f"{point:18} {mode:5} {rep:>3} {med:7.1f} {q[len(q) // 10]:6.1f} "
              f"{q[9 * len(q) // 10]:6.1f} {st.pstdev(times) / st.mean(times):.2f}")
    print()
    for (point, mode), meds in sorted(runs.items()):
        print(f"{point:18} {mode:5} run medians {', '.join(f'{x:.1f}' for x in meds)} ms: "
              f"max/min {max(meds) / min(meds):.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
