"""`moetune fit`: ranked parallel layouts that fit GPU memory, with flags and a one-GPU check."""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from moetune.analyzer.planner.config import load_planner_config
from moetune.analyzer.planner.plan import (
    plan_fit,
    read_contract,
    request_from_contract,
    to_document,
)
from moetune.errors import UserError


def add_parser(sub: Any) -> argparse.ArgumentParser:
    p = sub.add_parser("fit", help="plan parallel layouts that fit memory, ranked",
                       description="Enumerate legal Parallel Folding layouts for the contract's "
                       "model and GPUs, keep those the memory model fits, and rank them.")
    p.add_argument("--contract", required=True, metavar="FILE", help="measurement contract (YAML/JSON)")
    p.add_argument("--gpus", type=int, metavar="N", help="total GPUs (default: hardware.nodes × "
                   "hardware.gpus_per_node)")
    p.add_argument("--top", type=int, default=5, metavar="K", help="plans to show (default 5)")
    p.add_argument("--json", action="store_true", help="print the fit document (schemas/fit.schema.json)")
    p.add_argument("--planner-config", metavar="FILE", help="YAML merged over the planner's "
                   "built-in constants, ladder and weights (analyzer/planner/planner.yaml)")
    return p


def run(args: argparse.Namespace) -> int:
    if args.top < 1:
        raise UserError(f"--top must be ≥ 1, got {args.top}")
    config = load_planner_config(args.planner_config)  # bad file: UserError before any work
    doc = read_contract(args.contract)
    req = request_from_contract(doc, gpus=args.gpus, source=args.contract, config=config)
    outcome = plan_fit(req)
    fit = to_document(outcome, top=args.top, contract=str(args.contract))
    if args.json:
        print(json.dumps(fit, indent=2, sort_keys=True, ensure_ascii=False))
    else:
        sys.stdout.write(render(fit))
    return 0 if fit["plans"] else 1


def render(fit: dict[str, Any]) -> str:
    w, m, c = fit["world"], fit["model"], fit["counts"]
    wl = fit["workload"]
    lines = [
        f"moetune fit {fit['contract']} · {m['name'] or 'model'} ({_params(m['params_b'])} params, "
        f"{_params(m['active_params_b'])} active) · {w['gpus']} GPUs × {w['gpu_memory_gib']:g} GiB, "
        f"{w['gpus_per_node']}/node",
        f"seq {wl['seq_length']} · MBS {wl['micro_batch_size']} · GBS {wl['global_batch_size']}"
        f"{' · FP8' if wl['fp8'] else ''} · MoE imbalance ×{wl['moe_imbalance']:g} · "
        f"{c['legal']:,} legal layouts of {c['candidates']:,}, {c['fit']:,} fit",
    ]
    if not fit["plans"]:
        lines.append(fit["no_layout"]["explanation"])
        return "\n".join(lines) + "\n"
    if fit["current_layout_rank"]:
        lines.append(f"the contract's own layout ranks #{fit['current_layout_rank']}")
    for p in fit["plans"]:
        a, e, mem = p["attention"], p["moe"], p["memory"]
        vpp = f" VPP{a['vpp']}" if a["vpp"] else ""
        lines += [
            "",
            f"#{p['rank']}  Attention: {a['mesh']}{vpp}   MoE: {e['mesh']}   "
            f"cost {p['score']:.3f}" + (" (lower ranks first)" if p["rank"] == 1 else ""),
            f"    memory {mem['peak_gib']:.1f} of {mem['capacity_gib']:g} GiB (headroom "
            f"{mem['headroom_gib']:.1f} GiB, {mem['headroom_fraction']:.0%}) on pipeline rank "
            f"{mem['pipeline_rank']} · fit: {p['fit']['summary']}",
            f"    memory verdict: {mem['verdict']['verdict']}: {mem['verdict']['why']}",
            "      " + " · ".join(f"{k} {v:.1f}" for k, v in mem["breakdown_gib"].items()),
        ]
        for r in p["reasons"]:
            lines.append(f"    why: +{r['penalty']:.3f} {r['why']}")
        if not p["reasons"]:
            lines.append("    why: no penalty: no model parallelism, no fit option needed")
        lines.append("    flags: " + " ".join(p["flags"]))
        lines.append("    env: " + " ".join(f"{k}={v}" for k, v in p["env"].items()))
        lines.append("    check: " + p["check"]["command"])
    notes = fit["plans"][0]["check"]["notes"]
    lines += ["", *(f"note: {n}" for n in notes)]
    if fit["ties"]:
        lines.append(f"note: {fit['ties']}")
    return "\n".join(lines) + "\n"


def _params(billions: float) -> str:
    """A parameter count a reader can tell apart: 0.24 B reads '244 M', not '0.2 B' or '0.0 B'."""
    return f"{billions * 1e3:.0f} M" if billions < 1 else f"{billions:.1f} B"
