"""Critical path, blocking communication and recoverable bounds (numbers in the fixture README)."""

from __future__ import annotations

from pathlib import Path

import polars as pl
import pytest
from moetune.analyzer.critical_path import critical_path
from moetune.analyzer.frames import Trace
from moetune.analyzer.graph import build_graph
from moetune.analyzer.path_summary import analyze, critical_path_section, summary_lines
from moetune.analyzer.readers import load_trace

SYNTH = Path(__file__).resolve().parents[1] / "fixtures/traces/synthetic_critical_path/trace.json"
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
    assert cp["recoverable_s"] == pytest.approx(
        {"compute": 360e-6, "communication": 300e-6, "memory": 0.0, "host": 0.0})
    assert cp["gain_ceiling"]["communication"] == pytest.approx(0.8)  # 675/375 − 1
    assert cp["gain_ceiling"]["compute"] == pytest.approx(675 / 315 - 1, abs=1e-6)
    assert cp["gain_ceiling"]["host"] == 0.0
    assert (bl["communication_blocking_s"], bl["communication_exposed_s"],
            bl["communication_hidden_s"]) == pytest.approx((200e-6, 5e-6, 103e-6))
    (edge,) = bl["edges"]
    assert edge["kind"] == "event_wait" and edge["via"] == "Stream Wait Event"
    assert edge["communication"].startswith("ncclDevKernel_AllReduce")
    assert edge["waiter"].endswith("_bwd") and edge["on_path_s"] == pytest.approx(300e-6)
    assert cp["segments"][0]["name"].startswith("ncclDevKernel_AllReduce")
    assert not any(cp["graph"]["unlinked"].values())
    lines = summary_lines(sec)
    assert lines[0].startswith("critical path 0.68 ms") and "communication 0.30 ms" in lines[0]
    assert "blocking 0.20 ms" in lines[1]


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
    """The CPU launches a 1000 µs kernel every 1010 µs: the CPU's chain sets the step length (the
    path is host-paced), but the GPU is busy 99 % of the step, so a faster host can save only
    the GPU's idle 10 µs per kernel (+1 %), never ">10×"."""
    sec = critical_path_section(load_trace([_paced_trace(tmp_path, cpu_us=1005, gpu_us=1000)]))
    cp = sec["critical_path"]
    t = cp["length_s"]
    assert cp["paced_by"] == "host"
    assert cp["path_s"]["host"] > 0.9 * t
    assert cp["host_gpu_busy_s"] == pytest.approx(cp["path_s"]["host"] - cp["recoverable_s"]["host"])
    assert cp["recoverable_s"]["host"] < 0.02 * t
    assert cp["gain_ceiling"]["host"] < 0.02
    lines = summary_lines({**sec, "dominant_wall": "compute"})
    assert "host-paced" in lines[0] and "with the GPU idle (ceiling +1 %)" in lines[0]
    assert lines[1].startswith("  host-paced: the CPU issues work slower than the GPU runs it")
    assert "the rules read them" in lines[2] and "what-if estimates replay its graph" in lines[2]


def test_gpu_paced_path_when_the_cpu_runs_ahead(tmp_path: Path) -> None:
    """The CPU queues every kernel long before it runs: the GPU chain sets the step (device-
    paced), compute is the path, and no views note is printed beside a compute wall."""
    sec = critical_path_section(load_trace([_paced_trace(tmp_path, cpu_us=20, gpu_us=1000)]))
    cp = sec["critical_path"]
    assert cp["paced_by"] == "device"
    assert cp["path_s"]["compute"] == pytest.approx(cp["recoverable_s"]["compute"])
    assert cp["path_s"]["compute"] > 0.95 * cp["length_s"]
    assert len(summary_lines({**sec, "dominant_wall": "compute"})) == 1


def test_corpus_healthy_nsys_is_not_host_ceiling_bound(corpus: Path) -> None:
    """nsysai_synthetic_healthy: 400 × 1 ms kernels, 99 % compute; each launch follows the last
    kernel's end by 7 µs, so the path runs through the host, beside the busy GPU."""
    path = corpus / "public/nsys/nsysai_synthetic_healthy.sqlite"
    if not path.exists():
        pytest.skip("corpus file absent")
    cp = critical_path_section(load_trace([path]))["critical_path"]
    assert cp["paced_by"] == "host"
    assert cp["host_gpu_busy_s"] == pytest.approx(0.399, abs=2e-3)
    assert cp["gain_ceiling"]["host"] < 0.02  # was +10,000 %: T/(T − path host) − 1
