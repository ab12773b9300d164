"""The report's Phases section (moetune/report_phases.py) as a person sees it: the stacked bar per
layer drawn in headless Chromium, the phase table sortable by a click, the per-rank bars of a
two-rank run. Pages are built from real H200 traces; screenshots go with the report tests'
(`$MOETUNE_ARTIFACTS/report/`)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.golden import run_cli

pytest.importorskip("plotly", reason="the report extra (plotly) is not installed")

from tests.test_report import Browser, artifacts, browser  # noqa: F401

ROOT = Path(__file__).resolve().parents[1]
TRACES = ROOT / "fixtures" / "traces"
GRID = TRACES / "grid_host_mbs8_grp_rcnone_a2a_eager"
EP2 = TRACES / "gpu_ep2_alltoall_overlap"


@pytest.fixture(scope="module")
def pages(artifacts: Path) -> dict[str, Path]:  # noqa: F811
    out = {}
    for name, args in (("phases_grid", [str(GRID / "trace.json.gz")]), ("phases_ep2", [str(EP2)])):
        dst = artifacts / f"{name}.html"
        code, _, err = run_cli(["report", *args, "-o", str(dst)])
        assert code == 0, err
        out[name] = dst
    return out


def test_page_text_has_the_phase_table(pages: dict[str, Path]) -> None:
    html = pages["phases_grid"].read_text()
    assert 'id="phases"' in html and 'class="sortable phases"' in html
    for phase in ("router", "permute", "dispatch", "experts", "combine", "unpermute"):
        assert f"</span>{phase}</td>" in html
    assert "3 layers per pass" in html


def test_per_layer_bars_render_and_the_table_sorts(pages: dict[str, Path], browser: Browser,  # noqa: F811
                                                   artifacts: Path) -> None:  # noqa: F811
    browser.load(pages["phases_grid"].resolve().as_uri())
    # one trace per phase in the per-layer chart, each with a bar for layers 1, 2 and 3
    names = browser.eval("document.getElementById('chart-phases-per-layer').data.map(t => t.name)")
    assert {"attention", "router", "experts", "unpermute"} <= set(names)
    xs = browser.eval("document.getElementById('chart-phases-per-layer').data[0].x")
    assert xs == ["layer 1", "layer 2", "layer 3"]
    bars = browser.eval("document.querySelectorAll('#chart-phases-per-layer .bars path').length")
    assert bars >= 3 * 6
    col = "Array.from(document.querySelectorAll('table.phases tbody tr')).map(r => " \
          "parseFloat(r.cells[2].dataset.v))"
    browser.eval("document.querySelectorAll('table.phases th')[2].click()")
    asc = browser.eval(col)
    assert asc == sorted(asc)
    browser.eval("document.querySelectorAll('table.phases th')[2].click()")
    desc = browser.eval(col)
    assert desc == sorted(desc, reverse=True)
    browser.eval("document.getElementById('phases').scrollIntoView()")
    browser.screenshot(artifacts / "phases_grid.png")
    assert browser.errors() == []


def test_two_ranks_show_their_breakdown(pages: dict[str, Path], browser: Browser,  # noqa: F811
                                        artifacts: Path) -> None:  # noqa: F811
    browser.load(pages["phases_ep2"].resolve().as_uri())
    xs = browser.eval("document.getElementById('chart-phases-per-rank').data[0].x")
    assert xs == ["rank 0", "rank 1"]
    text = browser.eval("document.getElementById('phases').innerText")
    assert "Slowest: rank" in text and "Per rank" in text
    browser.screenshot(artifacts / "phases_ep2.png")
    assert browser.errors() == []
