"""`moetune tune --contract FILE --cmd "…" [--budget N] [--ledger PATH] [--try K=V]…`."""

from __future__ import annotations

import argparse
import json
import shlex
import sys

from moetune.commands.run_cmd import (
    add_exec_options,
    base_argv,
    env_pairs,
    load_contract_doc,
    tune_options,
)
from moetune.errors import UserError


def add_parser(subparsers: argparse._SubParsersAction) -> argparse.ArgumentParser:
    p = subparsers.add_parser(
        "tune", help="closed loop: profile, diagnose, recommend, validate, accept (resumable)",
        description="Profile the baseline (Megatron-LM's own profiler flags, or Megatron-Bridge's "
        "profiling overrides; the trace is read where the trainer writes it), diagnose it, take "
        "the rules' one-knob recommendations (and --try candidates), A/B each in pairs of fresh "
        "runs until the evidence decides, accept winners and start again from them. Re-running "
        "the same command resumes from the ledger: finished runs are never redone.")
    p.add_argument("--budget", type=int, default=4, help="candidates to judge, at most")
    p.add_argument("--try", dest="tries", action="append", default=[], metavar="KNOB=VALUE",
                   help="a candidate of your own (repeatable), after the rules' ones")
    p.add_argument("--no-rules", action="store_true", help="only the --try candidates")
    p.add_argument("--max-run-time", type=float, metavar="SECONDS",
                   help="machine time the session's runs may take in all (start to exit of "
                        "each run, resumed runs included): no run starts that would end past "
                        "it; a re-run with a larger value resumes")
    add_exec_options(p)
    return p


def run(args: argparse.Namespace) -> int:
    from pathlib import Path

    from moetune.executor.loop import tune

    if args.max_run_time is not None and args.max_run_time <= 0:
        raise UserError("--max-run-time must be a positive number of seconds")
    opts = tune_options(args, budget=args.budget, tries=tuple(args.tries),
                        use_rules=not args.no_rules, max_run_time_s=args.max_run_time)
    res = tune(base_argv(args), env=env_pairs(args.env),
               contract=load_contract_doc(args.contract),
               contract_path=Path(args.contract) if args.contract else None, opts=opts)
    if args.json:
        sys.stdout.write(json.dumps(res, indent=2, sort_keys=True, default=str) + "\n")
        return 0
    from moetune.commands.ledger import gains_text

    for d in res["decisions"]:
        proof = (d.get("evidence") or {}).get("proof")
        print(f"{d['verdict']:<9} {d['label']:<40} {gains_text(d)}"
              + (f" · proof: {proof}" if proof else "")
              + (f"  cause: {d['cause']}" if d["cause"] else ""))
    print(f"accepted {len(res['accepted'])} · session {res['session']} · "
          f"{res['runs_executed']} runs executed, {res['runs_reused']} read back · "
          f"runs took {res['run_time_s']:.0f} s")
    print(f"stopped: {res['stopped']}")
    print("final command: " + shlex.join(res["final_command"]))
    return 0
