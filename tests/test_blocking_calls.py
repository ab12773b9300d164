"""Host calls that block on the GPU: recognised from the data, linked by sync edges, and split on
the critical path so that only their unblocked part is host time (constructed traces with exact
paths; the real H200 Megatron traces and an nsys export)."""

from __future__ import annotations

from pathlib import Path

import polars as pl
import pytest
from moetune.analyzer import intervals as iv
from moetune.analyzer.classify import classify
from moetune.analyzer.critical_path import critical_path
from moetune.analyzer.frames import EVENTS_SCHEMA, Trace, conform
from moetune.analyzer.graph import build_graph
from moetune.analyzer.path_summary import analyze, summary_lines
from moetune.analyzer.readers import load_trace
from moetune.analyzer.steps import find_steps

ROOT = Path(__file__).resolve().parents[1]
US = 1_000


def _trace(rows: list[dict]) -> Trace:
    return Trace(events=conform(pl.DataFrame(rows), EVENTS_SCHEMA))


def _rt(name: str, ts_us: float, end_us: float, corr: int) -> dict:
    return {"rank": 0, "kind": "runtime", "name": name, "ts_ns": int(ts_us * US),
            "dur_ns": int((end_us - ts_us) * US), "pid": 1, "tid": 1, "correlation": corr}


def _gpu(kind: str, name: str, ts_us: float, end_us: float, corr: int, stream: int = 7,
         **kw) -> dict:
    return {"rank": 0, "kind": kind, "name": name, "ts_ns": int(ts_us * US),
            "dur_ns": int((end_us - ts_us) * US), "pid": 0, "tid": stream, "stream": stream,
            "device": 0, "correlation": corr, **kw}


def _sync_edges(g) -> list[tuple[int, int, int | None]]:
    return g.edges_frame().filter(pl.col("kind") == "sync").sort("src", "dst").select(
        "src", "dst", "via").rows()


def _walls(path) -> dict[str, int]:
    out: dict[str, int] = {}
    for s in path:
        out[s.wall] = out.get(s.wall, 0) + s.dur_ns
    return out


