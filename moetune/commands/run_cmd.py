"""`moetune run --change KNOB=VALUE [--cmd "…"]`: one candidate against the baseline.

Also holds the executor options `moetune tune` shares (add_exec_options, tune_options)."""

from __future__ import annotations

import argparse
import json
import shlex
import sys
from pathlib import Path
from typing import Any

from moetune.errors import UserError

DEFAULT_LEDGER = Path(".moetune") / "ledger.sqlite"
DEFAULT_WORKDIR = Path(".moetune") / "runs"


def add_exec_options(p: argparse.ArgumentParser) -> None:
    from moetune.executor.launchers import NAMES as LAUNCHERS  # the registry (choices follow it)

    p.add_argument("--cmd", metavar="COMMAND",
                   help="training command to tune, e.g. \"torchrun … pretrain_gpt.py …\" "
                   "(default: the bundled MoE GPT workload, `python -m moetune.executor.workloads.moe_gpt`)")
    p.add_argument("--env", action="append", default=[], metavar="NAME=VALUE",
                   help="environment variable for every run (repeatable)")
    p.add_argument("--env-profile", choices=["no-nvlink-multicast"], default=None,
                   help="variables every run gets, last (default: the contract's env_profile, "
                   "else none); no-nvlink-multicast: NVLS and NVLink multicast off, for shared "
                   "machines that forbid them")
    p.add_argument("--contract", metavar="FILE", help="measurement contract (YAML/JSON)")
    p.add_argument("--ledger", type=Path, default=DEFAULT_LEDGER, metavar="DB", help=f"SQLite ledger (default {DEFAULT_LEDGER})")
    p.add_argument("--workdir", type=Path, default=DEFAULT_WORKDIR, help="where run logs and traces go")
    p.add_argument("--launcher", choices=LAUNCHERS, default="local",
                   help="local runs --cmd as is (it may itself be torchrun …)")
    p.add_argument("--nproc-per-node", type=int, default=1, help="torchrun/nemo_run processes")
    p.add_argument("--nodes", type=int, default=1, help="Slurm nodes")
    p.add_argument("--slurm-option", action="append", default=[], metavar="KEY=VALUE",
                   help="extra #SBATCH --KEY=VALUE line (repeatable)")
    p.add_argument("--warmup-iters", type=int, default=2,
                   help="iterations of every run never measured (default 2: Megatron compiles "
                        "its fusions in the first two)")
    p.add_argument("--run-iters", type=int, default=12,
                   help="measured iterations of every run, after the warm-up (≥ 4; the profiler "
                        "takes three more at the end of a profiled run, run unprofiled in the rest)")
    p.add_argument("--max-pairs", type=int, default=4, metavar="N",
                   help="A/B pairs for one candidate, at most: a clear win takes one new run, a "
                        "small gain more pairs until the evidence decides (docs/executor.md)")
    p.add_argument("--noise-prior", type=float, default=0.10,
                   help="run-to-run noise of fresh processes (σ of log step time) assumed until "
                        "the session has measured its own (default 0.10)")
    p.add_argument("--min-gain", type=float, default=0.02, help="smallest gain worth keeping (0.02 = 2 %%)")
    p.add_argument("--loss-tolerance", type=float, default=0.05, help="relative loss difference allowed")
    p.add_argument("--timeout", type=float, default=900.0, help="seconds before a run counts as hung")
    p.add_argument("--no-profile", action="store_true", help="never add profiler flags")
    p.add_argument("--profile-args", metavar="TEMPLATE",
                   help="profiler flags with {dir} {start} {end} (default: chosen from --cmd)")
    p.add_argument("--json", action="store_true",
                   help="print the result (schemas/run.schema.json; tune: schemas/tune.schema.json)")


def base_argv(args: argparse.Namespace) -> list[str]:
    if not args.cmd:
        return [sys.executable, "-m", "moetune.executor.workloads.moe_gpt"]
    try:
        argv = shlex.split(args.cmd)
    except ValueError as exc:
        raise UserError(f"cannot split --cmd: {exc}") from None
    if not argv:
        raise UserError("--cmd is empty")
    return argv


