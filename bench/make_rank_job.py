"""A synthetic multi-rank job from real Kineto traces: one trace replicated per rank, with known
clock offsets, one slow rank and one overloaded expert-parallel rank (the cross-rank reduce's
ground truth, analyzer/cross_rank.py; docs/cross-rank.md).

    python bench/make_rank_job.py OUT_DIR --ranks 512 [--ep 8] [--seed N] [--source TRACE ...]
        [--jobs N]

What is true by construction (written to OUT_DIR/truth.json):

- groups: ranks form expert-parallel (EP) groups of `--ep` consecutive ranks; every other process
  group of the source with more than one member becomes a data-parallel (DP) group of the ranks
  with the same position in their EP group (within the source's block); `default_pg` spans the
  block. Process group names, descriptions, ranks, `Rank` and `distributedInfo` are rewritten per
  rank, so the job reads as Megatron would write it.
- time: every rank runs the source's timeline through a time warp. Between two consecutive
  collective ends of the source, the slow rank's compute kernels take `--slow-factor` × longer and
  the overloaded rank's expert GEMMs (kernel class `compute.gemm.grouped_cutlass`) take
  `--expert-factor` × longer; every other rank waits the difference inside the collective that
  ends the interval (work on other streams overlapping that collective stretches with it). Every collective therefore ends at the same true time on all its members, so
  clock alignment on collective ends has an exact answer. After the last collective nothing
  synchronises the ranks: the slow rank's step ends later.
- clocks: rank r's timestamps are the true times plus `clock_offset_ns[r]` (random, up to
  ±`--max-offset-ms`); the reduce, referenced to the lowest rank of r's block, should recover
  `expected_alignment_ns[r]` = `clock_offset_ns[lowest] − clock_offset_ns[r]`.
- processes: the host process id is 100000 + rank; GPU events keep the source's device.
- load: the overloaded rank's all-to-all `Out split size` (rows received from each peer) and
  `Out msg nelems` on its EP group are `--split-factor` × the source's.

With several `--source` traces the ranks are split into contiguous blocks, one per source (each a
multiple of `--ep`), each block its own job: no collective joins two blocks, so their clocks can
only be aligned within a block (truth.json `blocks`). The slow and overloaded ranks are in block 0.
A source without process-group metadata (older PyTorch) keeps its kernels unlabelled: its block's
collectives are matched by kernel name.

The JSON is written by filling a text template made once per source: per rank only timestamps and
the rank's own fields are formatted, and gzip runs at level 1: 512 ranks of the H200 trace
(6 MB of JSON, 0.8 MB written per rank) take about 30 s on 2 cores.
"""

from __future__ import annotations

import argparse
import gzip
import itertools
import json
import multiprocessing as mp
import os
import random
import re
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import msgspec
import numpy as np

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_SOURCE = ROOT / "fixtures/traces/gpu_ep2_alltoall_overlap/rank0.pt.trace.json.gz"
# Megatron's descriptions of groups that span the expert-parallel ranks (parallel_state.py).
EP_DESC = re.compile(r"^EXPERT_(MODEL|TENSOR_AND_MODEL|TENSOR_MODEL_PIPELINE)_PARALLEL_GROUP")
# kernel_classes.yaml `compute.gemm.grouped_cutlass`: the expert GEMMs of the grouped-GEMM path.
EXPERT_GEMM = re.compile(r"cutlass.*GemmUniversal.*GroupProblemShape|cutlass.*GroupProblemShape"
                         r"|[Gg][Rr][Oo][Uu][Pp][Ee][Dd]_?[Gg][Ee][Mm][Mm]")
SLOT = re.compile(r'"@@([A-Z]+):([^"@]*)@@"')
TYPES = ("normal", "slow", "over")


@dataclass
class Template:
    """One source trace as text chunks around slots, and per-type slot values."""

    source: str
    chunks: list[str]  # literal text; slot i sits between chunks[i] and chunks[i + 1]
    kinds: list[tuple[str, str]]  # (kind, key) of each slot
    ts_ns: dict[str, np.ndarray]  # type → warped timestamp (ns, rank clock before offset) per T slot
    fixed: dict[str, dict[int, str]]  # type → slot index → text (durations, splits)
    pgs: dict[str, dict[str, Any]]  # source pg name → {desc, size}
    dist: dict[str, Any] | None
    cpu_pids: set[int]
    has_pg: bool


