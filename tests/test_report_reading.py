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
                           f"({sp['low'] * 100:+.1f} % to {sp['high'] * 100:+.1f} %) over the "
                           f"{rec['gain']['step_time_s']['before'] * 1e3:,.2f} ms unprofiled "
                           f"step of train.log, memory {rec['memory']['verdict']}."), text


def test_steps_analysed_is_a_count(pages: dict[str, Path]) -> None:
    """Item 2: a count with its ids; one whole-trace nsys step reads as that, never "0"."""
    run = _plain(pages["mlm_hostbound"].read_text(), "run")
    assert "steps analysed 1 (step 10)" in run and "1 step(s) found (10)" in run
    nsys = _plain(pages["nsys_whole_trace"].read_text(), "run")
    assert "steps analysed 1 (the whole trace)" in nsys and "steps from whole trace" in nsys
    assert "the whole trace is analysed as one step" in nsys
    assert "· the whole trace (one step) " in _plain(pages["nsys_whole_trace"].read_text(),
                                                    "verdict")
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


def test_binned_lanes_are_shaded_by_occupancy() -> None:
    """Item 3, as data: a binned lane's ink (Σ occupancy × bin length) is its busy time, so the
    real host-bound step's GPU streams (busy ~2 % of 4.3 s) are drawn ~2 % inked, not solid."""
    import polars as pl

    from moetune import report

    data = report.collect([MLM / "trace.json.gz"])
    tl, d = data.timeline, data.analysis.diagnosis
    assert tl is not None and "GPU 0 · stream 7" in tl.merged  # 21,956 kernels: binned
    ink = (tl.boxes.filter(pl.col("lane").str.starts_with("GPU"))
           .select(((pl.col("end") - pl.col("start")) * pl.col("occupancy")).sum()).item())
    gpu_busy = 1 - d["walls"]["host"]  # the GPU's exposed walls: busy time in the step
    assert ink / tl.length_ns == pytest.approx(gpu_busy, rel=0.05)
    gpu = tl.boxes.filter(pl.col("lane") == "GPU 0 · stream 7")
    assert gpu["occupancy"].max() < 0.5 and gpu["occupancy"].mean() < 0.05


