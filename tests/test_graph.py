"""Timeline graph: typed edges on a constructed trace, HTA's critical-path traces, adversarial input."""

from __future__ import annotations

import itertools
from pathlib import Path

import networkx as nx
import polars as pl
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from moetune.analyzer.critical_path import critical_path
from moetune.analyzer.frames import EVENTS_SCHEMA, Trace, conform
from moetune.analyzer.graph import build_graph, release_constraint, tolerance_ns
from moetune.analyzer.readers import load_trace

SYNTH = Path(__file__).resolve().parents[1] / "fixtures/traces/synthetic_critical_path/trace.json"


def _names(trace: Trace) -> dict[int, str]:
    return dict(enumerate(trace.events.get_column("name").to_list()))


def _edges(graph, trace: Trace, kind: str) -> list[tuple[str, str, str | None]]:
    n = _names(trace)
    e = graph.edges_frame().filter(pl.col("kind") == kind).sort("src", "dst")
    return [(n[a][:24], n[b][:24], n.get(v)) for a, b, _, v in e.iter_rows()]


@pytest.fixture(scope="module")
def synth() -> Trace:
    return load_trace([SYNTH])


def test_synthetic_typed_edges(synth: Trace) -> None:
    g = build_graph(synth)
    assert g.edge_counts() == {"launch": 6, "stream": 3, "host": 10, "sync": 1,
                               "event_wait": 2, "collective": 0}
    assert _edges(g, synth, "event_wait") == [
        ("sm90_xmma_gemm_bf16bf16_", "ncclDevKernel_AllReduce_", "Stream Wait Event"),
        ("ncclDevKernel_AllReduce_", "sm90_xmma_gemm_bf16bf16_", "Stream Wait Event"),
    ]
    assert _edges(g, synth, "sync") == [
        ("void at::native::vectori", "cudaStreamSynchronize", "Stream Sync")]
    assert not any(g.unlinked.values()), g.unlinked
    assert nx.is_directed_acyclic_graph(g.g)
    # attributes live in the node frame, keyed by event row index
    row = g.nodes.filter(pl.col("name").str.starts_with("ncclDevKernel_AllReduce")).row(0, named=True)
    assert (row["stream"], row["wall"], row["end_ns"] - row["ts_ns"]) == (20, "communication", 300_000)
    assert synth.events.row(row["node"], named=True)["name"] == row["name"]


def test_window_keeps_launches_of_ops_inside(synth: Trace) -> None:
    t0 = synth.events.filter(pl.col("kind") == "kernel").get_column("ts_ns").min()
    g = build_graph(synth, window=(t0, t0 + 675_000))  # A starts at t0; launch calls ran before
    assert g.unlinked["gpu_without_launch"] == 0
    assert g.edge_counts()["launch"] == 6


def test_hta_cuda_event_sync_edges(corpus: Path) -> None:
    """HTA asserts SYNC_DEPENDENCY edges exist with weight 0 here; ours: one edge per sync record
    plus the pageable DtoH copy, each ending on the call that returned when the op ended."""
    tr = load_trace([corpus / "public/kineto/hta_cuda_event_sync.json.gz"])
    g = build_graph(tr)
    assert sorted(_edges(g, tr, "sync")) == sorted([
        ("Memcpy DtoH (Device -> P", "cudaStreamSynchronize", "Stream Sync"),
        ("Memcpy DtoH (Device -> P", "cudaMemcpyAsync", "cudaMemcpyAsync"),
        ("at::cuda::(anonymous nam", "cudaEventSynchronize", "Event Sync"),
        ("at::cuda::(anonymous nam", "cudaEventQuery", "Event Sync"),
        ("at::cuda::(anonymous nam", "cudaDeviceSynchronize", "Context Sync"),
    ])
    rc = release_constraint(g.edges_frame().filter(pl.col("kind") == "sync"), g.nodes)
    # call end − waited op end, µs, from the file: memcpy 512272 → cudaMemcpyAsync 512281 (9)
    # and cudaStreamSynchronize 512288 (16); spin_kernel 512408 → cudaEventSynchronize 512416
    # (8), cudaEventQuery 512422 (14), cudaDeviceSynchronize 512482 (74)
    lag = sorted((rc["constraint_ns"] - rc["release_ns"]).to_list())
    assert lag == [8_000, 9_000, 14_000, 16_000, 74_000]
    assert g.edge_counts()["launch"] == 5 and g.edge_counts()["stream"] == 4