def env_pairs(items: list[str]) -> dict[str, str]:
    out = {}
    for item in items:
        if "=" not in item:
            raise UserError(f"--env wants NAME=VALUE, got {item!r}")
        k, v = item.split("=", 1)
        out[k] = v
    return out


def load_contract_doc(path: str | None) -> Any:
    if not path:
        return None
    from moetune.analyzer.contract import load_contract, read_document

    load_contract(path)  # validates; raises UserError naming the field
    return read_document(path)


def tune_options(args: argparse.Namespace, *, budget: int = 1, tries: tuple[str, ...] = (),
                 use_rules: bool = False, max_run_time_s: float | None = None):
    from moetune.executor.loop import TuneOptions
    from moetune.executor.validate import Policy

    if args.run_iters < 4:
        raise UserError("--run-iters must be at least 4 (the drift check halves the window)")
    if args.warmup_iters < 1:
        raise UserError("--warmup-iters must be at least 1 (the first iteration carries start-up)")
    if args.max_pairs < 1:
        raise UserError("--max-pairs must be at least 1")
    if not 0 < args.noise_prior < 1:
        raise UserError("--noise-prior must lie between 0 and 1 (σ of log step time)")
    policy = Policy(warmup=args.warmup_iters, measured=args.run_iters, max_pairs=args.max_pairs,
                    noise_prior=args.noise_prior, min_gain=args.min_gain,
                    loss_tolerance=args.loss_tolerance, timeout_s=args.timeout)
    slurm = dict(env_pairs(args.slurm_option))
    return TuneOptions(workdir=args.workdir, ledger=args.ledger, budget=budget, policy=policy,
                       launcher=args.launcher, nproc_per_node=args.nproc_per_node,
                       nodes=args.nodes, tries=tries, use_rules=use_rules,
                       profile=not args.no_profile, profile_args=args.profile_args,
                       slurm_options=slurm, env_profile=env_profile(args),
                       max_run_time_s=max_run_time_s)


def env_profile(args: argparse.Namespace) -> str | None:
    """--env-profile, else the contract's `env_profile`."""
    if args.env_profile:
        return args.env_profile
    doc = load_contract_doc(getattr(args, "contract", None))
    return (doc or {}).get("env_profile") if isinstance(doc, dict) else None



def add_parser(subparsers: argparse._SubParsersAction) -> argparse.ArgumentParser:
    p = subparsers.add_parser(
        "run", help="run one knob change against the baseline (sequential A/B, verdict)",
        description="Apply one knob change to the training command (Megatron-LM flags, or "
        "Megatron-Bridge overrides for a Bridge recipe), A/B it against the baseline in pairs of "
        "fresh runs until the evidence decides, and record the verdict in the ledger.")
    p.add_argument("--change", action="append", required=True, metavar="KNOB=VALUE",
                   help="the change, e.g. micro_batch_size=4 (knob names from rules/knobs.yaml)")
    add_exec_options(p)
    return p


def run(args: argparse.Namespace) -> int:
    from moetune.executor.loop import run_one

    opts = tune_options(args)
    res = run_one(base_argv(args), args.change, env=env_pairs(args.env),
                  contract=load_contract_doc(args.contract), opts=opts)
    d = res["decision"]
    if args.json:
        sys.stdout.write(json.dumps(res, indent=2, sort_keys=True, default=str) + "\n")
        return 0
    gain = f"{d['measured_gain']:+.1%}" if d["measured_gain"] is not None else "n/a"
    noise = f"{d['noise']:.1%}" if d["noise"] is not None else "n/a"
    print(f"{d['label']}: {d['verdict']} · gain {gain} · 95 % band ±{noise}"
          + (f" · cause: {d['cause']}" if d["cause"] else ""))
    print(f"session {res['session']} · {res['runs_executed']} runs executed, "
          f"{res['runs_reused']} read back from {args.ledger}")
    return 0