def load(path: Path) -> dict[str, Any]:
    raw = path.read_bytes()
    if raw[:2] == b"\x1f\x8b":
        raw = gzip.decompress(raw)
    return msgspec.json.decode(raw)


def _to_ns(ts: float | int) -> int:
    return round(ts * 1000)


def _warps(events: list[dict[str, Any]], factors: dict[str, tuple[float, float]]
           ) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """Per type, the warp as (breakpoints, warped breakpoints) in ns relative to the first event.

    Type τ = (compute factor, expert-GEMM factor). See the module docstring: within each interval
    between consecutive collective ends, type τ gains w_τ of stretched kernels and waits the
    rest of X = max_τ w_τ in the tail of the collective ending the interval."""
    timed = [e for e in events if e.get("ph") != "M" and isinstance(e.get("ts"), int | float)]
    t0 = min(_to_ns(e["ts"]) for e in timed)
    t1 = max(_to_ns(e["ts"]) + _to_ns(e.get("dur") or 0) for e in timed)
    kern = [e for e in timed if e.get("cat") == "kernel" and e.get("ph") == "X"]
    comm = [(_to_ns(e["ts"]) - t0, _to_ns(e["ts"]) + _to_ns(e["dur"]) - t0) for e in kern
            if e["name"].startswith(("nccl", "void nccl"))]
    compute = [(_to_ns(e["ts"]) - t0, _to_ns(e["ts"]) + _to_ns(e["dur"]) - t0) for e in kern
               if not e["name"].startswith(("nccl", "void nccl"))]
    expert = [(_to_ns(e["ts"]) - t0, _to_ns(e["ts"]) + _to_ns(e["dur"]) - t0) for e in kern
              if EXPERT_GEMM.search(e["name"])]
    span = float(t1 - t0)
    ends = sorted({b for _, b in comm})
    start_of = {}
    for a, b in comm:  # the collective that ends at b: the earliest-starting one there
        start_of[b] = min(a, start_of.get(b, a))
    bounds = [0.0, *[float(e) for e in ends], span]

    def union(spans: list[tuple[int, int]]) -> list[tuple[float, float]]:
        out: list[list[float]] = []
        for a, b in sorted(spans):
            if out and a <= out[-1][1]:
                out[-1][1] = max(out[-1][1], b)
            else:
                out.append([float(a), float(b)])
        return [(a, b) for a, b in out]

    def measure(spans: list[tuple[float, float]], lo: float, hi: float) -> float:
        return sum(max(0.0, min(b, hi) - max(a, lo)) for a, b in spans)

    stretched = {"compute": union(compute), "expert": union(expert)}
    gain: dict[str, list[float]] = {}
    for t, (fc, fe) in factors.items():
        gain[t] = [(fc - 1) * measure(stretched["compute"], lo, hi)
                   + (fe - 1) * measure(stretched["expert"], lo, hi)
                   for lo, hi in itertools.pairwise(bounds)]
    n_sync = len(ends)  # intervals 0..n_sync-1 end at a collective; the last one does not
    top = [max(gain[t][i] for t in factors) for i in range(n_sync)]
    out = {}
    for t, (fc, fe) in factors.items():
        # Slope density pieces: (lo, hi, extra slope) added on top of 1.
        pieces: list[tuple[float, float, float]] = []
        pieces += [(a, b, fc - 1) for a, b in stretched["compute"] if fc != 1]
        pieces += [(a, b, fe - 1) for a, b in stretched["expert"] if fe != 1]
        for i in range(n_sync):
            wait = top[i] - gain[t][i]
            lo = max(float(start_of[ends[i]]), bounds[i])
            hi = float(ends[i])
            if wait > 0 and hi > lo:
                pieces.append((lo, hi, wait / (hi - lo)))
            elif wait > 0:  # a zero-length tail: the wait sits just before the end
                pieces.append((hi - 1.0, hi, wait))
        xs = np.unique(np.array([0.0, span, *[p[0] for p in pieces], *[p[1] for p in pieces]]))
        slope = np.ones(len(xs) - 1)
        mids = (xs[:-1] + xs[1:]) / 2
        for a, b, s in pieces:
            slope[(mids > a) & (mids < b)] += s
        ys = np.concatenate([[0.0], np.cumsum(slope * np.diff(xs))])
        out[t] = (xs + t0, ys + t0)
    return out


