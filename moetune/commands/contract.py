"""`moetune contract check FILE [--strict]` and `moetune contract from-log LOG [-o FILE] [--json]`."""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path

import yaml

from moetune.analyzer.contract import check_contract, read_document
from moetune.analyzer.log_hardware import FILL, fill_hint
from moetune.analyzer.megatron_args import DUMP, SOURCES, LogContract, read_log
from moetune.errors import GateFailed, UserError, read_user_text

FROM_LOG_SCHEMA_ID = "moetune.contract-from-log/1"
# Megatron-Bridge's own start-up output: a configuration summary instead of an argument dump
_BRIDGE = ("Configuration Summary (Non-Default Values", "megatron.bridge", "megatron/bridge")


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
    check.add_argument("--json", action="store_true",
                       help="print the problems (schemas/contract_check.schema.json)")
    from_log = sub.add_parser(
        "from-log", help="contract YAML from a Megatron-LM log",
        description="Read a contract from a Megatron-LM log: its argument dump (or argument lines "
        "without the dump's header), `using world size`, `using torch.* for parameters` and "
        "`padded vocab` lines, the launcher's command line (`… pretrain_gpt.py --flag value …`) "
        "and echoed flag variables (`MOE_ARGS: --num-experts 8 …`), in that precedence; the "
        "iteration lines fill the global batch size and train_iters where nothing stated them.")
    from_log.add_argument("log", help="Megatron-LM stdout/stderr log (launcher prefixes are fine)")
    from_log.add_argument("-o", "--output", metavar="FILE", help="write the contract here instead of stdout")
    from_log.add_argument("--json", action="store_true",
                          help="print the contract, each argument's source and the log's "
                          "evidence (theoretical memory), what it set aside and what to add "
                          "(schemas/contract_from_log.schema.json)")
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
    from moetune.executor.logparse import iteration_args, parse_text

    path = Path(args.log)
    text = read_user_text(path, errors="replace")
    parsed = parse_text(text)
    found = read_log(text, observed=iteration_args(parsed.iterations))
    if not found.contract:
        raise UserError(_nothing_found(text), path=path)
    if args.json:
        doc = from_log_document(found, path.name, parsed.theoretical_memory)
        text_out = json.dumps(_finite(doc), indent=1, ensure_ascii=False, allow_nan=False) + "\n"
    else:
        header = (f"# moetune contract from-log {path.name}: review it\n"
                  + "".join(f"# {line}\n" for line in _provenance(found))
                  + "".join(f"# {line}\n" for line in _to_fill(found)))
        text_out = header + yaml.dump(found.contract, Dumper=_NoAliases, sort_keys=False, width=100)
    if args.output:
        out = Path(args.output)
        if out.resolve() == path.resolve():
            raise UserError("refusing to overwrite the input log", path=out)
        out.write_text(text_out)
        print(f"wrote {out}", file=sys.stderr)
    else:
        sys.stdout.write(text_out)
    return 0


def _finite(value: object) -> object:
    """The document with NaN/inf (a log may print `lr nan`) as text: strict JSON has no such numbers."""
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)
    if isinstance(value, dict):
        return {k: _finite(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_finite(v) for v in value]
    return value


def _nothing_found(text: str) -> str:
    """The refusal: what was looked for; Megatron-Bridge named only for a Bridge log."""
    if not text.strip():
        return "is empty: no Megatron log to read"
    msg = ("no Megatron-LM arguments found: no argument dump ('---- arguments ----') or argument "
           "lines, no 'using world size' line, no pretrain_*.py command line, no echoed --flags")
    if any(marker in text for marker in _BRIDGE):
        msg += " (a Megatron-Bridge log: Bridge prints its configuration summary, not arguments)"
    return msg


def _provenance(found: LogContract) -> list[str]:
    """Comment lines naming the sources of the values, where more than the dump supplied them."""
    by_source: dict[str, list[str]] = {s: [] for s in SOURCES}  # strongest first
    for arg, source in found.sources.items():
        by_source.setdefault(source, []).append(arg)
    by_source = {s: names for s, names in by_source.items() if names}
    lines = []
    if set(by_source) - {DUMP}:
        for source, names in by_source.items():
            shown = ", ".join(names) if len(names) <= 12 else f"{len(names)} arguments"
            lines.append(f"from the {source}: {shown}")
    for c in found.conflicts:
        lines.append(f"{c['arg']}: {c['kept']['source']} says {c['kept']['value']!r}, kept over "
                     f"the {c['overruled']['source']}'s {c['overruled']['value']!r}")
    if found.unread_flags:
        lines.append("unread (a shell variable, not its value): " + " ".join(found.unread_flags))
    if "label" not in found.contract:
        lines.append("no label: the log shows only part of the arguments; set it after review")
    if hw := found.contract.get("hardware"):
        lines.append("hardware from the log: " + ", ".join(f"{k} {v}" for k, v in hw.items()))
    if found.set_aside:
        shown = ", ".join(f"{k}={v!r}" for k, v in found.set_aside.items())
        lines.append(f"printed, but not Megatron-LM arguments (left out of megatron_args): {shown}")
    return lines


def _to_fill(found: LogContract) -> list[str]:
    """Comment lines naming what the log does not state that later commands need, with the
    line to add."""
    if not found.missing:
        return []
    return ["not in the log; add before the commands that need it:",
            *(f"  {fill_hint(key)}" for key in found.missing), *_one_section(found.missing)]


def _one_section(missing: list[str]) -> list[str]:
    """The lines to add of keys sharing a section, as one mapping: YAML keeps only the last of a
    repeated key, so the lines added one by one would lose all but the last."""
    import re

    from moetune.analyzer.log_hardware import FILL

    inner: dict[str, list[str]] = {}
    for key in missing:
        m = re.match(r"(\w+): \{(.*?)\}", FILL[key][1])
        if m and m[2] not in inner.setdefault(m[1], []):
            inner[m[1]].append(m[2])
    return [f"  all in one `{section}:` (a repeated key keeps only its last): add "
            f"`{section}: {{{', '.join(parts)}}}`" for section, parts in inner.items()
            if len(parts) > 1]


def from_log_document(found: LogContract, log_name: str, theoretical: object) -> dict:
    """The `contract from-log --json` document (schemas/contract_from_log.schema.json)."""
    import polars as pl

    theory = None
    if isinstance(theoretical, pl.DataFrame) and theoretical.height:
        row = theoretical.sort("rank", nulls_last=True).row(0, named=True)
        theory = {k: row[k] for k in ("rank", "weight_and_optimizer_mb", "activation_mb", "total_mb")}
    counts: dict[str, int] = {}
    for source in found.sources.values():
        counts[source] = counts.get(source, 0) + 1
    return {
        "schema": FROM_LOG_SCHEMA_ID,
        "log": log_name,
        "contract": found.contract,
        "complete": found.complete,
        "sources": found.sources,
        "source_counts": counts,
        "conflicts": found.conflicts,
        "unread_flags": list(found.unread_flags),
        "set_aside": found.set_aside,
        "missing": [{"key": k, "needed_by": FILL[k][0], "add": FILL[k][1]} for k in found.missing],
        "evidence": {"theoretical_memory": theory},
    }
