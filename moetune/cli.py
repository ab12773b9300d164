"""Thin CLI: parse arguments, call the library, render. Each subcommand lives in moetune/commands/."""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Sequence

from moetune import __version__
from moetune.errors import GateFailed, UserError

# Subcommand name -> module under moetune.commands. Each module defines
# `add_parser(subparsers) -> argparse.ArgumentParser` and `run(args) -> int`.
COMMANDS: dict[str, str] = {
    "diagnose": "diagnose",
    "audit": "audit",
    "contract": "contract",
    "recommend": "recommend",
    "rules": "rules_cmd",
    "fit": "fit",
    "run": "run_cmd",
    "tune": "tune",
    "ledger": "ledger",
    "report": "report",
    "diff": "diff",
    "annotate": "annotate",
}


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="moetune",
        description="Diagnose, audit and tune slow MoE (Megatron-Core) training runs.",
    )
    parser.add_argument("--version", action="version", version=f"moetune {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for module in COMMANDS.values():
        try:
            mod = importlib.import_module(f"moetune.commands.{module}")
        except ModuleNotFoundError as exc:  # a command whose module is not there yet
            if exc.name != f"moetune.commands.{module}":
                raise
            continue
        p = mod.add_parser(sub)
        p.set_defaults(_run=mod.run)
    return parser




def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
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
