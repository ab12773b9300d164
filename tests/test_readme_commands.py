"""README.md's command table and its `--json` sentence agree with the program: every option a
synopsis names exists on that (sub)command's parser, an option shown outside `[...]` is required
and one inside is optional, every subcommand has a synopsis, and every command that prints a
result takes `--json` whose help names a schema that exists (the new documents of `rules` and
`contract check` validate against theirs)."""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
from pathlib import Path

import jsonschema
import pytest

from moetune.cli import build_parser

ROOT = Path(__file__).resolve().parents[1]
README = (ROOT / "README.md").read_text(encoding="utf-8")
WRITE_A_FILE = {"report", "annotate"}  # write a page / a trace instead of printing a result


def _subparsers(p: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    sub = next((a for a in p._actions if isinstance(a, argparse._SubParsersAction)), None)
    return dict(sub.choices) if sub else {}


PARSERS = _subparsers(build_parser())


def _leaves() -> dict[str, argparse.ArgumentParser]:
    out = {}
    for name, p in PARSERS.items():
        subs = _subparsers(p)
        out.update({f"{name} {s}": sp for s, sp in subs.items()} if subs else {name: p})
    return out


LEAVES = _leaves()


def _synopses() -> list[str]:
    """The backticked synopses of the `## Commands` table's first column."""
    table = README.split("## Commands", 1)[1].split("\n## ", 1)[0]
    out = []
    for row in table.splitlines():
        if not row.startswith("| `"):
            continue
        first = row[2:].split(" | ", 1)[0]
        out += re.findall(r"`([^`]+)`", first)
    return out


def _options(p: argparse.ArgumentParser) -> dict[str, argparse.Action]:
    return {o: a for a in p._actions for o in a.option_strings}


def test_every_synopsis_names_real_options_required_as_the_parser_says() -> None:
    seen: dict[str, int] = {}
    problems = []
    for syn in _synopses():
        words = syn.removeprefix("moetune ").split()
        for command in words[0].split("\\|"):
            leaf, rest = command, words[1:]
            if command in PARSERS and _subparsers(PARSERS[command]):
                leaf, rest = f"{command} {rest[0]}", rest[1:]
            assert leaf in LEAVES, f"README names `{leaf}`, which is no moetune command"
            seen[leaf] = seen.get(leaf, 0) + 1
            opts = _options(LEAVES[leaf])
            depth, first_option, takes = 0, True, None
            for w in rest:
                at = depth + len(w) - len(w.lstrip("["))
                name = w.lstrip("[").rstrip("]")
                if takes is not None and not takes.choices and re.fullmatch(r"[A-Z][A-Z0-9_:]*", name):
                    # the value's name as README shows it is the one --help shows
                    shown = takes.metavar or takes.dest.upper()
                    if shown != name:
                        problems.append(f"`{syn}`: README writes {takes.option_strings[-1]} "
                                        f"{name}, --help writes {shown}")
                takes = None
                if re.fullmatch(r"--?[a-z][a-z0-9-]*", name):
                    takes = opts.get(name) if opts.get(name) and opts[name].nargs != 0 else None
                    action = opts.get(name)
                    if action is None:
                        problems.append(f"`{syn}`: {leaf} has no option {name}")
                    elif at == 0 and not action.required and not (seen[leaf] > 1 and first_option):
                        problems.append(f"`{syn}`: {name} is shown required, {leaf} takes it as optional")
                    elif at > 0 and action.required:
                        problems.append(f"`{syn}`: {name} is shown optional, {leaf} requires it")
                    first_option = False  # an alternative form's first option selects the form
                depth += w.count("[") - w.count("]")
    assert not problems, "\n".join(problems)
    assert not set(LEAVES) - set(seen), f"no synopsis in README.md for {sorted(set(LEAVES) - set(seen))}"


def test_every_command_that_prints_a_result_takes_json_with_its_schema() -> None:
    assert "`report` and `annotate` write a file instead" in README
    for leaf, p in LEAVES.items():
        action = _options(p).get("--json")
        if leaf in WRITE_A_FILE:
            assert action is None, f"{leaf} takes --json: README.md says it writes a file instead"
            continue
        assert action is not None, f"`moetune {leaf}` has no --json (README.md says it does)"
        named = re.findall(r"schemas/(\w+)\.schema\.json", action.help or "")
        assert named, f"`moetune {leaf} --json`'s help names no schema: {action.help!r}"
        for name in named:
            assert (ROOT / "schemas" / f"{name}.schema.json").is_file(), name


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "moetune", *args], cwd=ROOT, capture_output=True,
                          text=True, timeout=300)


def _schema(name: str) -> dict:
    return json.loads((ROOT / "schemas" / f"{name}.schema.json").read_text())


@pytest.mark.parametrize(("args", "schema", "code"), [
    (("rules", "list", "--json"), "rules_list", 0),
    (("rules", "show", "host.cuda-graphs", "--json"), "rule", 0),
    (("rules", "check", "rules/catalog", "--json"), "rules_check", 0),
    (("contract", "check", "fixtures/contracts/qwen3_30b_h100.yaml", "--json"), "contract_check", 0),
])
def test_the_new_documents_validate(args: tuple[str, ...], schema: str, code: int) -> None:
    r = _cli(*args)
    assert r.returncode == code, r.stderr
    doc = json.loads(r.stdout)
    jsonschema.validate(doc, _schema(schema))
    if args[:2] == ("rules", "check"):
        assert doc["valid"] and doc["outcomes_checked"] > len(doc["rules"]) > 20
    if args[:2] == ("rules", "show"):
        assert doc["id"] == "host.cuda-graphs"


def test_rules_check_json_lists_each_problem(tmp_path: Path) -> None:
    rule = (ROOT / "rules" / "catalog" / "host" / "host.cuda-graphs.yaml").read_text()
    folder = tmp_path / "mine" / "host"
    folder.mkdir(parents=True)
    yaml_rule = rule.replace("fires: [", "fires: [no_such_fixture, ", 1)
    assert yaml_rule != rule
    (folder / "host.cuda-graphs.yaml").write_text(yaml_rule)
    r = _cli("rules", "check", str(tmp_path / "mine"), "--json")
    assert r.returncode == 1
    doc = json.loads(r.stdout)
    jsonschema.validate(doc, _schema("rules_check"))
    assert not doc["valid"]
    (p,) = [p for p in doc["problems"] if "no_such_fixture" in p["message"]]
    assert p["file"].endswith("host.cuda-graphs.yaml") and p["line"] > 0
