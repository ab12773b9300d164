"""`moetune report PATH... [--contract FILE] [--log FILE] [--memory-snapshot FILE] [--ledger DB]
[--baseline PATH [--baseline-contract FILE] [--baseline-log FILE]] -o report.html`: one
self-contained HTML page (opens offline) of the diagnosis, audit, advice and tune history; the
reference inputs as `recommend` takes them."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from moetune import scale
from moetune.commands import reference_args


def add_parser(subparsers: argparse._SubParsersAction) -> argparse.ArgumentParser:
    p = subparsers.add_parser(
        "report", help="write one self-contained HTML report (charts, timeline, advice)",
        description="Analyse the traces (one file or directory per rank) and write one HTML page "
        "that opens offline: walls per step, the median step's timeline with its critical path, "
        "top kernels and CPU ops, ranks, memory, the audit, the recommendations and, with a "
        "ledger, the tune history. Needs the report extra: pip install 'moetune[report]'.")
    p.add_argument("paths", nargs="+", metavar="PATH", help="trace files or directories")
    p.add_argument("-o", "--output", required=True, type=Path, metavar="FILE",
                   help="HTML file to write")
    p.add_argument("--contract", metavar="FILE", help="measurement contract (YAML/JSON): audit it")
    reference_args.add_arguments(p)
    p.add_argument("--ledger", metavar="DB", help="tune ledger (SQLite): show the tune history")
    p.add_argument("--baseline", metavar="PATH", action="append",
                   help="baseline run's trace file or directory (repeatable): compare against it")
    p.add_argument("--baseline-contract", metavar="FILE",
                   help="the baseline's measurement contract (YAML/JSON): its audit and its "
                   "Megatron arguments, compared with this run's (--contract, else --log)")
    p.add_argument("--baseline-log", metavar="FILE",
                   help="the baseline's Megatron log: its unprofiled step time and memory, as "
                   "--log is this run's, and its arguments where no --baseline-contract states "
                   "them")
    p.add_argument("--window", metavar="A:B", help="analyse steps A..B (inclusive step ids)")
    p.add_argument("--step-range", metavar="NAME", help="annotation/NVTX range name that marks one step")
    p.add_argument("--allow-mixed-runs", action="store_true",
                   help="analyse files together even when their metadata says they are not ranks "
                   "of one run (refused by default)")
    scale.add_arguments(p)
    return p


def run(args: argparse.Namespace) -> int:
    from moetune import report
    from moetune.errors import UserError

    if (args.baseline_contract or args.baseline_log) and not args.baseline:
        raise UserError("--baseline-contract and --baseline-log describe the baseline run: give "
                        "its trace with --baseline")
    report.plotly_modules()  # the missing extra is said before minutes of reading
    paths, notes = list(args.paths), []
    reference = reference_args.from_args(args)
    opts = scale.options_from_args(args)
    cross = None
    if scale.wanted(paths, opts):
        # Many ranks: every rank summarised (the map); the page's per-step views come from the
        # full trace of one typical rank, its cross-rank view from every rank's summary.
        mapped, rep, cross = scale.map_reduce(paths, opts, args.contract)
        paths = [mapped.rank_file[rep]]
        notes = [*scale.summary_lines(mapped), *mapped.warnings,
                 f"the page's steps, timeline and kernels are of rank {rep} ({paths[0].name}, the "
                 f"median rank by step time); its cross-rank view covers all "
                 f"{mapped.summaries.meta.height}"]
    data = report.collect(paths, args.contract, ledger=args.ledger, baseline=args.baseline,
                          window=args.window, step_range=args.step_range,
                          allow_mixed_runs=args.allow_mixed_runs, reference=reference,
                          log=args.log, baseline_contract=args.baseline_contract,
                          baseline_log=args.baseline_log)
    if cross and data.analysis is not None and data.analysis.diagnosis is not None:
        data.analysis.diagnosis.update(cross)
    out = report.write(data, args.output)
    size = out.stat().st_size / 2**20
    print(f"moetune report: wrote {out} ({size:.1f} MiB)", file=sys.stderr)
    for why in filter(None, (data.problem, data.ledger_problem, *notes)):
        print(f"moetune report: note: {why}", file=sys.stderr)
    return 0
