"""Start-up of the CLI (issue #19): only the chosen command's module is imported, the static help
texts stay those of the command modules, and in-process callers of `main` get their code back."""

from __future__ import annotations

import argparse
import importlib
import subprocess
import sys

import pytest

from moetune import cli


def test_static_help_matches_each_command_module() -> None:
    parser = argparse.ArgumentParser()
    sub = parser.add_subparsers()
    for module, _ in cli.COMMANDS.values():
        importlib.import_module(f"moetune.commands.{module}").add_parser(sub)
    own = {a.dest: a.help for a in sub._choices_actions}
    assert own == {name: help_text for name, (_, help_text) in cli.COMMANDS.items()}


def test_full_and_lazy_parsers_list_the_same_commands() -> None:
    full, lazy = cli.build_parser().format_help(), cli.build_parser([]).format_help()
    assert full == lazy
    assert all(name in lazy for name in cli.COMMANDS)


@pytest.mark.parametrize(("argv", "chosen"), [
    (["diagnose", "x.json"], "diagnose"), (["--version"], None), (["-h", "fit"], "fit"),
    (["bogus"], None), ([], None), (["--", "diagnose"], None)])
def test_chosen_command(argv: list[str], chosen: str | None) -> None:
    assert cli.chosen_command(argv) == chosen


def _modules_after(args: str) -> set[str]:
    code = ("import sys, contextlib, io\nfrom moetune import cli\n"
            "with contextlib.redirect_stdout(io.StringIO()), contextlib.suppress(SystemExit):\n"
            f"    cli.main({args})\n"
            "print(' '.join(sorted(sys.modules)))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    return set(out.stdout.split())


def test_help_imports_no_command_and_no_analysis_library() -> None:
    mods = _modules_after("['--help']")
    assert not {m for m in mods if m.startswith("moetune.commands.")}
    assert not {"polars", "numpy", "jsonschema", "networkx", "rich"} & mods


def test_a_command_imports_its_own_module_only() -> None:
    mods = _modules_after("['ledger', '--help']")
    assert {m for m in mods if m.startswith("moetune.commands.")} == {
        "moetune.commands.ledger", "moetune.commands.run_cmd"}  # ledger reads run_cmd's default


def test_in_process_main_returns_instead_of_exiting(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["diagnose", "--json", "--quiet", "/nonexistent/trace.json"]) != 0
    assert "no such file" in capsys.readouterr().err


def test_diagnose_json_imports_nothing_it_does_not_use() -> None:
    mods = _modules_after("['diagnose', '--json', '--quiet', "
                          "'fixtures/traces/gpu_mcore_hostbound/trace.json.gz']")
    assert "moetune.analyzer.diagnose" in mods  # it did run
    unused = {"networkx", "plotly", "dask", "distributed", "torch", "pandas", "rich",
              "moetune.analyzer.audit", "moetune.analyzer.contract", "moetune.knobs",
              "moetune.analyzer.planner", "moetune.render"}
    assert not unused & mods
