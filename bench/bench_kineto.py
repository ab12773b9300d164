"""Benchmark the Kineto reader (and the whole diagnosis) against Holistic Trace Analysis.

    python bench/bench_kineto.py                 # HTA's test traces + linearity rows, vs HTA
    python bench/bench_kineto.py --no-hta        # our side only (no venv, no network)
    python bench/bench_kineto.py --scales 1 4 16 --base hta_a100_2rank_nccl --json out.json

Every measurement runs in its own subprocess: wall time is taken inside the worker around the call
(imports excluded), peak RSS from `os.wait4` (the largest process of the tree) and from sampling
/proc every 10 ms (the sum over the tree, which counts HTA's multiprocessing workers). Both tools
read the same uncompressed `.json`, so MB/s is MB of JSON per second of one core's wall time.

HTA (`holistictraceanalysis`, PyPI) is installed into its own venv `bench/.venv-hta` on first use.
Agreement: our frames run through HTA's temporal-breakdown definitions (`get_temporal_breakdown()`,
HTA 0.5.0 `hta/utils/utils.py` kernel regexes, last ProfilerStep dropped, ns → µs with ceil(start)
/ floor(end)) and are compared with HTA's own numbers on the same file.
"""

from __future__ import annotations

import argparse
import gzip
import hashlib
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

ROOT = Path(__file__).resolve().parents[1]
BENCH = ROOT / "bench"
VENV = BENCH / ".venv-hta"
HTA_PIN = ["holistictraceanalysis==0.5.0"]
CORPUS = (
    Path(os.environ.get("MOETUNE_CORPUS", ROOT.parent / "shared" / "corpus")) / "public" / "kineto"
)
# Copies of HTA's own test traces (bench/README.md, "Inputs", maps them to HTA's tests/data); their
# temporal breakdowns by HTA are pinned in tests/test_reader_kineto.py.
DEFAULT_TRACES = [
    "hta_a100_2rank_nccl",
    "hta_a100_alltoall_rank3of8",
    "hta_sampled_rank0",
    "hta_v100_ddp_allreduce_rank1",
]


# --------------------------------------------------------------------------- workers (subprocess)