def build_template(path: Path, factors: dict[str, tuple[float, float]], split_factor: float
                   ) -> Template:
    doc = load(path)
    events = doc["traceEvents"]
    warps = _warps(events, factors)
    dist = doc.get("distributedInfo")
    pgs = {str(p["pg_name"]): {"desc": p.get("pg_desc"), "size": int(p.get("pg_size") or 1)}
           for p in (dist or {}).get("pg_config") or []}
    cpu_pids = {e["pid"] for e in events if e.get("cat") in ("cpu_op", "user_annotation")
                and isinstance(e.get("pid"), int)}
    ts_src: list[int] = []
    dur_src: list[tuple[int, int]] = []  # (ts, end) ns per D slot
    over_fix: dict[str, str] = {}
    has_pg = False
    for e in events:
        if e.get("ph") != "M" and isinstance(e.get("ts"), int | float):
            ts = _to_ns(e["ts"])
            if e.get("ph") == "X" and isinstance(e.get("dur"), int | float):
                dur_src.append((ts, ts + _to_ns(e["dur"])))
                e["dur"] = f"@@D:{len(dur_src) - 1}@@"
            ts_src.append(ts)
            e["ts"] = f"@@T:{len(ts_src) - 1}@@"
        if e.get("pid") in cpu_pids:
            e["pid"] = "@@PID:@@"
        a = e.get("args")
        if not isinstance(a, dict):
            continue
        pg = a.get("Process Group Name")
        if pg is not None:
            has_pg = True
            pg = str(pg)
            pgs.setdefault(pg, {"desc": a.get("Process Group Description"),
                                "size": int(a.get("Group size") or 1)})
            a["Process Group Name"] = f"@@PN:{pg}@@"
            a["Process Group Ranks"] = f"@@PR:{pg}@@"
            for k, kind in (("Group size", "GZ"), ("Global rank start", "GS"),
                            ("Global rank stride", "GT"), ("Rank", "RANK")):
                if k in a:
                    a[k] = f"@@{kind}:{pg}@@"
            if (a.get("Collective name") or "").startswith("all_to_all") and EP_DESC.match(
                    str(a.get("Process Group Description") or "")):
                key = str(len(over_fix))
                split = json.loads(a.get("Out split size") or "[]")
                n = a.get("Out msg nelems")
                if split and isinstance(n, int):
                    big = [round(v * split_factor) for v in split]
                    over_fix[key] = json.dumps(big)
                    a["Out split size"] = f"@@OS:{key}@@"
                    over_fix["n" + key] = str(n + sum(big) - sum(split))
                    a["Out msg nelems"] = f"@@ON:n{key}@@"
                    over_fix["s" + key] = json.dumps(json.dumps(split))
                    over_fix["m" + key] = str(n)
    doc["distributedInfo"] = "@@DIST:@@"
    text = msgspec.json.encode(doc).decode()
    parts = SLOT.split(text)
    chunks = parts[0::3]
    kinds = list(zip(parts[1::3], parts[2::3], strict=True))
    ts_arr = np.array(ts_src, dtype=np.int64)
    d_ts = np.array([a for a, _ in dur_src], dtype=np.int64)
    d_end = np.array([b for _, b in dur_src], dtype=np.int64)
    ts_ns: dict[str, np.ndarray] = {}
    fixed: dict[str, dict[int, str]] = {}
    for t in factors:
        xs, ys = warps[t]
        ts_ns[t] = _warp(ts_arr, xs, ys)
        dur = _warp(d_end, xs, ys) - _warp(d_ts, xs, ys)
        durs = [_us(v) for v in dur.tolist()]
        fx: dict[int, str] = {}
        for i, (kind, key) in enumerate(kinds):
            if kind == "D":
                fx[i] = durs[int(key)]
            elif kind == "OS":
                fx[i] = json.dumps(over_fix[key]) if t == "over" else over_fix["s" + key]
            elif kind == "ON":
                fx[i] = over_fix[key] if t == "over" else over_fix["m" + key[1:]]
        fixed[t] = fx
    return Template(str(path), chunks, kinds, ts_ns, fixed, pgs, dist, cpu_pids, has_pg)


