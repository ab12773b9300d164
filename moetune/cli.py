"""Thin CLI: parse arguments, call the library, render. Each subcommand lives in moetune/commands/."""

from __future__ import annotations

import argparse
import importlib
import os
import sys
from collections.abc import Iterable, Sequence

from moetune import __version__
from moetune.errors import GateFailed, UserError

# Subcommand name -> (module under moetune.commands, one-line help for `moetune --help`). Each
# module defines `add_parser(subparsers) -> argparse.ArgumentParser` and `run(args) -> int`. Only
# the chosen command's module is imported (a command pulls in polars, the planner, rich, ...: the
# start-up of `moetune diagnose` should not pay for `fit`'s imports); the others get a stub parser
# with the help text below, which tests/test_speed_cli.py keeps equal to each module's own.
COMMANDS: dict[str, tuple[str, str]] = {
    "diagnose": ("diagnose", "attribute step time to compute / communication / memory / host walls"),
    "audit": ("audit", "check the contract's claimed backends against trace evidence"),
    "contract": ("contract", "validate a measurement contract, or build one from a Megatron log"),
    "recommend": ("recommend", "rank one-knob Megatron changes that attack the dominant wall"),
    "rules": ("rules_cmd", "list, explain and validate tuning rules"),
    "classify": ("classify", "say which kernel_classes.yaml entry classifies an event name, "
                 "and which phases.yaml signature labels its phase"),
    "fit": ("fit", "plan parallel layouts that fit memory, ranked"),
    "run": ("run_cmd", "run one knob change against the baseline (sequential A/B, verdict)"),
    "tune": ("tune", "closed loop: profile, diagnose, recommend, validate, accept (resumable)"),
    "ledger": ("ledger", "list recorded runs and verdicts"),
    "report": ("report", "write one self-contained HTML report (charts, timeline, advice)"),
    "diff": ("diff", "compare two runs: step time and noise, walls, kernels, comm, backends, "
             "memory"),
    "annotate": ("annotate", "write the trace plus moetune's tracks (walls, critical path, "
                 "blocking, audit) for Perfetto"),
}


def chosen_command(argv: Sequence[str]) -> str | None:
    """The subcommand `argv` names: its first word that is not an option (the top-level options,
    -h and --version, take no value), or None."""
    for arg in argv:
        if arg == "--":
            return None
        if not arg.startswith("-"):
            return arg if arg in COMMANDS else None
    return None


def build_parser(commands: Iterable[str] | None = None) -> argparse.ArgumentParser:
    """The CLI's parser. `commands`: the subcommands whose modules are imported and whose full
    parsers are built (default: all); the rest get a stub that only lists them with their help."""
    full = set(COMMANDS) if commands is None else set(commands)
    parser = argparse.ArgumentParser(
        prog="moetune",
        description="Diagnose, audit and tune slow MoE (Megatron-Core) training runs.",
    )
    parser.add_argument("--version", action="version", version=f"moetune {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name, (module, help_text) in COMMANDS.items():
        if name not in full:
            sub.add_parser(name, help=help_text)
            continue
        try:
            mod = importlib.import_module(f"moetune.commands.{module}")
        except ModuleNotFoundError as exc:  # a command whose module is not there yet
            if exc.name != f"moetune.commands.{module}":
                raise
            continue
        p = mod.add_parser(sub)
        p.set_defaults(_run=mod.run)
    return parser


# Commands that leave nothing for the interpreter's shutdown to do (no child process, no open
# file, nothing registered to run at exit): when moetune runs as a program, the process ends as
# soon as they have returned and their output is flushed, without tearing down ~400 modules and
# the analysis' heap one object at a time (0.15–0.25 s of every `diagnose` on the dev VM).
QUICK_EXIT = frozenset({"diagnose"})


def main(argv: Sequence[str] | None = None) -> int:
    """The `moetune` program. `argv` None: the process's own arguments, and a command of
    QUICK_EXIT ends the process itself (in-process callers pass `argv` and get the code back)."""
    program = argv is None
    if argv is None:
        argv = sys.argv[1:]
    chosen = chosen_command(argv)
    rc = _main(argv, chosen)
    if program and chosen in QUICK_EXIT:
        _quick_exit(rc)
    return rc


def _quick_exit(rc: int) -> None:
    try:
        sys.stdout.flush()
        sys.stderr.flush()
    except (BrokenPipeError, ValueError):
        return  # let the normal exit report it as it always has
    os._exit(rc)


def _main(argv: Sequence[str], chosen: str | None) -> int:
    parser = build_parser([chosen] if chosen else [])
    # argparse exits 2 on usage errors with its own one-line message: that is our contract too.
    args = parser.parse_args(argv)
    if not getattr(args, "_run", None):
        parser.print_help(sys.stderr)
        return 2
    try:
        return int(args._run(args) or 0)
    except UserError as exc:
        print(f"moetune: {exc.message}", file=sys.stderr)
        return exc.exit_code
    except GateFailed as exc:
        if str(exc):
            print(f"moetune: {exc}", file=sys.stderr)
        return exc.exit_code
    except KeyboardInterrupt:
        print("moetune: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:
        return 0


if __name__ == "__main__":
    raise SystemExit(main())
