"""The report page read as an engineer reads it (issue 30, items 1–6): the verdict first, step
counts that are counts, a host-bound timeline that looks idle, recommendation cards with the
terminal's fields, CPU ops by self time, the nsys memory hint, and the baseline's configuration
delta. Pages are built from real H200 traces (a Megatron-LM host-bound step with its log, an nsys
export); the browser test keeps screenshots of the first screen and of the host-bound timeline
under `$MOETUNE_ARTIFACTS/report/`."""

from __future__ import annotations

import gzip
import html
import json
import re
import shutil
import sqlite3
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.golden import run_cli

pytest.importorskip("plotly", reason="the report extra (plotly) is not installed")

from tests.test_report import Browser, artifacts, find_chromium  # noqa: F401

ROOT = Path(__file__).resolve().parents[1]
TRACES = ROOT / "fixtures" / "traces"
MLM = TRACES / "mlm_host_mbs1_rcfull"  # Megatron-LM, MBS 1, full recompute: host-bound
NSYS = ROOT / "fixtures" / "nsys" / "h200_eager_2steps.sqlite.gz"


def whole_trace_nsys(dst: Path) -> Path:
    """The nsys export without its NVTX ranges: no step markers, so one whole-trace step (the
    shape of an nsys capture taken without `--capture-range`/NVTX step ranges)."""
    raw = dst.with_suffix("")
    with gzip.open(NSYS, "rb") as f, raw.open("wb") as out:
        shutil.copyfileobj(f, out)
    con = sqlite3.connect(raw)
    con.execute("DELETE FROM NVTX_EVENTS")
    con.commit()
    con.close()
    return raw


def _json(argv: list[str]) -> dict:
    code, out, err = run_cli(argv)
    assert code == 0, err
    return json.loads(out)


@pytest.fixture(scope="module")
def pages(artifacts: Path, tmp_path_factory: pytest.TempPathFactory  # noqa: F811
          ) -> dict[str, Path]:
    nsys = whole_trace_nsys(tmp_path_factory.mktemp("nsys") / "eager_whole.sqlite.gz")
    out = {}
    for name, args in (
            ("mlm_hostbound", [str(MLM / "trace.json.gz"), "--log", str(MLM / "train.log")]),
            ("nsys_whole_trace", [str(nsys)])):
        dst = artifacts / f"{name}.html"
        code, _, err = run_cli(["report", *args, "-o", str(dst)])
        assert code == 0, err
        out[name] = dst
    out["nsys_trace"] = nsys
    return out


def _plain(page: str, sid: str) -> str:
    """A section's text as a reader sees it (tags dropped, entities decoded, spaces collapsed)."""
    m = re.search(rf'<section id="{sid}">(.*?)</section>', page, re.S)
    assert m, sid
    inline = re.sub(r"</?(?:b|a|span|code)\b[^>]*>", "", m.group(1))
    return " ".join(html.unescape(re.sub(r"<[^>]+>", " ", inline)).split())


def test_verdict_leads_the_page(pages: dict[str, Path]) -> None:
    """Item 1: the first section is one verdict line with the wall, its pace, the step time and
    the top change (gain and memory verdict), each the number diagnose and recommend print."""
    page = pages["mlm_hostbound"].read_text()
    assert re.findall(r'<section id="(\w+)">', page)[0] == "verdict"
    ref = ["--log", str(MLM / "train.log")]
    diag = _json(["diagnose", "--json", str(MLM / "trace.json.gz"), *ref])
    rec = _json(["recommend", "--json", str(MLM / "trace.json.gz"), *ref])["recommendations"][0]
    text = _plain(page, "verdict")
    share = diag["walls"][diag["dominant_wall"]] * 100
    sp = rec["gain"]["speedup"]
    assert text.startswith(f"Verdict host-bound ({share:.1f} % of the step) · paced by the host · "
                           f"median step {diag['step_time_s'] * 1e3:,.2f} ms · top change: "
                           f"{rec['title']}, predicted {sp['mid'] * 100:+.1f} % "
                           f"({sp['low'] * 100:+.1f} % to {sp['high'] * 100:+.1f} %), memory "
                           f"{rec['memory']['verdict']}."), text


def test_steps_analysed_is_a_count(pages: dict[str, Path]) -> None:
    """Item 2: a count with its ids; one whole-trace nsys step reads as that, never "0"."""
    run = _plain(pages["mlm_hostbound"].read_text(), "run")
    assert "steps analysed 1 (step 10)" in run and "1 step(s) found (10)" in run
    nsys = _plain(pages["nsys_whole_trace"].read_text(), "run")
    assert "steps analysed 1 (the whole trace)" in nsys and "steps from whole trace" in nsys
    assert "the whole trace is analysed as one step" in nsys
    assert not re.search(r"steps (analysed|found) 0", nsys), nsys


@pytest.fixture(scope="module")
def chrome() -> Iterator[Browser]:
    exe = find_chromium()
    if exe is None:
        pytest.skip("no Chromium installed (apt-get install chromium; .ci/run installs it)")
    b = Browser(exe, width=1400, height=900)
    try:
        b.open()
        yield b
    finally:
        b.close()


def test_first_screen_shows_the_verdict(pages: dict[str, Path], chrome: Browser,
                                        artifacts: Path) -> None:  # noqa: F811
    """The first screen (1400×900) opens on the verdict, wholly visible under the header."""
    chrome.load(pages["mlm_hostbound"].resolve().as_uri())
    box = chrome.eval("(() => { const r = document.querySelector('.verdict')"
                      ".getBoundingClientRect(); return [r.top, r.bottom]; })()")
    shot = chrome.send("Page.captureScreenshot", {"format": "png"})
    (artifacts / "first_screen.png").write_bytes(__import__("base64").b64decode(shot["data"]))
    assert chrome.errors() == []
    assert 0 < box[0] < box[1] < 450, box