@pytest.mark.parametrize("name", ["hta_alexnet", "hta_simple_add"])
def test_hta_alexnet_graphs(corpus: Path, name: str) -> None:
    tr = load_trace([corpus / f"public/kineto/{name}.json.gz"])
    g = build_graph(tr)
    c = g.edge_counts()
    # 79 kernels + 16 memcpy + 3 memset, each with its launch; two streams (7, 20)
    assert (c["launch"], c["stream"]) == (98, 96)
    assert c["sync"] >= 16  # 16 Stream Sync records + Context Sync (HTA: SYNC_DEPENDENCY ≥ 1)
    # 20 Stream Wait Event records: 6 link ops of streams 7 and 20; 14 wait on cuDNN's streams
    # 21–25, which ran no op in the trace (nothing to wait for)
    assert c["event_wait"] == 6 and g.unlinked["event_wait_no_recorded_op"] == 14
    assert g.unlinked["time_inconsistent"] == 0 and g.unlinked["cycle_edges_dropped"] == 0


def test_event_wait_fallback_matches_record_correlation(corpus: Path) -> None:
    """hta_simple_add lacks wait_on_cuda_event_record_corr_id; bounding the record by the wait
    call finds the same 6 edges hta_alexnet (same workload, with the record ids) has."""
    pairs = {}
    for name in ("hta_alexnet", "hta_simple_add"):
        tr = load_trace([corpus / f"public/kineto/{name}.json.gz"])
        g = build_graph(tr)
        pairs[name] = sorted(_edges(g, tr, "event_wait"))
        assert g.unlinked["event_record_unknown"] == (20 if name == "hta_simple_add" else 0)
    assert pairs["hta_alexnet"] == pairs["hta_simple_add"]


def test_aggregation_above_size_limit(corpus: Path) -> None:
    tr = load_trace([corpus / "public/kineto/hta_a100_2rank_nccl.json.gz"])
    full = build_graph(tr)
    small = build_graph(tr, max_nodes=1_000)
    assert small.aggregated and not full.aggregated
    assert small.g.number_of_nodes() < full.g.number_of_nodes()
    # every absorbed event maps to a node that exists; node count accounts for every member
    m = small.members
    assert m.height > 0
    assert set(m["node"].to_list()) <= set(small.nodes["node"].to_list())
    assert small.nodes["n_members"].sum() - small.nodes.height == m.height
    assert nx.is_directed_acyclic_graph(small.g)


# ---------------------------------------------------------------- adversarial input

def _trace(rows: list[dict]) -> Trace:
    return Trace(events=conform(pl.DataFrame(rows), EVENTS_SCHEMA))


def _row(kind: str, name: str, ts: int, dur: int, *, corr: int | None = None, stream=None,
         tid: int = 1, pid: int = 1, **kw) -> dict:
    return {"rank": 0, "kind": kind, "name": name, "ts_ns": ts, "dur_ns": dur, "pid": pid,
            "tid": tid, "stream": stream, "correlation": corr, "device": 0 if stream else None,
            **kw}


def test_cycle_from_malformed_correlation_is_broken() -> None:
    """Zero-length events at one instant: launch R→K, sync K→R', host R'→R (R' has the lower
    id) is a time-consistent cycle; one edge against (ts, id) order goes, the rest stays."""
    tr = _trace([
        _row("runtime", "cudaStreamSynchronize", 100, 0, corr=6),  # R' (id 0)
        _row("runtime", "cudaLaunchKernel", 100, 0, corr=5),  # R (id 1)
        _row("kernel", "k", 100, 0, corr=5, stream=7, pid=0, tid=7),  # K (id 2)
        _row("sync", "Stream Sync", 100, 0, corr=6, stream=7, pid=0, tid=7,
             sync_kind="stream_sync"),
    ])
    g = build_graph(tr)
    assert nx.is_directed_acyclic_graph(g.g)
    assert g.unlinked["cycle_edges_dropped"] == 1
    assert sorted(g.g.edges) == [(0, 1), (1, 2)]


