"""Judge the advisor on the H200 grid (bench/grid/grid_h200.json): from every profiled point, ask
`moetune recommend` (the same pipeline: trace + the contract the run's own log gives) and compare
each recommendation with what the grid measured for that change.

    python bench/grid_advice.py                 # table on stdout
    python bench/grid_advice.py --json out.json # and the rows as JSON
    python bench/grid_advice.py --calibrate     # rewrite rules/gain_ranges.yaml from the pairs

A recommendation is judged where the grid holds the point it leads to: measured gain = step(start)
/ step(point) − 1 with the grid's step times (median of steady iterations, unprofiled), inside the
predicted range or not, and within ±25 % of the predicted midpoint or not. A point's step time is a
median over a few fresh processes whose own medians spread by up to ±30 % on this machine (host-bound
points), so the counts are also given over bootstrap resamples of every point's runs: how far the
judgement itself moves with the measurement, and paired within the device calls that ran both
points (`bench/grid/repeats/`): whether the spread is the machine drifting between calls (pairing
would cancel it) or each process's own level (it would not). The recorded logs predate
the workload's `grouped GEMM backend` line, so the contract states that backend (the environment
has torch._grouped_mm: the workload's grouped experts run without Transformer Engine).
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
GRID = ROOT / "bench" / "grid" / "grid_h200.json"
REPEATS = ROOT / "bench" / "grid" / "repeats"
TRACES = ROOT / "fixtures" / "traces"
RESAMPLES = 2000
RANGES = ROOT / "rules" / "gain_ranges.yaml"
NOISE = 0.03  # ln-gain a measured median moves by whatever the gain (the mem shape's runs: ≤ 7 %)


def grid_knobs(change: dict[str, Any], knobs: dict[str, Any]) -> dict[str, Any] | None:
    """The grid point a change leads to (None: a knob the grid does not vary)."""
    k, v = change["knob"], change["to"]
    out = dict(knobs)
    if k == "micro_batch_size":
        out["mbs"] = int(v)
    elif k == "moe_grouped_gemm":
        out["grouped"] = bool(v)
    elif k == "recompute_granularity":
        out["recompute"] = "none" if v is None else str(v)
    elif k == "cuda_graph_impl":
        out["graphs"] = "eager" if v in (None, "none") else "local"
    elif k == "moe_token_dispatcher_type":
        out["dispatcher"] = {"alltoall": "alltoall", "allgather": "allgather"}.get(v, v)
    else:
        return None
    return out


def hits(gain: Any, low: float, mid: float, high: float) -> tuple[Any, Any]:
    """(inside the predicted range, within ±25 % of its midpoint) for a measured gain, or for an
    array of them (elementwise)."""
    return (low <= gain) & (gain <= high), (abs(gain - mid) <= 0.25 * abs(mid)) & (mid != 0)


def judge(rec: dict[str, Any], start_ms: float, points: dict[str, dict[str, Any]],
          knobs: dict[str, Any]) -> dict[str, Any]:
    to = grid_knobs(rec["change"], knobs)
    sp = rec["gain"]["speedup"]
    replay = rec["gain"].get("replay") or sp
    row = {"rule": rec["rule"], "change": f"{rec['change']['knob']}={rec['change']['to']}",
           "predicted": [sp["low"], sp["mid"], sp["high"]],
           "replay": [replay["low"], sp["mid"], replay["high"]],
           "replayed": str(rec["gain"].get("recoverable_from") or "").startswith("whatif."),
           "measured": None, "point": None,
           "fits": (rec.get("memory") or {}).get("fits"),
           "memory_verdict": (rec.get("memory") or {}).get("verdict")}
    if to is None:
        return row
    hit = next((p for p in points.values() if p["knobs"] == to), None)
    if hit is None:
        return row
    row["point"] = hit["id"]
    mem = rec.get("memory") or {}
    if mem.get("peak_gib") is not None and hit.get("max_alloc_gib"):
        # the peak the advisor predicted (measured peak + the model's delta) against the point's
        row["memory_gib"] = {"predicted": mem["peak_gib"], "measured": hit["max_alloc_gib"],
                             "error": round(mem["peak_gib"] / hit["max_alloc_gib"] - 1, 4)}
    if hit["status"] == "ok" and hit["step_ms"]:
        g = start_ms / hit["step_ms"] - 1
        row["measured"] = round(g, 4)
        row["in_range"], row["within_25"] = hits(g, sp["low"], sp["mid"], sp["high"])
    else:
        row["status"] = hit["status"]
    return row


def resampled(rows: list[dict[str, Any]], grid: dict[str, Any], n: int = RESAMPLES,
              seed: int = 0) -> dict[str, Any]:
    """The judgement over `n` bootstrap resamples of every point's runs (one resample of a point is
    shared by every recommendation that reads it): counts in range / within ±25 % per resample,
    and each judged recommendation's 5-95 % interval of the measured gain (written in place)."""
    rng = np.random.default_rng(seed)
    meds: dict[tuple[str, str], np.ndarray] = {}
    for shape, s in grid["shapes"].items():
        for p in s["points"]:
            runs = np.asarray(p.get("runs_step_ms") or ([p["step_ms"]] if p["step_ms"] else []))
            if len(runs):
                meds[shape, p["id"]] = np.median(rng.choice(runs, (n, len(runs))), axis=1)
    in_range = np.zeros(n, dtype=int)
    within = np.zeros(n, dtype=int)
    top_in = np.zeros(n, dtype=int)
    top_within = np.zeros(n, dtype=int)
    judged = tops = 0
    for row in rows:
        for i, r in enumerate(row["recommendations"]):
            if r["measured"] is None:
                continue
            judged += 1
            g = meds[row["shape"], row["start"]] / meds[row["shape"], r["point"]] - 1
            inside, close = hits(g, *r["predicted"])
            in_range += inside
            within += close
            if i == 0 and not row["best"]:  # the change the loop tries first from this start
                tops += 1
                top_in += inside
                top_within += close
            r["measured_5_95"] = [round(float(x), 4) for x in np.percentile(g, [5, 95])]
    pct = lambda a: [int(x) for x in np.percentile(a, [5, 50, 95])]  # noqa: E731
    return {"resamples": n, "judged": judged, "in_range_5_50_95": pct(in_range),
            "within_25_5_50_95": pct(within), "tops": tops,
            "tops_in_range_5_50_95": pct(top_in), "tops_within_25_5_50_95": pct(top_within)}


