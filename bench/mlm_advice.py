"""The advice from every profiled state of the Megatron-LM grid, against what the grid measured.

    python bench/mlm_advice.py [--json bench/grid_mlm/advice.json]

For each profiled state (the fixtures `fixtures/traces/mlm_*` and `bench/grid_mlm/profiles/*`,
each a trace with its Megatron log), `moetune recommend TRACE --log LOG --json` as a user runs
it; each recommendation's change is mapped to the grid point it leads to (`bench/mlm_spec.py`
point ids) and judged against `bench/grid_mlm/grid.json`: measured gain = start's step / the
point's step − 1 (both by moetune's own step definition), `in range` when it lies inside the
predicted low … high. A point the grid has not measured is listed as such: these are the next
device session's jobs.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))
import mlm_spec as ms  # noqa: E402

GRID = ROOT / "bench" / "grid_mlm" / "grid.json"
STATES = {  # profiled state -> (shape, its grid point)
    ROOT / "fixtures/traces/mlm_host_mbs1_rcfull": ("host", "mbs1_seq_rcfull_a2a_eager"),
    ROOT / "fixtures/traces/mlm_host_mbs8_rcnone": ("host", "mbs8_seq_rcnone_a2a_eager"),
    ROOT / "fixtures/traces/mlm_mem_mbs1_rcfull": ("mem", "mbs1_seq_rcfull_a2a_eager"),
    ROOT / "bench/grid_mlm/profiles/mem_mbs4_seq_rcselective_a2a_eager":
        ("mem", "mbs4_seq_rcselective_a2a_eager"),
}


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
    grid = {(p["shape"], p["point"]): p for p in json.loads(GRID.read_text())["points"]}
    rows = []
    for state, (shape, point) in STATES.items():
        p = subprocess.run([sys.executable, "-m", "moetune", "recommend",
                            str(state / "trace.json.gz"), "--log", str(state / "train.log"),
                            "--json"], capture_output=True, text=True, check=True)
        start = grid[(shape, point)]["step_ms"]
        for rank, rec in enumerate(json.loads(p.stdout)["recommendations"], 1):
            sp = ((rec.get("gain") or {}).get("speedup") or {})
            to = target(point, rec["change"])
            got = grid.get((shape, to)) if to else None
            measured = (start / got["step_ms"] - 1 if got and got["status"] == "ok" else None)
            rows.append({
                "shape": shape, "state": point, "rank": rank, "rule": rec["rule"],
                "change": f"{rec['change']['knob']} {rec['change']['from']}→{rec['change']['to']}",
                "memory": (rec.get("memory") or {}).get("verdict"),
                "low": sp.get("low"), "high": sp.get("high"), "point": to,
                "status": got["status"] if got else "not measured",
                "measured": measured,
                "in_range": (None if measured is None or sp.get("low") is None
                             else sp["low"] <= measured <= sp["high"])})
    for r in rows:
        rng = (f"{r['low']:+.1%} … {r['high']:+.1%}" if r["low"] is not None else "—")
        got = f"{r['measured']:+.1%}" if r["measured"] is not None else r["status"]
        mark = {True: "in range", False: "MISS", None: ""}[r["in_range"]]
        print(f"{r['shape']:4} {r['state']:32} #{r['rank']} {r['change']:34} {rng:20} "
              f"memory {r['memory'] or '-':12} → {r['point'] or 'off grid':32} {got:14} {mark}")
    judged = [r for r in rows if r["in_range"] is not None]
    tops = [r for r in judged if r["rank"] == 1]
    print(f"judged {len(judged)}: {sum(r['in_range'] for r in judged)} in range; "
          f"tops judged {len(tops)}: {sum(r['in_range'] for r in tops)} in range")
    if a.json:
        a.json.write_text(json.dumps(rows, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