def _warp(t: np.ndarray, xs: np.ndarray, ys: np.ndarray) -> np.ndarray:
    """Warped ns, interpolated relative to the first breakpoint (float64 keeps ns exact there)."""
    base = xs[0]
    return np.rint(np.interp(t - base, xs - base, ys - base)).astype(np.int64) + int(base)


def _us(ns: int) -> str:
    """ns as Kineto's µs with 3 decimals, exactly (no float rounding at epoch magnitudes)."""
    sign = "-" if ns < 0 else ""
    ns = abs(ns)
    return f"{sign}{ns // 1000}.{ns % 1000:03d}"


@dataclass(frozen=True)
class Layout:
    """Where each rank sits: its block (source), EP group and position."""

    ranks: int
    ep: int
    blocks: list[tuple[int, int]]  # [lo, hi) per source

    def block_of(self, r: int) -> int:
        return next(b for b, (lo, hi) in enumerate(self.blocks) if lo <= r < hi)

    def group(self, r: int, desc: str | None, size: int) -> tuple[str, list[int]]:
        """(suffix naming the job's group, its ranks) for the source group (desc, size)."""
        b = self.block_of(r)
        lo, hi = self.blocks[b]
        if size <= 1:
            return f"r{r}", [r]
        if desc and EP_DESC.match(desc):
            e = r // self.ep
            return f"e{e}", list(range(e * self.ep, (e + 1) * self.ep))
        if desc == "default_pg":
            return f"b{b}", list(range(lo, hi))
        i = r % self.ep
        return f"d{b}.{i}", list(range(lo + i, hi, self.ep))


def render(tpl: Template, layout: Layout, r: int, kind: str, offset_ns: int, pid: int) -> bytes:
    """Rank r's trace text."""
    out: list[str] = [""] * (2 * len(tpl.chunks) - 1)
    out[0::2] = tpl.chunks
    ts = (tpl.ts_ns[kind] + offset_ns).tolist()
    fixed = tpl.fixed[kind]
    groups: dict[str, tuple[str, list[int]]] = {}

    def grp(pg: str) -> tuple[str, list[int]]:
        if pg not in groups:
            info = tpl.pgs.get(pg, {"desc": None, "size": 1})
            groups[pg] = layout.group(r, info["desc"], info["size"])
        return groups[pg]

    for i, (k, key) in enumerate(tpl.kinds):
        if k == "T":
            v = _us(ts[int(key)])
        elif k == "PID":
            v = str(pid)
        elif k == "PN":
            v = json.dumps(f"{key}.{grp(key)[0]}")
        elif k == "PR":
            v = json.dumps(str(grp(key)[1]))
        elif k == "GZ":
            v = str(len(grp(key)[1]))
        elif k == "GS":
            v = str(grp(key)[1][0])
        elif k == "GT":
            rk = grp(key)[1]
            v = str(rk[1] - rk[0] if len(rk) > 1 else 1)
        elif k == "RANK":
            v = str(r)
        elif k == "DIST":
            v = msgspec.json.encode(_dist(tpl, layout, r)).decode()
        else:
            v = fixed[i]
        out[2 * i + 1] = v
    return "".join(out).encode()


def _dist(tpl: Template, layout: Layout, r: int) -> dict[str, Any]:
    d = dict(tpl.dist or {"backend": "nccl"})
    d["rank"] = r
    d["world_size"] = layout.ranks
    if tpl.dist and tpl.dist.get("pg_config"):
        cfg = []
        for p in tpl.dist["pg_config"]:
            suffix, rk = layout.group(r, p.get("pg_desc"), int(p.get("pg_size") or 1))
            cfg.append({**p, "pg_name": f"{p['pg_name']}.{suffix}", "pg_size": len(rk),
                        "ranks": rk})
        d["pg_config"] = cfg
    return d


