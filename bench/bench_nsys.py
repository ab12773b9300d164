"""Time and peak memory of reading (and diagnosing) a large nsys export.

Builds the large export with make_large_nsys.py when it is missing, then runs each stage in a
fresh worker process so peak RSS is that stage's own (read alone; read + diagnose):

    python bench/bench_nsys.py --source fixtures/nsys/h200_eager_2steps.sqlite.gz   # ~1 GB from it
    python bench/bench_nsys.py                       # default --source: the full H200 export
    python bench/bench_nsys.py --large /tmp/big.sqlite --target-mb 2000 --json out.json

Target: read + diagnose of ~1 GB in < 30 s on 2 cores, memory bounded (see bench/README.md).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CORPUS = Path(os.environ.get("MOETUNE_CORPUS", ROOT.parent / "shared" / "corpus"))
DEFAULT_SOURCE = CORPUS / "made" / "h200_moe_eager_loop.nsys.sqlite.gz"
DEFAULT_LARGE = Path("/tmp/moetune-bench/large_nsys.sqlite")


def _watchdog(limit_mb: int) -> None:
    """Exit early (code 3) instead of letting a shared machine's OOM killer pick a victim."""

    def watch() -> None:
        while True:
            with open("/proc/self/statm") as fh:
                rss_mb = int(fh.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") // 2**20
            if rss_mb > limit_mb:
                print(json.dumps({"error": f"RSS above {limit_mb} MB, stopped"}), flush=True)
                os._exit(3)
            time.sleep(0.1)

    threading.Thread(target=watch, daemon=True).start()


def worker(stage: str, path: Path, limit_mb: int) -> dict:
    """One stage in this process; prints wall/CPU seconds and peak RSS."""
    sys.path.insert(0, str(ROOT))
    if Path("/proc/self/statm").exists():
        _watchdog(limit_mb)
    t0, c0 = time.perf_counter(), time.process_time()
    out: dict = {"stage": stage}
    if stage == "read":
        from moetune.analyzer.readers.nsys import read_nsys

        tr = read_nsys(path, first_rank=0)
        out["events"] = tr.events.height
        out["kernels"] = tr.events.filter(kind="kernel").height
        out["events_mb"] = round(tr.events.estimated_size() / 1e6)
    else:
        from moetune.analyzer.diagnose import diagnose

        # diagnose_core: walls/steps/observed only; diagnose: plus the timeline-graph sections
        doc = diagnose([path], sections=[]) if stage == "diagnose_core" else diagnose([path])
        out["steps"] = len(doc["steps"])
        out["dominant_wall"] = doc["dominant_wall"]
        out["walls"] = doc["walls"]
    out["wall_s"] = round(time.perf_counter() - t0, 2)
    out["cpu_s"] = round(time.process_time() - c0, 2)
    out["peak_rss_mb"] = round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024)
    # the reader's worker process for large exports (analyzer/readers/nsys_worker.py)
    out["worker_peak_rss_mb"] = round(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024)
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--source", type=Path, default=DEFAULT_SOURCE)
    ap.add_argument("--large", type=Path, default=DEFAULT_LARGE)
    ap.add_argument("--target-mb", type=float, default=1000.0)
    ap.add_argument("--stages", default="read,diagnose_core,diagnose",
                    help="comma list of read, diagnose_core (no timeline-graph sections), diagnose")
    ap.add_argument("--max-rss-mb", type=int, default=12_000,
                    help="stop a stage whose RSS passes this (protects a shared machine)")
    ap.add_argument("--ranks", type=int, default=8, help="simulated ranks when building")
    ap.add_argument("--json", type=Path, help="also write the results here")
    ap.add_argument("--worker", nargs=2, metavar=("STAGE", "FILE"), help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.worker:
        print(json.dumps(worker(args.worker[0], Path(args.worker[1]), args.max_rss_mb)))
        return 0
    results: dict = {"cores": os.cpu_count(), "load_avg_1m": round(os.getloadavg()[0], 2)}
    if not args.large.exists():
        sys.path.insert(0, str(ROOT / "bench"))
        from make_large_nsys import build

        args.large.parent.mkdir(parents=True, exist_ok=True)
        results["build"] = build(args.source, args.large, args.target_mb, args.ranks)
    results["file_mb"] = round(args.large.stat().st_size / 1e6, 1)
    for stage in args.stages.split(","):
        cmd = [sys.executable, __file__, "--worker", stage, str(args.large),
               "--max-rss-mb", str(args.max_rss_mb)]
        t0 = time.perf_counter()
        proc = subprocess.run(cmd, capture_output=True, text=True, check=False)
        lines = proc.stdout.strip().splitlines()
        if proc.returncode != 0 or not lines:
            results[stage] = {"error": (lines[-1:] or proc.stderr.strip().splitlines()[-1:] or
                                        [f"exit {proc.returncode}"])[0],
                              "after_s": round(time.perf_counter() - t0, 1)}
            continue
        results[stage] = json.loads(lines[-1])
    text = json.dumps(results, indent=2)
    print(text)
    if args.json:
        args.json.write_text(text + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
