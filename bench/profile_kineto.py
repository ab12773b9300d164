"""CPU cost of `read_kineto` per file: best of N `time.process_time()` reads in one process (all
threads, user + system), MB of JSON per CPU-second, optionally a cProfile of one more read.

    python bench/profile_kineto.py FILE [FILE ...] [--repeat 5] [--profile] [--rss]
    python bench/profile_kineto.py FILE ... --against /tmp/kineto_before.py   # A/B, interleaved
    python bench/profile_kineto.py FILE ... --python-too   # compiled scanner vs pure-Python reader
    python bench/profile_kineto.py FILE ... --scan-sources  # the scanner alone: file map vs buffer

`--against PATH` loads another copy of the reader's entry module (e.g. `git show HEAD~1:analyzer/
readers/kineto.py > /tmp/kineto_before.py`) and alternates reads between the two, so that both see
the same machine load; the best of N of each is printed (CPU seconds, all threads, and wall seconds:
the compiled scanner reads with one thread per part of at least 4 MB, up to one per core). A
`kineto.py` from before the reader was split into `kineto_*.py` modules is the whole reader; a later
one imports those modules from this tree, so the A/B then sees changes to `kineto.py` alone.
`--python-too` adds the current reader with its compiled scanner switched off
(`kineto_scan.USE_COMPILED = False`). `--rss` first reads each file once in a fresh subprocess per reader and prints its peak RSS (`ru_maxrss`), before this process reads anything:
Linux carries a parent's high-water mark into a child across fork/exec, so a child started after
a big read would report the parent's peak.
"""

from __future__ import annotations

import argparse
import cProfile
import importlib.util
import pstats
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from types import ModuleType

ROOT = Path(__file__).resolve().parents[1]
READER = ROOT / "analyzer" / "readers" / "kineto.py"
sys.path.insert(0, str(ROOT))

RSS_CHILD = """
import importlib.util, resource, sys
from pathlib import Path
sys.path.insert(0, sys.argv[3])
spec = importlib.util.spec_from_file_location("kineto_under_test", sys.argv[2])
mod = importlib.util.module_from_spec(spec)
sys.modules[spec.name] = mod
spec.loader.exec_module(mod)
from moetune.analyzer.readers import kineto_scan
# the switch is kineto_scan's since the split; a single-file reader from before it has its own
kineto_scan.USE_COMPILED = mod.USE_COMPILED = sys.argv[4] == "compiled"
mod.read_kineto(Path(sys.argv[1]), default_rank=0)
print(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss)
"""


def load_reader(path: Path, name: str) -> ModuleType:
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec and spec.loader
    mod = importlib.util.module_from_spec(spec)
    sys.modules[name] = mod  # msgspec resolves the Structs' annotations through the module
    spec.loader.exec_module(mod)
    return mod


def cpu_of(read: Callable[..., object], path: Path) -> tuple[float, float]:
    t, w = time.process_time(), time.perf_counter()
    read(path, default_rank=0)
    return time.process_time() - t, time.perf_counter() - w


def peak_rss_mb(path: Path, reader: Path, compiled: bool = True) -> float:
    out = subprocess.run(
        [sys.executable, "-c", RSS_CHILD, str(path), str(reader), str(ROOT),
         "compiled" if compiled else "python"],
        check=True,
        capture_output=True,
        text=True,
    )
    return int(out.stdout.strip()) / 1024


def scan_sources(path: Path, repeat: int) -> None:
    """The compiled scanner alone, 1 and 2 threads, on the reader's private file map (pages
    released behind the cursor, as `read_kineto` does, or kept) and on the bytes read into
    memory first; plus what touching every page of the map costs (minor faults, ms)."""
    import mmap
    import resource

    from moetune.analyzer.readers import kineto_scan

    scan = kineto_scan._kineto_scan.scan

    def once(source: str, threads: int) -> float:
        with path.open("rb") as fh:
            data = (fh.read() if source == "bytes"
                    else mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_COPY))
        t = time.perf_counter()
        scan(data, *kineto_scan._SCAN_SPEC, source == "map, released", threads,
             kineto_scan.SCAN_PART_BYTES)
        dt = time.perf_counter() - t
        if isinstance(data, mmap.mmap):
            data.close()
        return dt

    for threads in (1, 2):
        best = {src: min(once(src, threads) for _ in range(repeat))
                for src in ("map, released", "map, kept", "bytes")}
        print(f"{path.name}, {threads} thread(s): "
              + "  ".join(f"{k} {v:.3f} s" for k, v in best.items()), flush=True)
    with path.open("rb") as fh, mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_COPY) as m:
        f0, t = resource.getrusage(resource.RUSAGE_SELF).ru_minflt, time.perf_counter()
        with memoryview(m) as view:
            sum(view[i] for i in range(0, len(m), mmap.PAGESIZE))
        dt, faults = time.perf_counter() - t, resource.getrusage(resource.RUSAGE_SELF).ru_minflt - f0
        pages = len(m) // mmap.PAGESIZE
    print(f"{path.name}: touching the map's {pages} pages: {faults} minor faults,"
          f" {dt * 1000:.1f} ms", flush=True)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("files", nargs="+", type=Path)
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--profile", action="store_true")
    ap.add_argument("--rss", action="store_true")
    ap.add_argument("--against", type=Path, help="another copy of kineto.py to compare with")
    ap.add_argument("--python-too", action="store_true",
                    help="also the current reader with its compiled scanner off")
    ap.add_argument("--scan-sources", action="store_true",
                    help="only the scanner: from the file map vs from a buffer in memory")
    args = ap.parse_args()
    if args.scan_sources:
        for p in args.files:
            scan_sources(p, args.repeat)
        return
    readers = {"now": READER}
    if args.against:
        readers = {"before": args.against, **readers}
    if args.python_too:
        readers["python"] = READER
    if args.rss:
        for p in args.files:
            rss = "  ".join(f"{k} {peak_rss_mb(p, r, k != 'python'):.0f} MB"
                            for k, r in readers.items())
            print(f"{p.name}: peak RSS {rss}", flush=True)
    from moetune.analyzer.readers import kineto_scan

    mods = {k: load_reader(r, f"kineto_{k}") for k, r in readers.items()}

    def read_with(name: str) -> Callable[..., object]:
        """`name`'s reader, its scanner switched first: since the split the switch is
        kineto_scan's, shared by every copy of kineto.py; a single-file reader has its own."""
        mod = mods[name]

        def read(path: Path, default_rank: int) -> object:
            kineto_scan.USE_COMPILED = mod.USE_COMPILED = name != "python"
            return mod.read_kineto(path, default_rank=default_rank)

        return read

    reads = {k: read_with(k) for k in mods}
    for p in args.files:
        mb = p.stat().st_size / 1e6
        best = {k: (float("inf"), float("inf")) for k in mods}
        for _ in range(args.repeat):
            for k, read in reads.items():
                cpu, wall = cpu_of(read, p)
                best[k] = (min(best[k][0], cpu), min(best[k][1], wall))
        cols = "  |  ".join(
            f"{k}: {cpu:.3f} CPU-s {mb / cpu:6.1f} MB/CPU-s {wall:.3f} s"
            for k, (cpu, wall) in best.items()
        )
        print(f"{p.name} ({mb:.1f} MB): {cols}", flush=True)
        if args.profile:
            prof = cProfile.Profile()
            prof.runcall(reads["now"], p, default_rank=0)
            pstats.Stats(prof).sort_stats("tottime").print_stats(20)


if __name__ == "__main__":
    main()