def test_pageable_dtoh_call_is_split_across_clock_skew() -> None:
    """A pageable DtoH call returned 4 µs before its copy's recorded end (host/GPU clock skew,
    beyond the 2 µs rounding tolerance): it still waited on the copy, which waited on K. Of the
    call's 496 µs only the part after the copy is host time; the 500 µs of K are compute."""
    tr = _trace([
        _rt("cudaLaunchKernel", 0, 5, 1),  # 0
        _gpu("kernel", "K", 10, 510, 1),  # 1
        _rt("cudaMemcpyAsync", 20, 516, 2),  # 2
        _gpu("memcpy", "Memcpy DtoH (Device -> Pageable)", 510, 520, 2, copy_kind="DtoH"),  # 3
        _rt("cudaLaunchKernel", 530, 535, 3),  # 4
        _gpu("kernel", "K2", 540, 590, 3),  # 5
    ])
    g = build_graph(tr)
    assert _sync_edges(g) == [(3, 2, 2)]
    # the copy's issue edge starts at the call before (the call itself waits on it)
    launch = g.edges_frame().filter(pl.col("kind") == "launch").select("src", "dst").rows()
    assert sorted(launch) == [(0, 1), (0, 3), (4, 5)]
    path = critical_path(g, rank=0, step=0, start_ns=0, end_ns=590 * US)
    assert [(s.what, s.wall, s.start_ns // US, s.end_ns // US) for s in path] == [
        ("op", "host", 0, 5), ("launch_gap", "host", 5, 10), ("op", "compute", 10, 510),
        ("op", "memory", 510, 516), ("host_gap", "host", 516, 530), ("op", "host", 530, 535),
        ("launch_gap", "host", 535, 540), ("op", "compute", 540, 590)]
    assert _walls(path) == {"host": 34 * US, "compute": 550 * US, "memory": 6 * US}


def test_synchronous_copy_held_by_a_kernel_is_blocking() -> None:
    """cudaMemcpy HtoD from pinned memory, queued behind a 500 µs kernel, returns 2 µs after its
    copy: the call waited 491 µs for GPU work (≥ BLOCKED_MIN_NS), so the path runs through K."""
    tr = _trace([
        _rt("cudaLaunchKernel", 0, 5, 1),
        _gpu("kernel", "K", 10, 510, 1),
        _rt("cudaMemcpy", 20, 513, 2),
        _gpu("memcpy", "Memcpy HtoD (Pinned -> Device)", 510, 511, 2, copy_kind="HtoD"),
    ])
    g = build_graph(tr)
    assert _sync_edges(g) == [(3, 2, 2)]
    path = critical_path(g, rank=0, step=0, start_ns=0, end_ns=513 * US)
    assert _walls(path) == {"host": 12 * US, "compute": 500 * US, "memory": 1 * US}


def test_async_copy_on_an_idle_gpu_is_not_blocking() -> None:
    """gpu_mcore_hostbound's pattern: a 40 µs cudaMemcpyAsync DtoD whose copy runs as it is
    enqueued and ends 1.5 µs before the call returns. It waited on nothing: no sync edge, the
    call is host time."""
    tr = _trace([
        _rt("cudaMemcpyAsync", 0, 40, 1),
        _gpu("memcpy", "Memcpy DtoD (Device -> Device)", 37, 38.5, 1, copy_kind="DtoD"),
    ])
    g = build_graph(tr)
    assert _sync_edges(g) == [] and g.edge_counts()["launch"] == 1


def test_pageable_htod_returning_with_its_copy_in_flight() -> None:
    """A pageable HtoD call returns once the stream reached its copy (last chunk in flight): it
    waited on the op before the copy; the copy keeps its launch edge from the call."""
    tr = _trace([
        _rt("cudaLaunchKernel", 0, 5, 1),
        _gpu("kernel", "K", 10, 510, 1),
        _rt("cudaMemcpyAsync", 20, 515, 2),
        _gpu("memcpy", "Memcpy HtoD (Pageable -> Device)", 510, 610, 2, copy_kind="HtoD"),
    ])
    g = build_graph(tr)
    assert _sync_edges(g) == [(1, 2, 2)]
    assert (2, 3) in g.edges_frame().filter(pl.col("kind") == "launch").select("src", "dst").rows()


def test_sync_call_without_records_waits_only_on_finished_streams() -> None:
    """cudaEventSynchronize with no cuda_sync record (torch 2.11 default): every stream's last
    launched op is a candidate, but B was still running when the call returned, so only A is
    linked, and nothing is counted as time-inconsistent."""
    tr = _trace([
        _rt("cudaLaunchKernel", 0, 5, 1),  # 0
        _gpu("kernel", "A", 10, 310, 1, stream=7),  # 1
        _rt("cudaLaunchKernel", 6, 10, 2),  # 2
        _gpu("kernel", "B", 12, 1012, 2, stream=20),  # 3
        _rt("cudaEventSynchronize", 11, 315, 3),  # 4
    ])
    g = build_graph(tr)
    assert _sync_edges(g) == [(1, 4, 4)]
    assert g.unlinked["time_inconsistent"] == 0 and g.unlinked["sync_unresolved"] == 0


def test_ceiling_text_saturates() -> None:
    sec = {"critical_path": {
        "length_s": 0.18307, "median_step": [{"rank": 0, "step": 5}],
        "recoverable_s": {"compute": 1.4e-05, "communication": 0.0, "memory": 0.0,
                          "host": 0.183053},
        "gain_ceiling": {"compute": 7.6e-05, "communication": 0.0, "memory": 0.0,
                         "host": 10768.94},
        "path_s": {"compute": 1.4e-05, "communication": 0.0, "memory": 0.0, "host": 0.183053,
                   "other": 3e-06},
        "replay_fidelity": 1.0, "graph": {"unlinked": {}}}}
    line = summary_lines(sec)[1]
    assert "host >10× (183.05 ms)" in line and "compute +0 % (0.01 ms)" in line


# ---------------------------------------------------------------- real traces


def _paths(path: Path) -> tuple[Trace, list[dict]]:
    tr = load_trace([path])
    ev = classify(tr.events)
    tr = Trace(events=ev, comms=tr.comms, flows=tr.flows, ranks=tr.ranks, warnings=tr.warnings)
    steps = find_steps(ev).table
    return tr, analyze(tr, steps)


def _median(res: list[dict], rank: int = 0) -> dict:
    rs = sorted((r for r in res if r["rank"] == rank),
                key=lambda r: (r["end_ns"] - r["start_ns"], r["step"]))
    return rs[(len(rs) - 1) // 2]


def test_computebound_path_is_host_paced_and_why() -> None:
    """gpu_mcore_computebound, step 5 (60.45 ms): the GPU is busy 63 % of the step, yet the
    critical path is 79 % host, and that is right, not a missed sync:

    - its start (0–4.2 ms) is GPU work: the end-of-step cudaEventSynchronize is split (it waited
      on a pinned DtoH copy, which waited through an inferred event wait on the compute stream);
    - from there to 51.87 ms the host thread never waited on the GPU for more than a few µs
      (the only sync on the way, the dispatcher's mid-step cudaEventSynchronize, waited 32 µs),
      and the GPU drained its queue and sat idle 21 ms of those 47.7 ms, three times for over
      3 ms while the host ran inside aten::mm without issuing a CUDA call;
    - only then did the host run ahead for good: the last 8.6 ms are GPU work.

    A faster GPU cannot end the step before the host's last launch, so compute on the path is
    12.0 ms (0.20 of T), not the walls' 0.63."""
    tr, res = _paths(ROOT / "fixtures/traces/gpu_mcore_computebound/trace.json.gz")
    # steps 3-6 run 64.42, 53.18, 60.45 and 52.60 ms: the median of the four is step 4
    m = _median(res)
    assert (m["step"], round((m["end_ns"] - m["start_ns"]) / 1e6, 2)) == (4, 53.18)
    r = next(x for x in res if x["step"] == 5)
    t = r["end_ns"] - r["start_ns"]
    assert round(t / 1e6, 2) == 60.45
    w = r["walls"]
    assert w["compute"] / t == pytest.approx(0.199, abs=0.005)
    assert w["host"] / t == pytest.approx(0.788, abs=0.005)
    assert w["other"] / t < 0.005  # was 0.072: the step start is explained now
    # coarse blocks of the path: GPU, host (one 32 µs GPU op inside), GPU
    path, lo = r["path"], r["start_ns"]
    first_host = next(s for s in path if s.wall == "host")
    last_gpu_run = max(s.start_ns for s in path if s.wall == "host" and s.what != "step_tail")
    assert all(s.wall in ("compute", "memory", "other") for s in path
               if s.end_ns <= first_host.start_ns)
    assert round((first_host.start_ns - lo) / 1e6, 1) == 4.2
    end_host = max(s.end_ns for s in path if s.wall == "host" and s.what != "step_tail")
    assert round((end_host - lo) / 1e6, 2) == 51.87
    inside = [s for s in path if first_host.start_ns <= s.start_ns < end_host]
    assert sum(s.dur_ns for s in inside if s.wall != "host") < 50 * US
    assert max(s.dur_ns for s in inside if s.what == "sync_gap") < 100 * US
    assert last_gpu_run < end_host
    # the GPU was idle 21 ms of the host stretch, three gaps of > 3 ms
    ev = tr.events
    a, b = first_host.start_ns, end_host
    gpu = ev.filter(pl.col("kind").cast(pl.String).is_in(["kernel", "memcpy", "memset"]),
                    pl.col("ts_ns") + pl.col("dur_ns") > a, pl.col("ts_ns") < b).select(
        start_ns=pl.col("ts_ns").clip(a, b), end_ns=(pl.col("ts_ns") + pl.col("dur_ns")).clip(a, b))
    idle = iv.subtract(pl.DataFrame({"start_ns": [a], "end_ns": [b]}), gpu).with_columns(
        d=pl.col("end_ns") - pl.col("start_ns"))
    assert idle["d"].sum() / 1e6 == pytest.approx(21.07, abs=0.01)
    assert sorted(round(x / 1e6, 1) for x in idle.filter(pl.col("d") > 1_000_000)["d"]) == [
        3.2, 3.2, 3.7]


def test_hostbound_path_stays_host() -> None:
    _, res = _paths(ROOT / "fixtures/traces/gpu_mcore_hostbound/trace.json.gz")
    r = _median(res)
    t = r["end_ns"] - r["start_ns"]
    assert r["walls"]["host"] / t > 0.999 and r["walls"]["other"] == 0


def test_nsys_stream_syncs_link_across_clock_skew(corpus: Path) -> None:
    """nsysai_2gpu_training_before: on rank 0, 14 of 16 cudaStreamSynchronize calls (~10 ms
    each) return 4.4–6.7 µs before their awaited op's recorded end (device clock skew; rank 1's
    return 7–10 µs after). Linked, their wait belongs to the GPU work: rank 0's path goes from
    8 % compute to 62 %, like rank 1's 64 %."""
    tr, res = _paths(corpus / "public/nsys/nsysai_2gpu_training_before.sqlite")
    share = {}
    for r in res:
        share[r["rank"]] = r["walls"]["compute"] / (r["end_ns"] - r["start_ns"])
    assert share[0] == pytest.approx(0.615, abs=0.01)
    assert share[1] == pytest.approx(0.644, abs=0.01)
    g = build_graph(tr)
    assert g.unlinked["sync_unresolved"] == 0  # the 133 pending cudaEventQuery polls excluded
    assert g.edge_counts()["sync"] >= 33


def test_nsys_event_syncs_without_event_rows_resolve() -> None:
    """The H200 hostbound nsys export has no CUDA_EVENT rows: its 126 Event Sync records name
    no stream. They now wait on the device's finished streams instead of being unresolved."""
    tr = load_trace([ROOT / "fixtures/nsys/h200_mcore_hostbound_node.sqlite.gz"])
    g = build_graph(tr)
    assert g.unlinked["sync_unresolved"] == 0 and g.unlinked["time_inconsistent"] == 0
    assert g.edge_counts()["sync"] > 126
