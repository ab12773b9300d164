"""`moetune ledger [--json] [--ledger PATH ...] [--session ID] [--by-rule]`: every run and verdict
recorded, or per rule how its predictions compared with the measured gains."""

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
    p.add_argument("--ledger", type=Path, action="append", metavar="DB",
                   help=f"ledger file (repeatable: pooled, e.g. from several machines); "
                        f"default {DEFAULT_LEDGER}")
    p.add_argument("--session", help="only this session")
    p.add_argument("--by-rule", action="store_true",
                   help="per rule: decisions, accepted, median predicted vs measured gain")
    p.add_argument("--json", action="store_true", help="print the ledger document (schemas/ledger.schema.json)")
    return p


def run(args: argparse.Namespace) -> int:
    from moetune.executor.ledger import Ledger

    paths = args.ledger or [DEFAULT_LEDGER]
    doc: dict = {}
    for path in paths:
        if not path.exists():
            raise UserError("no ledger here (run `moetune run` or `moetune tune` first)", path=path)
        with Ledger.open_readonly(path) as led:
            one = led.document()
        if not doc:
            doc = one
        else:  # pooled: sessions are keyed by id already; run and decision ids stay per file
            for key in ("sessions", "runs", "decisions"):
                doc[key] = doc[key] + one[key]
    if args.session:
        doc["sessions"] = [s for s in doc["sessions"] if s["id"] == args.session]
        doc["runs"] = [r for r in doc["runs"] if r["session"] == args.session]
        doc["decisions"] = [d for d in doc["decisions"] if d["session"] == args.session]
    if args.by_rule:
        from moetune.executor.calibration import by_rule

        rows = by_rule(doc["decisions"])
        if args.json:
            sys.stdout.write(json.dumps(rows, indent=2, sort_keys=True) + "\n")
            return 0
        for r in rows:
            print(f"{r['rule']:<40} {r['decisions']:>3} decided, {r['accepted']:>3} accepted · "
                  f"predicted {_pct(r['predicted_gain_median'])}, measured "
                  f"{_pct(r['measured_gain_median'])} (median; measured/predicted "
                  f"{_x(r['measured_over_predicted'])})"
                  + (f" · causes: {', '.join(r['causes'])}" if r["causes"] else ""))
        if not rows:
            print("no decision with a rule's prediction in this ledger")
        return 0
    if args.json:
        sys.stdout.write(json.dumps(doc, indent=2, sort_keys=True, default=str) + "\n")
        return 0
    for r in doc["runs"]:
        m = r["metrics"] or {}
        step = f"{m['step_ms']:.1f} ms" if m.get("step_ms") else "—"
        print(f"{r['id']:>4} {r['session']:<18} {r['key']:<44} {r['status']:<11} {step:>10}"
              + (f"  {r['cause']}" if r["cause"] else ""))
    for d in doc["decisions"]:
        print(f"decision {d['session']} {d['label']}: {d['verdict']} ({gains_text(d)})"
              + (f" · {d['cause']}" if d["cause"] else ""))
    return 0


def gains_text(d: dict) -> str:
    """Measured gain, beside the prediction that proposed the candidate and the noise band."""
    parts = [f"gain {d['measured_gain']:+.1%}" if d["measured_gain"] is not None else "gain n/a"]
    if d.get("predicted_gain") is not None:
        parts.append(f"predicted {d['predicted_gain']:+.1%} by {d.get('source') or '?'}")
    if d.get("noise") is not None:
        parts.append(f"band ±{d['noise']:.1%}")
    return ", ".join(parts)


def _pct(x: float | None) -> str:
    return "n/a" if x is None else f"{x:+.1%}"


def _x(x: float | None) -> str:
    return "n/a" if x is None else f"{x:.2f}×"
