"""Kineto reader on the public corpus (HTA and TraceLens test traces) and on bad or odd inputs
written into tmp_path. Numbers asserted here were read from the files themselves or come from HTA's
own tests."""

from __future__ import annotations

import gzip
import json
import mmap
import subprocess
import sys
from pathlib import Path

import polars as pl
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from moetune.analyzer.frames import COMMS_SCHEMA, EVENTS_SCHEMA, FLOWS_SCHEMA, RANKS_SCHEMA, Trace
from moetune.analyzer.readers import kineto_columns, kineto_decode, kineto_scan, load_trace
from moetune.analyzer.readers.kineto import read_kineto

from moetune.errors import UserError

ROOT = Path(__file__).resolve().parents[1]
CORPUS_FILES = [
    "hta_a100_2rank_nccl",
    "hta_a100_alltoall_rank3of8",
    "hta_sampled_rank0",
    "hta_v100_ddp_allreduce_rank1",
    "hta_alexnet",
    "hta_simple_add",
    "hta_cuda_event_sync",
    "hta_cpu_only",
    "hta_mi250_minitoy",
    "tracelens_h100_qwen05b_inference",
]
_CACHE: dict[str, Trace] = {}


def kineto(corpus: Path, stem: str, default_rank: int = 0) -> Trace:
    key = f"{stem}:{default_rank}"
    if key not in _CACHE:
        _CACHE[key] = read_kineto(
            corpus / "public" / "kineto" / f"{stem}.json.gz", default_rank=default_rank
        )
    return _CACHE[key]


def kind(t: Trace, k: str) -> pl.DataFrame:
    return t.events.filter(pl.col("kind") == k)


def steps(t: Trace) -> list[int]:
    names = kind(t, "annotation").get_column("name")
    return sorted(int(n.split("#")[1]) for n in names if n.startswith("ProfilerStep#"))


def all_strings(t: Trace) -> pl.Series:
    """Every distinct string cell of every frame."""
    parts = [
        df.get_column(c).cast(pl.String).drop_nulls().unique()
        for df in (t.events, t.comms, t.flows, t.ranks)
        for c, dt in df.schema.items()
        if dt in (pl.String,) or isinstance(dt, pl.Enum)
    ]
    return pl.concat(parts).unique()


# --------------------------------------------------------------------------- every corpus file


@pytest.mark.parametrize("stem", CORPUS_FILES)
def test_frames_follow_the_contract(corpus: Path, stem: str) -> None:
    t = kineto(corpus, stem)
    assert t.events.schema == EVENTS_SCHEMA
    assert t.comms.schema == COMMS_SCHEMA
    assert t.flows.schema == FLOWS_SCHEMA
    assert t.ranks.schema == RANKS_SCHEMA
    assert t.warnings == ()
    assert t.ranks.height == 1
    r = t.ranks.row(0, named=True)
    assert r["format"] == "kineto" and r["source"].endswith(f"{stem}.json.gz")
    assert r["clock_offset_ns"] == 0 and r["graph_trace_mode"] == "node"
    ev = t.events
    assert ev.get_column("ts_ns").null_count() == 0
    assert ev.get_column("dur_ns").min() >= 0
    assert ev.get_column("rank").unique().to_list() == [r["rank"]]
    gpu = t.gpu
    assert gpu.get_column("device").null_count() == 0
    assert gpu.get_column("stream").null_count() == 0
    # Host rows carry no GPU columns; memcpy rows always get a direction.
    assert kind(t, "cpu_op").get_column("device").null_count() == kind(t, "cpu_op").height
    assert kind(t, "memcpy").get_column("copy_kind").null_count() == 0
    # Epoch ns: every trace here was captured between 2022 and 2025.
    lo, hi = 1_640_995_200 * 10**9, 1_767_225_600 * 10**9
    assert lo < ev.get_column("ts_ns").min() and ev.get_column("ts_ns").max() < hi


# --------------------------------------------------------------------------- per-file oracles


def test_a100_2rank_nccl_metadata(corpus: Path) -> None:
    t = kineto(corpus, "hta_a100_2rank_nccl", default_rank=5)  # distributedInfo.rank wins
    assert steps(t) == [4, 5, 6]
    kernels = kind(t, "kernel")
    assert kernels.height == 2700
    nccl = kernels.filter(pl.col("name").str.contains("ncclKernel"))
    assert nccl.height == 21
    assert nccl.get_column("stream").unique().to_list() == [40]
    assert (
        nccl.filter(pl.col("name").str.starts_with("ncclKernel_AllReduce_RING_LL_Sum_float")).height
        == 15
    )
    assert (
        nccl.filter(
            pl.col("name").str.starts_with("ncclKernel_Broadcast_RING_LL_Sum_int8_t")
        ).height
        == 6
    )
    # HTA test_nccl_parser_config: all 21 carry metadata; the longest is the 2,049,000 allreduce.
    j = nccl.join(t.comms, on="correlation", how="left", suffix="_comm")
    assert j.get_column("collective").null_count() == 0
    top = j.sort("dur_ns", descending=True).row(0, named=True)
    assert top["collective"] == "allreduce"
    assert top["in_nelems"] == top["out_nelems"] == 2_049_000
    assert top["in_split"] == top["out_split"] == "[]"
    assert (top["pg_name"], top["pg_desc"], top["pg_ranks"]) == ("0", "default_pg", "[0, 1]")
    assert top["group_size"] == 2 and top["dtype"] == "Float"
    # One comms row per record_param_comms call (27), none duplicated by nccl:* annotations.
    assert t.comms.height == 27
    assert t.comms.get_column("rank").unique().to_list() == [0]
    flows = t.flows.group_by("cat", "phase").len().sort("cat", "phase").rows()
    assert flows == [
        ("ac2g", "f", 8652),
        ("ac2g", "s", 3862),
        ("fwdbwd", "f", 543),
        ("fwdbwd", "s", 543),
    ]
    assert kind(t, "gpu_annotation").height == 30
    r = t.ranks.row(0, named=True)
    assert (r["rank"], r["world_size"], r["backend"], r["nccl_version"]) == (0, 2, "nccl", "2.17.1")
    assert (r["device_name"], r["num_sms"], r["compute_capability"]) == (
        "NVIDIA A100-PG509-200",
        108,
        "8.0",
    )


