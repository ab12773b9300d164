"""`moetune rules check DIR` validates a rule folder and runs each rule on the fixtures it names:
a missing fixture, a rule that does not fire on its `fires` fixture, fires on its `quiet` one or
is not blocked on its `blocked` one is one `file:line: message` line and exit 1. A user's folder
keeps its own fixtures in DIR/fixtures/ and may extend ours."""

from __future__ import annotations

from pathlib import Path

import pytest
from moetune.rules.check import check_folder
from moetune.rules.load import CATALOG, load_rules, rule_files

from fixtures.diagnoses import names
from tests.golden import run_cli

GOOD = (CATALOG / "host" / "host.manual-gc.yaml").read_text(encoding="utf-8")
RID = "host.manual-gc-often"
# a user's scenario: the shipped graphed_launch_bound, whose host time is unexplained idle
GAPS = "extends: graphed_launch_bound\ndescription: idle gaps no launch explains\n"


def user_folder(tmp: Path, fixtures: str = "fires: [gc_gaps]\n  quiet: [healthy]",
                scenario: str = GAPS) -> tuple[Path, Path]:
    text = GOOD.replace("id: host.manual-gc", f"id: {RID}").replace(
        "with: {manual_gc_interval: 100}", "with: {manual_gc_interval: 10}")
    text = text[: text.index("fixtures:")] + f"fixtures:\n  {fixtures}\n"
    rule = tmp / "host" / f"{RID}.yaml"
    rule.parent.mkdir(parents=True)
    rule.write_text(text, encoding="utf-8")
    (tmp / "fixtures").mkdir()
    (tmp / "fixtures" / "gc_gaps.yaml").write_text(scenario, encoding="utf-8")
    return rule, tmp / "fixtures" / "gc_gaps.yaml"


def line(path: Path, needle: str) -> int:
    return next(i for i, ln in enumerate(path.read_text().splitlines(), 1) if needle in ln)


def test_the_shipped_catalog_passes_every_fixture() -> None:
    done = check_folder(CATALOG)
    assert done.problems == []
    named = [n for r in load_rules().values() for k in ("fires", "quiet", "blocked")
             for n in r.spec["fixtures"].get(k, [])]
    assert done.runs == len(named) > 90 and set(named) <= set(names())
    code, out, err = run_cli(["rules", "check", str(CATALOG)])
    assert code == 0 and out == ""
    assert f"{len(done.rules)} rule(s) valid, {done.runs} fixture outcome(s) checked, 0 problem(s)" in err


def test_a_users_rule_with_its_own_fixture_passes(tmp_path: Path) -> None:
    user_folder(tmp_path)
    code, out, err = run_cli(["rules", "check", str(tmp_path)])
    assert (code, out) == (0, ""), err
    assert "1 rule(s) valid, 2 fixture outcome(s) checked, 0 problem(s)" in err
    # the fixtures folder holds scenarios, not rules: recommend --rules DIR does not read it
    assert [p.name for p in rule_files(tmp_path)] == [f"{RID}.yaml"]


@pytest.mark.parametrize(("fixtures", "needle", "message"), [
    ("fires: [gc_gaps, nope]\n  quiet: [healthy]", "  fires: [",
     "fixtures.fires: no fixture 'nope' (looked in "),
    ("fires: [gc_gaps, healthy]\n  quiet: [healthy]", "  fires: [",
     "fixtures.fires: the rule did not fire (quiet: condition not met) on 'healthy'"),
    ("fires: [gc_gaps]\n  quiet: [healthy, gc_gaps]", "  quiet: [",
     "fixtures.quiet: the rule is not quiet (it fires, rank "),
    ("fires: [gc_gaps]\n  quiet: [healthy]\n  blocked: [healthy]", "  blocked: [",
     "fixtures.blocked: the rule is not blocked (quiet: condition not met) on 'healthy'"),
])
def test_each_broken_expectation_is_one_line(tmp_path: Path, fixtures: str, needle: str,
                                              message: str) -> None:
    rule, _ = user_folder(tmp_path, fixtures)
    code, out, err = run_cli(["rules", "check", str(tmp_path)])
    assert code == 1, err
    assert len(out.splitlines()) == 1
    assert out.startswith(f"{rule}:{line(rule, needle)}: {message}"), out