def test_launch_after_its_kernel_is_dropped_and_counted() -> None:
    tr = _trace([
        _row("kernel", "k", 100_000, 10_000, corr=5, stream=7, pid=0, tid=7),
        _row("runtime", "cudaLaunchKernel", 500_000, 10_000, corr=5),  # 400 µs after it
    ])
    g = build_graph(tr)
    assert g.edge_counts()["launch"] == 0 and g.unlinked["time_inconsistent"] == 1


def test_missing_flows_change_nothing(synth: Trace) -> None:
    """Links come from correlation ids, never from flow events (sampled traces have none)."""
    bare = Trace(events=synth.events, comms=synth.comms, ranks=synth.ranks)
    assert sorted(build_graph(bare).g.edges) == sorted(build_graph(synth).g.edges)


_KINDS = ["runtime", "kernel", "memcpy", "sync"]


@st.composite
def _random_events(draw) -> list[dict]:
    n = draw(st.integers(1, 40))
    rows = []
    for _ in range(n):
        kind = draw(st.sampled_from(_KINDS))
        ts = draw(st.integers(0, 5_000))
        dur = draw(st.integers(0, 400))
        corr = draw(st.one_of(st.none(), st.integers(0, 8)))
        stream = draw(st.sampled_from([7, 20, 21])) if kind != "runtime" else None
        extra = {}
        if kind == "sync":
            extra = {"sync_kind": draw(st.sampled_from(
                ["stream_sync", "event_sync", "context_sync", "stream_wait_event"])),
                "wait_stream": draw(st.sampled_from([None, 7, 20])),
                "wait_correlation": draw(st.one_of(st.none(), st.integers(0, 8)))}
        rows.append(_row(kind, f"{kind}{corr}", ts, dur, corr=corr, stream=stream,
                         tid=draw(st.sampled_from([1, 2])) if kind == "runtime" else 7, **extra))
    return rows


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(_random_events())
def test_random_input_gives_dag_and_complete_path(rows: list[dict]) -> None:
    tr = _trace(rows)
    g = build_graph(tr)
    assert nx.is_directed_acyclic_graph(g.g)
    ev = tr.events
    lo, hi = int(ev["ts_ns"].min()), int((ev["ts_ns"] + ev["dur_ns"]).max()) + 1
    path = critical_path(g, rank=0, step=0, start_ns=lo, end_ns=hi)
    # segments tile the window: contiguous, no overlap, lengths add up
    assert sum(s.dur_ns for s in path) == hi - lo
    assert all(a.end_ns == b.start_ns for a, b in itertools.pairwise(path))
    assert len(path) <= 3 * g.g.number_of_nodes() + 2
    # no surviving edge is impossible in time (sync edges allow CPU/GPU clock skew)
    rc = release_constraint(g.edges_frame(), g.nodes)
    assert rc.select((pl.col("release_ns") <= pl.col("constraint_ns")
                      + tolerance_ns(pl.col("kind"))).all()).item()


