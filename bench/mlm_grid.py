"""Run the real-trainer grid (bench/mlm_spec.py: Megatron-LM's pretrain_gpt.py) on the device, and
fold what comes back into bench/grid_mlm/ here.

Device side (bench/gpu/mlm_grid.sh calls it; standard library only):

    python3 bench/mlm_grid.py run JOB... --megatron /tmp/mlm --work /tmp/g --out $OUT --deadline-s 520

A JOB is `SHAPE:POINT` (a profiled grid run, e.g. `host:mbs1_seq_rcfull_a2a_eager`),
`SHAPE:POINT@rep` (an unprofiled repeat: one more fresh process), `end:SHAPE:TUNE_JSON` (the final
command of a `moetune tune --json` session, unprofiled: the loop's end point measured beside the
grid's best in the same call), or a probe `probe:NAME`
(PROBES: the runs that give the other parts of the tool real inputs). Jobs run one at a time in
the order given, each a fresh process timed from start to exit; a job that would pass the deadline
(its estimate: the last finished job of its shape) is recorded as `skipped`. Each result is
appended to $OUT/grid.jsonl as it ends; logs, traces and snapshots are packed at the end into at
most 7 more files (traces trimmed to one step where they would not all come back).

Here:

    python bench/mlm_grid.py report bench/grid_mlm/calls/call*.jsonl   # -> bench/grid_mlm/grid.json

(Each call's grid.jsonl, logs.tar.gz and summary.txt are kept as bench/grid_mlm/calls/callN*.)
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tarfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
import mlm_spec as ms

ROOT = Path(__file__).resolve().parents[1]
MiB = 1024 * 1024
TIMEOUT_S = 240


def probes(megatron: str, work: Path) -> dict[str, tuple[str, dict[str, Any], list[str]]]:
    """name -> (shape, point, extra flags): runs that feed the reader, not the grid's figures."""
    snap = work / "probe_snapshot" / "snapshot.pickle"
    return {
        # Megatron's memory history (`torch.cuda.memory._dump_snapshot` at each log interval)
        "snapshot": ("host", {"mbs": 8}, ["--record-memory-history", "--memory-snapshot-path",
                                          str(snap)]),
        # Kineto with shapes and Python stacks (the anatomy's strongest Kineto source)
        "stack": ("host", {"mbs": 8}, ["--pytorch-profiler-collect-shapes",
                                       "--pytorch-profiler-collect-callstack"]),
        # whole-layer local CUDA graphs with static (drop-and-pad) MoE shapes
        "droppad": ("host", {"mbs": 8, "recompute": "none", "graphs": "local_droppad"}, []),
    }


def run_one(cmd: list[str], d: Path, env: dict[str, str], timeout: int = TIMEOUT_S) -> dict[str, Any]:
    d.mkdir(parents=True, exist_ok=True)
    log = d / "train.log"
    t0 = time.time()
    with open(log, "w") as fh:
        fh.write("$ " + " ".join(cmd) + "\n")
        fh.flush()
        try:
            rc = subprocess.run(cmd, stdout=fh, stderr=subprocess.STDOUT, timeout=timeout,
                                env=env, start_new_session=True).returncode
        except subprocess.TimeoutExpired:
            rc = 124
    wall = time.time() - t0
    res = ms.parse_log(log.read_text(errors="replace"), rc)
    res.update(rc=rc, wall_s=round(wall, 2), started_unix=round(t0, 1))
    # Megatron writes its trace beside the tensorboard dir, not inside it
    traces = sorted((d / "torch_profile").glob("rank-*.json.gz"))
    res["traces"] = [str(t.relative_to(d)) for t in traces]
    res["trace_bytes_gz"] = sum(t.stat().st_size for t in traces) or None
    return res