def call_runs(grid: dict[str, Any], folder: Path = REPEATS
              ) -> dict[tuple[str, str], dict[int, list[float]]]:
    """(shape, point) → device call (its order) → the step times of that call's runs of the point.
    The call files are read and checked as `grid_run.py repeats` reads them (ValueError: the one
    line that says why one cannot be read), and the runs counted are those it folds in."""
    from grid_run import read_call  # this folder

    unmerged = {**grid, "repeat_files": []}  # every call file here was merged: read them again
    runs: dict[tuple[str, str], dict[int, list[float]]] = {}
    files = sorted(folder.glob("call*.jsonl"), key=lambda f: int(f.stem.removeprefix("call")))
    for call, f in enumerate(files):
        recs = read_call(f, unmerged)
        if isinstance(recs, str):
            raise ValueError(recs)
        for r in recs:
            if r.get("status") == "ok" and r.get("step_ms"):
                key = (r["shape"], r["id"].partition("__rep")[0])
                runs.setdefault(key, {}).setdefault(call, []).append(r["step_ms"])
    return runs


def paired_by_call(rows: list[dict[str, Any]],
                   runs: dict[tuple[str, str], dict[int, list[float]]]) -> dict[str, int]:
    """Each judged recommendation's gain measured within every device call that ran both its start
    and its point (`call_runs`; the medians of each's runs in that call), written in place as
    `paired_gains`; counts of the recommendations with such a call whose median paired gain is in
    range / within ±25 %."""
    import statistics

    judged = in_range = within = 0
    for row in rows:
        for r in row["recommendations"]:
            if r["measured"] is None:
                continue
            a = runs.get((row["shape"], row["start"]), {})
            b = runs.get((row["shape"], r["point"]), {})
            gains = [statistics.median(a[c]) / statistics.median(b[c]) - 1
                     for c in sorted(set(a) & set(b))]
            r["paired_gains"] = [round(g, 4) for g in gains]
            if gains:
                inside, close = hits(statistics.median(gains), *r["predicted"])
                judged += 1
                in_range += bool(inside)
                within += bool(close)
    return {"judged": judged, "in_range": in_range, "within_25": within}


