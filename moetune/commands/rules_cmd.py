"""`moetune rules list | show ID | check DIR`: browse and validate the rule catalog.

`check` loads a folder of rule files exactly as `recommend --rules DIR` would, then runs each
rule on the fixtures it names (moetune/rules/check.py: they must exist, and it must fire on its
`fires`, stay quiet on its `quiet`, be blocked on its `blocked`), and prints every problem as
`file:line: message` (exit 1 when there is any). docs/extending.md walks writing a rule.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from moetune.errors import GateFailed, UserError


def add_parser(subparsers: argparse._SubParsersAction) -> argparse.ArgumentParser:
    p = subparsers.add_parser(
        "rules",
        help="list, explain and validate tuning rules",
        description="Browse the built-in rule catalog (rules/catalog) and validate rule folders.",
    )
    sub = p.add_subparsers(dest="rules_command", metavar="ACTION", required=True)
    ls = sub.add_parser("list", help="one line per rule: id, status, knob, title")
    ls.add_argument("--rules", action="append", default=[], metavar="DIR", help="extra rule folder")
    ls.add_argument("--json", action="store_true",
                    help="print the list (schemas/rules_list.schema.json)")
    show = sub.add_parser("show", help="everything about one rule")
    show.add_argument("id", metavar="ID")
    show.add_argument("--rules", action="append", default=[], metavar="DIR", help="extra rule folder")
    show.add_argument("--json", action="store_true",
                      help="print the rule as its file states it (schemas/rule.schema.json)")
    chk = sub.add_parser("check", help="validate a folder of rules and run each on its fixtures",
                         description="Validate every rule file of DIR (file:line: problem), then "
                         "run each rule on the fixtures it names: it must fire on `fires`, stay "
                         "quiet on `quiet` and be blocked on `blocked`. Fixtures are found in "
                         "--fixtures folders, DIR/fixtures/, then the source checkout's "
                         "fixtures/diagnoses/ (format: fixtures/diagnoses/README.md).")
    chk.add_argument("folder", metavar="DIR")
    chk.add_argument("--fixtures", action="append", default=[], metavar="FDIR",
                     help="a folder of scenario fixtures, searched first (repeatable)")
    chk.add_argument("--json", action="store_true",
                     help="print the verdict and the problems (schemas/rules_check.schema.json)")
    return p


def run(args: argparse.Namespace) -> int:
    from moetune.rules.load import load_catalog, load_rules

    if args.rules_command == "check":
        return _check(Path(args.folder), [Path(d) for d in args.fixtures], as_json=args.json)
    rules = load_rules([Path(d) for d in args.rules])
    catalog = load_catalog()
    if args.rules_command == "list":
        if args.json:
            out = [
                {"id": r.id, "status": r.spec["status"], "wall": r.wall, "knob": r.knob,
                 "title": r.spec["title"], "file": str(r.path)}
                for r in rules.values()
            ]
            sys.stdout.write(json.dumps(out, indent=2, ensure_ascii=False) + "\n")
        else:
            width = max((len(i) for i in rules), default=0)
            for r in rules.values():
                print(f"{r.id:<{width}}  {r.spec['status']:<10} {r.knob:<34} {r.spec['title']}")
        return 0
    rule = rules.get(args.id)
    if rule is None:
        raise UserError(f"no rule {args.id!r}; `moetune rules list` shows the ids")
    if args.json:
        sys.stdout.write(json.dumps(rule.spec, indent=2, ensure_ascii=False) + "\n")
        return 0
    sys.stdout.write(explain(rule.spec, catalog))
    return 0


def _check(folder: Path, fixture_dirs: list[Path], *, as_json: bool = False) -> int:
    from moetune.rules.check import check_folder
    from moetune.rules.load import rule_files

    for d in fixture_dirs:
        if not d.is_dir():
            raise UserError("fixtures folder not found", path=d)
    if not rule_files(folder):  # a mistyped folder must not pass the gate with nothing checked
        raise UserError("holds no rule files (.yaml, .yml): nothing to check", path=folder)
    done = check_folder(folder, fixture_dirs)
    if as_json:
        doc = {"schema": "moetune.rules-check/1", "folder": str(folder),
               "fixtures": [str(d) for d in done.fixtures], "rules": sorted(done.rules),
               "outcomes_checked": done.runs, "valid": not done.problems,
               "problems": [{"file": p.path, "line": p.line, "message": p.message}
                            for p in done.problems]}
        sys.stdout.write(json.dumps(doc, indent=2, ensure_ascii=False) + "\n")
    for p in [] if as_json else done.problems:
        print(p)
    where = ", ".join(map(str, done.fixtures)) or "none found"
    print(f"{len(done.rules)} rule(s) valid, {done.runs} fixture outcome(s) checked, "
          f"{len(done.problems)} problem(s) in {folder} (fixtures: {where})", file=sys.stderr)
    if done.problems:
        raise GateFailed()
    return 0


def explain(spec: dict[str, Any], catalog: Any) -> str:
    """ruff-rule-like text: id, title, why, when, fix, gain, risk, verify, example, sources."""
    from moetune.rules.docgen import scale_note, whatif_note
    from moetune.rules.engine import render_bridge, render_flags

    change = spec["change"]
    flags: list[str] = []
    bridge: list[str] = []
    for name, value in {change["knob"]: change["to"], **(change.get("with") or {})}.items():
        knob = catalog.knobs[name]
        f, r = render_flags(knob, value)
        flags += f + [f"(remove {x})" for x in r]
        if b := render_bridge(knob, value):
            bridge.append(b)
    gain = spec["expected_gain"]
    if "fixed" in gain:
        size = f"speedup {gain['fixed'][0] * 100:+.1f} % … {gain['fixed'][1] * 100:+.1f} %"
    else:
        rec = gain["recoverable"]
        src = f"wall {rec['wall']}" if "wall" in rec else rec["metric"]
        e = gain["efficiency"]
        size = f"removes {e[0] * 100:.0f}–{e[1] * 100:.0f} % of R ({src}); ceiling T/(T−R)−1"
    v = spec["verify"]
    lines = [
        f"{spec['id']} [{spec['status']}] {spec['title']}",
        "",
        "Why:",
        f"  {spec['why']}",
        "",
        "When (all/any/not over metric/contract/audit/fact/knob):",
        *("  " + ln for ln in json.dumps(spec["when"], ensure_ascii=False, indent=2).splitlines()),
        "",
        f"Fix: {' '.join(flags) or '(defaults)'}"
        + (scale_note(change, code="") if "scale" in change else ""),
    ]
    if bridge:
        lines.append(f"Bridge: {' '.join(bridge)}")
    lines += [
        f"Gain: {size}{whatif_note(gain)}",
        f"  basis: {gain['basis']}",
        f"Confidence: {spec['confidence']} · Risk: {spec['risk']['level']}",
        *(f"  - {n}" for n in spec["risk"]["notes"]),
        f"Verify: {('audit ' + v['audit'] + ' confirmed; ') if v.get('audit') else ''}"
        f"{v['metric']} {v['direction']}" + (f" — {v['signature']}" if v.get("signature") else ""),
        f"Quiet: {spec['quiet']}",
        f"Example: before: {spec['example']['before']}",
        f"         after:  {spec['example']['after']}",
        "Sources:",
        *(f"  - {s}" for s in spec["sources"]),
    ]
    return "\n".join(lines) + "\n"