def job_error(job: str, probes_: dict[str, Any]) -> str | None:
    """Why `job` cannot run (None when it can)."""
    kind, _, rest = job.partition(":")
    rest = rest.removesuffix("@rep")
    if kind == "probe":
        return None if rest in probes_ else f"no probe {rest!r} (one of {sorted(probes_)})"
    if kind == "ckpt":
        return None if rest else "ckpt:MODE"
    if kind == "end":
        shape, _, path = rest.partition(":")
        if shape not in ms.SHAPES:
            return f"end:SHAPE:TUNE_JSON: no shape {shape!r}"
        try:
            json.loads(Path(path).read_text())["final_command"]
        except (OSError, ValueError, KeyError) as exc:
            return f"end:{shape}:{path}: not a `moetune tune --json` document ({exc})"
        return None
    if kind not in ms.SHAPES:
        return f"no shape {kind!r} (one of {sorted(ms.SHAPES)})"
    try:
        ms.knob_flags(ms.parse_id(rest))
    except (ValueError, KeyError) as exc:
        return f"not a point id like mbs8_seq_rcnone_a2a_eager[@rep] ({exc})"
    return None


def run(args: argparse.Namespace) -> int:
    work, out = Path(args.work), Path(args.out)
    work.mkdir(parents=True, exist_ok=True)
    out.mkdir(parents=True, exist_ok=True)
    env = dict(os.environ)
    env.update(NCCL_NVLS_ENABLE="0", TORCH_SYMM_MEM_DISABLE_MULTICAST="1", NVSHMEM_DISABLE_NVLS="1",
               CUDA_DEVICE_MAX_CONNECTIONS="1", PYTHONUNBUFFERED="1")
    env["PYTHONPATH"] = args.megatron + os.pathsep + env.get("PYTHONPATH", "")
    t_end = time.time() + args.deadline_s
    walls: dict[str, float] = {}
    pr = probes(args.megatron, work)
    for job in args.jobs:  # every job checked before the first runs: a typo costs no device time
        if (bad := job_error(job, pr)) is not None:
            print(f"mlm_grid: job {job!r}: {bad}", file=sys.stderr)
            return 2
    for job in args.jobs:
        kind, _, rest = job.partition(":")
        repeat = rest.endswith("@rep")
        rest = rest.removesuffix("@rep")
        if kind == "probe":
            shape, point, extra = pr[rest]
            name = f"probe_{rest}"
        elif kind == "ckpt":  # torch checkpointing on the GPU: fixtures/checkpoint/make_traces.py
            name = f"ckpt_{rest}"
            d = work / name
            d.mkdir(parents=True, exist_ok=True)
            t0 = time.time()
            p = subprocess.run([sys.executable, str(ROOT / "fixtures/checkpoint/make_traces.py"),
                                rest, str(d / "trace.json"), "cuda"], capture_output=True,
                               text=True, env=env, timeout=120)
            subprocess.run(["gzip", "-9", str(d / "trace.json")], check=False)
            emit(out, {"id": name, "rc": p.returncode, "wall_s": round(time.time() - t0, 1),
                       "error": p.stderr[-300:] if p.returncode else None})
            continue
        elif kind == "end":  # the final command of a `moetune tune --json` session, unprofiled
            shape, _, path = rest.partition(":")
            tuned = json.loads(Path(path).read_text())
            point, beyond = ms.point_of(tuned["final_command"], tuned["final_env"])
            name = f"{shape}_tune_end"
        else:
            shape, point, extra = kind, ms.parse_id(rest), []
            name = f"{shape}_{rest}" + ("_rep" if repeat else "")
        est = walls.get(shape, 60.0)
        if time.time() + est > t_end:
            emit(out, {"id": name, "shape": shape, "status": "skipped", "why": "deadline"})
            continue
        d = work / name
        k = 1
        while d.exists():  # a second repeat of a point in one call
            k += 1
            d = work / f"{name}{k}"
        if kind == "end":
            cmd = list(tuned["final_command"])
            res = run_one(cmd, d, {**env, **tuned["final_env"]})
            rec = {"point": ms.point_id(point), "beyond_grid": beyond, "tune_end": True}
        else:
            cmd = ms.command(args.megatron, shape, point, str(d / "tb"), repeat=repeat,
                             extra=extra)
            res = run_one(cmd, d, env)
            rec = {"point": ms.point_id(point)}
        walls[shape] = res["wall_s"]
        emit(out, {"id": d.name, "shape": shape, **rec, "job": job, "command": cmd, **res})
    pack(out, work)
    return 0