def hta_equivalent(trace: Any) -> dict[str, float]:
    """HTA 0.5.0 get_temporal_breakdown() computed from our frames (µs, like HTA), for the
    trace's first rank (HTA reports one row per rank; the table compares the first)."""
    import polars as pl

    ev = trace.events.filter(pl.col("rank") == trace.events.get_column("rank").min())
    # HTA takes the last step start over every non-GPU row named ProfilerStep*, which includes
    # the GPU-projected copies (gpu_user_annotation has no stream arg, so HTA files it as CPU).
    steps = ev.filter(
        pl.col("kind").is_in(["annotation", "gpu_annotation"])
        & pl.col("name").str.contains("ProfilerStep")
    )
    gpu_kinds = ["kernel", "memcpy", "memset", "sync"]
    is_gpu = (
        pl.col("kind").is_in(gpu_kinds) & (pl.col("stream") >= 0) & (pl.col("correlation") >= 0)
    )
    gpu = ev.filter(is_gpu)
    if steps.get_column("name").n_unique() >= 2:  # HTA drops the last step and what it launched
        last = steps.get_column("ts_ns").max()
        cpu = ev.filter(~pl.col("kind").is_in(gpu_kinds) & (pl.col("ts_ns") < last))
        gpu = gpu.join(
            cpu.select("correlation").drop_nulls().unique(), on="correlation", how="semi"
        )
    iv = gpu.select(
        "name",
        # Integer ceil/floor: epoch ns do not fit a float64 mantissa.
        ts=-((-pl.col("ts_ns")) // 1000),
        end=(pl.col("ts_ns") + pl.col("dur_ns")) // 1000,
    )

    def union(df: pl.DataFrame) -> int:
        if df.height == 0:
            return 0
        df = df.sort("ts").with_columns(
            g=(pl.col("ts") > pl.col("end").shift().cum_max()).fill_null(False).cum_sum()
        )
        m = df.group_by("g").agg(pl.col("ts").min(), pl.col("end").max())
        return int((m.get_column("end") - m.get_column("ts")).sum())

    kernel_us = int(iv.get_column("end").max() - iv.get_column("ts").min())
    idle_us = kernel_us - union(iv)
    comm = pl.col("name").str.contains(r"^nccl.*Kernel")
    mem = pl.col("name").str.contains(r"^(Memcpy|Memset|dma)")
    noncomp = pl.col("name").str.contains(r"^(nccl.*Kernel|.*Memcpy|Memset|.*Sync)")
    compute_us = union(iv.filter(~comm & ~mem & ~noncomp))
    return {
        "idle_us": idle_us,
        "compute_us": compute_us,
        "non_compute_us": kernel_us - compute_us - idle_us,
        "kernel_us": kernel_us,
    }


def worker_read(path: Path, repeat: int, gz: Path | None) -> dict[str, Any]:
    """Best of `repeat` reads: `read_kineto` for a file, `load_trace` (ranks' files side by side)
    for a directory."""
    sys.path.insert(0, str(ROOT))
    from moetune.analyzer.readers import load_trace
    from moetune.analyzer.readers.kineto import read_kineto

    def read(p: Path, default_rank: int) -> Any:
        return load_trace([p]) if p.is_dir() else read_kineto(p, default_rank=default_rank)

    walls, cpus = [], []
    trace = None
    for _ in range(repeat):
        trace = None  # free the previous read first: peak RSS is that of one read
        t0, c0 = time.perf_counter(), time.process_time()
        trace = read(path, default_rank=0)
        walls.append(time.perf_counter() - t0)
        cpus.append(time.process_time() - c0)
    out: dict[str, Any] = {
        "read_s": min(walls),
        "read_first_s": walls[0],
        "read_cpu_s": min(cpus),
        "events": trace.events.height,
        "flows": trace.flows.height,
        "comms": trace.comms.height,
        "rank": int(trace.ranks.get_column("rank")[0]),
        "ranks": trace.ranks.height,
    }
    if gz is not None:
        t0 = time.perf_counter()
        read_kineto(gz, default_rank=0)
        out["read_gz_s"] = time.perf_counter() - t0
    t0 = time.perf_counter()
    out["hta_equivalent"] = hta_equivalent(trace)
    out["hta_equivalent_s"] = time.perf_counter() - t0
    return out


def worker_diagnose(path: Path, *, core: bool = False) -> dict[str, Any]:
    """`diagnose` in this process; `core`: without the timeline-graph sections, i.e. read +
    classify + steps + walls + observed, the scope of HTA's parse + temporal breakdown."""
    sys.path.insert(0, str(ROOT))
    try:
        # Imports excluded from the timing, like HTA's: with the ones `diagnose` makes on first
        # use (the reader, the cross-rank section), which otherwise compile inside the clock
        # where PYTHONDONTWRITEBYTECODE is set (this VM: ~25 ms).
        import moetune.analyzer.ranks
        import moetune.analyzer.readers.kineto  # noqa: F401
        from moetune.analyzer.diagnose import diagnose
    except ImportError as exc:
        return {"error": f"moetune.analyzer.diagnose not importable: {exc}"}
    t0 = time.perf_counter()
    try:
        doc = diagnose([path], sections=[] if core else None)
    except Exception as exc:
        return {"error": f"{type(exc).__name__}: {exc}"}
    return {
        "diagnose_s": time.perf_counter() - t0,
        "step_time_s": doc.get("step_time_s"),
        "walls": doc.get("walls"),
        "dominant_wall": doc.get("dominant_wall"),
    }


# --------------------------------------------------------------------------- measurement


def _tree_rss_kb(pid: int) -> int:
    """RSS of pid and all its descendants (Linux /proc)."""
    total, todo = 0, [pid]
    while todo:
        p = todo.pop()
        try:
            with open(f"/proc/{p}/status") as fh:
                for line in fh:
                    if line.startswith("VmRSS:"):
                        total += int(line.split()[1])
                        break
            for task in os.listdir(f"/proc/{p}/task"):
                with open(f"/proc/{p}/task/{task}/children") as fh:
                    todo.extend(int(c) for c in fh.read().split())
        except (FileNotFoundError, ProcessLookupError, PermissionError):
            continue
    return total


def measure(cmd: list[str], timeout: float = 3600, *, parse: bool = True,
            env: dict[str, str] | None = None, cwd: Path = ROOT) -> dict[str, Any]:
    """Run cmd; its stdout's last line is JSON (`parse`; else stdout is only checked to be a JSON
    document). Adds process wall, max RSS, tree peak RSS, CPU s of the tree and the digest of
    stdout."""
    t0 = time.perf_counter()
    proc = subprocess.Popen(
        cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=cwd, env=env
    )
    peak = [0]
    stop = threading.Event()

    def sample() -> None:
        while not stop.is_set():
            peak[0] = max(peak[0], _tree_rss_kb(proc.pid))
            stop.wait(0.01)

    th = threading.Thread(target=sample, daemon=True)
    th.start()
    out_chunks: list[str] = []
    err_chunks: list[str] = []
    readers = [
        threading.Thread(target=lambda: out_chunks.append(proc.stdout.read()), daemon=True),
        threading.Thread(target=lambda: err_chunks.append(proc.stderr.read()), daemon=True),
    ]
    for r in readers:
        r.start()
    _, status, usage = os.wait4(proc.pid, 0)
    wall = time.perf_counter() - t0
    stop.set()
    th.join()
    for r in readers:
        r.join(timeout)
    proc.returncode = os.waitstatus_to_exitcode(status)
    stdout, stderr = "".join(out_chunks), "".join(err_chunks)
    if proc.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} failed ({proc.returncode}):\n{stderr[-2000:]}")
    if parse:
        res = json.loads(stdout.strip().splitlines()[-1])
    else:
        res = {"document_keys": len(json.loads(stdout))}
    res.update(process_wall_s=wall, maxrss_mb=usage.ru_maxrss / 1024, tree_peak_mb=peak[0] / 1024,
               cpu_s=usage.ru_utime + usage.ru_stime,
               stdout_sha256=hashlib.sha256(stdout.encode()).hexdigest())
    return res