def test_float_relative_ts_keeps_nanoseconds(corpus: Path) -> None:
    # First NCCL kernel in the file: ts 4458677009853.422 µs after baseTimeNanoseconds
    # 1711964646000000000, dur 2636.669 µs → exact integer ns.
    t = kineto(corpus, "hta_a100_2rank_nccl")
    row = (
        kind(t, "kernel")
        .filter(pl.col("correlation") == 60047)
        .select("ts_ns", "dur_ns", "external_id", "device", "stream")
        .row(0)
    )
    assert row == (1711964646000000000 + 4458677009853422, 2636669, 12945, 0, 40)


def test_a100_alltoall_legacy_format(corpus: Path) -> None:
    t = kineto(corpus, "hta_a100_alltoall_rank3of8")
    assert steps(t) == list(range(1009, 1015))
    kernels = kind(t, "kernel")
    assert kernels.height == 8568
    assert sorted(kernels.get_column("stream").unique().to_list()) == [7, 20, 21]
    assert kernels.filter(pl.col("name").str.contains("ncclKernel_SendRecv")).height == 42
    assert kind(t, "annotation").filter(pl.col("name") == "nccl:all_to_all").height == 42
    # No metadata on kernels: each call comes from its nccl:<coll> annotation.
    assert t.comms.group_by("collective").len().sort("collective").rows() == [
        ("all_reduce", 18),
        ("all_to_all", 42),
    ]
    assert t.comms.get_column("in_nelems").null_count() == t.comms.height
    assert t.flows.get_column("cat").unique().to_list() == ["async_cpu_to_gpu"]
    # Integer epoch µs → ns exactly (first kernel of the file, correlation 1869557).
    k = kernels.filter(pl.col("correlation") == 1869557).select("ts_ns", "dur_ns", "device").row(0)
    assert k == (1661203463029566000, 7000, 3)
    assert t.ranks.select("rank", "world_size").row(0) == (3, 8)


def test_sampled_trace_without_flows(corpus: Path) -> None:
    t = kineto(corpus, "hta_sampled_rank0")
    assert t.flows.height == 0
    kernels = kind(t, "kernel")
    assert kernels.height == 1154
    assert sorted(kernels.get_column("stream").unique().to_list()) == [7, 23, 84, 203]
    assert kernels.filter(pl.col("name").str.contains("SendRecv")).height == 10
    assert steps(t) == [551, 552]
    r = t.ranks.row(0, named=True)
    assert (r["rank"], r["world_size"], r["device_name"]) == (0, 128, None)
    # HTA test_trace_filter: TimeRangeFilter((1682725898237042, 1682725898240570)) → 93 rows,
    # i.e. the events lying wholly inside the window (HTA keeps X events, drops cat Trace).
    lo, hi = 1682725898237042 * 1000, 1682725898240570 * 1000
    win = t.events.filter(
        (pl.col("ts_ns") >= lo)
        & (pl.col("ts_ns") + pl.col("dur_ns") <= hi)
        & (pl.col("kind") != "other")
    )
    assert win.height == 93


def test_v100_many_small_collectives(corpus: Path) -> None:
    t = kineto(corpus, "hta_v100_ddp_allreduce_rank1")
    kernels = kind(t, "kernel")
    assert kernels.height == 19370
    ar = kernels.filter(pl.col("name").str.starts_with("ncclKernel_AllReduce_RING_LL_Sum_float"))
    assert ar.height == 2020
    assert ar.get_column("stream").unique().to_list() == [14]
    assert kind(t, "annotation").filter(pl.col("name") == "nccl:all_reduce").height == 2020
    assert t.comms.height == 2020 and t.comms.get_column("collective").unique().to_list() == [
        "all_reduce"
    ]
    assert kind(t, "instant").height == 28010 + 2  # cpu_instant_event [memory] + window markers
    assert steps(t) == [2, 3, 4, 5, 6]
    assert t.events.height == 216092 - 42373 - 22290 - 38  # minus ac2g flow ends/starts and M rows
    assert t.ranks.select("rank", "device_name", "compute_capability").row(0) == (
        1,
        "Tesla V100-SXM2-32GB",
        "7.0",
    )


@pytest.mark.parametrize("stem", ["hta_alexnet", "hta_simple_add"])
def test_sync_events(corpus: Path, stem: str) -> None:
    t = kineto(corpus, stem)
    assert kind(t, "kernel").height == 79
    assert sorted(kind(t, "kernel").get_column("stream").unique().to_list()) == [7, 20]
    sync = kind(t, "sync")
    assert sync.group_by("sync_kind").len().sort("sync_kind").rows() == [
        ("stream_sync", 16),
        ("context_sync", 5),
        ("stream_wait_event", 20),
    ]
    swe = sync.filter(pl.col("sync_kind") == "stream_wait_event")
    assert swe.get_column("wait_stream").null_count() == 0
    if stem == "hta_simple_add":  # its writer predates wait_on_cuda_event_record_corr_id
        assert swe.get_column("wait_correlation").null_count() == 20
    else:
        # Every waited-on correlation is a real cudaEventRecord launch in the same file.
        rec = (
            kind(t, "runtime").filter(pl.col("name") == "cudaEventRecord").get_column("correlation")
        )
        assert swe.get_column("wait_correlation").null_count() == 0
        assert swe.get_column("wait_correlation").is_in(rec.implode()).all()
    assert (
        sync.filter(pl.col("sync_kind") != "stream_wait_event")
        .get_column("wait_stream")
        .null_count()
        == 21
    )


def test_cuda_event_sync(corpus: Path) -> None:
    t = kineto(corpus, "hta_cuda_event_sync")
    assert t.events.height + t.flows.height + 36 == 92  # 36 M rows dropped
    assert kind(t, "kernel").height == 4
    assert kind(t, "sync").group_by("sync_kind").len().sort("sync_kind").rows() == [
        ("stream_sync", 1),
        ("event_sync", 2),
        ("context_sync", 1),
    ]
    cp = kind(t, "memcpy").select("copy_kind", "bytes").rows()
    assert cp == [("DtoH", 1)]
    names = set(kind(t, "runtime").get_column("name"))
    assert {
        "cudaEventRecord",
        "cudaEventSynchronize",
        "cudaStreamSynchronize",
        "cudaDeviceSynchronize",
    } <= names
    assert steps(t) == [100]


