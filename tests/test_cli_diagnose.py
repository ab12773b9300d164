"""`moetune diagnose` as a real subprocess: stdout/stderr split, exit codes, --json."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def moetune(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "moetune", "diagnose", *args], cwd=ROOT, capture_output=True, text=True, timeout=120
    )


def test_terminal_summary(corpus) -> None:
    r = moetune(str(corpus / "public/kineto/hta_a100_alltoall_rank3of8.json.gz"))
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    assert lines[0].startswith("moetune diagnose hta_a100_alltoall_rank3of8.json.gz · kineto · 1 rank · steps 1009–1014")
    assert any(line.startswith("compute") and "← dominant" in line for line in lines)
    assert any(line.startswith("host idle") and "launch-starved" in line for line in lines)
    assert any("dispatcher nccl_alltoall" in line for line in lines)
    assert "dropped incomplete" not in r.stderr  # the last ProfilerStep is whole here
    assert "warning" not in r.stdout


def test_json_only_document(corpus) -> None:
    r = moetune(str(corpus / "public/kineto/tracelens_h100_qwen05b_inference.json.gz"), "--json")
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    assert doc["schema"] == "moetune.diagnosis/1" and doc["step_time_s"] == 0.034892


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["public/kineto/hta_cpu_only.json.gz"], "has no GPU events (CPU-only profile?)"),
        (["public/kineto/hta_a100_2rank_nccl.json.gz", "--window", "7:9"], "selects no complete step"),
        (["public/kineto/hta_a100_2rank_nccl.json.gz", "--window", "abc"], "--window must look like A:B"),
        (["public/kineto/hta_a100_2rank_nccl.json.gz", "--step-range", "nope"], "no annotation named 'nope'"),
        (["public/kineto/missing.json.gz"], "no such file"),
    ],
)
def test_bad_input_one_line_exit_2(corpus, args, message) -> None:
    r = moetune(*[str(corpus / a) if a.startswith("public/") else a for a in args])
    assert r.returncode == 2
    assert r.stdout == ""
    err = [line for line in r.stderr.splitlines() if not line.startswith("warning:")]
    assert len(err) == 1 and err[0].startswith("moetune: ") and message in err[0]
    assert "Traceback" not in r.stderr


def test_default_trace() -> None:
    default = ROOT / "fixtures/traces/gpu_mcore_hostbound/trace.json.gz"
    r = moetune("--json")
    if default.exists():
        assert r.returncode == 0 and json.loads(r.stdout)["schema"] == "moetune.diagnosis/1"
    else:
        assert r.returncode == 2 and "default example trace is missing" in r.stderr


def test_run_folder_with_notes_beside_the_rank_traces(tmp_path: Path) -> None:
    """A run folder as a user has it: both ranks' traces, a truth/config .json and a log. The small
    non-trace .json is skipped with a warning; named explicitly it is still an error."""
    import shutil

    src = ROOT / "fixtures" / "traces" / "gpu_ep2_allgather"
    run = tmp_path / "run"
    shutil.copytree(src, run)
    (run / "config.json").write_text('{"lr": 0.001}')
    r = moetune(str(run), "--json")
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    assert doc["ranks_analyzed"] == [0, 1]
    assert sorted(i["file"] for i in doc["inputs"]) == ["rank0.pt.trace.json.gz",
                                                       "rank1.pt.trace.json.gz"]
    assert "config.json: skipped, a .json with no traceEvents" in r.stderr
    assert "truth.json: skipped" in r.stderr
    r = moetune(str(run / "config.json"))
    assert r.returncode == 2 and "not a Kineto trace" in r.stderr
    notes = tmp_path / "notes"
    notes.mkdir()
    (notes / "a.json").write_text("{}")
    r = moetune(str(notes))
    assert r.returncode == 2 and "its .json files have no traceEvents" in r.stderr
