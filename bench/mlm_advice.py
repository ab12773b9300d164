"""The advice from every profiled state of the Megatron-LM grid, against interleaved pairs.

    python bench/mlm_advice.py [--json bench/grid_mlm/advice.json]

For each profiled state (the fixtures `fixtures/traces/mlm_*` and `bench/grid_mlm/profiles/*`,
each a trace with its Megatron log), `moetune recommend TRACE --log LOG --json` as a user runs
it; each recommendation's change is mapped to the grid point it leads to (`bench/mlm_spec.py`
point ids; a gate, such as expandable segments, by the change it unlocks) and judged by pairs
measured in one device call: every grid call (`bench/grid_mlm/grid.json`, its runs by call) and
every tune session (`bench/grid_mlm/tune/*_ledger.sqlite`) that ran both the state's point and
the target's. Per call, gain = the state's step / the target's step − 1 (their medians in that
call, moetune's own step definition); the measured gain is the median over calls, `in range`
when it lies inside the predicted low … high. Host-bound levels move between machine starts
(bench/grid_mlm/README.md), which is why only same-call pairs count. A target no call paired
with its state is listed as such: the next device session's jobs.
"""

from __future__ import annotations

import argparse
import json
import sqlite3
import statistics
import subprocess
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))
import mlm_spec as ms  # noqa: E402

GRID = ROOT / "bench" / "grid_mlm" / "grid.json"
TUNES = ROOT / "bench" / "grid_mlm" / "tune"
# tune sessions whose device call also ran grid jobs after the loop (bench/gpu/mlm_tune.sh CHECK):
# one call, so their runs pair with that call's
CALL_OF = {"tune2_host": "call4", "tune3_mem": "call5", "tune4_host": "call6", "tune5_mem": "call9",
           "tune6_host": "call10", "tune7_host": "call11"}
# profiled state -> (shape, its grid point[, the one call whose pairs judge it: a tune session's
# own profile run is judged by what that session measured on the same machine])
STATES: dict[Path, tuple[str, ...]] = {
    ROOT / "fixtures/traces/mlm_host_mbs1_rcfull": ("host", "mbs1_seq_rcfull_a2a_eager"),
    ROOT / "fixtures/traces/mlm_host_mbs8_rcnone": ("host", "mbs8_seq_rcnone_a2a_eager"),
    ROOT / "fixtures/traces/mlm_mem_mbs1_rcfull": ("mem", "mbs1_seq_rcfull_a2a_eager"),
    ROOT / "bench/grid_mlm/profiles/mem_mbs4_seq_rcselective_a2a_eager":
        ("mem", "mbs4_seq_rcselective_a2a_eager"),
    # the first candidate runs of tune sessions tune4 (host) and tune3 (mem), profiled at their end
    ROOT / "bench/grid_mlm/profiles/host_mbs8_seq_rcfull_a2a_eager":
        ("host", "mbs8_seq_rcfull_a2a_eager"),
    # tune5 (mem)'s accepted MBS 4 run, the profile of its round 1
    ROOT / "bench/grid_mlm/profiles/mem_mbs4_seq_rcfull_a2a_eager":
        ("mem", "mbs4_seq_rcfull_a2a_eager", "call9"),
    ROOT / "bench/grid_mlm/profiles/mem_mbs8_seq_rcfull_a2a_eager":
        ("mem", "mbs8_seq_rcfull_a2a_eager"),
    ROOT / "fixtures/mlm_states/tune3_mem_mbs1_rcfull": ("mem", "mbs1_seq_rcfull_a2a_eager",
                                                          "call5"),
    ROOT / "fixtures/mlm_states/tune4_host_mbs1_rcfull": ("host", "mbs1_seq_rcfull_a2a_eager",
                                                           "call6"),
}


def runs_by_call() -> dict[tuple[str, str, str], list[float]]:
    """(call, shape, point) -> the step times of its runs in that call: grid calls and tune
    sessions (a tune ledger's runs, their points read back from their commands)."""
    out: dict[tuple[str, str, str], list[float]] = {}
    for p in json.loads(GRID.read_text())["points"]:
        for r in p["runs"]:
            if r["status"] == "ok" and r.get("step_ms"):
                out.setdefault((r["call"], p["shape"], p["point"]), []).append(r["step_ms"])
    for led in sorted(TUNES.glob("*_ledger.sqlite")):
        shape = led.name.split("_")[1]  # tuneN_SHAPE_ledger.sqlite
        with sqlite3.connect(led) as db:
            for cmd, env, metrics in db.execute(
                    "select command, env, metrics from runs where status = 'done'"):
                step = json.loads(metrics or "{}").get("step_ms")
                point, beyond = ms.point_of(json.loads(cmd), json.loads(env or "{}"))
                session = led.name.split("_ledger")[0]
                if step and not beyond:
                    out.setdefault((CALL_OF.get(session, session), shape, ms.point_id(point)),
                                   []).append(step)
    return out