def test_cpu_only(corpus: Path) -> None:
    t = kineto(corpus, "hta_cpu_only", default_rank=3)
    assert t.gpu.height == 0
    assert t.events.filter(pl.col("device").is_not_null()).height == 0
    r = t.ranks.row(0, named=True)
    assert (r["rank"], r["world_size"], r["backend"]) == (34, 300, "gloo")
    assert (r["device_name"], r["num_sms"], r["compute_capability"]) == (None, None, None)
    assert t.events.get_column("rank").unique().to_list() == [34]
    assert steps(t) == [551]
    assert t.comms.height == 10 and t.comms.get_column("collective").unique().to_list() == [
        "all_reduce"
    ]


def test_rocm_trace_and_default_rank(corpus: Path) -> None:
    t = kineto(corpus, "hta_mi250_minitoy", default_rank=7)  # no distributedInfo
    assert t.ranks.select("rank", "world_size", "backend").row(0) == (7, None, None)
    assert t.events.get_column("rank").unique().to_list() == [7]
    kernels = kind(t, "kernel")
    assert kernels.height == 14
    assert kernels.get_column("stream").unique().to_list() == [0]
    assert kernels.get_column("device").unique().to_list() == [2]
    assert kernels.filter(pl.col("name").str.starts_with("Cijk_")).height >= 1
    assert {"hipLaunchKernel", "hipExtModuleLaunchKernel", "hipMemcpyWithStream"} <= set(
        kind(t, "runtime").get_column("name")
    )
    # ROCm copies carry no bytes arg; the direction still comes from the name.
    assert kind(t, "memcpy").select("copy_kind", "bytes").rows() == [("HtoD", None), ("HtoD", None)]
    assert t.ranks.select("device_name", "compute_capability").row(0) == (
        "AMD Radeon Graphics",
        "9.0",
    )


def test_tracelens_no_credentials(corpus: Path) -> None:
    t = kineto(corpus, "tracelens_h100_qwen05b_inference")
    kernels = kind(t, "kernel")
    assert kernels.height == 1465
    assert kernels.get_column("stream").unique().to_list() == [7]
    assert kind(t, "python").height == 4262
    runtime = kind(t, "runtime")
    assert runtime.filter(pl.col("name") == "cuLaunchKernel").height == 1  # cuda_driver → runtime
    assert runtime.filter(pl.col("name") == "cudaLaunchKernelExC").height == 168
    assert steps(t) == [6]
    step = kind(t, "gpu_annotation").filter(pl.col("name") == "ProfilerStep#6")
    assert step.get_column("dur_ns").to_list() == [34_892_421]  # TraceLens total 34,892.421 µs
    # The harness metadata (pip list, env with a scrubbed token) must reach no frame.
    with gzip.open(corpus / "public/kineto/tracelens_h100_qwen05b_inference.json.gz") as fh:
        env = json.load(fh)["metadata"]["system"]["env"]
    secrets = {v for v in env.values() if isinstance(v, str) and len(v) >= 8} | {
        "<removed>",
        "HF_TOKEN",
    }
    cells = all_strings(t)
    for s in secrets:
        assert not cells.str.contains(s, literal=True).any(), s


# HTA 0.5.0 get_temporal_breakdown() on these files, µs:
# idle, compute, non-compute, kernel time.
HTA_TEMPORAL = {
    "hta_a100_2rank_nccl": (338_781, 75_169, 21_636, 435_586),
    "hta_a100_alltoall_rank3of8": (62_119, 234_760, 86_525, 383_404),
    "hta_sampled_rank0": (321_378, 106_252, 172_428, 600_058),
    "hta_v100_ddp_allreduce_rank1": (643_612, 496_485, 256_572, 1_396_669),
}


@pytest.mark.parametrize("stem", sorted(HTA_TEMPORAL))
def test_frames_reproduce_hta_temporal_breakdown(corpus: Path, stem: str) -> None:
    """HTA's definitions applied to our frames give HTA's numbers to the µs: same events, same
    times, same correlations (bench/bench_kineto.py:hta_equivalent)."""
    import importlib.util

    spec = importlib.util.spec_from_file_location(
        "bench_kineto", ROOT / "bench" / "bench_kineto.py"
    )
    assert spec and spec.loader
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    got = bench.hta_equivalent(kineto(corpus, stem))
    assert (
        got["idle_us"],
        got["compute_us"],
        got["non_compute_us"],
        got["kernel_us"],
    ) == HTA_TEMPORAL[stem]


# --------------------------------------------------------------------------- odd but valid inputs


def write(tmp_path: Path, name: str, content: bytes | str | dict, *, gz: bool = False) -> Path:
    if isinstance(content, dict):
        content = json.dumps(content)
    data = content.encode() if isinstance(content, str) else content
    p = tmp_path / name
    p.write_bytes(gzip.compress(data) if gz else data)
    return p


def ev(**kw: object) -> dict:
    base = {
        "ph": "X",
        "cat": "cpu_op",
        "name": "aten::mm",
        "pid": 10,
        "tid": 11,
        "ts": 100,
        "dur": 5,
    }
    base.update(kw)
    return base


def test_odd_values_are_coerced_not_fatal(tmp_path: Path) -> None:
    doc = {
        "traceEvents": [
            ev(name="ünïcødé ✓ 内核", ts="1000.5", dur="2"),  # string numbers (old writers)
            ev(dur=-3),  # negative duration → dropped
            ev(dur=8 * 24 * 3600 * 1e6),  # CUPTI overflow → dropped
            ev(
                cat="kernel",
                name="k",
                pid=0,
                tid=7,
                ts=200,
                dur=1,
                args={"correlation": 2**70, "External id": 9, "device": 0, "stream": 7},
            ),
            ev(ph="i", cat=None, name="Record Window End", pid="", tid="", ts=300, dur=None),
            {"ph": "M", "name": "process_name", "pid": 10, "args": {"name": "python"}},
        ],
        "metadata": {"env": {"HF_TOKEN": "hf_abcdefghijklmnop"}},
        "distributedInfo": {"rank": 2, "world_size": 4, "backend": "nccl", "secret": "pw123456789"},
        "deviceProperties": [
            {
                "id": 0,
                "name": "GPU X",
                "numSms": 1,
                "computeMajor": 9,
                "computeMinor": 0,
                "token": "tok_ABCDEFGHIJ",
            }
        ],
    }
    t = read_kineto(write(tmp_path, "odd.json", doc), default_rank=0)
    e = t.events.sort("ts_ns")
    assert e.get_column("name").to_list() == [
        "k",
        "Record Window End",
        "ünïcødé ✓ 内核",
    ]
    assert e.get_column("ts_ns").to_list() == [200_000, 300_000, 1_000_500]
    assert e.get_column("dur_ns").to_list() == [1000, 0, 2000]
    assert e.get_column("kind").to_list() == ["kernel", "instant", "cpu_op"]
    assert "odd.json: 1 event(s) with a negative duration dropped" in t.warnings
    k = e.filter(pl.col("kind") == "kernel").row(0, named=True)
    assert (k["correlation"], k["external_id"], k["device"], k["stream"]) == (None, 9, 0, 7)
    assert any("7 days" in w for w in t.warnings)
    assert t.ranks.select("rank", "world_size", "device_name").row(0) == (2, 4, "GPU X")
    cells = all_strings(t)
    for s in ("hf_abcdefghijklmnop", "pw123456789", "tok_ABCDEFGHIJ"):
        assert not cells.str.contains(s, literal=True).any()


