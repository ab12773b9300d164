"""`moetune ledger [--json] [--ledger PATH] [--session ID]`: every run and verdict recorded."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from moetune.commands.run_cmd import DEFAULT_LEDGER
from moetune.errors import UserError


def add_parser(subparsers: argparse._SubParsersAction) -> argparse.ArgumentParser:
    p = subparsers.add_parser("ledger", help="list recorded runs and verdicts",
                              description="List the runs and decisions in the SQLite ledger.")
    p.add_argument("--ledger", type=Path, default=DEFAULT_LEDGER, help=f"default {DEFAULT_LEDGER}")
    p.add_argument("--session", help="only this session")
    p.add_argument("--json", action="store_true", help="print the ledger document (JSON)")
    return p


def run(args: argparse.Namespace) -> int:
    from executor.ledger import Ledger

    if not args.ledger.exists():
        raise UserError("no ledger here (run `moetune run` or `moetune tune` first)",
                        path=args.ledger)
    with Ledger.open(args.ledger) as led:
        doc = led.document()
    if args.session:
        doc["sessions"] = [s for s in doc["sessions"] if s["id"] == args.session]
        doc["runs"] = [r for r in doc["runs"] if r["session"] == args.session]
        doc["decisions"] = [d for d in doc["decisions"] if d["session"] == args.session]
    if args.json:
        sys.stdout.write(json.dumps(doc, indent=2, sort_keys=True, default=str) + "\n")
        return 0
    for r in doc["runs"]:
        m = r["metrics"] or {}
        step = f"{m['step_ms']:.1f} ms" if m.get("step_ms") else "—"
        print(f"{r['id']:>4} {r['session']:<18} {r['key']:<44} {r['status']:<11} {step:>10}"
              + (f"  {r['cause']}" if r["cause"] else ""))
    for d in doc["decisions"]:
        print(f"decision {d['session']} {d['label']}: {d['verdict']} ({_gains(d)})"
              + (f" · {d['cause']}" if d["cause"] else ""))
    return 0


def _gains(d: dict) -> str:
    """Measured gain, beside the prediction that proposed the candidate and the noise band."""
    parts = [f"gain {d['measured_gain']:+.1%}" if d["measured_gain"] is not None else "gain n/a"]
    if d.get("predicted_gain") is not None:
        parts.append(f"predicted {d['predicted_gain']:+.1%} by {d.get('source') or '?'}")
    if d.get("noise") is not None:
        parts.append(f"noise ±{d['noise']:.1%}")
    return ", ".join(parts)