def paired(runs: dict[tuple[str, str, str], list[float]], shape: str, a: str, b: str
           ) -> list[tuple[str, float]]:
    """(call, gain of b over a) for every call that ran both points of `shape`."""
    calls = sorted({c for c, s, _ in runs if s == shape})
    return [(c, statistics.median(runs[(c, shape, a)]) / statistics.median(runs[(c, shape, b)]) - 1)
            for c in calls if (c, shape, a) in runs and (c, shape, b) in runs]


def target(point: str, change: dict[str, Any]) -> str | None:
    """The grid point a recommendation's change leads to from `point` (None: off the grid)."""
    p = ms.parse_id(point)
    knob, to = change["knob"], change["to"]
    if knob == "micro_batch_size":
        p["mbs"] = int(to)
    elif knob == "recompute_granularity":
        p["recompute"] = to or "none"
    elif knob == "cuda_graph_impl" and to == "local":
        p["graphs"] = "local"
    elif knob == "moe_token_dispatcher_type":
        p["dispatcher"] = to
    elif knob == "moe_grouped_gemm":
        p["grouped"] = bool(to)
    else:
        return None
    return ms.point_id(p)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", type=Path)
    a = ap.parse_args(argv)
    runs = runs_by_call()
    rows = []
    for state, (shape, point, *only) in STATES.items():
        p = subprocess.run([sys.executable, "-m", "moetune", "recommend",
                            str(state / "trace.json.gz"), "--log", str(state / "train.log"),
                            "--json"], capture_output=True, text=True, check=True)
        for rank, rec in enumerate(json.loads(p.stdout)["recommendations"], 1):
            judged, via = rec, None
            if rec.get("unlocks"):  # a gate is worth what it unlocks: judge that change
                judged, via = rec["unlocks"][0], rec["rule"]
            sp = ((judged.get("gain") or {}).get("speedup") or {})
            to = target(point, judged["change"])
            pairs = [(c, g) for c, g in (paired(runs, shape, point, to) if to else [])
                     if not only or c == only[0]]
            measured = statistics.median(g for _, g in pairs) if pairs else None
            ch = judged["change"]
            rows.append({
                "shape": shape, "state": point, "profiled": str(state.relative_to(ROOT)),
                "rank": rank, "rule": judged["rule"],
                "via": via, "change": f"{ch['knob']} {ch['from']}→{ch['to']}",
                "memory": (judged.get("memory") or rec.get("memory") or {}).get("verdict"),
                "low": sp.get("low"), "high": sp.get("high"), "point": to,
                "pairs": [{"call": c, "gain": round(g, 4)} for c, g in pairs],
                "status": "measured" if pairs else ("not measured" if to else "off grid"),
                "measured": measured,
                "in_range": (None if measured is None or sp.get("low") is None
                             else sp["low"] <= measured <= sp["high"])})
        if not json.loads(p.stdout)["recommendations"]:
            rows.append({"shape": shape, "state": point, "profiled": str(state.relative_to(ROOT)),
                         "rank": 0, "rule": None, "via": None,
                         "change": "nothing recommended", "memory": None, "low": None,
                         "high": None, "point": None, "pairs": [], "status": "none",
                         "measured": None, "in_range": None})
    for r in rows:
        rng = (f"{r['low']:+.1%} … {r['high']:+.1%}" if r["low"] is not None else "—")
        each = ", ".join(f"{x['gain']:+.0%} {x['call']}" for x in r["pairs"])
        got = f"{r['measured']:+.1%} ({each})" if r["measured"] is not None else r["status"]
        mark = {True: "in range", False: "MISS", None: ""}[r["in_range"]]
        via = f" (via {r['via']})" if r["via"] else ""
        print(f"{r['shape']:4} {r['state']:28} #{r['rank']} {r['change'] + via:40} {rng:18} "
              f"memory {r['memory'] or '-':10} → {r['point'] or '-':30} {got} {mark}")
    judged = [r for r in rows if r["in_range"] is not None]
    tops = [r for r in judged if r["rank"] == 1]
    print(f"judged {len(judged)}: {sum(r['in_range'] for r in judged)} in range; "
          f"tops judged {len(tops)}: {sum(r['in_range'] for r in tops)} in range")
    if a.json:
        a.json.write_text(json.dumps(rows, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