def advise_grid(grid: dict[str, Any], *, reference: bool, quiet: bool = False
                ) -> list[dict[str, Any]]:
    """From every profiled point, the advice and each recommendation judged against the grid."""
    from moetune.analyzer.megatron_args import contract_from_log

    from moetune.analysis import analyze

    rows = []
    for shape, s in grid["shapes"].items():
        points = {p["id"]: p for p in s["points"]}
        best = min((p["step_ms"] for p in points.values() if p["status"] == "ok"), default=None)
        for pid, p in points.items():
            folder = TRACES / f"grid_{shape}_{pid}"
            if p["status"] != "ok" or not (folder / "trace.json.gz").is_file():
                continue
            contract = contract_from_log((folder / "train.log").read_text())
            contract.setdefault("versions", {}).setdefault("grouped_gemm", "torch._grouped_mm")
            advice = analyze(folder / "trace.json.gz", contract,
                             reference_step_s=p["step_ms"] / 1e3 if reference else None
                             ).advise()
            recs = advice.document["recommendations"]
            judged = [judge(r, p["step_ms"], points, p["knobs"]) for r in recs]
            rows.append({"shape": shape, "start": pid, "step_ms": p["step_ms"],
                         "best": p["step_ms"] == best, "recommendations": judged,
                         "prerequisites": [x["rule"] for x in advice.document["prerequisites"]]})
            top = judged[0] if judged else None
            if quiet:
                continue
            print(f"{shape:4} {pid:30} {p['step_ms']:8.1f} ms  top: "
                  + (f"{top['change']:28} pred {top['predicted'][0]:+.0%}…{top['predicted'][2]:+.0%}"
                     f" (mid {top['predicted'][1]:+.0%}) measured "
                     + (f"{top['measured']:+.0%}" if top["measured"] is not None else "n/a")
                     if top else "nothing"), flush=True)
    return rows


def z_of(r: dict[str, Any], noise: float = NOISE) -> float:
    """How far a measured gain fell from the replay's midpoint, in units of ln(1 + mid), beyond
    the noise floor (schemas/gain_ranges.schema.json)."""
    g = float(np.log1p(r["predicted"][1]))
    d = float(np.log1p(r["measured"])) - g
    d = float(np.sign(d)) * max(0.0, abs(d) - noise)
    return d / g


def calibrated(r: dict[str, Any], z_low: float, z_high: float, noise: float = NOISE
               ) -> tuple[float, float]:
    """The replay's range widened as rules/gain.py `calibrate` widens it (fidelity aside)."""
    g = float(np.log1p(r["predicted"][1]))
    return (min(r["replay"][0], float(np.expm1(g * (1 + z_low) - noise))),
            max(r["replay"][2], float(np.expm1(g * (1 + z_high) + noise))))


