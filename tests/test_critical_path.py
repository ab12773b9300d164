"""Critical path, blocking communication and recoverable bounds (numbers in the fixture README)."""

from __future__ import annotations

import json
from pathlib import Path

import jsonschema
import polars as pl
import pytest
from moetune.analyzer.critical_path import critical_path
from moetune.analyzer.frames import Trace
from moetune.analyzer.graph import build_graph
from moetune.analyzer.path_summary import analyze, critical_path_section, summary_lines
from moetune.analyzer.readers import load_trace

ROOT = Path(__file__).resolve().parents[1]
SYNTH = ROOT / "fixtures/traces/synthetic_critical_path/trace.json"
BASE_NS = 1_700_000_000_000_000_000
US = 1_000


@pytest.fixture(scope="module")
def synth() -> Trace:
    return load_trace([SYNTH])


def test_synthetic_exact_path(synth: Trace) -> None:
    (res,) = analyze(synth)
    assert (res["start_ns"] - BASE_NS, res["end_ns"] - BASE_NS) == (25 * US, 700 * US)
    got = [(s.what, s.wall, (s.start_ns - BASE_NS) // US, s.dur_ns // US, s.blocking)
           for s in res["path"]]
    assert got == [
        ("op", "compute", 25, 100, False),  # A
        ("event_wait_gap", "other", 125, 5, False),
        ("op", "communication", 130, 300, True),  # N, B waits on it through the event
        ("event_wait_gap", "other", 430, 5, False),
        ("op", "compute", 435, 200, False),  # B
        ("stream_gap", "other", 635, 5, False),
        ("op", "compute", 640, 60, False),  # D
    ]
    assert res["walls"] == {"compute": 360 * US, "communication": 300 * US, "memory": 0,
                            "host": 0, "other": 15 * US}
    assert res["comm"] == {"busy": 308 * US, "hidden": 103 * US, "blocking": 200 * US,
                           "exposed": 5 * US}


def test_synthetic_section(synth: Trace) -> None:
    sec = critical_path_section(synth)
    cp, bl = sec["critical_path"], sec["blocking"]
    assert cp["length_s"] == pytest.approx(675e-6)
    assert cp["path_s"] == pytest.approx({"compute": 360e-6, "communication": 300e-6,
                                          "memory": 0.0, "host": 0.0, "other": 15e-6})
    assert cp["path_other_s"] == pytest.approx({"event_wait_gap": 10e-6, "stream_gap": 5e-6})
    # the ceilings replay the step without the wall's time (fixture README: 667 µs untouched;
    # compute gone 407 µs, N still waits for its launch; communication gone 518 µs, then H and
    # B, which it hid, hold the chain; host gone 660 µs)
    assert cp["replay_fidelity"] == pytest.approx(667 / 675, abs=1e-4)
    assert cp["recoverable_s"] == pytest.approx(
        {"compute": 675e-6 * (1 - 407 / 667), "communication": 675e-6 * (1 - 518 / 667),
         "memory": 0.0, "host": 675e-6 * (1 - 660 / 667)}, abs=1e-9)
    assert cp["gain_ceiling"]["communication"] == pytest.approx(667 / 518 - 1, abs=1e-5)
    assert cp["ceiling_basis"].startswith("what-if replay")
    assert (bl["communication_blocking_s"], bl["communication_exposed_s"],
            bl["communication_hidden_s"]) == pytest.approx((200e-6, 5e-6, 103e-6))
    (edge,) = bl["edges"]
    assert edge["kind"] == "event_wait" and edge["via"] == "Stream Wait Event"
    assert edge["communication"].startswith("ncclDevKernel_AllReduce")
    assert edge["waiter"].endswith("_bwd") and edge["on_path_s"] == pytest.approx(300e-6)
    assert cp["segments"][0]["name"].startswith("ncclDevKernel_AllReduce")
    assert not any(cp["graph"]["unlinked"].values())
    lines = summary_lines(sec)
    assert lines[0] == ("critical path 0.68 ms (step 1, rank 0), GPU-paced: compute 0.36 ms, "
                        "communication 0.30 ms, other 0.02 ms")
    assert lines[1].startswith("  other 0.02 ms: the GPU waiting with no op, host call or launch")
    assert "0.01 ms after the event it waited on was recorded" in lines[1]
    assert lines[2].startswith("  gain ceilings (the step replayed without the wall's time): "
                               "compute +64 % (0.26 ms), communication +29 % (0.15 ms)")
    assert "blocking 0.20 ms" in lines[3]


def _host_step(path: Path) -> Path:
    """One step of one rank (µs): K1 [10, 710] and K2 [710, 1410] on stream 7, launched before
    the step's window; cudaStreamSynchronize [20, 1412] waits for K2; then the host launches K3
    on stream 7 [1418, 1618], an unrelated all-gather on stream 20 [1695, 1813], and only at
    2715 K4, which runs after K3 by stream order [2720, 3170]. Every launch starts its kernel
    5 µs later. The window is [10, 3170]: T = 3160 µs."""
    base = 1_700_000_000_000_000
    rows: list[dict] = [{"ph": "X", "cat": "user_annotation", "name": "ProfilerStep#1",
                         "pid": 4242, "tid": 4242, "ts": base, "dur": 3300, "args": {}}]
    gemm, ag = ("sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_fwd",
                "ncclDevKernel_AllGather_RING_LL(ncclDevKernelArgsStorage<4096ul>)")
    # correlation ids in call order, as CUPTI numbers them (the sync's is 3)
    for corr, (launch, name, stream, start, dur) in zip((1, 2, 4, 5, 6), (
            (1, gemm, 7, 10, 700), (5, gemm, 7, 710, 700), (1413, gemm, 7, 1418, 200),
            (1690, ag, 20, 1695, 118), (2715, gemm, 7, 2720, 450)), strict=True):
        rows.append({"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "pid": 4242,
                     "tid": 4242, "ts": base + launch, "dur": 4,
                     "args": {"External id": corr, "correlation": corr}})
        rows.append({"ph": "X", "cat": "kernel", "name": name, "pid": 0, "tid": stream,
                     "ts": base + start, "dur": dur,
                     "args": {"External id": corr, "device": 0, "context": 1, "stream": stream,
                              "correlation": corr}})
    rows.append({"ph": "X", "cat": "cuda_runtime", "name": "cudaStreamSynchronize", "pid": 4242,
                 "tid": 4242, "ts": base + 20, "dur": 1392,
                 "args": {"External id": 3, "correlation": 3}})
    rows.append({"ph": "X", "cat": "cuda_sync", "name": "Stream Sync", "pid": 0, "tid": 7,
                 "ts": base + 20, "dur": 1392,
                 "args": {"External id": 3, "cuda_sync_kind": "Stream Sync", "stream": 7,
                          "correlation": 3, "device": 0, "context": 1}})
    doc = {"schemaVersion": 1, "deviceProperties": [{"id": 0, "name": "NVIDIA H100 80GB HBM3",
                                                     "computeMajor": 9, "computeMinor": 0,
                                                     "numSms": 132}],
           "traceEvents": sorted(rows, key=lambda e: e["ts"])}
    path.write_text(json.dumps(doc))
    return path


def test_host_ceiling_is_what_a_host_at_zero_gains(tmp_path: Path) -> None:
    """Issue 28: host time on the path is 1,310 µs, of it 992 µs with the GPU idle; neither is
    what a faster host gains. With the host at zero K3 (200 µs) still runs before K4, the
    all-gather beside it; the GPU chain K1 → K2 → K3 → K4 takes 2,050 of 3,160 µs, so the ceiling
    is 1,110 µs. The replay says so, in the JSON and on the terminal."""
    doc, text = _diagnosis(_host_step(tmp_path / "host_step.json"))
    cp = doc["critical_path"]
    assert cp["length_s"] == pytest.approx(3160e-6)
    assert cp["path_s"]["host"] == pytest.approx(1310e-6)
    assert cp["path_s"]["compute"] == pytest.approx(1850e-6)
    assert cp["host_gpu_busy_s"] == pytest.approx(318e-6)  # 1,310 − 992: K3 and the all-gather
    assert cp["replay_fidelity"] == 1.0
    assert cp["recoverable_s"]["host"] == pytest.approx(1110e-6)
    assert cp["gain_ceiling"]["host"] == pytest.approx(3160 / 2050 - 1, abs=1e-4)
    assert cp["recoverable_s"]["communication"] == 0.0  # the all-gather holds nothing up
    assert "host +54 % (1.11 ms)" in text


def _diagnosis(path: Path) -> tuple[dict, str]:
    from tests.golden import run_cli

    code, out, err = run_cli(["diagnose", "--json", str(path)])
    assert code == 0, err
    doc = json.loads(out)
    jsonschema.validate(doc, json.loads((ROOT / "schemas" / "diagnosis.schema.json").read_text()))
    code, text, err = run_cli(["diagnose", str(path)])
    assert code == 0, err
    return doc, text


def test_shared_graph_gives_same_section(synth: Trace) -> None:
    g = build_graph(synth)
    assert critical_path_section(synth, graph=g)["blocking"] == critical_path_section(synth)[
        "blocking"]


def test_without_the_wait_the_comm_is_not_blocking(synth: Trace) -> None:
    """Drop the stream-7 wait row: B then only follows H on its stream, nothing ties it to N,
    so N is exposed/hidden but never blocking, and the path runs A → H → B → D."""
    ev = synth.events.with_row_index("_i")
    wait7 = ev.filter((pl.col("sync_kind") == "stream_wait_event") & (pl.col("stream") == 7))
    cut = Trace(events=ev.filter(pl.col("_i") != wait7["_i"][0]).drop("_i"), ranks=synth.ranks)
    (res,) = analyze(cut)
    assert res["comm"]["blocking"] == 0
    assert res["walls"]["communication"] == 0
    # B waited for its launch (60–70 µs) long before: GPU idle from H's end (240) to B (435)
    # has no known cause, so it is `other`, never host
    assert res["walls"]["host"] == 0


def test_hta_annotation_window(corpus: Path) -> None:
    """HTA's critical-path test window on hta_alexnet / hta_simple_add (annotation
    [param|pytorch.model.alex_net|0|0|0|measure|forward], instance 1). The segments tile it
    exactly; like HTA's path on simple_add (launch and nested-op edges), ours runs through
    the host almost entirely."""
    for name, host_min in (("hta_alexnet", 0.85), ("hta_simple_add", 0.99)):
        tr = load_trace([corpus / f"public/kineto/{name}.json.gz"])
        ann = tr.events.filter(
            pl.col("name") == "[param|pytorch.model.alex_net|0|0|0|measure|forward]"
        ).sort("ts_ns").row(1, named=True)
        lo, hi = ann["ts_ns"], ann["ts_ns"] + ann["dur_ns"]
        g = build_graph(tr, window=(lo, hi))
        path = critical_path(g, rank=0, step=1, start_ns=lo, end_ns=hi)
        assert sum(s.dur_ns for s in path) == hi - lo
        host = sum(s.dur_ns for s in path if s.wall == "host")
        assert host / (hi - lo) > host_min
        assert any(s.what == "op" and s.wall == "compute" for s in path)


@pytest.mark.slow
def test_alltoall_trace_partition(corpus: Path) -> None:
    """Old Kineto (no wait rows): inferred event waits let SendRecv block compute; the three
    communication parts always add up to the comm busy time of the step."""
    tr = load_trace([corpus / "public/kineto/hta_a100_alltoall_rank3of8.json.gz"])
    sec = critical_path_section(tr)
    bl, cp = sec["blocking"], sec["critical_path"]
    assert bl["communication_blocking_s"] > 0
    assert (bl["communication_blocking_s"] + bl["communication_exposed_s"]
            + bl["communication_hidden_s"]) == pytest.approx(bl["communication_busy_s"], abs=1e-9)
    assert all(e["communication"].startswith("ncclKernel_SendRecv") for e in bl["edges"])
    # steps 1009-1014, every one whole: 29 inferred waits in 1009-1013 and 6 in 1014
    assert cp["graph"]["unlinked"]["event_wait_inferred"] == 35
    for s in cp["per_step"]:
        assert sum(s["walls_s"].values()) == pytest.approx(s["length_s"], abs=1e-8)


def test_diagnose_hook_agrees_with_walls() -> None:
    """Through analyzer/diagnose.py's SECTIONS hook: the document validates, and blocking +
    exposed / hidden / busy equal the walls module's communication exposed / hidden / busy."""
    import json

    import jsonschema
    from moetune.analyzer.diagnose import diagnose
    from moetune.analyzer.path_summary import diagnosis_section

    doc = diagnose([SYNTH], sections=[("timeline_graph", diagnosis_section)])
    root = Path(__file__).resolve().parents[1]
    jsonschema.validate(doc, json.loads((root / "schemas/diagnosis.schema.json").read_text()))
    bl, wd = doc["blocking"], doc["wall_detail"]["communication"]
    assert bl["communication_blocking_s"] + bl["communication_exposed_s"] == pytest.approx(
        wd["exposed_s"], abs=1e-9)
    assert bl["communication_hidden_s"] == pytest.approx(wd["hidden_s"], abs=1e-9)
    assert bl["communication_busy_s"] == pytest.approx(wd["busy_s"], abs=1e-9)
    assert doc["critical_path"]["length_s"] == pytest.approx(doc["step_time_s"], abs=1e-9)
    assert "ranks" not in doc  # one rank


def _paced_trace(tmp: Path, *, cpu_us: int, gpu_us: int, n: int = 40) -> Path:
    """A Kineto trace of one ProfilerStep: the CPU works `cpu_us` between kernel launches, each
    kernel runs `gpu_us` on one stream (shaped like the writer's: launch rows on the Python
    thread, kernels on stream 7 with the launch's correlation)."""
    import json

    t0, ev, gpu_free = 1_700_000_000_000_000, [], 0
    t = t0 + 10
    for i in range(1, n + 1):
        ev.append({"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "pid": 4242,
                   "tid": 4242, "ts": t, "dur": 5, "args": {"External id": i, "correlation": i}})
        start = max(t + 8, gpu_free)
        ev.append({"ph": "X", "cat": "kernel", "name": "sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n",
                   "pid": 0, "tid": 7, "ts": start, "dur": gpu_us,
                   "args": {"External id": i, "device": 0, "context": 1, "stream": 7, "correlation": i}})
        gpu_free = start + gpu_us
        t += 5 + cpu_us
    end = max(gpu_free, t) + 5
    ev.insert(0, {"ph": "X", "cat": "user_annotation", "name": "ProfilerStep#1", "pid": 4242,
                  "tid": 4242, "ts": t0, "dur": end - t0, "args": {}})
    doc = {"schemaVersion": 1, "distributedInfo": {"backend": "nccl", "rank": 0, "world_size": 1},
           "deviceProperties": [{"id": 0, "name": "NVIDIA H100 80GB HBM3", "computeMajor": 9,
                                 "computeMinor": 0, "numSms": 132}], "traceEvents": ev}
    path = tmp / f"paced_{cpu_us}_{gpu_us}.json"
    path.write_text(json.dumps(doc))
    return path


def test_host_paced_path_beside_a_busy_gpu_recovers_only_the_gpu_idle(tmp_path: Path) -> None:
    """The CPU launches a 1000 µs kernel every 1010 µs: the CPU's chain is the path, but the GPU
    is busy 99 % of the step, so the step is GPU-paced (moetune/vocabulary.py `paced_by`: the
    host paces only where the GPU sat idle for it) and a faster host can save only the GPU's idle
    10 µs per kernel (+1 %), never ">10×"."""
    sec = critical_path_section(load_trace([_paced_trace(tmp_path, cpu_us=1005, gpu_us=1000)]))
    cp = sec["critical_path"]
    t = cp["length_s"]
    assert cp["paced_by"] == "device"
    assert cp["path_s"]["host"] > 0.9 * t
    assert cp["host_gpu_busy_s"] == pytest.approx(0.039)  # 39 kernels ran beside the host
    # at zero host time the 40 kernels run back to back: 40.00 of 40.39 ms remain
    assert cp["recoverable_s"]["host"] == pytest.approx(t - 0.040)
    assert cp["gain_ceiling"]["host"] < 0.02
    # and without compute, only the last kernel after the host's last launch goes
    assert cp["recoverable_s"]["compute"] == pytest.approx(0.001)
    lines = summary_lines({**sec, "dominant_wall": "compute"})
    assert "GPU-paced" in lines[0] and "(39.00 ms of it beside running GPU work)" in lines[0]
    assert "host +1 % (0.39 ms)" in lines[1]
    assert len(lines) == 2  # GPU-paced beside a compute wall: nothing to reconcile
    # the same path beside a host wall (as a host-bound step's walls read) says what each means
    lines = summary_lines({**sec, "dominant_wall": "host"})
    assert lines[2].startswith("  GPU-paced: the GPU's own work and dependencies set")
    assert "the rules read them" in lines[3] and "what-if estimates replay its graph" in lines[3]


def test_gpu_paced_path_when_the_cpu_runs_ahead(tmp_path: Path) -> None:
    """The CPU queues every kernel long before it runs: the GPU chain sets the step (device-
    paced), compute is the path, and no views note is printed beside a compute wall."""
    sec = critical_path_section(load_trace([_paced_trace(tmp_path, cpu_us=20, gpu_us=1000)]))
    cp = sec["critical_path"]
    assert cp["paced_by"] == "device"
    assert cp["path_s"]["compute"] > 0.95 * cp["length_s"]
    # without compute the host's 40 launches, 25 µs apart, are what remains of the step
    assert cp["recoverable_s"]["compute"] == pytest.approx(cp["length_s"] - 0.000972, abs=2e-6)
    assert len(summary_lines({**sec, "dominant_wall": "compute"})) == 2  # path, ceilings


def test_corpus_healthy_nsys_is_not_host_ceiling_bound(corpus: Path) -> None:
    """nsysai_synthetic_healthy: 400 × 1 ms kernels, 99 % compute; each launch follows the last
    kernel's end by 7 µs, so the path runs through the host, beside the busy GPU."""
    path = corpus / "public/nsys/nsysai_synthetic_healthy.sqlite"
    if not path.exists():
        pytest.skip("corpus file absent")
    cp = critical_path_section(load_trace([path]))["critical_path"]
    assert cp["paced_by"] == "device"  # the path runs through the host, beside a busy GPU
    assert cp["host_gpu_busy_s"] == pytest.approx(0.399, abs=2e-3)
    assert cp["gain_ceiling"]["host"] < 0.02  # was +10,000 %: T/(T − path host) − 1


def test_every_part_of_the_path_is_printed_with_what_other_was() -> None:
    """A real H200 step (grid_mem_mbs2_grp_rcnone_a2a_eager): the line names every part of the
    path, `other` too, and they sum to its length; the next line says what `other` was on this
    trace, from the JSON's path_other_s; the host wall's `other` idle says what it is."""
    path = ROOT / "fixtures/traces/grid_mem_mbs2_grp_rcnone_a2a_eager/trace.json.gz"
    doc, text = _diagnosis(path)
    cp = doc["critical_path"]
    parts = cp["path_s"]
    assert sum(parts.values()) == pytest.approx(cp["length_s"], abs=1e-5)
    assert parts["other"] > 0.009 and cp["path_other_s"] == {"stream_gap": parts["other"]}
    head = next(ln for ln in text.splitlines() if ln.startswith("critical path"))
    for w, v in parts.items():
        if v:
            assert f"{w} {v * 1e3:.2f} ms" in head
    assert (f"  other {parts['other'] * 1e3:.2f} ms: the GPU waiting with no op, host call or "
            f"launch to account for it — {parts['other'] * 1e3:.2f} ms after the previous op on "
            "its stream ended (scheduling gap)") in text
    assert "other 4.7 ms (its next op already launched, no host call blocking" in text