def ensure_hta_venv() -> Path:
    py = VENV / "bin" / "python"
    if not py.exists():
        print(f"creating {VENV} and installing {' '.join(HTA_PIN)} …", file=sys.stderr)
        subprocess.run([sys.executable, "-m", "venv", str(VENV)], check=True)
        subprocess.run([str(py), "-m", "pip", "install", "-q", *HTA_PIN], check=True)
    return py


# --------------------------------------------------------------------------- driver


def prepare(workdir: Path, traces: list[str], base: str, scales: list[int],
            ranks: list[int] = ()) -> list[dict[str, Any]]:
    """Uncompressed copies, one per directory (HTA reads a directory of rank files); for each n
    in `ranks`, a directory of n rank files (the 4× replica, `distributedInfo.rank` 0…n−1)."""
    items = []
    for stem in traces:
        src = CORPUS / f"{stem}.json.gz"
        d = workdir / stem
        d.mkdir(parents=True, exist_ok=True)
        dst = d / f"{stem}.json"
        if not dst.exists():
            dst.write_bytes(gzip.decompress(src.read_bytes()))
        items.append({"name": stem, "json": dst, "gz": src, "scale": 1})
    base_src = Path(base) if Path(base).exists() else CORPUS / f"{base}.json.gz"
    stem = base_src.name.removesuffix(".gz").removesuffix(".json")
    base = base_src.parent.name if stem == "trace" else stem  # fixtures/traces/<name>/trace.json.gz
    for n in scales:
        if n == 1 and base in traces:
            continue
        name = f"{base}_x{n}"
        d = workdir / name
        d.mkdir(parents=True, exist_ok=True)
        dst = d / f"{name}.json"
        if not dst.exists():
            subprocess.run(
                [
                    sys.executable,
                    str(BENCH / "make_large_trace.py"),
                    str(base_src),
                    str(n),
                    str(dst),
                ],
                check=True,
            )
        items.append({"name": name, "json": dst, "gz": None, "scale": n})
    for n in ranks:
        src = workdir / f"{base}_x4" / f"{base}_x4.json"
        if not src.exists():
            raise SystemExit(f"--ranks needs the 4x replica: run with --scales 4 first ({src})")
        d = workdir / f"{base}_x4_r{n}"
        d.mkdir(parents=True, exist_ok=True)
        text = src.read_text()
        head = text.index('"distributedInfo"')
        for r in range(n):
            dst = d / f"rank{r}.json"
            if not dst.exists():  # the first "rank": after distributedInfo is its own
                at = text.index('"rank":', head)
                end = text.index(",", at)
                # and its world size: n ranks of a world of 2 are no ranks of one run
                w_at = text.index('"world_size":', end)
                w_end = text.index(",", w_at)
                dst.write_text(f'{text[:at]}"rank": {r}{text[end:w_at]}"world_size": {n}'
                               f'{text[w_end:]}')
        items.append({"name": d.name, "json": d, "gz": None, "scale": 4})
    return items