def calibration(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """z range over the replayed recommendations the grid measured, and the held-out coverage:
    each one judged by the range calibrated on all the others."""
    pairs = [r for row in rows for r in row["recommendations"]
             if r["measured"] is not None and r["replayed"] and r["predicted"][1] > 0]
    zs = [z_of(r) for r in pairs]
    held = 0
    for i, r in enumerate(pairs):
        rest = zs[:i] + zs[i + 1:]
        lo, hi = calibrated(r, min(rest), max(rest))
        held += lo <= r["measured"] <= hi
    # rounded outward: the extremes stay inside
    return {"z_low": math.floor(min(min(zs), 0.0) * 1000) / 1000,
            "z_high": math.ceil(max(max(zs), 0.0) * 1000) / 1000,
            "noise": NOISE, "pairs": len(pairs), "held_out_coverage": f"{held} of {len(pairs)}"}


def write_ranges(with_ref: dict[str, Any], profiled: dict[str, Any]) -> None:
    import datetime

    day = datetime.date.today().isoformat()
    lines = [
        "# The what-if replay's error on measured A/B pairs (schemas/gain_ranges.schema.json):",
        "# rules/gain.py widens every replayed range to cover it. Written by",
        "# `python bench/grid_advice.py --calibrate`; docs/advisor.md states the coverage.",
        "schema: moetune.gain_ranges/1",
        f'source: "bench/grid/grid_h200.json: every replayed recommendation whose change the grid '
        f'measured, from each profiled point (H200, {day}); with_reference: the estimates start '
        f'from the point\'s unprofiled step; profiled_only: from its profiled step"',
        "fidelity_tolerance: 0.07",
        "whatif:",
    ]
    for key, c in (("with_reference", with_ref), ("profiled_only", profiled)):
        lines.append(f"  {key}: {{z_low: {c['z_low']}, z_high: {c['z_high']}, noise: "
                     f"{c['noise']}, pairs: {c['pairs']}, held_out_coverage: "
                     f"\"{c['held_out_coverage']}\"}}")
    RANGES.write_text("\n".join(lines) + "\n")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", type=Path)
    ap.add_argument("--no-reference", dest="reference", action="store_false",
                    help="predict from the profiled step, not the run's unprofiled step time")
    ap.add_argument("--calibrate", action="store_true",
                    help="judge both ways (with and without the reference step) and rewrite "
                    "rules/gain_ranges.yaml from the measured pairs")
    args = ap.parse_args(argv)
    if args.calibrate:
        cals = {}
        for ref in (True, False):
            rows = advise_grid(json.loads(GRID.read_text()), reference=ref, quiet=True)
            cals[ref] = calibration(rows)
            print(f"{'with' if ref else 'without'} the reference step: {cals[ref]}")
        write_ranges(cals[True], cals[False])
        print(f"wrote {RANGES.relative_to(ROOT)}")
        return 0
    grid = json.loads(GRID.read_text())
    try:  # the repeat calls are read first: a bad one stops the script before the analysis
        runs = call_runs(grid)
    except ValueError as exc:
        print(f"grid_advice.py: {exc}", file=sys.stderr)
        return 2
    rows = advise_grid(grid, reference=args.reference)
    judged = [r for row in rows for r in row["recommendations"] if r["measured"] is not None]
    tops = [row["recommendations"][0] for row in rows
            if row["recommendations"] and not row["best"]]
    print()
    print(f"judged recommendations: {len(judged)}; in predicted range "
          f"{sum(r['in_range'] for r in judged)}, within ±25 % of the midpoint "
          f"{sum(r['within_25'] for r in judged)}")
    print(f"top recommendation from non-optimal points: {len(tops)}; measured wins "
          f"{sum(1 for t in tops if (t['measured'] or 0) > 0.02)}, unmeasured "
          f"{sum(1 for t in tops if t['measured'] is None)}")
    # the change `tune` tries (and accepts when it wins) first from each start
    judged_tops = [t for t in tops if t["measured"] is not None]
    print(f"top recommendations judged: {len(judged_tops)}; in predicted range "
          f"{sum(t['in_range'] for t in judged_tops)}, within ±25 % of the midpoint "
          f"{sum(t['within_25'] for t in judged_tops)}")
    replayed = [r for r in judged if r["replayed"]]
    bare = sum(r["replay"][0] <= r["measured"] <= r["replay"][2] for r in replayed)
    cal = calibration(rows)
    print(f"replayed and judged: {len(replayed)}; inside the replay's own range {bare}, inside "
          f"the calibrated range {sum(r['in_range'] for r in replayed)} (in sample), "
          f"{cal['held_out_coverage']} held out (each judged by the calibration of the others)")
    verdicts: dict[str, int] = {}
    for row in rows:
        for r in row["recommendations"]:
            if r.get("memory_verdict"):
                verdicts[r["memory_verdict"]] = verdicts.get(r["memory_verdict"], 0) + 1
    print("memory verdicts of the recommendations: " + ", ".join(
        f"{v} {n}" for v, n in sorted(verdicts.items())))
    boot = resampled(rows, grid)
    print(f"over {boot['resamples']} resamples of each point's runs: in predicted range "
          "{1} (5-95 %: {0}-{2})".format(*boot["in_range_5_50_95"])
          + ", within ±25 % of the midpoint {1} ({0}-{2})".format(*boot["within_25_5_50_95"])
          + f" of {boot['judged']}; the tops: "
          + "{1} ({0}-{2})".format(*boot["tops_in_range_5_50_95"])
          + ", {1} ({0}-{2})".format(*boot["tops_within_25_5_50_95"]) + f" of {boot['tops']}")
    paired = paired_by_call(rows, runs)
    print(f"paired within device calls ({paired['judged']} with a call that ran both points): "
          f"in predicted range {paired['in_range']}, within ±25 % of the midpoint "
          f"{paired['within_25']}")
    mems = [r["memory_gib"]["error"] for row in rows for r in row["recommendations"]
            if r.get("memory_gib")]
    if mems:
        print(f"memory predictions against the measured max allocated: {len(mems)}; within "
              f"±15 % {sum(abs(e) <= 0.15 for e in mems)} (errors {min(mems):+.1%} … "
              f"{max(mems):+.1%}); out-of-memory points recommended: "
              f"{sum(1 for row in rows for r in row['recommendations'] if r.get('status') == 'oom')}")
    if args.json:
        args.json.write_text(json.dumps(rows, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
