"""Write the Megatron-LM argument list moetune knows (`analyzer/megatron_arguments.json`) from a
Megatron-LM source tree's own parser.

    python tools/megatron_arguments.py MEGATRON_LM_DIR --commit SHA --log TRAIN.LOG \
        --previous analyzer/megatron_arguments.json > new.json && mv new.json analyzer/…

Needs torch (the CPU build does) and what `megatron.training.arguments` imports. The parser is
`megatron.training.arguments.add_megatron_arguments` — the one `pretrain_gpt.py` parses with — so
the list follows the checked-out commit, dataclass-generated arguments included. Each entry: the
destination (the name the argument dump prints), its flags, type, default, choices and nargs.
`--log`: a real run's log of that commit; the names its argument dump prints beyond the parser's
(set by `validate_args`: `data_parallel_size`, `world_size`, …) are `derived`. `--previous`: the
file this replaces; names it knew that this commit no longer has move to `older` (users run older
Megatron-LMs too).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path
from typing import Any


def _plain(v: Any) -> Any:
    """A JSON value for a default: containers and scalars as they are, anything else as text."""
    if v is None or isinstance(v, (bool, int, float, str)):
        return v
    if isinstance(v, (list, tuple)):
        return [_plain(x) for x in v]
    return str(v)


def dump_names(log: Path) -> list[str]:
    """The argument names of a Megatron log's `---- arguments ----` block."""
    names, inside = [], False
    for line in log.read_text(errors="replace").splitlines():
        if "-- arguments --" in line:
            inside = True
        elif "-- end of arguments --" in line:
            break
        elif inside and " ..." in line:
            names.append(line.split()[0])
    return names


def arguments(root: Path) -> dict[str, Any]:
    sys.path.insert(0, str(root))
    from megatron.training.arguments import add_megatron_arguments

    parser = add_megatron_arguments(argparse.ArgumentParser(allow_abbrev=False))
    args: dict[str, dict[str, Any]] = {}
    for a in parser._actions:
        if not a.option_strings or a.dest == "help":
            continue
        kind = ("flag" if isinstance(a, (argparse._StoreTrueAction, argparse._StoreFalseAction,
                                         argparse._StoreConstAction)) else
                getattr(a.type, "__name__", None) or "str")
        entry = args.setdefault(a.dest, {"flags": [], "type": kind, "default": _plain(a.default)})
        entry["flags"] += [f for f in a.option_strings if f not in entry["flags"]]
        if a.choices is not None:
            entry["choices"] = [_plain(c) for c in a.choices]
        if a.nargs not in (None, 0):
            entry["nargs"] = str(a.nargs)
        if isinstance(a, argparse._StoreFalseAction):
            entry["negates"] = True
    return dict(sorted(args.items()))


def main() -> int:
    ap = argparse.ArgumentParser(prog="megatron_arguments")
    ap.add_argument("root", type=Path)
    ap.add_argument("--commit", help="the tree's commit (default: git rev-parse HEAD there)")
    ap.add_argument("--log", type=Path, help="a run's log of that commit (its derived names)")
    ap.add_argument("--previous", type=Path, help="the argument file this one replaces")
    a = ap.parse_args()
    commit = a.commit or subprocess.run(["git", "-C", str(a.root), "rev-parse", "HEAD"],
                                        capture_output=True, text=True).stdout.strip() or None
    args = arguments(a.root.resolve())
    derived = sorted(set(dump_names(a.log)) - set(args)) if a.log else []
    older: set[str] = set()
    if a.previous:
        prev = json.loads(a.previous.read_text())
        older = (set(prev.get("older", [])) | set(prev.get("arguments", {}))
                 | set(prev.get("derived", []))) - set(args) - set(derived)
    json.dump({"source": "NVIDIA/Megatron-LM megatron/training/arguments.py "
                         "add_megatron_arguments", "commit": commit, "arguments": args,
               "derived": derived, "older": sorted(older)}, sys.stdout, indent=1)
    sys.stdout.write("\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