def test_lenient_decode_of_mistyped_fields(tmp_path: Path) -> None:
    doc = {
        "traceEvents": [
            None,
            ev(args=["not", "a", "dict"]),
            ev(ts=[1, 2]),  # unusable timestamp → row dropped with a warning
            ev(
                cat="kernel",
                pid=0,
                tid=7,
                ts=50,
                args={"stream": {"x": 1}, "device": 0, "correlation": 4},
            ),
            {"ph": "s", "id": 4, "pid": 10, "tid": 11, "ts": 49, "cat": "ac2g", "name": "ac2g"},
            {
                "ph": "f",
                "id": 4,
                "pid": 0,
                "tid": 7,
                "ts": 50,
                "cat": "ac2g",
                "name": "ac2g",
                "bp": "e",
            },
        ],
        "baseTimeNanoseconds": 1_000_000_000,
    }
    t = read_kineto(write(tmp_path, "lenient.json.gz", doc, gz=True), default_rank=1)
    assert t.events.height == 2
    k = t.events.filter(pl.col("kind") == "kernel").row(0, named=True)
    assert (k["ts_ns"], k["stream"], k["correlation"]) == (1_000_050_000, 7, 4)  # stream from tid
    assert t.flows.select("flow_id", "phase", "ts_ns").rows() == [
        (4, "s", 1_000_049_000),
        (4, "f", 1_000_050_000),
    ]
    assert any("lenient" in w for w in t.warnings)
    assert any("timestamp" in w for w in t.warnings)


def test_invalid_utf8_is_replaced(tmp_path: Path) -> None:
    raw = (
        json.dumps({"traceEvents": [ev(name="NAME")]}).encode().replace(b"NAME", b"bad\xff\xfename")
    )
    t = read_kineto(write(tmp_path, "latin.json", raw), default_rank=0)
    assert t.events.get_column("name").to_list() == ["bad\ufffd\ufffdname"]
    assert any("UTF-8" in w for w in t.warnings)


def test_graph_replay_ids(tmp_path: Path) -> None:
    """Newer Kineto (PR #1276): one cudaGraphLaunch, kernels sharing its correlation, each with
    `graph id` / `graph node id`."""
    launch = ev(
        cat="cuda_runtime",
        name="cudaGraphLaunch",
        ts=10,
        dur=2,
        args={"correlation": 77, "External id": 5, "cbid": 311},
    )
    kernels = [
        ev(
            cat="kernel",
            name=f"k{i}",
            pid=1,
            tid=9,
            ts=20 + i,
            dur=1,
            args={
                "correlation": 77,
                "External id": 5,
                "device": 1,
                "stream": 9,
                "graph id": 3,
                "graph node id": 100 + i,
            },
        )
        for i in range(3)
    ]
    t = read_kineto(
        write(tmp_path, "graph.json", {"traceEvents": [launch, *kernels]}), default_rank=0
    )
    k = kind(t, "kernel").sort("ts_ns")
    assert k.select("correlation", "graph_id").unique().rows() == [(77, 3)]
    assert k.get_column("graph_node_id").to_list() == [100, 101, 102]
    assert kind(t, "runtime").select("graph_id", "graph_node_id").row(0) == (None, None)


def test_two_files_two_ranks(corpus: Path) -> None:
    k = corpus / "public" / "kineto"
    # two unrelated public traces (captured months apart): merged only when asked
    t = load_trace([k / "hta_cuda_event_sync.json.gz", k / "hta_cpu_only.json.gz"],
                   allow_mixed_runs=True)
    assert t.ranks.get_column("rank").to_list() == [0, 34]
    assert t.events.group_by("rank").len().sort("rank").rows() == [(0, 35), (34, 18)]
    assert t.events.schema == EVENTS_SCHEMA and t.comms.schema == COMMS_SCHEMA