def size_mb(path: Path) -> float:
    files = sorted(path.glob("*.json")) if path.is_dir() else [path]
    return sum(f.stat().st_size for f in files) / 1e6


def pct(part: float, whole: float) -> float:
    return 100.0 * part / whole if whole else float("nan")


def run(args: argparse.Namespace) -> dict[str, Any]:
    load0 = os.getloadavg()
    workdir = Path(args.workdir)
    items = prepare(workdir, args.traces, args.base, args.scales, args.ranks)
    hta_py = None if args.no_hta else ensure_hta_venv()
    results = []
    for it in items:
        mb = size_mb(it["json"])
        row: dict[str, Any] = {"name": it["name"], "scale": it["scale"], "mb": mb}
        cmd = [
            sys.executable,
            __file__,
            "--worker",
            "read",
            str(it["json"]),
            "--repeat",
            str(args.repeat),
        ]
        if it["gz"] is not None:
            cmd += ["--gz", str(it["gz"])]
        row["ours"] = measure(cmd)
        if not args.no_diagnose:
            for stage in ("core", "diagnose"):
                row[stage] = measure([sys.executable, __file__, "--worker", stage, str(it["json"])])
            # what a user runs: a fresh interpreter, its imports, the read and every section
            runs = [measure([sys.executable, "-m", "moetune", "diagnose", "--json",
                             str(it["json"])], parse=False) for _ in range(args.whole_repeat)]
            best = min(runs, key=lambda x: x["process_wall_s"])
            row["whole"] = best | {"maxrss_mb": max(x["maxrss_mb"] for x in runs),
                                   "walls_s": [x["process_wall_s"] for x in runs]}
        if hta_py is not None:
            trace_dir = it["json"] if it["json"].is_dir() else it["json"].parent
            row["hta"] = measure([str(hta_py), str(BENCH / "hta_breakdown.py"), str(trace_dir)])
        results.append(row)
        print(summary_line(row), file=sys.stderr)
    return {
        "machine": {
            "cpus": os.cpu_count(),
            "python": sys.version.split()[0],
            "platform": sys.platform,
            "loadavg_start": load0,
            "loadavg_end": os.getloadavg(),
        },
        "command": " ".join([Path(sys.executable).name, "bench/bench_kineto.py", *sys.argv[1:]]),
        "results": results,
    }


def summary_line(r: dict[str, Any]) -> str:
    o = r["ours"]
    s = f"{r['name']}: {r['mb']:.1f} MB, read {o['read_s']:.3f}s ({r['mb'] / o['read_s']:.0f} MB/s)"
    if "hta" in r:
        s += f", HTA parse {r['hta']['parse_s']:.2f}s"
    return s


