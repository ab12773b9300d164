"""Run the H200 grid (bench/grid_spec.py) on the device, and turn what comes back into the grid's
results, table and fixtures here.

Device side (bench/gpu/grid.sh calls it; standard library only):

    python3 bench/grid_run.py run host mem --graph-probe --share host=240 --deadline-s 520

`--graph-probe`: tiny local-CUDA-graph variants first (which runs and replays). Then per shape: the
mis-tuned start, each of its one-knob neighbours, a greedy path (expand the fastest point measured
so far, micro-batch size to the next smaller/larger value, until it is its own best neighbour),
the shape's EXTRA points, the greedy step again. A point that would pass the deadline is skipped
(status `skipped`; `--resume` of this call's grid.jsonl runs it in the next). Every point is one
fresh workload process; its wall time is measured from start to exit. Results are appended to
$OUT/grid.jsonl as each point ends; logs and traces are packed at the end (traces past the ~58 MiB
that can come back are trimmed to one step on the device).

Here:

    python bench/grid_run.py report DIR...   # DIRs: device outputs -> bench/grid/, fixtures
    python bench/grid_run.py repeats FILE... # later calls' `@rep` runs -> grid_h200.json
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import shutil
import statistics
import subprocess
import sys
import tarfile
import tempfile
import time
from pathlib import Path
from typing import Any, ClassVar

sys.path.insert(0, str(Path(__file__).resolve().parent))
import grid_spec as gs

ROOT = Path(__file__).resolve().parents[1]
TRIM = ROOT / "fixtures" / "gpu" / "trim_steps.py"
MiB = 1024 * 1024


def trace_facts(path: Path) -> dict[str, Any]:
    raw = gzip.decompress(path.read_bytes())
    return {"trace_bytes_gz": path.stat().st_size, "trace_bytes_json": len(raw),
            "cudaGraphLaunch_rows": raw.count(b'"cudaGraphLaunch"'),
            "kernel_rows": raw.count(b'"cat": "kernel"') + raw.count(b'"cat":"kernel"')}


def run_cmd(cmd: list[str], d: Path, timeout: int) -> dict[str, Any]:
    d.mkdir(parents=True, exist_ok=True)
    log = d / "train.log"
    t0 = time.time()
    with open(log, "w") as fh:
        fh.write("$ " + " ".join(cmd) + "\n")
        fh.flush()
        try:
            rc = subprocess.run(cmd, stdout=fh, stderr=subprocess.STDOUT, timeout=timeout).returncode
        except subprocess.TimeoutExpired:
            rc = 124
    wall = time.time() - t0
    res = gs.parse_log(log.read_text(errors="replace"), rc)
    res.update(rc=rc, wall_s=round(wall, 2), started_unix=round(t0, 1))
    tr = d / "rank0.pt.trace.json.gz"
    if tr.exists():
        res.update(trace_facts(tr))
    return res


def emit(out: Path, name: str, rec: dict[str, Any]) -> None:
    with open(out / name, "a") as fh:
        fh.write(json.dumps(rec) + "\n")
    keys = ("status", "step_ms", "max_alloc_gib", "max_reserved_gib", "wall_s",
            "cudaGraphLaunch_rows", "trace_bytes_gz", "error")
    print(f"[{rec.get('shape', 'probe')}] {rec['id']}: " +
          ", ".join(f"{k}={rec[k]}" for k in keys if rec.get(k) is not None), flush=True)


def pack(out: Path, work: Path, prefix: str, files_left: int, budget: int) -> None:
    """Logs (one tar.gz) and traces (tars of at most 15.5 MiB, `files_left` of them at most,
    `budget` bytes together; past that a trace is trimmed to one step, ProfilerStep#PROFILE_END-1)."""
    with tarfile.open(out / f"{prefix}_logs.tar.gz", "w:gz") as t:
        for log in sorted(work.rglob("train.log")):
            t.add(log, arcname=str(log.relative_to(work)))
    traces = sorted(work.rglob("rank0.pt.trace.json.gz"), key=lambda p: p.stat().st_size)
    cap = min(budget, files_left * int(15.5 * MiB))
    chosen: list[tuple[Path, str]] = []
    used = 0
    for tr in traces:
        arc = str(tr.relative_to(work))
        if used + tr.stat().st_size > cap:
            small = tr.with_name("trace.trim1.json.gz")
            try:
                trim_one(tr, small, gs.PROFILE_END - 1 if "__trace" not in arc else 4)
            except Exception as exc:
                print(f"trim failed for {arc}: {exc}", flush=True)
            if not small.exists() or used + small.stat().st_size > cap:
                print(f"trace left behind: {arc}", flush=True)
                continue
            tr, arc = small, str(small.relative_to(work))
        chosen.append((tr, arc))
        used += tr.stat().st_size
    bins: list[list[tuple[Path, str]]] = []
    size = 0
    for tr, arc in chosen:
        if not bins or (size + tr.stat().st_size > 15.5 * MiB and len(bins) < files_left):
            bins.append([])
            size = 0
        bins[-1].append((tr, arc))
        size += tr.stat().st_size
    for k, members in enumerate(bins, 1):
        with tarfile.open(out / f"{prefix}_traces{k}.tar", "w") as t:
            for tr, arc in members:
                t.add(tr, arcname=arc)


# ---------------------------------------------------------------- device: the grid
TINY = ["--num-layers", "2", "--hidden-size", "256", "--num-attention-heads", "4",
        "--num-experts", "16", "--moe-router-topk", "2", "--moe-ffn-hidden-size", "256",
        "--seq-length", "512", "--micro-batch-size", "2", "--global-batch-size", "4",
        "--moe-token-dispatcher-type", "alltoall", "--vocab-size", "256", "--moe-grouped-gemm"]
DROPPAD = ["--moe-expert-capacity-factor", "1.0", "--moe-pad-expert-input-to-capacity"]
LOCAL = ["--cuda-graph-impl", "local"]
ROUTER = ["--cuda-graph-modules", "moe_router", "moe_preprocess"]


def graph_probes() -> list[tuple[str, list[str]]]:
    """Local CUDA graphs on a tiny model (grouped GEMM, alltoall, MBS 2 x 2): which variant runs,
    replays (cudaGraphLaunch rows in the profiled steps) and trains like its eager twin."""
    t = [*gs.WORKLOAD, *TINY, *gs.COMMON]
    return [
        ("tiny_eager", t),
        ("tiny_local_whole_dropless", [*t, *LOCAL]),
        ("tiny_local_router", [*t, *LOCAL, *ROUTER]),
        ("tiny_local_whole_droppad", [*t, *LOCAL, *DROPPAD]),
        ("tiny_eager_droppad", [*t, *DROPPAD]),
        ("tiny_local_attn_only", [*t, *LOCAL, "--cuda-graph-modules", "attn"]),
        ("tiny_local_full_recompute", [*t, *LOCAL, "--recompute-granularity", "full"]),
    ]


def replays(rec: dict[str, Any] | None) -> bool:
    return bool(rec and rec["status"] == "ok" and rec.get("cudaGraphLaunch_rows", 0) > 0)


class Grid:
    def __init__(self, work: Path, out: Path, timeout: int) -> None:
        self.work, self.out, self.timeout = work, out, timeout
        self.done: dict[tuple[str, str], dict[str, Any]] = {}
        self.walls: list[float] = []
        self.walls_by: dict[str, list[float]] = {}
        self.summary: dict[str, Any] = {"graph_flags": " ".join(gs.GRAPH_FLAGS), "shapes": {}}

    EST: ClassVar[dict[str, float]] = {"probe": 20.0, "host": 25.0, "mem": 50.0}  # seconds, before any run of the shape

    def est(self, shape: str = "probe") -> float:
        w = sorted(self.walls_by.get(shape, []))
        return w[int(0.75 * (len(w) - 1))] if w else self.EST.get(shape, 30.0)

    def run_probes(self, deadline: float) -> None:
        recs = {}
        for name, cmd in graph_probes():
            if time.monotonic() + 20 > deadline:
                break
            d = self.work / "probe" / name
            rec = {"shape": "probe", "id": name, "cmd": " ".join(cmd)}
            rec.update(run_cmd([*cmd, "--profile-dir", str(d)], d, 90))
            recs[name] = rec
            self.walls.append(rec["wall_s"])
            emit(self.out, "grid.jsonl", rec)
        if not replays(recs.get("tiny_local_router")) and \
                replays(recs.get("tiny_local_whole_droppad")):
            gs.GRAPH_FLAGS[:] = [*LOCAL, *DROPPAD]  # whole layers, drop-and-pad MoE
        self.summary["graph_flags"] = " ".join(gs.GRAPH_FLAGS)
        print(f"graph flags for the grid: {self.summary['graph_flags']}", flush=True)

    def run(self, shape: str, p: dict[str, Any], why: str, deadline: float,
            trace_rerun: bool = False, repeat: bool = False) -> None:
        p = gs.full_point(p)
        pid = gs.point_id(p) + ("__trace" if trace_rerun else "")
        if repeat:  # __repN: the N-th repeat of this point in this call
            n = 1 + sum(1 for s, i in self.done if s == shape and i.startswith(pid + "__rep"))
            pid += f"__rep{n}"
        if (shape, pid) in self.done:
            return
        d = self.work / shape / pid
        rec: dict[str, Any] = {"shape": shape, "id": pid, "knobs": p, "why": why,
                               "cmd": " ".join(gs.command(shape, p, f"{shape}/{pid}",
                                                          trace_rerun, repeat))}
        if time.monotonic() + self.est(shape) > deadline:
            rec.update(status="skipped", oom=False)
        else:
            rec.update(run_cmd(gs.command(shape, p, str(d), trace_rerun, repeat), d,
                               self.timeout))
            if rec["status"] != "refused":
                self.walls_by.setdefault(shape, []).append(rec["wall_s"])
            if trace_rerun:  # 5 iterations: no steady window; the grid's run has the step time
                rec["status"] = "ok" if rec["rc"] == 0 and rec["iterations"] == 5 \
                    else rec["status"]
                rec["step_ms"] = None
                if rec["status"] == "ok":
                    rec.pop("error", None)
            if rec["status"] != "refused":
                self.walls.append(rec["wall_s"])
            self.done[(shape, pid)] = rec
        emit(self.out, "grid.jsonl", rec)

    def shape(self, shape: str, deadline: float) -> None:
        t0 = time.monotonic()
        path: list[str] = []

        def greedy() -> None:
            while True:
                ok = [r for (s, _), r in self.done.items()
                      if s == shape and r["status"] == "ok" and r.get("step_ms")]
                if not ok:
                    return
                best = min(ok, key=lambda r: r["step_ms"])
                if best["id"] in path:
                    return
                path.append(best["id"])
                for n in gs.neighbours(best["knobs"], adjacent_mbs=True):
                    self.run(shape, n, f"neighbour of {best['id']}", deadline)

        self.run(shape, gs.START, "start", deadline)
        path.append(gs.point_id(gs.START))
        for n in gs.neighbours(gs.START):
            self.run(shape, n, "neighbour of the start", deadline)
        greedy()
        for e in gs.EXTRA[shape]:
            self.run(shape, e, "extra", deadline)
        greedy()
        self.summary["shapes"][shape] = {
            "desc": gs.SHAPES[shape]["desc"], "greedy_expanded": path,
            "wall_s_this_call": round(time.monotonic() - t0, 1),
            "points_done": sum(1 for s, _ in self.done if s == shape)}

    def resume(self, files: list[Path]) -> None:
        for f in files:
            for line in f.read_text().splitlines():
                rec = json.loads(line)
                if rec.get("shape") in gs.SHAPES and rec["status"] != "skipped":
                    self.done[(rec["shape"], rec["id"])] = rec


def run_grid(a: argparse.Namespace) -> None:
    t0 = time.monotonic()
    deadline = t0 + a.deadline_s
    if a.work.exists():
        shutil.rmtree(a.work)
    g = Grid(a.work, a.out, a.timeout)
    if a.graph_flags:
        gs.GRAPH_FLAGS[:] = a.graph_flags.split()
    g.resume(a.resume)
    if a.graph_probe:
        g.run_probes(deadline)
    for spec in a.points:  # SHAPE:ID[@trace|@rep], in this order, instead of the search
        shape, pid = spec.split(":")
        pid, _, mode = pid.partition("@")
        g.run(shape, gs.parse_id(pid), "listed", deadline, trace_rerun=mode == "trace",
              repeat=mode == "rep")
    if a.points:
        a.shapes = []
    shares = dict(x.split("=") for x in a.share)
    for shape in a.shapes:
        until = min(deadline, time.monotonic() + float(shares[shape])) if shape in shares \
            else deadline
        g.shape(shape, until)
    g.summary["call_wall_s"] = round(time.monotonic() - t0, 1)
    (a.out / "grid_summary.json").write_text(json.dumps(g.summary, indent=1))
    print(json.dumps(g.summary), flush=True)
    pack(a.out, a.work, "grid", files_left=4, budget=58 * MiB)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    ru = sub.add_parser("run")
    ru.add_argument("shapes", nargs="*", help=f"of {sorted(gs.SHAPES)}")
    ru.add_argument("--points", nargs="*", default=[],
                    help="SHAPE:POINT_ID[@trace|@rep] to run in this order instead of the search "
                         "(@trace: a 5-iteration re-run for the trace only; @rep: one more "
                         "unprofiled run of a measured point)")
    ru.add_argument("--timeout", type=int, default=100, help="seconds per point")
    ru.add_argument("--work", type=Path, default=Path("/tmp/grid"))
    ru.add_argument("--out", type=Path, default=Path(os.environ.get("OUT", "/tmp/out")))
    ru.add_argument("--deadline-s", type=float, default=520, help="for the whole call")
    ru.add_argument("--share", nargs="*", default=[], help="SHAPE=SECONDS: at most this long")
    ru.add_argument("--graph-probe", action="store_true", help="tiny local-graph variants first")
    ru.add_argument("--graph-flags", default="", help="override grid_spec.GRAPH_FLAGS")
    ru.add_argument("--resume", type=Path, nargs="*", default=[],
                    help="grid.jsonl of earlier calls: their points are not run again")
    rp = sub.add_parser("report")
    rp.add_argument("dirs", nargs="+", type=Path)
    sub.add_parser("table", help="print the README tables from bench/grid/grid_h200.json")
    mp = sub.add_parser("repeats", help="merge `@rep` runs (device calls' grid.jsonl, kept under "
                                         "bench/grid/repeats/) into bench/grid/grid_h200.json")
    mp.add_argument("files", nargs="+", type=Path)
    a = ap.parse_args(argv)
    if a.cmd == "run" and not set(a.shapes) <= set(gs.SHAPES):
        ap.error(f"shapes are {sorted(gs.SHAPES)}")
    if a.cmd == "report":
        return report(a.dirs)
    if a.cmd == "table":
        print(tables(), end="")
        return 0
    if a.cmd == "repeats":
        return merge_repeats(a.files)
    a.out.mkdir(parents=True, exist_ok=True)
    run_grid(a)
    return 0


GRID = ROOT / "bench" / "grid"
FIXTURES = ROOT / "fixtures" / "traces"
KEEP = ROOT / "bench" / "out" / "grid"


def load(dirs: list[Path]) -> tuple[dict, list, dict]:
    """Records of every device call's grid.jsonl (later calls win), probe records, and the trace
    (and log) of each point: its own run's, else a `@trace` re-run's."""
    recs: dict[tuple[str, str], dict[str, Any]] = {}
    probes: list[dict[str, Any]] = []
    files: dict[tuple[str, str], dict[str, Any]] = {}
    reps: dict[tuple[str, str], list[dict[str, Any]]] = {}
    for d in dirs:
        for line in (d / "grid.jsonl").read_text().splitlines():
            r = json.loads(line)
            r["device_call"] = d.name
            if r["shape"] == "probe":
                r["log"] = d / "probe" / r["id"] / "train.log"
                probes.append(r)
                continue
            key = (r["shape"], r["id"])
            if "__rep" in r["id"]:  # a repeat: another run of the point, kept beside it
                if r["status"] != "skipped":
                    reps.setdefault((r["shape"], r["id"].split("__rep")[0]), []).append(r)
                continue
            if r["status"] == "skipped" and key in recs:
                continue
            base = r["id"].removesuffix("__trace")
            folder = d / r["shape"] / r["id"]
            tr = next((p for p in (folder / "rank0.pt.trace.json.gz",
                                   folder / "trace.trim1.json.gz") if p.exists()), None)
            if tr is not None:
                files[(r["shape"], base)] = {"trace": tr, "log": folder / "train.log",
                                             "rerun": r["id"].endswith("__trace"),
                                             "trimmed": tr.name.startswith("trace.trim")}
            if r["id"].endswith("__trace"):
                files.setdefault((r["shape"], base), {})["rerun_record"] = r
                continue
            r["log"] = folder / "train.log"
            recs[key] = r
    for key, more in reps.items():
        if key in recs and recs[key]["status"] == "ok":
            with_repeats(recs[key], more)
    return recs, probes, files


def with_repeats(r: dict[str, Any], more: list[dict[str, Any]]) -> None:
    """A point measured in several fresh processes: its step time is the median of the runs'
    (host-bound points move ±15-30 % between processes; one run is not the point's speed)."""
    ok = [m for m in more if m["status"] == "ok" and m.get("step_ms")]
    r["first_run_step_ms"] = r["step_ms"]
    r["runs_step_ms"] = [r["step_ms"], *(m["step_ms"] for m in ok)]
    r["runs_failed"] = [m["id"] for m in more if m not in ok]
    r["step_ms"] = round(statistics.median(r["runs_step_ms"]), 2)


def refuse_here(recs: dict) -> None:
    """A skipped point the workload refuses before it starts (exit 2, parse time: the same on any
    machine) is recorded as refused from the workload's own check, run here."""
    for (shape, _), r in recs.items():
        if r["status"] != "skipped":
            continue
        proc = subprocess.run([sys.executable, "-c",
                               "import sys; from moetune.executor.workloads import moe_gpt as m; "
                               "a = m.build_parser().parse_args(sys.argv[1:]); "
                               "print(m.cuda_graph_refusal(a) or '')",
                               *gs.SHAPES[shape]["flags"], *gs.knob_flags(r["knobs"])],
                              capture_output=True, text=True, check=True)
        if proc.stdout.strip():
            r.update(status="refused", rc=2, oom=False, wall_s=None,
                     error="moe_gpt: error: " + proc.stdout.strip(),
                     device_call="here (parse-time refusal, no GPU involved)")


def label(shape: str, recs: dict, path: list[str]) -> None:
    """`listed` points (device call 3's explicit list): which greedy-path point they neighbour."""
    for (s, pid), r in recs.items():
        if s != shape or r.get("why") != "listed":
            continue
        for i, cur in enumerate(path):
            nb = {gs.point_id(n) for n in gs.neighbours(gs.parse_id(cur), adjacent_mbs=i > 0)}
            if pid in nb:
                r["why"] = f"neighbour of {cur}"
                break
        else:
            r["why"] = "extra"


def greedy_path(shape: str, recs: dict) -> tuple[list[str], bool]:
    """Steepest descent from the start over measured points (the start: every MBS; after it the
    next smaller/larger MBS); True when the end's neighbours were all measured."""
    ok = {pid: r for (s, pid), r in recs.items() if s == shape}
    cur = gs.point_id(gs.START)
    path = [cur]
    while True:
        nb = gs.neighbours(gs.parse_id(cur), adjacent_mbs=len(path) > 1)
        ids = [gs.point_id(n) for n in nb]
        measured = [ok[i] for i in ids if i in ok and ok[i]["status"] == "ok"]
        complete = all(i in ok and ok[i]["status"] != "skipped" for i in ids)
        better = [r for r in measured if r["step_ms"] < ok[cur]["step_ms"]]
        if not better:
            return path, complete
        cur = min(better, key=lambda r: r["step_ms"])["id"]
        path.append(cur)


def fmt(v: Any, nd: int = 1) -> str:
    return "" if v is None else (f"{v:.{nd}f}" if isinstance(v, float) else str(v))


def point_row(r: dict[str, Any], base: float | None, f: dict[str, Any]) -> dict[str, Any]:
    """One point of grid_h200.json from its run record (`f`: its trace and log, if any)."""
    row = {
        "id": r["id"], "knobs": r["knobs"], "changed_vs_start": gs.changed(gs.START, r["knobs"]),
        "why": r.get("why"), "status": r["status"], "oom": r["status"] == "oom",
        "step_ms": r.get("step_ms"),
        "runs_step_ms": r.get("runs_step_ms"),
        "speedup_vs_start": round(base / r["step_ms"], 2) if base and r.get("step_ms")
        else None,
        "steady_iter_ms": [r["iter_ms"][i - 1] for i in gs.STEADY]
        if r.get("iter_ms") and len(r["iter_ms"]) >= max(gs.STEADY) else None,
        "iter_ms": r.get("iter_ms"),
        "max_alloc_gib": r.get("max_alloc_gib"),
        "max_reserved_gib": r.get("max_reserved_gib"),
        "wall_s": r.get("wall_s"), "rc": r.get("rc"), "loss_last": r.get("loss_last"),
        "cudaGraphLaunch_rows": r.get("cudaGraphLaunch_rows"),
        "kernel_rows": r.get("kernel_rows"), "error": r.get("error"),
        "cmd": r.get("cmd"), "device_call": r["device_call"],
        "trace": None if not f.get("trace") else
        ("5-iteration re-run (iterations 4-5 profiled)" if f.get("rerun") else
         "this run (iterations 11-12 profiled)"),
    }
    for k in ("oom_tried_gib", "oom_free_gib", "oom_in_use_gib", "oom_alloc_gib",
              "oom_reserved_unalloc_gib"):
        if k in r:
            row[k] = r[k]
    return row


def by_speed(r: dict[str, Any]) -> tuple[bool, float]:
    """Sort key of a shape's points: the measured ones fastest first, then the rest."""
    return r["status"] != "ok", r.get("step_ms") or 1e9


def shape_summary(shape: str, pts: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """What grid_h200.json reads off one shape's points (point id → record or row, with `status`,
    `step_ms`, `wall_s`, `why`): start and best step times, the greedy path (labelling the
    `listed` points by it), whether the grid is complete, the skipped points, the GPU wall."""
    recs = {(shape, pid): r for pid, r in pts.items()}
    start = pts.get(gs.point_id(gs.START))
    base = start["step_ms"] if start else None
    ok = [r for r in pts.values() if r["status"] == "ok"]
    best = min(ok, key=lambda r: r["step_ms"]) if ok else None
    path, complete = greedy_path(shape, recs) if start else ([], False)
    label(shape, recs, path)
    return {
        "start_step_ms": base,
        "best": best["id"] if best else None, "best_step_ms": best["step_ms"] if best else None,
        "best_speedup": round(base / best["step_ms"], 2) if best and base else None,
        "greedy_path": path, "greedy_end_neighbours_all_measured": complete,
        # complete: the start's neighbours all measured and the greedy end a checked optimum
        "grid_complete": complete and all(
            pts.get(gs.point_id(n), {}).get("status") not in (None, "skipped")
            for n in gs.neighbours(gs.START)),
        "skipped": sorted(pid for pid, r in pts.items() if r["status"] == "skipped"),
        "grid_gpu_wall_s": round(sum(r.get("wall_s") or 0 for r in pts.values()), 1),
    }


def report(dirs: list[Path]) -> int:
    recs, probes, files = load(dirs)
    refuse_here(recs)
    GRID.mkdir(parents=True, exist_ok=True)
    doc: dict[str, Any] = {
        "machine": "1 x NVIDIA H200 (143771 MiB, driver 580.159.04), library device kind "
                   "nvidia-h200",
        "software": "torch 2.11.0+cu130, megatron-core 0.19.2 (local spec, no Transformer "
                    "Engine, no Apex), workload moetune.executor.workloads.moe_gpt",
        "protocol": {"train_iters": gs.TRAIN_ITERS, "steady_iterations": list(gs.STEADY),
                     "step_ms": "median of the logged per-iteration times of the steady "
                                "iterations (Megatron log lines, log interval 1); for a point "
                                "run in several fresh processes (`runs_step_ms`: the first, "
                                "profiled, then unprofiled repeats), the median of the runs'",
                     "profiled_iterations": [gs.PROFILE_START + 1, gs.PROFILE_END],
                     "profiler_steps": [f"ProfilerStep#{i}" for i in
                                        range(gs.PROFILE_START, gs.PROFILE_END)],
                     "memory": "max allocated / max reserved of the run (torch.cuda.max_memory_*"
                               " in the workload's last memory line)",
                     "wall_s": "the run's process, start to exit, on the device",
                     "common_flags": gs.COMMON},
        "knobs": gs.KNOBS, "start": gs.START, "graph_flags": gs.GRAPH_FLAGS,
        "whole_droppad_flags": gs.WHOLE_DROPPAD_FLAGS,
        "shapes": {}, "graph_probes": []}
    for p in probes:
        doc["graph_probes"].append({k: p.get(k) for k in (
            "id", "cmd", "status", "step_ms", "iter_ms", "max_alloc_gib", "max_reserved_gib",
            "wall_s", "cudaGraphLaunch_rows", "kernel_rows", "loss_last", "error",
            "device_call")})
    for shape in gs.SHAPES:
        pts = {pid: r for (s, pid), r in recs.items() if s == shape}
        summary = shape_summary(shape, pts)
        rows = [point_row(r, summary["start_step_ms"], files.get((shape, pid), {}))
                for pid, r in sorted(pts.items(), key=lambda kv: by_speed(kv[1]))]
        doc["shapes"][shape] = {
            "desc": gs.SHAPES[shape]["desc"], "flags": gs.SHAPES[shape]["flags"],
            "start": gs.point_id(gs.START), **summary, "points": rows}
    (GRID / "grid_h200.json").write_text(json.dumps(doc, indent=1) + "\n")
    fixtures(doc, files)
    print(GRID / "grid_h200.json")
    return 0


def read_call(f: Path, doc: dict[str, Any]) -> list[dict[str, Any]] | str:
    """A device call's grid.jsonl records, or the one line that says why they cannot be merged
    into `doc` (already merged, unreadable, a record of no known shape or point)."""
    if f.name in doc.get("repeat_files", []):
        return f"{f}: already merged into grid_h200.json"
    try:
        lines = f.read_text().splitlines()
    except OSError as exc:
        return f"{f}: {exc.strerror or exc}"
    recs = []
    for n, line in enumerate(lines, 1):
        try:
            r = json.loads(line)
        except json.JSONDecodeError as exc:
            return f"{f}:{n}: not a JSON record ({exc.msg})"
        if not isinstance(r, dict) or not isinstance(r.get("id"), str) or "status" not in r:
            return f"{f}:{n}: not a grid record (an object with id and status)"
        if r.get("shape") not in doc["shapes"]:
            return f"{f}:{n}: shape {r.get('shape')!r} is not in the grid"
        base, sep, _ = r["id"].partition("__rep")
        known = {p["id"] for p in doc["shapes"][r["shape"]]["points"]} | \
            {q["id"] for q in recs if q["shape"] == r["shape"]}
        if sep and base not in known:
            return f"{f}:{n}: a repeat of {base}, which the grid has not measured"
        recs.append(r)
    return recs


def merge_repeats(files: list[Path], path: Path = GRID / "grid_h200.json") -> int:
    """Fold later calls into the recorded grid: a point not measured before becomes a row (and,
    with its trace, a fixture); an `@rep` run joins its point's `runs_step_ms`, whose median is
    the step time again; everything read off step times (speed-ups, best point, greedy path, the
    fixtures' truth.json) follows. A file already merged (by name, `repeat_files`) is refused, so
    no run counts twice. A call's `FILE_logs.tar.gz` and `FILE_traces*.tar` lie beside it."""
    doc = json.loads(path.read_text())
    done = doc.setdefault("repeat_files", [])
    calls = []
    for f in files:  # every record checked before anything is written
        problem = read_call(f, doc)
        if isinstance(problem, str):
            print(f"grid_run.py repeats: {problem}", file=sys.stderr)
            return 2
        calls.append((f, problem))
    new: dict[tuple[str, str], dict[str, Any]] = {}
    work = Path(tempfile.mkdtemp(prefix="grid-merge-"))
    for f, recs in calls:
        # the call's logs and traces (bench/gpu/grid.sh's tars beside its grid.jsonl)
        for tar in sorted(f.parent.glob(f"{f.stem}_logs.tar.gz")) + \
                sorted(f.parent.glob(f"{f.stem}_traces*.tar")):
            with tarfile.open(tar) as t:
                t.extractall(work / f.stem, filter="data")
        for r in sorted(recs, key=lambda r: "__rep" in r["id"]):  # a new point before its repeats
            base, sep, _ = r["id"].partition("__rep")
            points = doc["shapes"][r["shape"]]["points"]
            old = next((p for p in points if p["id"] == base), None)
            if not sep and r.get("status") != "skipped" and \
                    (old is None or old["status"] == "skipped"):  # a point not measured before
                folder = work / f.stem / r["shape"] / r["id"]
                tr = folder / "rank0.pt.trace.json.gz"
                fl = {"trace": tr, "log": folder / "train.log"} if tr.exists() else {}
                row = point_row({**r, "device_call": f.stem}, None, fl)
                points[:] = [p for p in points if p["id"] != base] + [row]
                new[(r["shape"], base)] = fl
                continue
            if not sep or r.get("status") != "ok" or not r.get("step_ms"):
                continue
            row = next(p for p in points if p["id"] == base)
            row["runs_step_ms"] = [*(row.get("runs_step_ms") or [row["step_ms"]]), r["step_ms"]]
            row["step_ms"] = round(statistics.median(row["runs_step_ms"]), 2)
        done.append(f.name)
    for shape, sd in doc["shapes"].items():
        sd.update(shape_summary(shape, {p["id"]: p for p in sd["points"]}))
        base = sd["start_step_ms"]
        for p in sd["points"]:
            p["speedup_vs_start"] = round(base / p["step_ms"], 2) if p.get("step_ms") else None
        sd["points"].sort(key=by_speed)
        for p in sd["points"]:
            if new.get((shape, p["id"])):
                write_fixture(shape, sd, p, new[(shape, p["id"])])
            tf = FIXTURES / f"grid_{shape}_{p['id']}" / "truth.json"
            if not tf.is_file():
                continue
            t = json.loads(tf.read_text())
            t["measured"].update(step_ms=p["step_ms"], speedup_vs_start=p["speedup_vs_start"],
                                 runs_step_ms=p["runs_step_ms"])
            t["shape_best"].update(id=sd["best"], step_ms=sd["best_step_ms"])
            t["shape_start"]["step_ms"] = base
            tf.write_text(json.dumps(t, indent=1) + "\n")
    shutil.rmtree(work)
    path.write_text(json.dumps(doc, indent=1) + "\n")
    print(path)
    return 0


def tables(path: Path = GRID / "grid_h200.json") -> str:
    """The README's markdown tables from grid_h200.json."""
    doc = json.loads(path.read_text())
    out = []
    for shape, sd in doc["shapes"].items():
        out.append(f"### `{shape}`: {sd['desc']}\n")
        out.append("| point | change vs start | step ms (median of runs: each run's it 4-9 median) "
                   "| speed-up | "
                   "max alloc GiB | max reserved GiB | OOM | status | run wall s | "
                   "cudaGraphLaunch | why |")
        out.append("|---|---|---|---|---|---|---|---|---|---|---|")
        for r in sd["points"]:
            ch = ", ".join(f"{k}={v}" for k, v in r["changed_vs_start"].items()) or "(start)"
            runs = r.get("runs_step_ms") or []
            rng = f" ({', '.join(f'{x:.1f}' for x in runs)})" if len(runs) > 1 else ""
            step = f"{r['step_ms']:.1f}{rng}" if r.get("step_ms") else ""
            name = f"**{r['id']}**" if r["id"] == sd["best"] else f"`{r['id']}`"
            out.append(
                f"| {name} | {ch} | {step} | {fmt(r['speedup_vs_start'], 2)} | "
                f"{fmt(r['max_alloc_gib'], 2)} | {fmt(r['max_reserved_gib'], 2)} | "
                f"{'yes' if r['oom'] else ('no' if r['status'] == 'ok' else '')} | "
                f"{r['status']} | {fmt(r['wall_s'])} | {fmt(r['cudaGraphLaunch_rows'])} | "
                f"{r['why'] or ''} |")
        out.append("")
    out.append("### Local CUDA graph probes (tiny model, before the grid)\n")
    out.append("| probe | step ms | max alloc GiB | cudaGraphLaunch (2 steps) | loss it 12 | "
               "status |")
    out.append("|---|---|---|---|---|---|")
    for p in doc["graph_probes"]:
        out.append(f"| `{p['id']}` | {fmt(p['step_ms'], 2)} | {fmt(p['max_alloc_gib'], 2)} | "
                   f"{fmt(p['cudaGraphLaunch_rows'])} | {fmt(p['loss_last'], 4)} | "
                   f"{p['status']} |")
    return "\n".join(out) + "\n"


def trim_one(src: Path, dst: Path, step: int) -> None:
    """fixtures/gpu/trim_steps.py's trim() keeping ProfilerStep#`step`. torch 2.11 also writes
    each ProfilerStep as a `gpu_user_annotation` row, which trim() would count as further step
    windows ("steps not all in the trace"): those rows are renamed while it picks the window."""
    sys.path.insert(0, str(TRIM.parent))
    import trim_steps

    doc = json.loads(gzip.decompress(src.read_bytes()))
    hidden = [e for e in doc["traceEvents"] if e.get("cat") == "gpu_user_annotation"
              and str(e.get("name", "")).startswith("ProfilerStep#")]
    for e in hidden:
        e["name"] = "~" + e["name"]
    small = trim_steps.trim(doc, {step})
    for e in hidden:
        e["name"] = e["name"][1:]
    with gzip.open(dst, "wt", compresslevel=9) as fh:
        json.dump(small, fh, separators=(",", ":"))


def fixtures(doc: dict[str, Any], files: dict) -> None:
    """fixtures/traces/grid_SHAPE_ID/: one trimmed step, the run's log, truth.json, for every
    non-optimal non-OOM point with a trace; untrimmed copies under bench/out/grid/traces/."""
    for old in FIXTURES.glob("grid_*"):
        shutil.rmtree(old)
    for shape, sd in doc["shapes"].items():
        for row in sd["points"]:
            f = files.get((shape, row["id"]))
            if not f or not f.get("trace"):
                continue
            keep = KEEP / "traces" / shape / row["id"]
            keep.mkdir(parents=True, exist_ok=True)
            shutil.copy(f["trace"], keep / f["trace"].name)
            shutil.copy(f["log"], keep / "train.log")
            write_fixture(shape, sd, row, f)


def write_fixture(shape: str, sd: dict[str, Any], row: dict[str, Any], f: dict[str, Any]) -> None:
    """fixtures/traces/grid_SHAPE_ID/ of one point (not for failed runs or a proven best)."""
    if row["status"] != "ok" or (row["id"] == sd["best"] and sd["grid_complete"]):
        return
    out = FIXTURES / f"grid_{shape}_{row['id']}"
    out.mkdir(parents=True, exist_ok=True)
    step = 4 if f.get("rerun") else gs.PROFILE_END - 1   # the last profiled step
    if f.get("trimmed"):
        shutil.copy(f["trace"], out / "trace.json.gz")
    else:
        trim_one(f["trace"], out / "trace.json.gz", step)
    shutil.copy(f["log"], out / "train.log")
    truth = {
        "case": f"grid_{shape}_{row['id']}",
        "shape": shape, "shape_desc": sd["desc"],
        "knobs": row["knobs"], "changed_vs_start": row["changed_vs_start"],
        "claimed": {"micro_batch_size": row["knobs"]["mbs"],
                    "moe_grouped_gemm": row["knobs"]["grouped"],
                    "recompute_granularity": None if row["knobs"]["recompute"] == "none"
                    else row["knobs"]["recompute"],
                    "moe_token_dispatcher_type": row["knobs"]["dispatcher"],
                    "cuda_graph_impl": "none" if row["knobs"]["graphs"] == "eager"
                    else "local"},
        "grouped_gemm": row["knobs"]["grouped"],  # torch._grouped_mm experts when true
        "cuda_graph_replay": bool(row.get("cudaGraphLaunch_rows")),
        "measured": {k: row[k] for k in ("step_ms", "runs_step_ms", "speedup_vs_start",
                                         "steady_iter_ms", "max_alloc_gib", "max_reserved_gib",
                                         "wall_s")},
        "shape_best": {"id": sd["best"], "step_ms": sd["best_step_ms"],
                       "grid_complete": sd["grid_complete"]},
        "shape_start": {"id": sd["start"], "step_ms": sd["start_step_ms"]},
        "trace_step": f"ProfilerStep#{step}",
        "trace_from": row["trace"], "log": "train.log: the run the trace is from",
        "cmd": row["cmd"],
        **({"trace_cmd": f["rerun_record"]["cmd"]} if f.get("rerun") else {}),
        "setting": "bench/grid/README.md (H200 grid, megatron-core 0.19.2 local spec, "
                   "no TE, bf16, one GPU)",
    }
    (out / "truth.json").write_text(json.dumps(truth, indent=1) + "\n")


if __name__ == "__main__":
    sys.exit(main())
