"""`moetune diff A B [--json] [--top N] [--fail-if-slower PCT] [--contract-a FILE]
[--contract-b FILE] [--log-a FILE] [--log-b FILE] [--memory-snapshot-a FILE] [--memory-snapshot-b
FILE]` and `moetune diff --ledger DB RUN_A RUN_B`."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from moetune import scale
from moetune.commands import reference_args
from moetune.errors import GateFailed, GateUndecided, UserError, read_user_text

CONTRACT_SUFFIXES = (".yaml", ".yml", ".json")


def add_parser(subparsers: argparse._SubParsersAction) -> argparse.ArgumentParser:
    p = subparsers.add_parser(
        "diff",
        help="compare two runs: step time and noise, walls, kernels, comm, backends, memory",
        description="Compare run A (before) with run B (after): two traces or rank directories, "
        "or with --ledger two runs of a tune ledger (their ids, as `moetune ledger` lists them).",
    )
    p.add_argument("a", metavar="A", help="the run before: a trace file or rank directory "
                   "(with --ledger: a run id)")
    p.add_argument("b", metavar="B", help="the run after")
    p.add_argument("--ledger", metavar="DB", type=Path, help="compare two runs of this ledger")
    p.add_argument("--contract-a", metavar="FILE",
                   help="A's measurement contract (YAML/JSON) or Megatron log: model shape, audit")
    p.add_argument("--contract-b", metavar="FILE", help="B's contract or Megatron log")
    reference_args.add_arguments(p, "-a", "A's reference, as recommend's --log / "
                                 "--memory-snapshot: ")
    reference_args.add_arguments(p, "-b", "B's reference: ")
    p.add_argument("--window", metavar="A:B", help="analyze steps A..B of both runs")
    p.add_argument("--step-range", metavar="NAME", help="annotation/NVTX range that marks one step")
    p.add_argument("--top", type=int, default=10, metavar="N",
                   help="rows per table (classes, kernels, ops) by |Δ| (default 10)")
    p.add_argument("--fail-if-slower", type=float, metavar="PCT",
                   help="exit 1 when B's step time is more than PCT %% slower than A's beyond "
                   "the step-to-step noise of both; exit 3 when it is more than PCT %% slower "
                   "but a run's noise is unknown (one analysed step): undecided")
    p.add_argument("--json", action="store_true", help="print only the diff document (schemas/diff.schema.json)")
    scale.add_arguments(p)
    return p


def _contract(path: str | None) -> tuple[Any, dict[str, Any], tuple[str | None, dict[str, Any]]]:
    """(contract for analyze or None, model fields, (where the arguments came from, the Megatron
    arguments)): a contract file, or a Megatron log."""
    from moetune.analysis import read_contract
    from moetune.analyzer.contract import thaw
    from moetune.analyzer.megatron_args import contract_from_log
    from moetune.compare import config_of, model_of

    if path is None:
        return None, {}, (None, {})
    p = Path(path)
    if p.suffix.lower() in CONTRACT_SUFFIXES:
        con = read_contract(p)
        doc = thaw(con) if con is not None else None
        return con, model_of(doc), ("contract", config_of(doc))
    text = read_user_text(p, errors="replace")
    found = contract_from_log(text)
    if not found:
        raise UserError("neither a contract (.yaml/.json) nor a Megatron log with arguments",
                        path=p)
    return None, model_of(found), ("log", config_of(found))


def _claims(contract: str | None, log: str | None
            ) -> tuple[Any, dict[str, Any], tuple[str | None, dict[str, Any]]]:
    """`_contract` of the run's contract, else of its --log's argument dump (as report's
    --baseline-log and recommend read it); a log without one leaves the configuration unknown."""
    if contract is not None or log is None:
        return _contract(contract)
    try:
        return _contract(log)
    except UserError:  # no argument dump: the log still gives the reference step
        return None, {}, (None, {})


def _ledger_doc(args: argparse.Namespace, model_a: dict, model_b: dict,
                config: dict[str, Any] | None) -> dict[str, Any]:
    from moetune.compare import diff_ledger_runs, model_of
    from moetune.executor.ledger import Ledger

    if not args.ledger.exists():
        raise UserError("no ledger here", path=args.ledger)
    ids = []
    for x in (args.a, args.b):
        try:
            ids.append(int(x))
        except ValueError:
            raise UserError(f"{x!r} is not a run id (with --ledger, A and B are run ids as "
                            "`moetune ledger` lists them)", path=args.ledger) from None
    with Ledger.open_readonly(args.ledger) as led:
        runs = {r["id"]: r for r in led.runs()}
        sessions = {s["id"]: s for s in led.sessions()}
    picked = []
    for i in ids:
        r = runs.get(i)
        if r is None:
            raise UserError(f"has no run {i}", path=args.ledger)
        if not (r.get("metrics") or {}).get("step_ms_all"):
            raise UserError(f"run {i} recorded no step times (status {r.get('status')})",
                            path=args.ledger)
        picked.append(r)
    if not model_a:
        model_a = model_of((sessions.get(picked[0]["session"]) or {}).get("contract"))
    if not model_b:
        model_b = model_of((sessions.get(picked[1]["session"]) or {}).get("contract"))
    return diff_ledger_runs(picked[0], picked[1], model_a=model_a, model_b=model_b, config=config)


def run(args: argparse.Namespace) -> int:
    from moetune.analysis import analyze
    from moetune.analyzer.top import top_section
    from moetune.compare import diff_analyses
    from moetune.progress import describe, progress
    from moetune.render import render_diff, render_warnings

    if args.top < 1:
        raise UserError("--top must be at least 1")
    many: list[tuple[str, Any, scale.MapResult]] = []  # sides read through the map
    from moetune.compare import config_delta

    con_a, model_a, (src_a, conf_a) = _claims(args.contract_a, args.log_a)
    con_b, model_b, (src_b, conf_b) = _claims(args.contract_b, args.log_b)
    config = config_delta(conf_a, conf_b, sources=(src_a, src_b))
    if args.ledger is not None:
        if reference_args.given(args, "-a") or reference_args.given(args, "-b"):
            raise UserError("--log-a/-b and --memory-snapshot-a/-b apply to traces, not to "
                            "ledger runs (a ledger holds each run's measured steps)",
                            path=args.ledger)
        doc = _ledger_doc(args, model_a, model_b,
                          config if config["changes"] is not None else None)
    else:
        from moetune.analysis import apply_reference

        analyses = []
        opts = scale.options_from_args(args)
        refs = [reference_args.from_args(args, "-a", require_step=False),
                reference_args.from_args(args, "-b", require_step=False)]
        for label, p, con, ref in zip("AB", (args.a, args.b), (con_a, con_b), refs, strict=True):
            if scale.wanted([p], opts):  # many ranks: summarised per rank (docs/scale.md)
                an, mapped = scale.diagnose_many([p], opts, con, audit=con is not None,
                                                 extra_sections=[top_section(None)])
                apply_reference(an.diagnosis, ref, contract=an.contract_doc)
                analyses.append(an)
                many.append((label, an.diagnosis, mapped))
                continue
            with progress(f"reading and analysing {p} ({describe([p])})"):
                analyses.append(analyze([p], con, window=args.window, step_range=args.step_range,
                                        audit=con is not None, extra_sections=[top_section(None)],
                                        reference_step_s=ref))
        doc = diff_analyses(*analyses, top=args.top, labels=(args.a, args.b),
                            model_a=model_a or None, model_b=model_b or None, config=config)
    if args.json:
        sys.stdout.write(json.dumps(doc, indent=2, sort_keys=True, ensure_ascii=False) + "\n")
    else:
        render_diff(doc)
        for label, _, mapped in many:  # how each many-ranks side was read
            print("\n".join(f"{label}: {line}" for line in scale.summary_lines(mapped)))
    render_warnings(doc["warnings"])
    if args.fail_if_slower is not None:
        gate(doc["step_time"], args.fail_if_slower)
    return 0


def gate(st: dict[str, Any], limit: float) -> None:
    """`--fail-if-slower`: GateFailed (exit 1) when B is more than `limit` % slower than A
    beyond both runs' noise; GateUndecided (exit 3) when B is slower than that but a run's noise
    is unknown (one analysed step), so the slowdown may be noise. The slowdown beyond the noise
    never exceeds the measured one: a measured slowdown within the limit passes whatever the
    noise."""
    if st["delta_pct"] is None:
        raise UserError("--fail-if-slower: no step time on one side to compare")
    slower = st["slower_beyond_noise_pct"]
    if slower is None:  # noise unknown
        if st["delta_pct"] > limit:
            raise GateUndecided(f"cannot decide: B is {st['delta_pct']:.1f} % slower than A, but "
                                f"{st['noise_unknown']}, so this may be noise (limit {limit:g} %); "
                                "analyse at least 2 steps of each run")
        return
    if slower > limit:
        raise GateFailed(f"B is {slower:.1f} % slower than A beyond the noise (limit {limit:g} %)")
