"""Kineto reader on the public corpus (HTA and TraceLens test traces): every file, and per-file
oracles. Numbers asserted here were read from the files themselves or come from HTA's own tests.
Odd and bad inputs: test_reader_kineto_inputs.py; the fixture, round trip, chunking and fast-path
equivalences: test_reader_kineto_paths.py."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import polars as pl
import pytest
from moetune.analyzer.frames import COMMS_SCHEMA, EVENTS_SCHEMA, FLOWS_SCHEMA, RANKS_SCHEMA

from tests.kineto_reading import (
    CORPUS_FILES,
    ROOT,
    all_strings,
    kind,
    kineto,
    steps,
)

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