def test_rank_files_read_side_by_side_same_as_one_by_one(
    corpus: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Several ranks' files are read by a thread pool: the Trace equals the one read with one
    worker, and of two bad files the first in the given order is the error reported."""
    import moetune.analyzer.readers as readers

    k = corpus / "public" / "kineto"
    files = [k / "hta_cuda_event_sync.json.gz", k / "hta_cpu_only.json.gz",
             k / "hta_mi250_minitoy.json.gz", k / "hta_a100_alltoall_rank3of8.json.gz"]
    monkeypatch.setattr(readers, "cpu_count", lambda: 4)
    many = load_trace(files, allow_mixed_runs=True)  # unrelated public traces, as asked
    monkeypatch.setattr(readers, "cpu_count", lambda: 1)
    one = load_trace(files, allow_mixed_runs=True)
    assert all(a.equals(b) for a, b in zip(
        (many.events, many.comms, many.flows, many.ranks, many.memory),
        (one.events, one.comms, one.flows, one.ranks, one.memory), strict=True))
    text = json.dumps({"traceEvents": [ev()] * 20})
    bad1 = write(tmp_path, "b1.json", text[: len(text) // 2])
    bad2 = write(tmp_path, "b2.json.gz", b"\x1f\x8b garbage")
    monkeypatch.setattr(readers, "cpu_count", lambda: 4)
    for order in ([files[0], bad2, bad1], [files[0], bad1, bad2]):
        with pytest.raises(UserError) as info:
            load_trace(order)
        assert str(order[1]) in str(info.value)


def test_absurd_header_values_read_as_unknown(tmp_path: Path) -> None:
    doc = {
        "distributedInfo": {"rank": 2**40, "world_size": -(2**63) - 1, "backend": 7},
        "deviceProperties": [{"id": 0, "name": None, "numSms": 2**33, "computeMajor": "9"}],
        "traceEvents": [ev(cat="kernel", pid=0, tid=7)],
    }
    t = read_kineto(write(tmp_path, "hdr.json", doc), default_rank=6)
    r = t.ranks.row(0, named=True)
    assert (r["rank"], r["world_size"], r["backend"], r["num_sms"], r["compute_capability"]) == (
        6,
        None,
        "7",
        None,
        "9.0",
    )


def test_rank_strings_and_old_tid_spelling(tmp_path: Path) -> None:
    doc = {
        "distributedInfo": {"rank": "5"},
        "traceEvents": [ev(cat="Kernel", pid=0, tid="stream 12", args={"correlation": 1})],
    }
    t = read_kineto(write(tmp_path, "old.json", doc), default_rank=0)
    row = t.events.row(0, named=True)
    assert (row["rank"], row["kind"], row["tid"], row["stream"], row["device"]) == (
        5,
        "kernel",
        12,
        12,
        0,
    )


# --------------------------------------------------------------------------- bad inputs


def one_line_error(path: Path, needle: str) -> None:
    with pytest.raises(UserError) as info:
        load_trace([path])
    msg = str(info.value)
    assert "\n" not in msg
    assert str(path) in msg
    assert needle in msg


def test_truncated_gzip(tmp_path: Path) -> None:
    full = gzip.compress(json.dumps({"traceEvents": [ev()] * 200}).encode())
    one_line_error(write(tmp_path, "cut.json.gz", full[: len(full) // 2]), "gzip")


def test_corrupt_gzip_body(tmp_path: Path) -> None:
    full = bytearray(gzip.compress(json.dumps({"traceEvents": [ev()] * 200}).encode()))
    full[20:40] = b"\x00" * 20  # deflate stream garbage → zlib.error, not OSError
    one_line_error(write(tmp_path, "garbled.json.gz", bytes(full)), "gzip")


def test_truncated_json(tmp_path: Path) -> None:
    text = json.dumps({"traceEvents": [ev()] * 20})
    one_line_error(write(tmp_path, "cut.json", text[: len(text) // 2]), "is truncated: its JSON ends")


def test_unescaped_quote_names_position(tmp_path: Path) -> None:
    text = '{"traceEvents": [{"ph": "X", "name": "say "hi"", "ts": 1, "dur": 1}]}'
    with pytest.raises(UserError, match=r"not valid JSON at line 1: expected") as info:
        read_kineto(write(tmp_path, "quote.json", text), default_rank=0)
    assert "quote.json" in str(info.value)


def test_not_json(tmp_path: Path) -> None:
    one_line_error(write(tmp_path, "notes.json", "hello, this is text"), "not a trace")
    with pytest.raises(UserError, match="not valid JSON"):
        read_kineto(write(tmp_path, "brace.json", "{ nope"), default_rank=0)


def test_empty_file(tmp_path: Path) -> None:
    one_line_error(write(tmp_path, "empty.json", b""), "empty")
    with pytest.raises(UserError, match="empty"):
        read_kineto(write(tmp_path, "empty.json.gz", b"   \n", gz=True), default_rank=0)


def test_json_without_trace_events(tmp_path: Path) -> None:
    one_line_error(write(tmp_path, "cfg.json", {"model": "x", "layers": 4}), "not a Kineto trace")
    one_line_error(write(tmp_path, "nulls.json", {"traceEvents": None}), "not a Kineto trace")
    with pytest.raises(UserError, match="not a Kineto trace"):
        read_kineto(write(tmp_path, "arr.json", "[1, 2]"), default_rank=0)


def test_missing_file(tmp_path: Path) -> None:
    with pytest.raises(UserError, match="no such file"):
        read_kineto(tmp_path / "absent.json", default_rank=0)


def test_cli_reports_bad_trace_in_one_line(tmp_path: Path) -> None:
    from moetune.cli import build_parser

    sub = next(a for a in build_parser()._actions if a.dest == "command")
    if "diagnose" not in sub.choices:
        pytest.skip("diagnose command not there yet")
    bad = write(tmp_path, "cut.json", '{"traceEvents": [')
    proc = subprocess.run(
        [sys.executable, "-m", "moetune", "diagnose", str(bad)],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=60,
    )
    assert proc.returncode == 2
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and str(bad) in lines[0] and "Traceback" not in proc.stderr


# --------------------------------------------------------------------------- project fixture


def test_cpu_moe_fixture(fixtures_dir: Path) -> None:
    path = fixtures_dir / "traces" / "cpu_moe" / "trace.json.gz"
    assert path.stat().st_size < 300_000
    t = read_kineto(path, default_rank=4)
    assert t.gpu.height == 0 and t.comms.height == 0 and t.warnings == ()
    assert t.events.group_by("kind").len().sort("kind").rows() == [
        ("cpu_op", 2028),
        ("annotation", 15),
        ("instant", 2),
        ("other", 1),
    ]
    assert steps(t) == [2, 3, 4]
    names = t.events.get_column("name")
    assert (names == "moe_router").sum() == (names == "moe_experts").sum() == 3
    assert (names == "aten::nonzero").sum() == (names == "aten::index_add").sum() == 12
    assert t.flows.get_column("cat").unique().to_list() == ["fwdbwd"] and t.flows.height == 246
    r = t.ranks.row(0, named=True)
    assert (r["rank"], r["device_name"], r["backend"]) == (4, None, None)
    # Each expert loop sits inside its step, and each step inside the profiler window.
    step = (
        kind(t, "annotation").filter(pl.col("name").str.starts_with("ProfilerStep#")).sort("ts_ns")
    )
    loops = kind(t, "annotation").filter(pl.col("name") == "moe_experts").sort("ts_ns")
    for s, lp in zip(step.iter_rows(named=True), loops.iter_rows(named=True), strict=True):
        assert s["ts_ns"] <= lp["ts_ns"] and lp["ts_ns"] + lp["dur_ns"] <= s["ts_ns"] + s["dur_ns"]


# --------------------------------------------------------------------------- round trip


CAT_KIND = {
    "cpu_op": "cpu_op",
    "user_annotation": "annotation",
    "gpu_user_annotation": "gpu_annotation",
    "python_function": "python",
    "cuda_runtime": "runtime",
    "cuda_driver": "runtime",
    "kernel": "kernel",
    "gpu_memcpy": "memcpy",
    "gpu_memset": "memset",
    "cuda_sync": "sync",
    "overhead": "other",
}


@settings(
    max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    rows=st.lists(
        st.tuples(
            st.sampled_from(sorted(CAT_KIND)),
            st.integers(0, 5 * 10**15),  # ts in ns after the base (Kineto: up to ~2 months)
            st.integers(-5_000, 10**7),  # dur in ns (negative → dropped)
            st.integers(0, 2**40),  # correlation
            st.text(max_size=12),
        ),
        min_size=1,
        max_size=30,
    ),
    base=st.sampled_from([0, 1_700_000_000_000_000_000]),
)
def test_round_trip(tmp_path: Path, rows: list[tuple[str, int, int, int, str]], base: int) -> None:
    """Frame → Kineto JSON (ns-precision float µs, as torch ≥2.3 writes) → reader → same frame."""
    events = [
        {
            "ph": "X",
            "cat": cat,
            "name": name,
            "pid": 3,
            "tid": 5,
            "ts": ts / 1000,
            "dur": dur / 1000,
            "args": {"correlation": corr, "External id": i},
        }
        for i, (cat, ts, dur, corr, name) in enumerate(rows)
    ]
    doc: dict = {"traceEvents": events}
    if base:
        doc["baseTimeNanoseconds"] = base
    path = tmp_path / "rt.json"
    path.write_text(json.dumps(doc))
    t = read_kineto(path, default_rank=0).events.sort("external_id")
    rows = [r for r in rows if r[2] >= 0]  # negative durations are dropped
    assert t.get_column("kind").to_list() == [CAT_KIND[r[0]] for r in rows]
    assert t.get_column("name").to_list() == [r[4] for r in rows]
    assert t.get_column("ts_ns").to_list() == [base + r[1] for r in rows]
    assert t.get_column("dur_ns").to_list() == [r[2] for r in rows]
    assert t.get_column("correlation").to_list() == [r[3] for r in rows]
    gpu = t.filter(pl.col("kind").is_in(["kernel", "memcpy", "memset", "gpu_annotation", "sync"]))
    assert set(gpu.get_column("device")) <= {3} and set(gpu.get_column("stream")) <= {5}


# --------------------------------------------------------------------------- chunked decoding
# These tests are about the pure-Python reader's own paths: the compiled scanner (which reads the
# clean files first) is switched off for them; tests/test_kineto_scan.py checks the two agree.


@pytest.fixture
def python_reader(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(kineto_scan, "USE_COMPILED", False)


def _frames(t: Trace) -> tuple[pl.DataFrame, ...]:
    return (t.events, t.comms, t.flows, t.ranks)


def _same(a: Trace, b: Trace) -> bool:
    return a.warnings == b.warnings and all(
        x.schema == y.schema and x.equals(y) for x, y in zip(_frames(a), _frames(b), strict=True)
    )


def _whole_and_chunked(path: Path, monkeypatch: pytest.MonkeyPatch,
                       chunk: int | None = None) -> tuple:
    """`path` read by the whole-file typed decode, then by the raw-slice chunked path (`chunk`
    events at a time when given)."""
    monkeypatch.setattr(kineto_decode, "RAW_MIN_BYTES", 1 << 40)
    whole = read_kineto(path, default_rank=0)
    monkeypatch.setattr(kineto_decode, "RAW_MIN_BYTES", 0)
    if chunk is not None:
        monkeypatch.setattr(kineto_columns, "CHUNK", chunk)
    return whole, read_kineto(path, default_rank=0)


@pytest.mark.usefixtures("python_reader")
def test_chunked_decode_equals_whole_decode(corpus: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Raw slices decoded 1,000 events at a time (rows renumbered per chunk, side frames concatenated)
    give the same frames as one typed decode of the whole file."""

    path = corpus / "public" / "kineto" / "hta_a100_2rank_nccl.json.gz"
    whole, chunked = _whole_and_chunked(path, monkeypatch, 1000)
    assert _same(whole, chunked)
    assert (chunked.events.height, chunked.flows.height, chunked.comms.height) == (
        whole.events.height,
        whole.flows.height,
        whole.comms.height,
    )
    assert chunked.flows.height > 0 and chunked.comms.height > 0


@pytest.mark.usefixtures("python_reader")
@pytest.mark.parametrize("bad", ["mistyped", "utf8"])
def test_chunk_failing_typed_decode_falls_back_to_whole_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, bad: str
) -> None:
    """A bad event in a late chunk (after good chunks were built) restarts the lenient whole-file
    decode: same frames and warnings as the small-file path."""

    evs = [ev(ts=100 + i, args={"External id": i}) for i in range(7)]
    evs.append(ev(ts=[1, 2]) if bad == "mistyped" else ev(name="NAME"))
    raw = json.dumps({"traceEvents": evs}).encode().replace(b"NAME", b"bad\xffname")
    path = write(tmp_path, "late_bad.json", raw)
    whole, chunked = _whole_and_chunked(path, monkeypatch, 3)
    assert _same(whole, chunked)
    expect = "lenient" if bad == "mistyped" else "UTF-8"
    assert any(expect in w for w in chunked.warnings)
    assert chunked.events.height == (7 if bad == "mistyped" else 8)
    assert chunked.events.get_column("external_id").to_list()[:7] == list(range(7))