@pytest.mark.parametrize(("scenario", "message"), [
    ("extends: no_such_base\n", "no scenario 'no_such_base' (extended by 'gc_gaps')"),
    ("extends: healthy\ndiagnosis:\n  walls: {compute: lots}\n",
     "diagnosis.walls.compute: 'lots' is not of type 'number'"),
    ("extends: healthy\ndrop: [contract.nothing_here]\n", "drop: 'contract.nothing_here' is not in"),
    ("extends: healthy\n  bad: [", "cannot read scenario"),
])
def test_a_broken_fixture_is_one_line_naming_its_file(tmp_path: Path, scenario: str,
                                                     message: str) -> None:
    _, fixture = user_folder(tmp_path, scenario=scenario)
    code, out, err = run_cli(["rules", "check", str(tmp_path)])
    assert code == 1, err
    assert len(out.splitlines()) == 1 and message in out, out
    assert out.startswith(str(fixture)) or out.startswith(f"{fixture}:"), out


def test_fixture_folders_given_are_searched_first(tmp_path: Path) -> None:
    rules_dir, extra = tmp_path / "rules", tmp_path / "elsewhere"
    rules_dir.mkdir()
    user_folder(rules_dir)
    extra.mkdir()
    (extra / "gc_gaps.yaml").write_text("extends: healthy\n")  # shadows DIR/fixtures: now quiet
    code, out, _ = run_cli(["rules", "check", str(rules_dir), "--fixtures", str(extra)])
    assert code == 1 and "fixtures.fires: the rule did not fire" in out
    code, _, err = run_cli(["rules", "check", str(rules_dir), "--fixtures", str(tmp_path / "x")])
    assert code == 2 and "fixtures folder not found" in err


@pytest.mark.parametrize(("old", "new", "message"), [
    ("whatif: grouped_gemm", "whatif: grouped_gemms",
     "unknown what-if transform 'grouped_gemms' (not in analyzer/whatif.yaml)"),
    ("whatif: grouped_gemm", "whatif: recompute_off",
     "what-if transform 'recompute_off' models recompute_granularity, the rule changes moe_grouped_gemm"),
])
def test_a_rule_naming_a_what_if_transform_must_name_one_of_its_knob(
        tmp_path: Path, old: str, new: str, message: str) -> None:
    text = (CATALOG / "compute" / "compute.grouped-gemm.yaml").read_text(encoding="utf-8")
    assert old in text
    rule = tmp_path / "compute" / "compute.grouped-gemm.yaml"
    rule.parent.mkdir()
    rule.write_text(text.replace(old, new), encoding="utf-8")
    code, out, _ = run_cli(["rules", "check", str(tmp_path)])
    assert code == 1 and out == f"{rule}:{line(rule, new)}: {message}\n"


def test_a_folder_with_no_rules_or_a_file_is_refused(tmp_path: Path) -> None:
    """An empty folder (a mistyped path) once passed the gate: '0 rule(s) valid, … 0 problem(s)',
    exit 0. It is bad input now, and so is a file given for the folder: one line, exit 2."""
    (tmp_path / "empty").mkdir()
    trace = Path(__file__).resolve().parents[1] / "fixtures" / "traces" / "mlm_host_mbs1_rcfull"
    for given, said in ((tmp_path / "empty", "holds no rule files (.yaml, .yml): nothing to check"),
                        (trace / "train.log", "is a file, not a rules folder")):
        for json_flag in ([], ["--json"]):
            code, out, err = run_cli(["rules", "check", str(given), *json_flag])
            assert code == 2 and out == "", (given, out, err)
            assert err.strip().splitlines() == [f"moetune: {given}: {said}" + (
                " (a folder of rule .yaml files)" if given.is_file() else "")]