def table(res: dict[str, Any]) -> str:
    lines = [
        "| trace | JSON MB | events | ours read s (first) | MB/s | MB/CPU-s | events/s | ours peak RSS MB | "
        "core s (RSS MB) | diagnose s (RSS MB) | whole process s (RSS MB) | whole MB/s | "
        "HTA parse s | HTA breakdown s | "
        "HTA peak RSS MB (tree) | speed-up read / core / diagnose / whole | "
        "memory core / whole ÷ HTA | idle % ours / HTA | compute % ours / HTA |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"
        "---|---|",
    ]
    for r in res["results"]:
        o, h, c, d, w = r["ours"], r.get("hta"), r.get("core"), r.get("diagnose"), r.get("whole")
        whole = f"{w['process_wall_s']:.2f} ({w['maxrss_mb']:.0f})" if w else "—"
        whole_mbs = f"{r['mb'] / w['process_wall_s']:.0f}" if w else "—"
        e = o["hta_equivalent"]

        def cell(x: dict[str, Any] | None) -> str:
            if x and "diagnose_s" in x:
                return f"{x['diagnose_s']:.2f} ({x['maxrss_mb']:.0f})"
            return "n/a" if x else "—"

        def ratio(x: dict[str, Any] | None, hta_s: float) -> str:
            return f"{hta_s / x['diagnose_s']:.1f}×" if x and "diagnose_s" in x else "—"

        if h:
            hr = min(h["ranks"], key=lambda x: x["rank"])
            hta_s = h["parse_s"] + h["breakdown_s"]
            mem = (f"{c['maxrss_mb'] / h['tree_peak_mb']:.2f}" if c and "maxrss_mb" in c
                   else "—")
            mem += f" / {w['maxrss_mb'] / h['tree_peak_mb']:.2f}" if w else " / —"
            w_ratio = f"{hta_s / w['process_wall_s']:.1f}×" if w else "—"
            hta_cols = (
                f"{h['parse_s']:.2f} | {h['breakdown_s']:.2f} | {h['tree_peak_mb']:.0f} | "
                f"{h['parse_s'] / o['read_s']:.1f}× / {ratio(c, hta_s)} / {ratio(d, hta_s)} / "
                f"{w_ratio} | "
                f"{mem} | "
                f"{pct(e['idle_us'], e['kernel_us']):.2f} / {pct(hr['idle_us'], hr['kernel_us']):.2f} | "
                f"{pct(e['compute_us'], e['kernel_us']):.2f} / {pct(hr['compute_us'], hr['kernel_us']):.2f}"
            )
        else:
            hta_cols = (
                f"— | — | — | — | — | {pct(e['idle_us'], e['kernel_us']):.2f} / — | "
                f"{pct(e['compute_us'], e['kernel_us']):.2f} / —"
            )
        lines.append(
            f"| {r['name']} | {r['mb']:.1f} | {o['events'] + o['flows']:,} | "
            f"{o['read_s']:.3f} ({o['read_first_s']:.3f}) | {r['mb'] / o['read_s']:.0f} | "
            f"{r['mb'] / o['read_cpu_s']:.0f} | {(o['events'] + o['flows']) / o['read_s'] / 1e3:,.0f}k | "
            f"{o['maxrss_mb']:.0f} | {cell(c)} | {cell(d)} | {whole} | {whole_mbs} | {hta_cols} |"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description="Kineto reader / diagnose vs HTA benchmark")
    ap.add_argument("--worker", choices=["read", "core", "diagnose"], help=argparse.SUPPRESS)
    ap.add_argument("path", nargs="?", type=Path, help=argparse.SUPPRESS)
    ap.add_argument("--gz", type=Path, help=argparse.SUPPRESS)
    ap.add_argument(
        "--traces", nargs="*", default=DEFAULT_TRACES, help="corpus stems (public/kineto)"
    )
    ap.add_argument("--base", default="hta_a100_2rank_nccl",
                    help="trace replicated for linearity: a corpus stem or a .json(.gz) path")
    ap.add_argument("--scales", nargs="*", type=int, default=[1, 4, 16])
    ap.add_argument("--ranks", nargs="*", type=int, default=[4],
                    help="also a directory of this many rank files (copies of the 4x replica)")
    ap.add_argument("--repeat", type=int, default=3, help="reads per worker; the fastest is kept")
    ap.add_argument("--whole-repeat", type=int, default=1,
                    help="whole-process `moetune diagnose --json` runs per trace; the fastest is kept")
    ap.add_argument("--no-hta", action="store_true")
    ap.add_argument("--no-diagnose", action="store_true")
    ap.add_argument("--workdir", default=str(Path(tempfile.gettempdir()) / "moetune-bench"))
    ap.add_argument("--json", type=Path, help="write raw results here")
    ap.add_argument("--clean", action="store_true", help="delete the workdir afterwards")
    args = ap.parse_args(argv)

    if args.worker == "read":
        print(json.dumps(worker_read(args.path, args.repeat, args.gz)))
        return 0
    if args.worker in ("core", "diagnose"):
        print(json.dumps(worker_diagnose(args.path, core=args.worker == "core")))
        return 0
    res = run(args)
    if args.json:
        args.json.write_text(json.dumps(res, indent=1, sort_keys=True))
    m = res["machine"]
    print(
        f"`{res['command']}` · {m['cpus']} CPUs · Python {m['python']} · load average "
        f"{m['loadavg_start'][0]:.1f} → {m['loadavg_end'][0]:.1f}\n"
    )
    print(table(res))
    if args.clean:
        shutil.rmtree(args.workdir, ignore_errors=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