# --------------------------------------------------------------------------- fast-path equivalences


@pytest.mark.usefixtures("python_reader")
def test_in_place_chunks_equal_whole_decode_and_leave_file_intact(
    corpus: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An uncompressed file is decoded chunk by chunk in its private map (brackets written around
    each span, then put back): same frames as the whole-file typed decode, file bytes and mtime
    untouched."""
    import hashlib

    src = corpus / "public" / "kineto" / "hta_a100_2rank_nccl.json.gz"
    path = write(tmp_path, "a100.json", gzip.decompress(src.read_bytes()))
    digest, mtime = hashlib.sha256(path.read_bytes()).hexdigest(), path.stat().st_mtime_ns
    # 41 chunks, boundaries at every separator layout
    whole, chunked = _whole_and_chunked(path, monkeypatch, 999)
    assert _same(whole, chunked) and chunked.events.height == 26935
    assert hashlib.sha256(path.read_bytes()).hexdigest() == digest
    assert path.stat().st_mtime_ns == mtime

    # The span located from the raw slices' addresses starts and ends on those slices' bytes, with
    # a separator on either side (where the brackets go); the map holds the file's bytes after.
    data = kineto_decode._open(path)
    doc, _ = kineto_decode._decode_top(data, path)
    origin = kineto_columns._address(data)
    assert origin is not None and isinstance(data, mmap.mmap)
    evs = doc.traceEvents
    for base in range(0, len(evs), 999):
        chunk = evs[base : base + 999]
        start = kineto_columns._address(chunk[0]) - origin
        end = kineto_columns._address(chunk[-1]) - origin + len(chunk[-1])
        assert bytes(data[start : start + len(chunk[0])]) == bytes(chunk[0])
        assert bytes(data[end - len(chunk[-1]) : end]) == bytes(chunk[-1])
        assert data[start - 1 : start] in (b"[", b",", b" ", b"\n") and data[end : end + 1] in (
            b"]",
            b",",
            b" ",
            b"\n",
        )
        assert len(kineto_columns._decode_chunk(chunk, data, origin)) == len(chunk)
    assert hashlib.sha256(data[:]).hexdigest() == digest


@pytest.mark.usefixtures("python_reader")
@pytest.mark.parametrize("gz", [False, True])
def test_bad_gpu_args_in_late_chunk_fall_back(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, gz: bool
) -> None:
    """GPU args are decoded in a second pass, from the rows' raw slices: a mistyped one there still
    sends the whole file through the lenient decode (same frames and warning as the small path)."""

    evs = [ev(ts=100 + i, args={"External id": i}) for i in range(7)]
    evs.append(ev(cat="kernel", pid=0, tid=7, ts=200, args={"stream": {"x": 1}, "device": 0}))
    path = write(tmp_path, "late_gpu.json" + (".gz" if gz else ""), {"traceEvents": evs}, gz=gz)
    whole, chunked = _whole_and_chunked(path, monkeypatch, 3)
    assert _same(whole, chunked)
    assert any("lenient" in w for w in chunked.warnings)
    kern = chunked.events.filter(pl.col("kind") == "kernel").row(0, named=True)
    assert (kern["device"], kern["stream"]) == (0, 7)  # bad stream → null → the row's tid


@pytest.mark.usefixtures("python_reader")
def test_unused_mistyped_arg_does_not_force_lenient_decode(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Above RAW_MIN_BYTES only the args a row's category uses are decoded: a `stream` list on a
    cpu_op (never read) no longer costs the lenient whole-file pass; the frames are those of the
    lenient decode, which drops that field anyway."""

    evs = [ev(ts=100 + i, args={"External id": i, "stream": [1, 2]}) for i in range(5)]
    path = write(tmp_path, "unused.json", {"traceEvents": evs})
    whole, chunked = _whole_and_chunked(path, monkeypatch)
    assert any("lenient" in w for w in whole.warnings)
    assert chunked.warnings == ()
    assert all(x.equals(y) for x, y in zip(_frames(whole), _frames(chunked), strict=True))
    assert chunked.events.get_column("external_id").to_list() == list(range(5))


def test_gpu_masks_match_categories() -> None:
    """GPU rows are found through the category's kind: the same rows as `cat ∈ GPU_CATS`."""
    from moetune.analyzer.readers.kineto_format import GPU_CAT_KINDS, GPU_CATS, KIND_OF_CAT

    cats = [*KIND_OF_CAT, "ac2g", "Trace", "fwdbwd", "", "KERNEL"]
    assert [c in GPU_CATS for c in cats] == [
        KIND_OF_CAT.get(c, "other") in GPU_CAT_KINDS for c in cats
    ]


@settings(max_examples=60, deadline=None)
@given(
    st.lists(
        st.one_of(st.none(), st.integers(-(2**63), 2**63 - 1), st.integers(2**52, 2**54)),
        max_size=40,
    )
)
def test_float_column_from_ints_rounds_like_float(values: list[int | None]) -> None:
    """ts/dur ints are built as Int64 then cast: identical to float(v) for every int64."""
    from moetune.analyzer.readers.kineto_columns import _num_series

    got = _num_series("ts", values, pl.Float64)
    assert got.dtype == pl.Float64
    assert got.to_list() == [None if v is None else float(v) for v in values]


def test_id_series_fast_and_fallback_paths() -> None:
    from moetune.analyzer.readers.kineto_columns import _id_series

    assert _id_series("pid", [1, None, 2**40]).to_list() == [1, None, 2**40]
    odd = [1, "Spans", "stream 7", "", 2.0, 2**70, None, "-3"]
    assert _id_series("tid", odd).to_list() == [1, None, 7, None, 0, None, None, -3]


KIND_OF_CAT_FOR_TEST = ["cpu_op", "kernel", "Kernel", "gpu_memcpy", "cuda_runtime", "cuda_sync"]
_ODD_ARGS = st.fixed_dictionaries(
    {},
    optional={
        "External id": st.integers(0, 2**40),
        "correlation": st.integers(0, 2**40),
        "device": st.integers(0, 7),
        "stream": st.integers(0, 300),
        "bytes": st.integers(0, 2**31),
        "graph id": st.integers(0, 9),
        "Collective name": st.sampled_from(["allreduce", "all_to_allv"]),
        "In msg nelems": st.integers(0, 2**30),
        "Group size": st.integers(1, 8),
        "dtype": st.sampled_from(["Float", "BFloat16"]),
        "In split size": st.sampled_from(["[]", "[1, 2]"]),
        "Process Group Ranks": st.sampled_from(["[0, 1]", "[0, 1, 2, 3]"]),
        "Seq": st.integers(0, 99),
    },
)


@settings(
    max_examples=30, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    rows=st.lists(
        st.tuples(
            st.sampled_from(["X", "X", "i", "s", "f", "M"]),
            st.sampled_from([*KIND_OF_CAT_FOR_TEST, "ac2g", "Trace"]),
            st.sampled_from(["aten::mm", "record_param_comms", "Memcpy DtoH (Device -> Pinned)"]),
            st.integers(0, 10**6),
            _ODD_ARGS,
        ),
        min_size=1,
        max_size=40,
    ),
    chunk=st.integers(1, 7),
)
def test_lean_chunks_equal_full_decode(
    tmp_path_factory: pytest.TempPathFactory,
    rows: list[tuple[str, str, str, int, dict]],
    chunk: int,
) -> None:
    """Random mixes of categories, phases and args: lean Structs + second-pass GPU/collective
    args, decoded in place in chunks, give the frames of the full whole-file typed decode."""
    evs = [
        {"ph": ph, "cat": cat, "name": name, "pid": 1, "tid": 2, "ts": ts, "dur": 3, "id": i}
        | ({"args": args} if args else {})
        for i, (ph, cat, name, ts, args) in enumerate(rows)
    ]
    path = write(tmp_path_factory.mktemp("lean"), "t.json", {"traceEvents": evs})
    old = (kineto_decode.RAW_MIN_BYTES, kineto_columns.CHUNK, kineto_scan.USE_COMPILED)
    try:
        kineto_scan.USE_COMPILED = False
        kineto_decode.RAW_MIN_BYTES = 1 << 40
        whole = read_kineto(path, default_rank=0)
        kineto_decode.RAW_MIN_BYTES, kineto_columns.CHUNK = 0, chunk
        chunked = read_kineto(path, default_rank=0)
    finally:
        kineto_decode.RAW_MIN_BYTES, kineto_columns.CHUNK, kineto_scan.USE_COMPILED = old
    assert _same(whole, chunked)


@pytest.mark.usefixtures("python_reader")
def test_two_copies_of_the_reader_coexist(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The buffer-address helper (`kineto_columns._address`) declares its own ctypes function
    objects: a second copy of its module (importlib.reload, a bench comparing two readers) must
    not retype the first's."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("kineto_columns_copy", kineto_columns.__file__)
    assert spec and spec.loader
    copy = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, "kineto_columns_copy", copy)
    spec.loader.exec_module(copy)
    path = write(tmp_path, "t.json", {"traceEvents": [ev(ts=100 + i) for i in range(9)]})
    monkeypatch.setattr(kineto_decode, "RAW_MIN_BYTES", 0)  # raw slices, decoded in place
    for mod in (kineto_columns, copy, kineto_columns):
        monkeypatch.setattr(mod, "CHUNK", 4)
        data = kineto_decode._open(path)
        doc, _ = kineto_decode._decode_top(data, path)
        assert mod._address(data) is not None
        raw, _ = mod._columns(doc.traceEvents, data)
        assert raw.height == 9


@pytest.mark.usefixtures("python_reader")
def test_released_pages_read_back_from_the_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Pages of decoded chunks are dropped from the private map; anything touching them again
    (the lenient fallback here, forced by a mistyped event near the end) reads the file's bytes."""
    evs = [{"ph": "X", "cat": "kernel", "name": f"k{i}", "pid": 0, "tid": 7, "ts": 10.0 * i,
            "dur": 5.0, "args": {"correlation": i, "stream": 7, "device": 0}} for i in range(3000)]
    good = tmp_path / "good.json"
    good.write_text(json.dumps({"traceEvents": evs}, indent=1))
    bad_evs = [*evs[:-1], {**evs[-1], "dur": {"oops": 1}}]
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"traceEvents": bad_evs}, indent=1))
    released: list[int] = []
    real = kineto_columns._release_pages

    def spy(data, origin, last):  # type: ignore[no-untyped-def]
        released.append(1)
        real(data, origin, last)

    monkeypatch.setattr(kineto_columns, "_release_pages", spy)
    monkeypatch.setattr(kineto_decode, "RAW_MIN_BYTES", 0)
    monkeypatch.setattr(kineto_columns, "CHUNK", 100)
    before = bad.read_bytes()
    a = read_kineto(good, default_rank=0)
    n_good = len(released)
    b = read_kineto(bad, default_rank=0)  # chunks released, then the whole file re-decoded
    assert n_good == 30 and len(released) > n_good
    assert bad.read_bytes() == before
    assert a.events.height == b.events.height == 3000  # the mistyped field is nulled, not the row
    assert a.events.head(2999).equals(b.events.head(2999))  # every other byte read back intact
    assert b.events.get_column("name")[-1] == "k2999"
    assert b.warnings == (f"{bad.name}: fields with unexpected types ignored (lenient decode)",)