def emit(out: Path, rec: dict[str, Any]) -> None:
    with open(out / "grid.jsonl", "a") as fh:
        fh.write(json.dumps(rec) + "\n")
    keys = ("status", "step_ms", "tflops_per_gpu", "max_alloc_gib", "max_reserved_gib", "init_s",
            "wall_s", "trace_bytes_gz", "error")
    print(f"{rec['id']}: " + ", ".join(f"{k}={rec[k]}" for k in keys if rec.get(k) is not None),
          flush=True)


def pack(out: Path, work: Path) -> None:
    """Logs + snapshots (one tar.gz), traces in tars of ≤ 15.5 MiB (6 at most; past that a trace
    is left behind and named)."""
    with tarfile.open(out / "logs.tar.gz", "w:gz") as t:
        for f in sorted(work.rglob("train.log")) + sorted(work.rglob("*.pickle")):
            t.add(f, arcname=str(f.relative_to(work)))
    traces = sorted(list(work.rglob("rank-*.json.gz")) + list(work.rglob("ckpt_*/trace.json.gz")),
                    key=lambda p: p.stat().st_size)
    bins: list[list[Path]] = [[]]
    size = 0
    for tr in traces:
        s = tr.stat().st_size
        if size + s > 15.5 * MiB:
            if len(bins) == 6:
                print(f"trace left behind: {tr.relative_to(work)} ({s / MiB:.1f} MiB)", flush=True)
                continue
            bins.append([])
            size = 0
        bins[-1].append(tr)
        size += s
    for k, members in enumerate(b for b in bins if b):
        with tarfile.open(out / f"traces{k + 1}.tar", "w") as t:
            for tr in members:
                t.add(tr, arcname=str(tr.relative_to(work)))


# ---- here: fold device outputs into bench/grid_mlm/ ----

def moetune_step(log_text: str, command: list[str], rc: int) -> dict[str, Any]:
    """A run's step time by moetune's own definition (executor/validate.py `run_metrics`): the
    measured window is iterations 3 … profile start − 2 (3-8 in calls 1-2, 3-14 after)."""
    from moetune.executor.launchers.base import RunResult
    from moetune.executor.logparse import parse_text
    from moetune.executor.validate import Window, run_metrics

    iters = _flag(command, "--train-iters", ms.TRAIN_ITERS)
    start = _flag(command, "--profile-step-start", iters - 1)
    m = run_metrics(parse_text(log_text), RunResult(rc, False, 0.0, Path("train.log")),
                    Window(3, start - 2))
    return {"step_ms": m["step_ms"], "window": m["window"], "drift": m["drift"],
            "drifting": m["drifting"], "window_median_ms": m["window_median_ms"]}


def moetune_step_from_times(iter_ms: list[float], command: list[str]) -> dict[str, Any]:
    """`moetune_step` from the record's iteration times, for a run whose log was not kept."""
    from moetune.executor.validate import Window, run_level

    iters = _flag(command, "--train-iters", ms.TRAIN_ITERS)
    start = _flag(command, "--profile-step-start", iters - 1)
    step, window_ms, drift, drifting = run_level(iter_ms[2:start - 2])
    return {"step_ms": step, "window": str(Window(3, start - 2)), "drift": drift,
            "drifting": drifting, "window_median_ms": window_ms, "from": "record's iter_ms"}


def _flag(command: list[str], name: str, default: int) -> int:
    return int(command[command.index(name) + 1]) if name in command else default


def _logs(files: list[Path]) -> dict[tuple[str, str], str]:
    """(call, run folder) -> its train.log, from the calls' kept logs.tar.gz."""
    out: dict[tuple[str, str], str] = {}
    for f in files:
        tar = f.with_name(f"{f.stem}_logs.tar.gz")
        if not tar.is_file():
            continue
        with tarfile.open(tar) as t:
            for m in t.getmembers():
                if m.name.endswith("train.log") and (fh := t.extractfile(m)) is not None:
                    out[(f.stem, m.name.split("/")[0])] = fh.read().decode(errors="replace")
    return out


