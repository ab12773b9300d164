"""`diagnose --top N`, `--quiet` and the progress line on long reads."""

from __future__ import annotations

import contextlib
import io
import json
import time
from pathlib import Path

import jsonschema
import polars as pl
import pytest
from moetune.analyzer.top import self_times

from moetune.cli import main
from moetune.progress import progress

ROOT = Path(__file__).resolve().parent.parent
EP2 = ROOT / "fixtures" / "traces" / "gpu_ep2_alltoall_overlap"
SCHEMA = json.loads((ROOT / "schemas" / "diagnosis.schema.json").read_text())


@pytest.fixture(scope="module")
def top_doc() -> dict:
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        assert main(["diagnose", str(EP2), "--top", "3", "--json"]) == 0
    return json.loads(out.getvalue())


def test_top_json(top_doc: dict) -> None:
    jsonschema.validate(top_doc, SCHEMA)
    top = top_doc["top"]
    assert len(top["kernels"]) == 3 and len(top["ops"]) == 3
    assert top["rank_steps"] == len(top_doc["per_step"])
    # the same first kernel and time as the diagnosis' own evidence
    first = top_doc["evidence"]["top_kernels"][0]
    assert (top["kernels"][0]["name"], top["kernels"][0]["time_s"]) == (first["name"], first["time_s"])
    assert top["kernels"][0]["kclass"] == "comm.nccl.sendrecv"
    assert 0 < sum(k["share"] for k in top["kernels"]) <= 1
    assert all(o["self_s"] <= o["total_s"] for o in top["ops"])


def test_no_top_without_flag(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["diagnose", str(EP2), "--json"]) == 0
    assert "top" not in json.loads(capsys.readouterr().out)  # the goldens' document unchanged


def test_top_terminal(top_doc: dict, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["diagnose", str(EP2), "--top", "3"]) == 0
    out = capsys.readouterr().out
    for title in ("top GPU kernels (per step and rank)", "top host ops by self time",
                  "copies by direction and memory"):
        assert title in out
    assert "comm.nccl.sendrecv" in out and "aten::copy_" in out and "DtoD" in out


def test_quiet(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["diagnose", str(EP2), "--quiet"]) == 0
    out = capsys.readouterr()
    assert out.out.splitlines() == ["step 149.9 ms · dominant host 59.8 %"]
    assert out.err == ""  # no hint, no warnings (the directory's truth.json is skipped)


def test_quiet_errors_still_said(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    assert main(["diagnose", str(tmp_path / "missing.json"), "--quiet"]) == 2
    assert capsys.readouterr().err.count("\n") == 1


def test_self_times_nested() -> None:
    """Nested ranges on one thread: a parent's self time excludes its children, a child that
    outlives its parent is clipped, another thread is separate."""
    ops = pl.DataFrame({
        "rank": [0, 0, 0, 0, 0], "pid": [1, 1, 1, 1, 1], "tid": [1, 1, 1, 1, 2],
        "ts_ns": [0, 10, 20, 95, 0], "dur_ns": [100, 5, 30, 10, 50],
        "name": ["parent", "a", "b", "c", "other"],
    })
    got = dict(self_times(ops).select("name", "self_ns").iter_rows())
    assert got == {"parent": 100 - 5 - 30 - 5, "a": 5, "b": 30, "c": 10, "other": 50}


class _Tty(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_progress_on_a_terminal_only() -> None:
    tty = _Tty()
    with progress("reading 1 file, 1.0 MB", stream=tty, delay_s=0.05):
        time.sleep(0.4)
    text = tty.getvalue()
    assert "reading 1 file, 1.0 MB" in text and text.endswith("\r\033[K")
    quick = _Tty()
    with progress("x", stream=quick, delay_s=5):
        pass
    assert quick.getvalue() == ""  # short work stays silent
    pipe = io.StringIO()
    with progress("x", stream=pipe, delay_s=0):
        time.sleep(0.1)
    assert pipe.getvalue() == ""  # never in a pipe or a log


def test_progress_never_on_stdout(monkeypatch: pytest.MonkeyPatch,
                                  capsys: pytest.CaptureFixture[str]) -> None:
    """On a terminal the progress line shows on stderr while stdout carries the JSON alone."""
    import moetune.progress as prog

    tty = _Tty()
    monkeypatch.setattr(prog, "DELAY_S", 0.0)
    monkeypatch.setattr(prog.sys, "stderr", tty)
    assert main(["diagnose", str(EP2), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["step_time_s"] > 0
    assert "reading and analysing 2 files, 1.1 MB" in tty.getvalue()


@pytest.mark.parametrize("name, want", [
    ("void at::native::vectorized_elementwise_kernel<4, at::native::FillFunctor<float>, "
     "std::array<char*, 1ul> >(int, at::native::FillFunctor<float>, std::array<char*, 1ul>)",
     "vectorized_elementwise_kernel<FillFunctor>"),
    ("nvjet_sm90_tst_64x8_64x16_2x4_h_bz_NNT", "nvjet_sm90_tst_64x8_64x16_2x4_h_bz_NNT"),
    ("aten::mm", "aten::mm"),
])
def test_short_kernel_names(name: str, want: str) -> None:
    from moetune.render import _short_name

    assert _short_name(name, 44) == want
