"""`moetune diagnose PATH... [--window A:B] [--json] [--contract FILE] [--step-range NAME]
[--allow-mixed-runs] [--top N] [--csv DIR] [--parquet DIR] [--quiet] [--cache DIR]
[--scheduler ADDRESS | --scheduler-file FILE] [--workers N] [--worker-memory GB]`."""

from __future__ import annotations

import argparse
import json
import shlex
import sys

from moetune import scale
from moetune.commands import reference_args
from moetune.errors import UserError
from moetune.resources import demo_trace

DEFAULT_TRACE = demo_trace()


def add_parser(subparsers: argparse._SubParsersAction) -> argparse.ArgumentParser:
    p = subparsers.add_parser(
        "diagnose",
        help="attribute step time to compute / communication / memory / host walls",
        description="Read PyTorch-profiler (Kineto) traces or Nsight Systems SQLite exports (one "
        "file or directory per rank) and say where each training step's time goes.",
    )
    p.add_argument("paths", nargs="*", metavar="PATH", help="trace files or directories (default: the shipped example trace)")
    p.add_argument("--window", metavar="A:B", help="analyze steps A..B (inclusive step ids)")
    p.add_argument("--json", action="store_true", help="print only the diagnosis document (schemas/diagnosis.schema.json)")
    p.add_argument("--contract", metavar="FILE", help="measurement contract (YAML/JSON)")
    reference_args.add_arguments(p)
    p.add_argument("--step-range", metavar="NAME", help="annotation/NVTX range name that marks one step")
    p.add_argument("--allow-mixed-runs", action="store_true",
                   help="analyse files together even when their metadata says they are not ranks "
                   "of one run (refused by default)")
    p.add_argument("--top", type=int, metavar="N",
                   help="also show the top N kernels by GPU time, host ops by self time and the "
                   "copies by kind (adds `top` to --json)")
    p.add_argument("--csv", metavar="DIR",
                   help="also write the phase table, the kernels by GPU time and the per-rank "
                   "breakdown as CSV files into DIR")
    p.add_argument("--parquet", metavar="DIR", help="the same tables as Parquet files into DIR")
    p.add_argument("--quiet", "-q", action="store_true",
                   help="for scripts: one verdict line (with --json: the document), no hints, "
                   "warnings or progress; errors still go to stderr")
    scale.add_arguments(p)
    return p


def run(args: argparse.Namespace) -> int:
    from moetune.analysis import analyze
    from moetune.analyzer.top import top_section
    from moetune.progress import describe, progress

    paths = list(args.paths) or [DEFAULT_TRACE]
    if not args.paths and not DEFAULT_TRACE.exists():
        raise UserError("no PATH given and the default example trace is missing", path=DEFAULT_TRACE)
    if args.top is not None and args.top < 1:
        raise UserError("--top must be at least 1")
    exporting = bool(args.csv or args.parquet)
    # the export's kernel table: the --top N rows, or every kernel name
    extra = [top_section(args.top)] if args.top else [top_section(None)] if exporting else []
    reference = reference_args.from_args(args)
    opts = scale.options_from_args(args)
    mapped = None
    if scale.wanted(paths, opts):  # many ranks: summarised per rank, reduced across ranks
        from moetune.analysis import apply_reference

        an, mapped = scale.diagnose_many(paths, opts, args.contract, extra_sections=extra)
        doc = apply_reference(an.diagnosis, reference, contract=an.contract_doc)
    else:
        with progress(f"reading and analysing {describe(paths)}", enabled=not args.quiet):
            doc = analyze(paths, args.contract, window=args.window, step_range=args.step_range,
                          audit=False, allow_mixed_runs=args.allow_mixed_runs,
                          extra_sections=extra, reference_step_s=reference).diagnosis
    if exporting:
        from moetune.export import write_tables

        for fmt, where in (("csv", args.csv), ("parquet", args.parquet)):
            if where:
                written = write_tables(doc, where, fmt=fmt)
                if not args.quiet:
                    print(f"wrote {', '.join(str(w) for w in written)}", file=sys.stderr)
    if args.json:
        sys.stdout.write(json.dumps(doc, indent=2, sort_keys=True, ensure_ascii=False) + "\n")
    elif args.quiet:
        from moetune.render import quiet_lines

        print("\n".join(quiet_lines(doc)))
    else:
        from moetune.render import render_diagnosis, render_top

        render_diagnosis(doc)
        if mapped is not None:
            print("\n".join(scale.summary_lines(mapped) + scale.cross_rank_lines(doc)))
        if args.top:
            render_top(doc)
        print(next_hint(args.paths or [str(DEFAULT_TRACE)], args.contract,
                        getattr(args, "log", None)), file=sys.stderr)
    if not args.quiet and doc.get("warnings"):
        from moetune.render import render_warnings  # rich: only when there is something to show

        render_warnings(doc["warnings"])
    return 0


def next_hint(paths: list[str], contract: str | None, log: str | None) -> str:
    """The commands to run next, on the same inputs, each runnable as printed (paths quoted):
    the contract given, else the log (its argument dump stands in for one: moetune/analysis.py
    for recommend, `audit --log`), else the placeholder FILE."""
    shown = " ".join(shlex.quote(str(p)) for p in paths)
    given = f"--contract {shlex.quote(contract)}" if contract else ""
    with_log = f" --log {shlex.quote(log)}" if log else ""
    claims = given or with_log.strip() or "--contract FILE"
    return (f"next: moetune recommend {shown} {(given + with_log).strip() or claims}  ·  "
            f"moetune audit {claims} {shown}")
