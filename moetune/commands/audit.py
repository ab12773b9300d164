"""`moetune audit --contract FILE TRACE... [--json]`: did the claimed backends actually run?

Exit 0 when at least one claim was checked and none is contradicted, 1 when a claim is
contradicted, 3 when no claim could be checked (every verdict unobservable, or nothing the audit
tests claimed), 2 on bad input.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from moetune.analysis import analyze
from moetune.analyzer.audit import describe_claim
from moetune.errors import GateFailed, GateUndecided, UserError
from moetune.vocabulary import steps_label

MARK = {"confirmed": "confirmed   ", "contradicted": "CONTRADICTED", "unobservable": "unobservable"}


def add_parser(subparsers: argparse._SubParsersAction) -> argparse.ArgumentParser:
    p = subparsers.add_parser(
        "audit",
        help="check the contract's claimed backends against trace evidence",
        description="For every feature the contract claims (CUDA graphs, dispatcher backend, FP8, "
        "grouped GEMM, fusions, recompute, offload, overlap), say whether the trace confirms it, "
        "contradicts it, or cannot show it — with the evidence. Exit 1 if anything is contradicted, "
        "3 if no claim could be checked (undecided).",
    )
    p.add_argument("--contract", metavar="FILE", help="contract file (YAML or JSON); or --log")
    p.add_argument("--log", metavar="FILE",
                   help="the run's Megatron log: its argument dump is the claim (as `contract "
                   "from-log` reads it), when no --contract is given")
    p.add_argument("traces", nargs="+", metavar="TRACE", help="Kineto .json[.gz] / nsys .sqlite files or directories")
    p.add_argument("--window", metavar="A:B", help="steady steps A:B (default: the contract's window.steady)")
    p.add_argument("--json", action="store_true", help="print the audit document (schemas/audit.schema.json)")
    return p


def run(args: argparse.Namespace) -> int:
    if not args.contract and not args.log:
        raise UserError("audit needs the claims: --contract FILE, or --log FILE (the run's "
                        "Megatron log, whose argument dump states them)")
    reference = None
    if not args.contract:
        from moetune.analysis import read_reference

        reference = read_reference(args.log, require_step=False)
        if reference is None or reference.log_contract is None:
            raise UserError("no Megatron argument dump to audit against (`------------------------ "
                            "arguments ------------------------` block)", path=args.log)
    doc = analyze(args.traces, args.contract, window=args.window, full=False,
                  reference_step_s=reference).audit
    assert doc is not None  # a contract was given, or the log's stood in
    if not args.contract:
        doc["contract"]["file"] = f"{Path(args.log).name}'s arguments"
    if args.json:
        print(json.dumps(doc, indent=1, sort_keys=False))
    else:
        sys.stdout.write(render(doc))
    s = doc["summary"]
    if s["outcome"] == "failed":
        raise GateFailed("")
    if s["outcome"] == "undecided":
        raise GateUndecided("")
    return 0


def render(doc: dict[str, Any]) -> str:
    """Human text: one block per verdict, contradicted first."""
    files = ", ".join(i["file"] for i in doc["inputs"])
    steps = doc.get("steps") or []
    span = f" · {steps_label(steps)}" if steps else ""
    label = doc["contract"]["label"] or "unlabelled"
    lines = [f"moetune audit {doc['contract']['file']} ({label}) · {files}{span}"]
    order = {"contradicted": 0, "unobservable": 1, "confirmed": 2}
    items = sorted(doc["verdicts"].items(), key=lambda kv: (order[kv[1]["verdict"]], kv[0]))
    for _arg, v in items:
        said = ", as claimed" if v["verdict"] == "confirmed" else ""
        lines.append(f"{MARK[v['verdict']]}  {describe_claim(v['claimed'])}  — {v['title']}{said}")
        lines.append(f"    {v['reason']}")
        ev = " · ".join(f"{k.split('.', 1)[-1]} {_num(val)}" for k, val in v["evidence"].items())
        if ev:
            lines.append(f"    evidence: {ev}")
        for e in v.get("examples", [])[:2]:
            lines.append(f"    e.g. {e['name'][:100]} ×{e['count']}, {e['time_s'] * 1e3:.3f} ms")
    s = doc["summary"]
    lines.append(
        f"{s['contradicted']} contradicted, {s['confirmed']} confirmed, {s['unobservable']} unobservable"
        + ("" if doc["verdicts"] else " (the contract claims nothing the audit tests)")
    )
    if s["outcome"] == "undecided":
        lines.append("undecided: no claim could be checked against this trace, so the audit "
                     "neither passes nor fails (exit 3)")
    if s.get("unaudited"):
        lines.append(f"not audited ({len(s['unaudited'])}: no signature tests these claims): "
                     + ", ".join(s["unaudited"]))
    lines += [f"warning: {w}" for w in doc.get("warnings", [])]
    return "\n".join(lines) + "\n"


def _num(v: Any) -> str:
    if isinstance(v, float):
        return f"{v:.4g}"
    if isinstance(v, dict):
        return "{" + ", ".join(f"{k}: {x}" for k, x in v.items()) + "}"
    return "null" if v is None else str(v)