def test_deeply_nested_json_is_one_line_not_a_traceback(tmp_path: Path) -> None:
    """100,000 levels of nesting overflow any recursive decoder: one line, exit 2 (issue #17)."""
    deep = b'{"traceEvents": [' + b"[" * 100_000 + b"]" * 100_000 + b"]}"
    one_line_error(write(tmp_path, "deep.json", deep), "nested too deeply")
    one_line_error(write(tmp_path, "deep.json.gz", deep, gz=True), "nested too deeply")


@pytest.mark.parametrize("compiled", [True, False])
def test_negative_durations_are_dropped_and_counted(tmp_path: Path, compiled: bool,
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    """A writer's negative `dur` is no interval: dropped, with the count in one warning (it had
    been clipped to 0 silently and moved the walls; issue #17)."""
    monkeypatch.setattr(kineto_scan, "USE_COMPILED", compiled)
    events = [ev(ts=100 + i * 10, dur=-3 if i < 3 else 5) for i in range(8)]
    tr = read_kineto(write(tmp_path, "neg.json", {"traceEvents": events}), default_rank=0)
    assert tr.events.height == 5 and (tr.events["dur_ns"] >= 0).all()
    assert "neg.json: 3 event(s) with a negative duration dropped" in tr.warnings  # names it


def test_nan_literals_are_read_as_unknown_not_a_parse_error(tmp_path: Path) -> None:
    """Python's json.dump writes NaN; JSON has no such literal. The values read as unknown and
    the warning counts them, instead of 'invalid character (byte N)'."""
    text = json.dumps({"traceEvents": [ev(ts=100, dur=float("nan")), ev(ts=200, dur=5),
                                       ev(ts=300, name="NaN handling", dur=float("inf"))]})
    assert "NaN" in text and "Infinity" in text
    tr = read_kineto(write(tmp_path, "nan.json", text), default_rank=0)
    assert "nan.json: 2 NaN/Infinity value(s) read as unknown" in tr.warnings  # names the file
    assert "NaN handling" in tr.events["name"].to_list()  # a name that says NaN is untouched