_STATE: dict[str, Any] = {}


def _write(r: int) -> int:
    s = _STATE
    b = s["layout"].block_of(r)
    kind = "slow" if r == s["slow"] else "over" if r == s["over"] else "normal"
    text = render(s["templates"][b], s["layout"], r, kind, s["offsets"][r], 100_000 + r)
    path = s["out"] / f"rank{r:05d}.pt.trace.json.gz"
    with gzip.open(path, "wb", compresslevel=1) as f:
        f.write(text)
    return path.stat().st_size


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("out", type=Path)
    ap.add_argument("--ranks", type=int, default=512)
    ap.add_argument("--ep", type=int, default=8)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--source", type=Path, nargs="+", default=[DEFAULT_SOURCE])
    ap.add_argument("--slow-factor", type=float, default=1.5)
    ap.add_argument("--expert-factor", type=float, default=2.0)
    ap.add_argument("--split-factor", type=float, default=1.5)
    ap.add_argument("--max-offset-ms", type=float, default=50.0)
    ap.add_argument("--jobs", type=int, default=os.cpu_count() or 1)
    a = ap.parse_args(argv)
    n_src = len(a.source)
    if a.ranks % a.ep or a.ranks // a.ep < 2 * n_src:
        ap.error("--ranks must be a multiple of --ep with at least two EP groups per source")
    per = a.ranks // a.ep // n_src * a.ep
    blocks = [(i * per, (i + 1) * per if i < n_src - 1 else a.ranks) for i in range(n_src)]
    layout = Layout(a.ranks, a.ep, blocks)
    rng = random.Random(a.seed)
    lim = int(a.max_offset_ms * 1e6)
    offsets = [rng.randint(-lim, lim) for _ in range(a.ranks)]
    b0 = blocks[0][1] // a.ep  # EP groups of block 0
    g_slow, g_over = rng.sample(range(b0), 2)  # different EP groups: the two causes stay apart
    slow = g_slow * a.ep + rng.randrange(a.ep)
    over = g_over * a.ep + rng.randrange(a.ep)
    factors = {"normal": (1.0, 1.0), "slow": (a.slow_factor, a.slow_factor),
               "over": (1.0, a.expert_factor)}
    templates = [build_template(p, factors, a.split_factor) for p in a.source]
    a.out.mkdir(parents=True, exist_ok=True)
    _STATE.update(layout=layout, slow=slow, over=over, templates=templates, offsets=offsets,
                  out=a.out)
    jobs = max(1, min(a.jobs, a.ranks))
    if jobs == 1:
        sizes = [_write(r) for r in range(a.ranks)]
    else:  # forked workers share the templates built above
        with mp.get_context("fork").Pool(jobs) as pool:
            sizes = pool.map(_write, range(a.ranks), chunksize=4)
    truth = {
        "ranks": a.ranks, "ep": a.ep, "seed": a.seed,
        "sources": [str(p) for p in a.source],
        "blocks": [{"source": str(p), "ranks": [lo, hi], "process_groups": t.has_pg}
                   for p, (lo, hi), t in zip(a.source, blocks, templates, strict=True)],
        "clock_offset_ns": {str(r): o for r, o in enumerate(offsets)},
        "expected_alignment_ns": {str(r): offsets[blocks[layout.block_of(r)][0]] - o
                                  for r, o in enumerate(offsets)},
        "slow_rank": slow, "slow_factor": a.slow_factor,
        "overloaded_rank": over, "expert_factor": a.expert_factor,
        "split_factor": a.split_factor,
        "bytes": sum(sizes),
    }
    (a.out / "truth.json").write_text(json.dumps(truth, indent=1) + "\n")
    print(f"{a.ranks} ranks → {a.out} ({sum(sizes) / 1e6:.0f} MB); slow rank {slow}, "
          f"overloaded EP rank {over}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