def test_downsample_counts_nested_calls_once() -> None:
    """Nested host calls (an op inside its parent) cover their bin once; gaps stay empty."""
    import polars as pl

    from moetune import report

    n = report.LANE_MAX_BOXES + 10
    # per 1,000 ns: a parent of 400 ns holding a child of 200 ns, then 600 ns idle
    starts = [i * 1000 for i in range(n // 2)]
    boxes = pl.DataFrame({
        "lane": ["CPU thread 1"] * (2 * len(starts)),
        "start": starts + [s + 100 for s in starts],
        "end": [s + 400 for s in starts] + [s + 300 for s in starts],
        "wall": ["host"] * (2 * len(starts)), "label": ["parent"] * len(starts) + ["child"] * len(starts)})
    out, merged = report.downsample(boxes, len(starts) * 1000)
    assert merged == {"CPU thread 1": 2 * len(starts)}
    ink = out.select(((pl.col("end") - pl.col("start")) * pl.col("occupancy")).sum()).item()
    assert ink == pytest.approx(400 * len(starts), rel=1e-9)
    assert int(out["n"].sum()) == 2 * len(starts)


INK_JS = """(async (uri) => {
  const img = new Image(); img.src = uri; await img.decode();
  const c = document.createElement('canvas'); c.width = img.width; c.height = img.height;
  const g = c.getContext('2d'); g.drawImage(img, 0, 0);
  const px = g.getImageData(0, 0, c.width, c.height).data; let ink = 0;
  for (let i = 0; i < px.length; i += 4) ink += 1 - (px[i] + px[i + 1] + px[i + 2]) / 765;
  return ink / (px.length / 4);
})"""


def _lane_ink(chrome: Browser, lane: str) -> float:
    """The mean darkness (0 white … 1 black) of a thin strip through `lane`'s row of the drawn
    timeline, from a screenshot decoded in the page."""
    box = chrome.eval(
        "(() => { const plot = document.querySelector('#chart-timeline .nsewdrag')"
        ".getBoundingClientRect(); const t = Array.from(document.querySelectorAll("
        "'#chart-timeline .ytick text')).find(e => e.textContent === " + json.dumps(lane) + ")"
        ".getBoundingClientRect(); return [plot.left + window.scrollX, plot.width, "
        "(t.top + t.bottom) / 2 + window.scrollY]; })()")
    shot = chrome.send("Page.captureScreenshot", {
        "format": "png", "captureBeyondViewport": True,
        "clip": {"x": box[0] + 2, "y": box[2] - 3, "width": box[1] - 4, "height": 6, "scale": 1}})
    uri = "data:image/png;base64," + shot["data"]
    return chrome.eval(f"{INK_JS}({json.dumps(uri)})")


def test_host_bound_timeline_looks_idle(pages: dict[str, Path], chrome: Browser,
                                        artifacts: Path) -> None:  # noqa: F811
    """Item 3, as seen: in the drawn timeline of the host-bound step the GPU's lane is pale
    (busy ~2 %), while the critical path lane (contiguous by construction) is solid."""
    import base64

    chrome.load(pages["mlm_hostbound"].resolve().as_uri())
    chrome.eval("document.getElementById('timeline').scrollIntoView()")
    gpu = _lane_ink(chrome, "GPU 0 · stream 7")
    path = _lane_ink(chrome, "critical path")
    r = chrome.eval("(() => { const r = document.getElementById('timeline')"
                    ".getBoundingClientRect(); return [r.top + window.scrollY, r.height]; })()")
    shot = chrome.send("Page.captureScreenshot", {
        "format": "png", "captureBeyondViewport": True,
        "clip": {"x": 0, "y": r[0], "width": chrome.width, "height": r[1], "scale": 1}})
    (artifacts / "hostbound_timeline.png").write_bytes(base64.b64decode(shot["data"]))
    assert chrome.errors() == []
    assert gpu < 0.1 and path > 0.3, (gpu, path)


def test_recommendation_cards_say_what_the_terminal_says(pages: dict[str, Path]) -> None:
    """Item 4: every card has the predicted memory (verdict and basis), what to verify and the
    risk, in the very words `moetune recommend` prints for the same run."""
    ref = ["--log", str(MLM / "train.log")]
    code, term, err = run_cli(["recommend", str(MLM / "trace.json.gz"), *ref])
    assert code == 0, err
    recs = _json(["recommend", "--json", str(MLM / "trace.json.gz"), *ref])["recommendations"]
    assert len(recs) >= 2
    page = pages["mlm_hostbound"].read_text()
    cards = re.findall(r'<article class="rec">(.*?)</article>', page, re.S)
    assert len(cards) == len(recs)
    for card, rec in zip(cards, recs, strict=True):
        text = " ".join(html.unescape(re.sub(r"<[^>]+>", "", card)).split())
        lines = {k: [ln.split(": ", 1)[1] for ln in term.splitlines() if ln.startswith(k + ": ")]
                 for k in ("memory", "verify", "risk")}
        verify = next(v for v in lines["verify"] if v.startswith(
            (f"audit {rec['verify']['audit']}" if rec["verify"].get("audit") else "")
            + ("" if rec["verify"].get("audit") else rec["verify"]["metric"])))
        assert f"Verify on the next profile: {verify}" in text
        assert f"Risk {rec['risk']['level']}: {'; '.join(rec['risk']['notes'])}" in text
        assert f"risk: {rec['risk']['level']}: {'; '.join(rec['risk']['notes'])}" in term
        # the predicted gain: its point, its calibrated range and their basis, in both
        sp = rec["gain"]["speedup"]
        point, low, high = (f"{sp[k] * 100:+.1f} %" for k in ("mid", "low", "high"))
        assert f"Predicted gain {point} (range {low} to {high})" in text
        gains = [ln for ln in term.splitlines() if ln.startswith("gain: ")]
        assert any(g.startswith(f"gain: {point} ({low} … {high}) ") for g in gains) or (
            low == high and any(g.startswith(f"gain: {point} alone") for g in gains))
        assert f"Basis: {rec['gain']['basis']}" in text
        assert f"  basis: {rec['gain']['basis']}" in term.splitlines()
        if rec.get("memory") is None:  # no memory cost to predict (expandable segments)
            continue
        assert f"Memory: {rec['memory']['verdict']}: " in text and "Basis: " in text
        assert any(f"Memory: {m}" in text for m in lines["memory"])


def _figure(page: str, cid: str) -> list[dict]:
    """The data array plotly draws in chart `cid`."""
    at = re.search(rf'Plotly\.newPlot\(\s*"chart-{cid}",', page).start()
    start = page.index("[", at)
    return json.JSONDecoder().raw_decode(page[start:])[0]


def test_cpu_ops_by_self_time_as_top_ranks_them(pages: dict[str, Path]) -> None:
    """Item 5: the CPU ops chart ranks by self time with `diagnose --top`'s numbers (inclusive
    time would put CheckpointFunctionBackward, 3.1 s inclusive but 0.54 s self, first)."""
    page = pages["mlm_hostbound"].read_text()
    top = _json(["diagnose", "--json", "--top", "15", str(MLM / "trace.json.gz")])["top"]
    bars = _figure(page, "cpu-ops")[0]
    names = [re.sub(r"…$", "", n) for n in bars["y"][::-1]]
    want = top["ops"][:15]
    assert len(names) == len(want) == 15
    for name, x, row in zip(names, bars["x"][::-1], want, strict=True):
        assert row["name"].startswith(name)
        assert x == pytest.approx(row["self_s"] / top["rank_steps"] * 1e3, abs=1e-3)  # 1 µs
    assert names[0] == "aten::mm"
    assert "CPU ops: the top 15 by self time" in page and "ms per step (CPU self time)" in page


def test_kernel_class_title_counts_its_bars(pages: dict[str, Path]) -> None:
    """Item 5: the kernel-class chart's title says how many bars it draws."""
    for name in ("mlm_hostbound", "nsys_whole_trace"):
        page = pages[name].read_text()
        n = len(_figure(page, "kernel-classes")[0]["y"])
        m = re.search(r"<h3>Kernel classes: (all (\d+)|the top (\d+) of \d+), by GPU time</h3>",
                      page)
        assert m and int(m.group(2) or m.group(3)) == n, (name, n)
        assert f"Top {n + 5} kernel classes" not in page and "Top 15 kernel classes" not in page


def test_nsys_page_advises_the_nsys_memory_option(pages: dict[str, Path]) -> None:
    """Item 5: an nsys trace without memory events is told nsys's option, not Kineto's."""
    nsys = _plain(pages["nsys_whole_trace"].read_text(), "memory")
    assert "nsys profile --cuda-memory-usage=true" in nsys and "profile_memory" not in nsys
    code, _, err = run_cli(["report", str(ROOT / "fixtures" / "traces" / "gpu_mcore_hostbound"),
                            "-o", str(pages["nsys_trace"].with_name("kineto.html"))])
    assert code == 0, err
    kineto = _plain(pages["nsys_trace"].with_name("kineto.html").read_text(), "memory")
    assert "profile_memory=True" in kineto and "cuda-memory-usage" not in kineto


def test_baseline_takes_its_own_contract_or_log(tmp_path: Path) -> None:
    """Item 6: `report --baseline` takes the baseline's log (`--baseline-log`) or contract
    (`--baseline-contract`), and the comparison opens with what configuration changed."""
    mbs8 = TRACES / "mlm_host_mbs8_rcnone"
    page = tmp_path / "logs.html"
    code, _, err = run_cli(["report", str(mbs8 / "trace.json.gz"), "--log", str(mbs8 / "train.log"),
                            "--baseline", str(MLM / "trace.json.gz"), "--baseline-log",
                            str(MLM / "train.log"), "-o", str(page)])
    assert code == 0, err
    text = _plain(page.read_text(), "baseline")
    assert text.startswith(
        "Against the baseline Configuration (baseline's log, this run's log): "
        "eval_micro_batch_size 1 → 8, micro_batch_size 1 → 8, recompute_granularity full → unset, "
        "recompute_method uniform → unset, recompute_num_layers 1 → unset. Baseline"), text
    assert "model shape not compared" not in text
    # the baseline's log is its memory evidence (2.83 GiB; unknown without it), as --log is
    # this run's (5.69 GiB)
    assert "peak allocated memory: 2.83 GiB → 5.69 GiB" in text
    no, yes = TRACES / "gpu_ep2_alltoall_nooverlap", TRACES / "gpu_ep2_alltoall_overlap"
    page = tmp_path / "contracts.html"
    code, _, err = run_cli(["report", str(yes), "--contract", str(yes / "golden" / "contract.yaml"),
                            "--baseline", str(no), "--baseline-contract",
                            str(no / "golden" / "contract.yaml"), "-o", str(page)])
    assert code == 0, err
    text = _plain(page.read_text(), "baseline")
    assert text.startswith("Against the baseline Configuration (baseline's contract, this run's "
                           "contract): overlap_grad_reduce false → true."), text
    # without them the page says which options would tell, not a request it cannot take
    code, _, err = run_cli(["report", str(MLM / "trace.json.gz"), "--baseline",
                            str(mbs8 / "trace.json.gz"), "-o", str(tmp_path / "none.html")])
    assert code == 0, err
    text = _plain((tmp_path / "none.html").read_text(), "baseline")
    assert ("Configuration: not compared, no Megatron arguments for the baseline "
            "(--baseline-contract or --baseline-log) and this run (--contract or --log).") in text
    assert "give the baseline's --baseline-contract or --baseline-log" in text
    assert "each run's contract or Megatron log" not in text


def test_baseline_options_need_a_baseline(tmp_path: Path) -> None:
    code, out, err = run_cli(["report", str(MLM / "trace.json.gz"), "--baseline-log",
                              str(MLM / "train.log"), "-o", str(tmp_path / "r.html")])
    assert code == 2 and out == "" and len(err.strip().splitlines()) == 1
    assert "give its trace with --baseline" in err and not (tmp_path / "r.html").exists()


def _column(page: str, heading: str, col: int) -> list[str]:
    """Column `col` of the first table after `heading`, as text."""
    at = page.index(heading)
    table = page[page.index("<table", at): page.index("</table>", at)]
    rows = re.findall(r"<tr>(.*?)</tr>", table, re.S)[1:]  # the header row first
    return [html.unescape(re.sub(r"<[^>]+>", "", re.findall(r"<td[^>]*>(.*?)</td>", r, re.S)[col]))
            .strip() for r in rows]


def test_page_counts_per_step_as_the_terminal_prints_them(tmp_path: Path) -> None:
    """Item 7 on the page: the real H200 Megatron-Core step (4 profiled steps) once listed its
    top kernels' launches as totals over the steps beside times per step (1,016 where the
    terminal says 254 per step) and copies per step as floats (`22.0`); now both columns are per
    step and read as `moetune diagnose --top` prints them."""
    trace = TRACES / "gpu_mcore_hostbound" / "trace.json.gz"
    code, term, err = run_cli(["diagnose", str(trace), "--top", "10"])
    assert code == 0, err
    lines = term.splitlines()

    def counts(title: str, col: int) -> list[str]:
        at = next(i for i, ln in enumerate(lines) if ln.startswith(title)) + 2
        out = []
        while at < len(lines) and lines[at].strip() and not lines[at].startswith("top "):
            out.append(lines[at].split()[col])
            at += 1
        return out

    page_file = tmp_path / "r.html"
    code, _, err = run_cli(["report", str(trace), "-o", str(page_file)])
    assert code == 0, err
    page = page_file.read_text()
    launches = _column(page, "<h3>Top kernels</h3>", 2)
    want = counts("top GPU kernels", -5)  # count, total, "ms", share, "%"
    assert launches[: len(want)] == want and "223.5" in want
    copies = _column(page, "<h3>Copies by direction and memory kind</h3>", 2)
    assert sorted(copies) == sorted(counts("copies by direction", 2))
    assert not any(c.endswith(".0") for c in launches + copies)
