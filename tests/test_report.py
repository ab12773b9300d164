"""`moetune report`: one self-contained HTML page, checked as text and as a person sees it.

The reports are built once per module from real inputs (fixtures, a real tune ledger, the public
corpus when present, a planted-token copy of a real trace). The browser tests load each page in
headless Chromium over the DevTools protocol (a pipe: `--remote-debugging-pipe`, no extra package),
fail on any console error or uncaught exception, check that every chart and the timeline's lanes
rendered in the DOM, and keep a full-page screenshot under `$MOETUNE_ARTIFACTS/report/` (else the
test's temporary directory). They skip when no Chromium is installed; `.ci/run` installs it.
"""

from __future__ import annotations

import base64
import contextlib
import json
import os
import queue
import re
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import polars as pl
import pytest

from tests.golden import run_cli
from tests.test_redact import assert_clean, planted_trace

pytest.importorskip("plotly", reason="the report extra (plotly) is not installed")

from moetune import report

ROOT = Path(__file__).resolve().parents[1]
TRACES = ROOT / "fixtures" / "traces"
HOSTBOUND = TRACES / "gpu_mcore_hostbound"
EP2 = TRACES / "gpu_ep2_alltoall_overlap"
GRID = TRACES / "grid_host_mbs1_seq_rcfull_a2a_eager" / "trace.json.gz"
LEDGER = ROOT / "fixtures" / "ledgers" / "h200_tune_session_b.sqlite"  # a real tune's ledger
MAX_BYTES = 10 * 2**20


# --------------------------------------------------------------------------- the reports


@pytest.fixture(scope="module")
def artifacts(tmp_path_factory: pytest.TempPathFactory) -> Path:
    base = os.environ.get("MOETUNE_ARTIFACTS")
    out = Path(base) / "report" if base else tmp_path_factory.mktemp("report")
    out.mkdir(parents=True, exist_ok=True)
    return out


def _build(out: Path, name: str, args: list[str]) -> Path:
    dst = out / f"{name}.html"
    code, _, err = run_cli(["report", *args, "-o", str(dst)])
    assert code == 0, err
    assert "wrote" in err
    return dst


