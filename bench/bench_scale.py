"""The many-ranks path (`moetune.scale`, docs/scale.md) on a job directory: a first run that
summarises every rank on a local Dask cluster, then a second run served from the summaries.

    python bench/make_rank_job.py /work/scratch/job512 --ranks 512     # the synthetic job
    python bench/bench_scale.py /work/scratch/job512 [--cache DIR] [--workers N] [--json]

Each run is `moetune diagnose JOB --cache DIR --json` in its own process; its process tree
(the client, which hosts the LocalCluster's scheduler and nannies, and the worker processes) is
sampled with psutil every 50 ms for the peak resident memory of every process. Printed: wall
time of both runs, the cached run's share of the first, ranks per minute per core, and the peak
RSS of each process. The cache directory starts empty (a fresh temporary one unless given);
the job directory is only read. With the job's `truth.json` (bench/make_rank_job.py), the
reduce's answers are set beside the truth: straggler, overloaded EP rank, clock offsets.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import psutil

SAMPLE_S = 0.05


def run_sampled(cmd: list[str]) -> tuple[float, dict[str, int], str, int]:
    """(wall seconds, peak RSS per process label, stdout, exit code) of `cmd`."""
    t0 = time.perf_counter()
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    peaks: dict[int, tuple[str, int]] = {}
    done = threading.Event()

    def sample() -> None:
        try:
            root = psutil.Process(proc.pid)
        except psutil.NoSuchProcess:
            return
        while not done.is_set():
            try:
                tree = [root, *root.children(recursive=True)]
            except psutil.NoSuchProcess:
                break
            for p in tree:
                try:
                    rss = p.memory_info().rss
                    label = "client" if p.pid == proc.pid else _label(p)
                except psutil.Error:
                    continue
                old = peaks.get(p.pid, (label, 0))
                peaks[p.pid] = (label, max(old[1], rss))
            done.wait(SAMPLE_S)

    t = threading.Thread(target=sample, daemon=True)
    t.start()
    out, err = proc.communicate()
    done.set()
    t.join()
    wall = time.perf_counter() - t0
    if proc.returncode != 0:
        sys.stderr.write(err)
    by_label: dict[str, int] = {}
    for pid, (label, rss) in sorted(peaks.items()):
        by_label[label if label == "client" else f"{label} {pid}"] = rss
    return wall, by_label, out, proc.returncode


def _label(p: psutil.Process) -> str:
    cmd = " ".join(p.cmdline())
    if "resource_tracker" in cmd:
        return "resource tracker"  # multiprocessing's, started with the cluster
    if "spawn_main" in cmd or "distributed" in cmd:
        return "worker"
    return p.name()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("job", type=Path, help="directory of rank traces")
    ap.add_argument("--cache", type=Path, help="summary cache (default: a fresh temporary one)")
    ap.add_argument("--workers", type=int, help="local cluster workers (default: the cores)")
    ap.add_argument("--json", action="store_true", help="print the figures as JSON")
    a = ap.parse_args()
    cache = a.cache or Path(tempfile.mkdtemp(prefix="moetune-scale-cache-"))
    if cache.exists() and any(cache.iterdir()):
        ap.error(f"{cache} is not empty: the first run must summarise every rank")
    files = [f for f in a.job.iterdir() if f.name.endswith((".json.gz", ".json", ".sqlite"))
             and f.name != "truth.json"]
    cmd = [sys.executable, "-m", "moetune", "diagnose", str(a.job), "--cache", str(cache),
           "--json"] + (["--workers", str(a.workers)] if a.workers else [])
    load = [round(os.getloadavg()[0], 2)]  # other jobs on the machine: the figures' context
    try:
        first, mem1, out1, rc1 = run_sampled(cmd)
        second, mem2, out2, rc2 = run_sampled(cmd)
    finally:
        if a.cache is None:
            shutil.rmtree(cache, ignore_errors=True)
    load.append(round(os.getloadavg()[0], 2))
    if rc1 or rc2:
        return 1
    doc = json.loads(out2)
    cores = a.workers or len(os.sched_getaffinity(0))
    ranks = doc["ranks"]["count"]
    fig: dict[str, Any] = {
        "ranks": ranks, "files": len(files),
        "trace_bytes": sum(f.stat().st_size for f in files), "cores": cores,
        "first_run_s": round(first, 2), "cached_run_s": round(second, 2),
        "cached_share": round(second / first, 4),
        "ranks_per_minute_per_core": round(ranks / first * 60 / cores, 1),
        "peak_rss_first_mib": {k: round(v / 2**20) for k, v in mem1.items()},
        "peak_rss_cached_mib": {k: round(v / 2**20) for k, v in mem2.items()},
        "max_process_rss_mib": round(max([*mem1.values(), *mem2.values()]) / 2**20),
        "load_average_1min": load,
    }
    if json.loads(out1).get("cross_rank") != doc.get("cross_rank"):
        fig["warning"] = "the cached run's cross_rank differs from the first run's"
    fig |= _against_truth(a.job / "truth.json", doc)
    if a.json:
        print(json.dumps(fig, indent=2))
        return 0
    print(f"{ranks} ranks, {len(files)} files, {fig['trace_bytes'] / 1e6:,.0f} MB, {cores} cores")
    print(f"first run  {first:8.1f} s  ({fig['ranks_per_minute_per_core']} ranks/min/core)")
    print(f"cached run {second:8.1f} s  ({fig['cached_share']:.1%} of the first)")
    print(f"peak RSS of any process: {fig['max_process_rss_mib']} MiB · load average "
          f"{load[0]} → {load[1]}")
    for k, v in fig["peak_rss_first_mib"].items():
        print(f"  first run  {k:<24} {v:6d} MiB")
    for k, v in fig["peak_rss_cached_mib"].items():
        print(f"  cached run {k:<24} {v:6d} MiB")
    for k in ("warning", "straggler", "overloaded_ep", "offset_error_max_us"):
        if k in fig:
            print(f"{k}: {fig[k]}")
    return 0


def _against_truth(truth_file: Path, doc: dict[str, Any]) -> dict[str, Any]:
    """The reduce's answers beside the job's ground truth (bench/make_rank_job.py)."""
    if not truth_file.is_file():
        return {}
    truth = json.loads(truth_file.read_text())
    cr = doc.get("cross_rank") or {}
    out: dict[str, Any] = {}
    strag = (cr.get("stragglers") or {}).get("ranks")
    if "slow_rank" in truth:
        out["straggler"] = {"truth": truth["slow_rank"], "found": strag}
    over = [o.get("rank") for o in (cr.get("ep_imbalance") or {}).get("overloaded", [])]
    if "overloaded_rank" in truth:
        out["overloaded_ep"] = {"truth": truth["overloaded_rank"], "found": over}
    offs = (cr.get("alignment") or {}).get("offsets_ns") or {}
    true = truth.get("expected_alignment_ns") or {}  # what the alignment should recover
    if offs and true:
        errs = [abs(int(offs[r]) - int(true[r])) for r in offs if r in true]
        out["offset_error_max_us"] = round(max(errs) / 1e3, 3) if errs else None
    return out


if __name__ == "__main__":
    raise SystemExit(main())