def test_graph_launch_fans_out_and_sync_waits_on_last_replayed_op() -> None:
    """One cudaGraphLaunch (corr 9) replays three kernels sharing its correlation: three launch
    edges from the one call; a later stream sync waits on the replay's last kernel."""
    tr = _trace([
        _row("runtime", "cudaGraphLaunch", 0, 5_000, corr=9),  # id 0
        _row("kernel", "g0", 100_000, 10_000, corr=9, stream=7, pid=0, tid=7),  # id 1
        _row("kernel", "g1", 110_000, 10_000, corr=9, stream=7, pid=0, tid=7),  # id 2
        _row("kernel", "g2", 120_000, 10_000, corr=9, stream=7, pid=0, tid=7),  # id 3
        _row("runtime", "cudaStreamSynchronize", 6_000, 126_000, corr=10),  # id 4
        _row("sync", "Stream Sync", 6_000, 126_000, corr=10, stream=7, pid=0, tid=7,
             sync_kind="stream_sync"),
    ])
    g = build_graph(tr)
    e = g.edges_frame().sort("kind", "src", "dst")
    assert e.filter(pl.col("kind") == "launch").select("src", "dst").rows() == [
        (0, 1), (0, 2), (0, 3)]
    assert e.filter(pl.col("kind") == "sync").select("src", "dst").rows() == [(3, 4)]
    # the replay started 95 µs (> LAUNCH_LATENCY_NS) after the call returned, nothing known
    # held it: `other`, not host (HTA's test trace shows a 41.8 ms launch→replay delay)
    path = critical_path(g, rank=0, step=0, start_ns=0, end_ns=130_000)
    assert [(s.what, s.wall, s.dur_ns) for s in path] == [
        ("op", "host", 5_000), ("unexplained_gap", "other", 95_000),
        ("op", "compute", 10_000), ("op", "compute", 10_000), ("op", "compute", 10_000)]


def test_thread_handoff_after_silence() -> None:
    """Thread 2 issues nothing for 5 ms, then launches right after thread 1's last call ended:
    a host hand-off edge joins them, so the path continues on thread 1."""
    tr = _trace([
        _row("runtime", "cudaLaunchKernel", 0, 10_000, corr=1, tid=2),  # id 0, thread 2
        _row("runtime", "cudaLaunchKernel", 100_000, 4_900_000, corr=2, tid=1),  # id 1
        _row("runtime", "cudaLaunchKernel", 5_005_000, 10_000, corr=3, tid=2),  # id 2
        _row("kernel", "k", 5_020_000, 10_000, corr=3, stream=7, pid=0, tid=7),  # id 3
    ])
    g = build_graph(tr)
    host = sorted(g.edges_frame().filter(pl.col("kind") == "host").select("src", "dst").rows())
    # program order on thread 2; hand-offs 1 → 2 and 0 → 1 (thread 1 had no earlier call)
    assert host == [(0, 1), (0, 2), (1, 2)]
    path = critical_path(g, rank=0, step=0, start_ns=100_000, end_ns=5_030_000)
    assert [s.node for s in path if s.what == "op"] == [1, 2, 3]


def test_unresolved_waits_of_current_pytorch_are_unknown_not_stream_minus_one() -> None:
    """PyTorch 2.10+ writes wait_on_stream / wait_on_cuda_event_record_corr_id = -1 on every
    cudaStreamWaitEvent row (fixtures/traces/gpu_ep2_alltoall_overlap, H200, torch 2.11): the
    reader keeps them unknown, so the graph's timing fallback links the waits and the compute that
    waited on the all-to-all counts as blocked by communication, not as exposed (issue #17)."""
    import json as _json

    from moetune.analyzer.diagnose import diagnose
    from moetune.analyzer.readers import load_trace

    folder = Path(__file__).resolve().parents[1] / "fixtures" / "traces" / "gpu_ep2_alltoall_overlap"
    tr = load_trace([folder])
    raw = _json.loads(__import__("gzip").open(folder / "rank0.pt.trace.json.gz").read())
    assert {e["args"].get("wait_on_stream") for e in raw["traceEvents"]
            if e.get("name") == "Stream Wait Event"} == {-1}  # the cuda_sync rows
    waits = tr.events.filter(pl.col("name") == "Stream Wait Event")
    assert waits.height > 0
    assert waits["wait_stream"].null_count() == waits.height
    assert waits["wait_correlation"].null_count() == waits.height
    doc = diagnose([folder])
    assert doc["critical_path"]["graph"]["edges"]["event_wait"] > 0
    assert doc["blocking"]["communication_blocking_s"] > 4 * doc["blocking"]["communication_exposed_s"]