@pytest.fixture(scope="module")
def reports(artifacts: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """name -> HTML file, for every input the page must handle."""
    planted = planted_trace(tmp_path_factory.mktemp("planted") / "trace.json.gz")
    out = {
        "hostbound": _build(artifacts, "hostbound", [
            str(HOSTBOUND / "trace.json.gz"), "--contract",
            str(HOSTBOUND / "golden" / "contract.yaml")]),
        "ep2": _build(artifacts, "ep2", [str(EP2)]),
        "grid_ledger": _build(artifacts, "grid_ledger", [str(GRID), "--ledger", str(LEDGER)]),
        "missing_ledger": _build(artifacts, "missing_ledger", [
            str(GRID), "--ledger", str(artifacts / "no_such_ledger.sqlite")]),
        "baseline": _build(artifacts, "baseline", [
            str(TRACES / "grid_host_mbs8_grp_rcnone_a2a_eager" / "trace.json.gz"),
            "--baseline", str(GRID)]),
        "planted": _build(artifacts, "planted", [str(planted)]),
    }
    cpu_only = ROOT.parent / "shared" / "corpus" / "public" / "kineto" / "hta_cpu_only.json.gz"
    if cpu_only.exists():
        out["no_steps"] = _build(artifacts, "no_steps", [
            str(cpu_only), "--contract", str(HOSTBOUND / "golden" / "contract.yaml")])
    return out


def _text(reports: dict[str, Path], name: str) -> str:
    return reports[name].read_text(encoding="utf-8")


def _charts(page: str) -> list[str]:
    return re.findall(r'data-chart="([\w-]+)"', page)


def test_hostbound_page_has_every_section(reports: dict[str, Path]) -> None:
    page = _text(reports, "hostbound")
    assert reports["hostbound"].stat().st_size < MAX_BYTES
    assert page.count("Plotly.newPlot") == len(_charts(page)) >= 5
    # plotly.js inlined once: opens offline, no CDN
    assert page.count("<script>") == 1 + len(_charts(page))
    own = page.replace(report.plotly_modules()[1].get_plotlyjs(), "")
    assert "<script src" not in page and "<link" not in page and "http" not in own
    for sid in ("run", "walls", "timeline", "kernels", "ranks", "memory", "audit", "advice"):
        assert f'<section id="{sid}">' in page
    assert {"walls-per-step", "walls-exposed-hidden", "timeline", "kernel-classes",
            "cpu-ops"} <= set(_charts(page))
    # the audit table with its verdicts, the advice with its exact flags and basis
    assert 'class="v-contradicted">contradicted' in page
    assert "--cuda-graph-impl local" in page and "what-if replay" in page
    # one rank, no allocator events: said, not left blank
    assert "One rank analysed: no cross-rank view" in page
    assert "No allocator events" in page
    assert "No tune history" not in page  # no --ledger given: no ledger section at all


def test_two_ranks_cross_rank_and_memory(reports: dict[str, Path]) -> None:
    page = _text(reports, "ep2")
    assert {"rank-step-times", "arrival-skew", "memory", "copies"} <= set(_charts(page))
    assert "rank 1" in page and "Collective arrival skew over 62 instances" in page
    # two ranks: no straggler verdict, and the page says why (as the terminal and JSON do)
    assert ("Stragglers (robust z &gt; 3.5 (MAD floor 1% of median)): unobservable (2 ranks with "
            "a step time: it takes 3 to tell an outlier from its peers).") in page
    assert "Downsampled:" in page  # the step's CPU thread has more than LANE_MAX_BOXES calls
    # the critical path's parts, what `other` was and the gain ceilings: the terminal's lines
    import html

    from moetune.analyzer.path_summary import path_lines

    doc = json.loads(run_cli(["diagnose", "--json", str(EP2)])[1])
    lines = path_lines(doc["critical_path"])
    assert len(lines) == 3 and lines[2].startswith("  gain ceilings")
    for line in lines:
        assert f"<p>{html.escape(line.strip())}</p>" in page
    assert (f"other {doc['host']['other_s'] * 1e3:,.2f} ms (its next op already launched, no host "
            "call blocking: launch latency or a wait the trace does not record)") in page


def test_ledger_tune_history(reports: dict[str, Path]) -> None:
    page = _text(reports, "grid_ledger")
    assert "ledger" in _charts(page)
    # the real ledger's two decisions, predicted vs measured with the noise band
    for text in ("micro_batch_size=2", "micro_batch_size=4", "+50.1 %", "+72.6 %", "±25.7 %",
                 "+47.8 %", "+79.6 %", 'class="v-accepted">accepted', "18 run(s)"):
        assert text in page


def test_missing_ledger_still_renders(reports: dict[str, Path]) -> None:
    page = _text(reports, "missing_ledger")
    assert "No tune history: no_such_ledger.sqlite: no such ledger file" in page
    assert "timeline" in _charts(page)


def test_baseline_side_by_side(reports: dict[str, Path]) -> None:
    page = _text(reports, "baseline")
    assert "baseline" in _charts(page)
    # the diff document (moetune.compare) of baseline mbs1/sequential/recompute → mbs8/grouped
    assert '<section id="baseline">' in page
    assert "grouped GEMM: no → yes" in page and "Dominant wall host → compute" in page
    assert "compute.gemm.grouped_cutlass</td><td>appeared" in page
    # one analysed step a side: no noise, so no verdict on the change (as diff's terminal says)
    assert ("not decidable: A has 1 analysed step and B has 1 analysed step: step-to-step noise "
            "is unknown, so a change cannot be told from step-to-step variation") in page
    assert "beyond both runs&#x27; noise" not in page and "± noise unknown" in page


def test_no_steps_page_says_what_is_missing(reports: dict[str, Path]) -> None:
    if "no_steps" not in reports:
        pytest.skip("public corpus (hta_cpu_only.json.gz) not present")
    page = _text(reports, "no_steps")
    assert "No diagnosis: hta_cpu_only.json.gz: has no GPU events" in page
    assert '<p class="verdict">No verdict: hta_cpu_only.json.gz: has no GPU events' in page
    assert "The evidence follows" not in page
    assert "No recommendations" in page
    assert "Not audited: the claims are checked against the analysed steps" in page
    assert _charts(page) == []


def test_planted_tokens_never_reach_the_page(reports: dict[str, Path]) -> None:
    page = _text(reports, "planted")
    assert_clean(page)
    assert "NVIDIA H200" in page  # the whitelisted metadata is still shown


def test_credential_in_an_op_name_is_redacted(tmp_path: Path) -> None:
    """A credential in a CPU op's name (a harness that labels ranges with its command line)."""
    import gzip

    token = "hf_PlantedOpNameToken0123456789xyz"
    src = HOSTBOUND / "trace.json.gz"
    with gzip.open(src, "rt") as f:
        doc = json.load(f)
    for e in doc["traceEvents"]:
        if e.get("cat") == "cpu_op" and e["name"] == "aten::mm":  # among the top CPU ops
            e["name"] = f"launch --hf-token={token}"
    dst = tmp_path / "trace.json.gz"
    with gzip.open(dst, "wt") as f:
        json.dump(doc, f)
    data = report.collect([dst])
    assert data.cpu_ops is not None
    assert any(n.startswith("launch --hf-token=") for n in data.cpu_ops["name"].to_list())
    page = report.render(data)
    assert token not in page and "launch --hf-token=[redacted]" in page  # the name kept


def test_without_plotly_one_line_exit_2(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setitem(sys.modules, "plotly.graph_objects", None)
    code, out, err = run_cli(["report", str(HOSTBOUND / "trace.json.gz"), "-o",
                              str(tmp_path / "r.html")])
    assert code == 2 and out == ""
    assert err.strip() == "moetune: the report needs plotly: pip install 'moetune[report]'"
    assert not (tmp_path / "r.html").exists()


def test_unreadable_trace_is_one_line(tmp_path: Path) -> None:
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    code, _, err = run_cli(["report", str(bad), "-o", str(tmp_path / "r.html")])
    assert code == 2 and len(err.strip().splitlines()) == 1 and "bad.json" in err


def test_downsample_bounds_a_lane() -> None:
    n = report.LANE_MAX_BOXES * 5
    boxes = pl.DataFrame({
        "lane": ["GPU 0 · stream 7"] * n + ["GPU 0 · stream 9"] * 3,
        "start": [i * 100 for i in range(n)] + [0, 500, 900],
        "end": [i * 100 + 60 for i in range(n)] + [100, 600, 1000],
        "wall": ["compute" if i % 3 else "communication" for i in range(n)] + ["memory"] * 3,
        "label": [f"k{i}" for i in range(n)] + ["a", "b", "c"],
    })
    out, merged = report.downsample(boxes, n * 100)
    big = out.filter(pl.col("lane") == "GPU 0 · stream 7")
    assert merged == {"GPU 0 · stream 7": n}
    assert big.height <= report.LANE_BINS and int(big["n"].sum()) == n
    assert set(big["wall"]) == {"compute"}  # each bin: its busiest wall
    assert out.filter(pl.col("lane") == "GPU 0 · stream 9").height == 3  # small lanes untouched


def test_merge_runs_keeps_the_path_length() -> None:
    path = pl.DataFrame({"start": [0, 10, 20, 30], "end": [10, 20, 30, 45],
                         "wall": ["host", "host", "compute", "host"],
                         "label": ["a", "b", "c", "d"]})
    m = report.merge_runs(path)
    assert m["wall"].to_list() == ["host", "compute", "host"]
    assert int((m["end"] - m["start"]).sum()) == 45


# --------------------------------------------------------------------------- the browser


def find_chromium() -> str | None:
    for name in ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable"):
        if p := shutil.which(name):
            return p
    return None


def _high_fd(fd: int) -> int:
    import fcntl

    hi = fcntl.fcntl(fd, fcntl.F_DUPFD, 10)
    os.close(fd)
    return hi


class Browser:
    """Headless Chromium over the DevTools protocol on a pipe (`--remote-debugging-pipe`: JSON
    messages, NUL-terminated, Chromium reading fd 3 and writing fd 4)."""

    def __init__(self, exe: str, *, width: int = 1400, height: int = 900) -> None:
        self.profile = tempfile.mkdtemp(prefix="moetune-chromium-")
        to_r, self._to_w = os.pipe()
        self._from_r, from_w = os.pipe()
        # above 3 and 4, so that placing one there cannot overwrite the other
        to_r, from_w = (_high_fd(to_r), _high_fd(from_w))
        args = [exe, "--headless=new", "--remote-debugging-pipe", "--no-sandbox",
                "--disable-gpu", "--no-first-run", "--no-default-browser-check",
                "--disable-extensions", f"--user-data-dir={self.profile}",
                f"--window-size={width},{height}"]

        def on_3_and_4() -> None:  # in the child, before exec: where Chromium looks for them
            os.dup2(to_r, 3)
            os.dup2(from_w, 4)

        self.proc = subprocess.Popen(args, pass_fds=(3, 4), preexec_fn=on_3_and_4,
                                     stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                     stderr=subprocess.DEVNULL)
        os.close(to_r)
        os.close(from_w)
        self.width, self.height = width, height
        self._id = 0
        self._replies: dict[int, queue.Queue] = {}
        self.events: list[dict[str, Any]] = []
        self._lock = threading.Lock()
        self.session: str | None = None
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        buf = b""
        while True:
            try:
                chunk = os.read(self._from_r, 1 << 16)
            except OSError:  # closed by close()
                return
            if not chunk:
                return
            buf += chunk
            while b"\0" in buf:
                raw, buf = buf.split(b"\0", 1)
                msg = json.loads(raw)
                with self._lock:
                    if "id" in msg and msg["id"] in self._replies:
                        self._replies[msg["id"]].put(msg)
                    elif "method" in msg:
                        self.events.append(msg)

    def send(self, method: str, params: dict | None = None, *, browser: bool = False,
             timeout: float = 60.0) -> dict[str, Any]:
        with self._lock:
            self._id += 1
            mid, q = self._id, queue.Queue()
            self._replies[mid] = q
        msg: dict[str, Any] = {"id": mid, "method": method, "params": params or {}}
        if self.session and not browser:
            msg["sessionId"] = self.session
        os.write(self._to_w, json.dumps(msg).encode() + b"\0")
        reply = q.get(timeout=timeout)
        if "error" in reply:
            raise RuntimeError(f"{method}: {reply['error']}")
        return reply.get("result", {})

    def open(self) -> None:
        tid = self.send("Target.createTarget", {"url": "about:blank"}, browser=True)["targetId"]
        self.session = self.send("Target.attachToTarget", {"targetId": tid, "flatten": True},
                                 browser=True)["sessionId"]
        for m in ("Page.enable", "Runtime.enable", "Log.enable"):
            self.send(m)
        self.send("Emulation.setDeviceMetricsOverride", {"width": self.width, "height": self.height,
                                                         "deviceScaleFactor": 1, "mobile": False})

    def load(self, url: str, timeout: float = 60.0) -> None:
        with self._lock:
            self.events.clear()
        self.send("Page.navigate", {"url": url})
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            with self._lock:
                if any(e["method"] == "Page.loadEventFired" for e in self.events):
                    return
            time.sleep(0.05)
        raise TimeoutError(f"{url} did not load in {timeout} s")

    def eval(self, expr: str) -> Any:
        r = self.send("Runtime.evaluate", {"expression": expr, "returnByValue": True,
                                           "awaitPromise": True})
        if "exceptionDetails" in r:
            raise RuntimeError(str(r["exceptionDetails"]))
        return r["result"].get("value")

    def errors(self) -> list[str]:
        """Uncaught exceptions, console.error/assert calls and error log entries so far."""
        out = []
        with self._lock:
            evs = list(self.events)
        for e in evs:
            m, p = e["method"], e.get("params", {})
            if m == "Runtime.exceptionThrown":
                d = p.get("exceptionDetails", {})
                out.append(f"exception: {d.get('exception', {}).get('description') or d.get('text')}")
            elif m == "Runtime.consoleAPICalled" and p.get("type") in ("error", "assert"):
                out.append("console: " + " ".join(str(a.get("value", a.get("description")))
                                                  for a in p.get("args", [])))
            elif m == "Log.entryAdded" and p.get("entry", {}).get("level") == "error":
                out.append(f"log: {p['entry'].get('text')}")
        return out

    def screenshot(self, dst: Path) -> Path:
        """The whole page (up to 16000 px tall) as PNG."""
        m = self.send("Page.getLayoutMetrics")
        h = int((m.get("cssContentSize") or m["contentSize"])["height"])
        r = self.send("Page.captureScreenshot", {
            "format": "png", "captureBeyondViewport": True,
            "clip": {"x": 0, "y": 0, "width": self.width, "height": min(h, 16000), "scale": 1}})
        dst.write_bytes(base64.b64decode(r["data"]))
        return dst

    def close(self) -> None:
        with contextlib.suppress(RuntimeError, queue.Empty, OSError):
            self.send("Browser.close", browser=True, timeout=10)
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        os.close(self._to_w)
        os.close(self._from_r)
        shutil.rmtree(self.profile, ignore_errors=True)


@pytest.fixture(scope="module")
def browser() -> Iterator[Browser]:
    exe = find_chromium()
    if exe is None:
        pytest.skip("no Chromium installed (apt-get install chromium; .ci/run installs it)")
    b = Browser(exe)
    try:
        b.open()
        yield b
    finally:
        b.close()


# What each page must show once rendered: charts (by data-chart id) and timeline lanes.
EXPECTED: dict[str, dict[str, Any]] = {
    "hostbound": {"charts": {"walls-per-step", "timeline", "kernel-classes", "cpu-ops"},
                  "lanes": ["critical path", "GPU 0 · stream 7"]},
    "ep2": {"charts": {"timeline", "rank-step-times", "arrival-skew", "memory"},
            "lanes": ["critical path", "GPU 0 · stream 7"]},
    "grid_ledger": {"charts": {"timeline", "ledger"}, "lanes": ["critical path"]},
    "missing_ledger": {"charts": {"timeline"}, "lanes": ["critical path"]},
    "baseline": {"charts": {"timeline", "baseline"}, "lanes": ["critical path"]},
    "planted": {"charts": {"timeline"}, "lanes": ["critical path"]},
    "no_steps": {"charts": set(), "lanes": []},
}


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_page_renders_in_chromium(name: str, reports: dict[str, Path], browser: Browser,
                                  artifacts: Path) -> None:
    if name not in reports:
        pytest.skip(f"{name}: its input is not present")
    want = EXPECTED[name]
    t0 = time.monotonic()
    browser.load(reports[name].resolve().as_uri())
    # every chart div became a plotly graph with its SVG drawn
    rendered = browser.eval(
        "Array.from(document.querySelectorAll('[data-chart]')).filter(d => "
        "d.querySelector('.js-plotly-plot svg.main-svg')).map(d => d.dataset.chart)")
    declared = browser.eval(
        "Array.from(document.querySelectorAll('[data-chart]')).map(d => d.dataset.chart)")
    lanes = browser.eval("Array.from(document.querySelectorAll("
                         "'#chart-timeline .yaxislayer-above .ytick text')).map(e => e.textContent)")
    bars = browser.eval("document.querySelectorAll('#chart-timeline .bars path').length")
    hover = []
    if want["lanes"]:  # what a person hovering a box reads: its name, start and length
        browser.eval("Plotly.Fx.hover('chart-timeline', [{curveNumber: 0, pointNumber: 0}])")
        hover = browser.eval("Array.from(document.querySelectorAll("
                             "'#chart-timeline .hoverlayer text')).map(e => e.textContent)")
    browser.screenshot(artifacts / f"{name}.png")
    assert browser.errors() == []
    assert time.monotonic() - t0 < 30, "the page took more than 30 s to open"
    assert sorted(rendered) == sorted(declared)
    assert want["charts"] <= set(rendered)
    for lane in want["lanes"]:
        assert lane in lanes
    if want["lanes"]:
        assert bars > 0
        assert any(re.search(r"at [\d.]+ ms, lasting [\d.,]+ µs", h) for h in hover), hover


def test_audit_that_checked_nothing_says_undecided(tmp_path: Path) -> None:
    """A real nsys export in graph-level trace mode hides the kernels the claims are about: both
    verdicts unobservable, and the page says the audit is undecided (as `moetune audit` does,
    exit 3) rather than showing a bare 0 contradicted."""
    contract = tmp_path / "claims.yaml"
    contract.write_text("megatron_args:\n  moe_grouped_gemm: true\n  fp8: e4m3\n")
    trace = ROOT / "fixtures" / "nsys" / "h200_graphs_replay_graph.sqlite.gz"
    page = _build(tmp_path, "undecided", [str(trace), "--contract", str(contract)]).read_text()
    assert "0 confirmed, 0 contradicted, 2 unobservable" in page
    assert "Undecided: no claim could be checked against this trace" in page
    assert run_cli(["audit", "--contract", str(contract), str(trace)])[0] == 3
