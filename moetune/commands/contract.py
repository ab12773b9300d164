"""`moetune contract check FILE [--strict]` and `moetune contract from-log LOG [-o FILE]`."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import yaml

from moetune.analyzer.contract import check_contract, read_document
from moetune.analyzer.megatron_args import contract_from_log
from moetune.errors import GateFailed, UserError


class _NoAliases(yaml.SafeDumper):
    """Repeat shared values instead of writing YAML anchors (&id001) a reader must resolve."""

    def ignore_aliases(self, data: object) -> bool:
        return True


def add_parser(subparsers: argparse._SubParsersAction) -> argparse.ArgumentParser:
    p = subparsers.add_parser(
        "contract",
        help="validate a measurement contract, or build one from a Megatron log",
        description="Validate a measurement contract (JSON or YAML), or build one from the "
        "argument dump a Megatron-LM run prints at start-up.",
    )
    sub = p.add_subparsers(dest="contract_command", metavar="ACTION", required=True)
    check = sub.add_parser("check", help="validate a contract; exit 1 when it has errors")
    check.add_argument("file", help="contract file (.yaml, .yml or .json)")
    check.add_argument(
        "--strict", action="store_true", help="demand the complete set of sections and fields"
    )
    check.add_argument("--json", action="store_true", help="print the problems as JSON")
    from_log = sub.add_parser("from-log", help="contract YAML from a Megatron-LM log")
    from_log.add_argument("log", help="Megatron-LM stdout/stderr log (launcher prefixes are fine)")
    from_log.add_argument("-o", "--output", help="write the contract here instead of stdout")
    return p


def run(args: argparse.Namespace) -> int:
    if args.contract_command == "check":
        return _check(args)
    return _from_log(args)


def _check(args: argparse.Namespace) -> int:
    doc = read_document(args.file)
    if doc is None:
        raise UserError("is empty", path=args.file)
    problems = check_contract(doc, strict=args.strict)
    errors = [p for p in problems if p.severity == "error"]
    if args.json:
        out = {
            "file": Path(args.file).name,
            "strict": args.strict,
            "valid": not errors,
            "problems": [
                {"path": p.path, "message": p.message, "severity": p.severity} for p in problems
            ],
        }
        print(json.dumps(out, indent=1))
    else:
        for p in problems:
            print(f"{args.file}: {p.severity}: {p}")
        kind = "complete" if args.strict else "valid"
        verdict = f"not {kind}" if errors else kind
        warn = sum(p.severity == "warning" for p in problems)
        print(f"{args.file}: {verdict} ({len(errors)} error(s), {warn} warning(s))", file=sys.stderr)
    if errors:
        raise GateFailed("")
    return 0


def _from_log(args: argparse.Namespace) -> int:
    path = Path(args.log)
    try:
        text = path.read_text(errors="replace")
    except FileNotFoundError:
        raise UserError("no such file", path=path) from None
    except OSError as exc:
        raise UserError(f"cannot read: {exc.strerror or exc}", path=path) from None
    doc = contract_from_log(text)
    if not doc:
        raise UserError(
            "no Megatron-LM argument dump ('---- arguments ----') or 'using world size' line found "
            "(Megatron-Bridge logs print no argument dump)",
            path=path,
        )
    header = f"# moetune contract from-log {path.name}: review, then fill hardware/versions/window\n"
    text_out = header + yaml.dump(doc, Dumper=_NoAliases, sort_keys=False, width=100)
    if args.output:
        out = Path(args.output)
        if out.resolve() == path.resolve():
            raise UserError("refusing to overwrite the input log", path=out)
        out.write_text(text_out)
        print(f"wrote {out}", file=sys.stderr)
    else:
        sys.stdout.write(text_out)
    return 0
