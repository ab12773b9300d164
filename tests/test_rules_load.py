"""Rule files are data: schema-validated, cross-checked against knobs.yaml and the diagnosis
schema, and every bad file is rejected at load with its file and line."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from moetune.rules.load import CATALOG, check_rules, diagnosis_path_ok, load_rules

from moetune.errors import UserError

ROOT = Path(__file__).resolve().parents[1]
GOOD = (CATALOG / "host" / "host.manual-gc.yaml").read_text(encoding="utf-8")


def write(folder: Path, name: str, text: str, wall: str = "host") -> Path:
    (folder / wall).mkdir(parents=True, exist_ok=True)
    p = folder / wall / f"{name}.yaml"
    p.write_text(text, encoding="utf-8")
    return p


def variant(old: str, new: str, rid: str = "host.manual-gc") -> str:
    assert old in GOOD, old
    return GOOD.replace(old, new).replace("id: host.manual-gc", f"id: {rid}")


def line_of(text: str, needle: str) -> int:
    return next(i for i, ln in enumerate(text.splitlines(), 1) if needle in ln)


def only_problem(folder: Path) -> str:
    rules, problems = check_rules(folder)
    assert len(problems) == 1, [str(p) for p in problems]
    assert not rules
    return str(problems[0])


def test_builtin_catalog_loads() -> None:
    rules = load_rules()
    assert len(rules) >= 21
    assert all(r.id == r.path.stem for r in rules.values())


@pytest.mark.parametrize(
    ("old", "new", "needle", "message"),
    [
        ("status: preview", "status: preview\nseverity: high", "severity:", "unknown field 'severity'"),
        ("op: \">=\", value: 0.15}", "op: \"~=\", value: 0.15}", "op: \"~=\"", "unknown op '~='"),
        ("knob: manual_gc\n  from", "knob: manual_gcc\n  from", "manual_gcc", "unknown knob 'manual_gcc'"),
        ("metric: host.other_s, op", "metric: host.others_s, op", "host.others_s",
         "unknown metric path 'host.others_s'"),
        ("{metric: walls.host, op: \">=\", value: 0.15}", "{metric: walls.host, op: \">=\"}",
         "metric: walls.host", "needs a value"),
        ("with: {manual_gc_interval: 100}", "with: {micro_batch_size: 2}", "micro_batch_size",
         "exactly one knob"),
        ("  to: true\n", "  to: 3\n", "to: 3", "manual_gc is a bool"),
        ("efficiency: [0.1, 0.6]", "efficiency: [0.6, 0.1]", "efficiency", "[low, high]"),
    ],
)
def test_bad_rule_rejected_with_file_and_line(
    tmp_path: Path, old: str, new: str, needle: str, message: str
) -> None:
    text = variant(old, new)
    path = write(tmp_path, "host.manual-gc", text)
    problem = only_problem(tmp_path)
    assert problem.startswith(f"{path}:{line_of(text, needle)}: "), problem
    assert message in problem


def test_unknown_field_in_condition(tmp_path: Path) -> None:
    text = variant("{knob: manual_gc, op: \"==\", value: false}",
                   "{knob: manual_gc, op: \"==\", value: false, python: 'import os'}")
    path = write(tmp_path, "host.manual-gc", text)
    problem = only_problem(tmp_path)
    assert problem.startswith(f"{path}:{line_of(text, 'python:')}:")


def test_duplicate_id(tmp_path: Path) -> None:
    write(tmp_path, "host.manual-gc", GOOD)
    dup = tmp_path / "host.manual-gc.yaml"  # same id, another place in the folder
    dup.write_text(GOOD, encoding="utf-8")
    rules, problems = check_rules(tmp_path)
    assert len(rules) == 1 and len(problems) == 1
    assert "duplicate id 'host.manual-gc'" in str(problems[0])
    assert f":{line_of(GOOD, 'id:')}:" in str(problems[0])


def test_id_must_match_stem_and_wall(tmp_path: Path) -> None:
    write(tmp_path, "host.other-name", GOOD)
    assert "must equal the file stem" in only_problem(tmp_path)


@pytest.mark.parametrize(
    ("payload", "message"),
    [
        ("!!python/object/apply:os.system ['echo hacked']", "not allowed"),
        ("!custom 1", "not allowed"),
    ],
)
def test_yaml_tags_never_execute(tmp_path: Path, payload: str, message: str) -> None:
    marker = tmp_path / "hacked"
    text = variant("title: Host-bound", f"metadata: {{x: {payload.replace('echo hacked', f'touch {marker}')}}}\ntitle: Host-bound")
    write(tmp_path, "host.manual-gc", text)
    problem = only_problem(tmp_path)
    assert message in problem and f":{line_of(text, 'metadata:')}:" in problem
    assert not marker.exists()


def test_duplicate_yaml_key(tmp_path: Path) -> None:
    text = variant("confidence: low", "confidence: low\nconfidence: high")
    write(tmp_path, "host.manual-gc", text)
    problem = only_problem(tmp_path)
    assert "duplicate key 'confidence'" in problem
    assert f":{line_of(text, 'confidence: high')}:" in problem


def test_user_folder_adds_and_overrides(tmp_path: Path) -> None:
    write(tmp_path, "host.manual-gc", GOOD.replace("confidence: low", "confidence: high"))
    write(tmp_path, "host.manual-gc-10", variant("manual_gc_interval: 100", "manual_gc_interval: 10",
                                                 rid="host.manual-gc-10"))
    rules = load_rules([tmp_path])
    assert rules["host.manual-gc"].spec["confidence"] == "high"
    assert rules["host.manual-gc"].path.parent.parent == tmp_path
    assert "host.manual-gc-10" in rules and len(rules) == len(load_rules()) + 1


def test_load_rules_raises_user_error(tmp_path: Path) -> None:
    write(tmp_path, "host.manual-gc", variant("status: preview", "status: beta"))
    with pytest.raises(UserError, match=r"host\.manual-gc\.yaml:\d+: status"):
        load_rules([tmp_path])
    with pytest.raises(UserError, match="rules folder not found"):
        load_rules([tmp_path / "absent"])


def test_a_weighed_follow_up_must_be_a_rule(tmp_path: Path) -> None:
    """A typo in `weigh_with` would silently drop the weighing: the merged rule set refuses it,
    and a user folder may name a built-in rule."""
    shipped = (ROOT / "rules/catalog/host/host.larger-micro-batch.yaml").read_text()
    assert "weigh_with: [memory.recompute-off]" in shipped
    (tmp_path / "host").mkdir()
    (tmp_path / "host" / "host.larger-micro-batch.yaml").write_text(
        shipped.replace("weigh_with: [memory.recompute-off]", "weigh_with: [memory.recompute-of]"))
    with pytest.raises(UserError, match=r"host\.larger-micro-batch\.yaml:\d+: expected_gain\."
                                        r"weigh_with names no rule 'memory\.recompute-of'"):
        load_rules([tmp_path])
    (tmp_path / "host" / "host.larger-micro-batch.yaml").write_text(shipped)
    assert load_rules([tmp_path])["host.larger-micro-batch"].path.parent.parent == tmp_path


def test_metric_paths_against_diagnosis_schema() -> None:
    assert diagnosis_path_ok("walls.host")
    assert diagnosis_path_ok("evidence.classes.comm.deepep.dispatch.time_s")  # dotted class key
    assert diagnosis_path_ok("critical_path.gain_ceiling.communication")
    assert diagnosis_path_ok("wall_detail.memory.recompute_s")
    assert not diagnosis_path_ok("walls")  # a section, not a value
    assert not diagnosis_path_ok("critical_path.gain_ceiling.network")
    assert not diagnosis_path_ok("observed.fp8")


def test_cli_rules_check_and_show(tmp_path: Path) -> None:
    write(tmp_path, "host.manual-gc", variant("status: preview", "status: preview\nseverity: high"))
    p = subprocess.run([sys.executable, "-m", "moetune", "rules", "check", str(tmp_path)],
                       cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert p.returncode == 1
    assert "host/host.manual-gc.yaml:3: unknown field 'severity'" in p.stdout
    from moetune.cli import main

    assert main(["rules", "check", str(CATALOG)]) == 0
    assert main(["rules", "show", "nope.nope"]) == 2


def test_cli_rules_show_text(capsys: pytest.CaptureFixture) -> None:
    from moetune.cli import main

    assert main(["rules", "show", "communication.flex-deepep"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("communication.flex-deepep [preview] ")
    assert "Fix: --moe-token-dispatcher-type flex --moe-flex-dispatcher-backend deepep" in out
    assert "Why:" in out and "Example: before:" in out and "Verify: audit moe_token_dispatcher_type confirmed" in out
    # a scaling change says it scales, and a replayed gain names its replays (recommend proposed
    # MBS 8 where the card read "--micro-batch-size 2, removes 30-60 %")
    assert main(["rules", "show", "host.larger-micro-batch"]) == 0
    out = capsys.readouterr().out
    assert "else the current micro_batch_size × 2, while it divides" in out
    assert "replayed by what-if micro_batch_x2 / micro_batch_x4 / micro_batch_x8" in out
    assert main(["rules", "list"]) == 0
    assert len(capsys.readouterr().out.splitlines()) == len(load_rules())


KNOBS_YAML = ROOT / "rules" / "knobs.yaml"


@pytest.mark.parametrize(
    ("old", "new", "needle", "message"),
    [
        ("    bridge: train.manual_gc\n", "    bridge: train.manual_gc\n    section: \"5.8\"\n",
         "section:", "unknown field 'section'"),
        ("      - {flag: --moe-layer-recompute, sets: {recompute_granularity: selective,",
         "      - {flag: --moe-layer-recompute, sets: {recompute_granularity: partial,",
         "--moe-layer-recompute", "recompute_granularity must be one of"),
        ("      - {flag: --fake-init-process-group, note:", "      - {flag: --moe-deepep-num-sms, note:",
         "--moe-deepep-num-sms, note: \"documented", "--moe-deepep-num-sms belongs to both"),
        ("then: {knob: fake_process_group, op: \"!=\", value: true}",
         "then: {knob: fake_process_groups, op: \"!=\", value: true}",
         "fake_process_groups", "unknown knob 'fake_process_groups'"),
        ("then: {contract: shape.static, op: \"==\", value: true}",
         "then: {contract: shape.statik, op: \"==\", value: true}",
         "shape.statik", "unknown contract path 'shape.statik'"),
        ("then: {knob: fake_process_group, op: \"!=\", value: true}",
         "then: {knob: fake_process_group, op: \"~\", value: true}",
         "op: \"~\"", "unknown op '~'"),
    ],
)
def test_bad_knob_catalog_rejected_with_file_and_line(
    tmp_path: Path, old: str, new: str, needle: str, message: str
) -> None:
    """The knob catalog is checked on load (moetune.knobs: schema, names, flags, deprecated
    settings; rules.load: metric and contract paths); each problem names its file and line."""
    from moetune.rules.load import load_catalog

    text = KNOBS_YAML.read_text(encoding="utf-8")
    assert text.count(old) == 1, old
    text = text.replace(old, new)
    path = tmp_path / "knobs.yaml"
    path.write_text(text, encoding="utf-8")
    with pytest.raises(UserError) as exc:
        load_catalog(path)
    assert str(exc.value).startswith(f"{path}:{line_of(text, needle)}: "), str(exc.value)
    assert message in str(exc.value)