def report(args: argparse.Namespace) -> int:
    dest = ROOT / "bench" / "grid_mlm"
    dest.mkdir(parents=True, exist_ok=True)
    recs: list[dict[str, Any]] = []
    for f in map(Path, args.files):
        try:
            lines = f.read_text().splitlines()
            recs += [{**json.loads(x), "call": f.stem} for x in lines if x.strip()]
        except (OSError, ValueError) as exc:
            print(f"mlm_grid: {f}: {exc}", file=sys.stderr)
            return 2
    logs = _logs([Path(f) for f in args.files])
    points: dict[str, dict[str, Any]] = {}
    for r in recs:
        text = logs.get((r["call"], r["id"]))
        if text is not None and r.get("status") == "ok":
            r.update(moetune_step(text, r.get("command") or [], r.get("rc") or 0))
        elif r.get("status") == "ok" and r.get("iter_ms"):  # its log was not kept
            r.update(moetune_step_from_times(r["iter_ms"], r.get("command") or []))
        cmd = r.get("command") or []
        if r.get("point", "").endswith("_local") and "--cuda-graph-modules" not in cmd:
            r["point"] = r["point"] + "_layer"  # call 2 ran "local" as whole layers
        if r.get("beyond_grid"):  # a tune end point that sets more than the grid's knobs
            r["point"] = f"{r['point']} + {' '.join(r['beyond_grid'])}"
        if r.get("status") != "ok" and r.get("status") not in ("oom", "crash", "refused"):
            continue
        key = f"{r.get('shape')}:{r.get('point')}"
        if not r.get("point") or r["id"].startswith("probe_"):
            continue
        p = points.setdefault(key, {"shape": r["shape"], "point": r["point"], "runs": []})
        p["runs"].append({k: r.get(k) for k in ("call", "id", "status", "step_ms", "window",
                                                  "drift", "drifting", "window_median_ms",
                                                  "from", "iter_ms", "tflops_per_gpu", "max_alloc_gib",
                                                  "max_reserved_gib", "wall_s", "init_s", "error")})
    for p in points.values():
        ok = [x["step_ms"] for x in p["runs"] if x["status"] == "ok" and x["step_ms"]]
        p["status"] = "ok" if ok else p["runs"][0]["status"]
        p["step_ms"] = round(statistics.median(ok), 2) if ok else None
        p["n_runs"] = len(ok)
    doc = {"trainer": "NVIDIA/Megatron-LM pretrain_gpt.py", "megatron_commit": ms.MEGATRON_COMMIT,
           "shapes": {k: v["desc"] for k, v in ms.SHAPES.items()},
           "protocol": {"train_iters": ms.TRAIN_ITERS, "steady": [ms.STEADY.start, ms.STEADY.stop - 1],
                        "profile": [ms.PROFILE_START, ms.PROFILE_END],
                        "step_ms": "executor/validate.py run_metrics over each run's window"},
           "points": sorted(points.values(), key=lambda p: (p["shape"], p["point"]))}
    (dest / "grid.json").write_text(json.dumps(doc, indent=1) + "\n")
    for p in doc["points"]:
        mem = p["runs"][0]
        drift = ", ".join(f"{x['drift']:+.0%}" for x in p["runs"] if x.get("drift") is not None)
        print(f"{p['shape']:5} {p['point']:32} {p['status']:7} {p['step_ms'] or '':>9} ms "
              f"n={p['n_runs']} alloc={mem.get('max_alloc_gib')} wall={mem.get('wall_s')} "
              f"drift {drift or '-'}")
    return 0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="mlm_grid")
    sub = ap.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("run")
    r.add_argument("jobs", nargs="+")
    r.add_argument("--megatron", required=True)
    r.add_argument("--work", required=True)
    r.add_argument("--out", required=True)
    r.add_argument("--deadline-s", type=float, default=520)
    rp = sub.add_parser("report")
    rp.add_argument("files", nargs="+")
    a = ap.parse_args(argv)
    return run(a) if a.cmd == "run" else report(a)


if __name__ == "__main__":
    sys.exit(main())
