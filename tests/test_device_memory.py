"""Device memory from the caching allocator's `[memory]` events, checked against the raw JSON."""

from __future__ import annotations

import gzip
import json
import subprocess
import sys
from pathlib import Path

import jsonschema
import polars as pl
import pytest
from moetune.analyzer.classify import classify
from moetune.analyzer.device_memory import memory_section, peaks, summary_lines
from moetune.analyzer.frames import MEMORY_SCHEMA, Trace
from moetune.analyzer.readers import load_trace
from moetune.analyzer.steps import find_steps

ROOT = Path(__file__).resolve().parents[1]
SCHEMA = json.loads((ROOT / "schemas" / "diagnosis.schema.json").read_text())
V100 = "public/kineto/hta_v100_ddp_allreduce_rank1.json.gz"


def _raw_memory_events(path: Path) -> list[dict]:
    with gzip.open(path, "rt") as fh:
        doc = json.load(fh)
    return [e for e in doc["traceEvents"] if e.get("name") == "[memory]"]


def test_v100_memory_frame_matches_the_json(corpus: Path) -> None:
    path = corpus / V100
    raw = _raw_memory_events(path)
    tr = load_trace([path])
    m = tr.memory
    assert m.schema == MEMORY_SCHEMA
    assert m.height == len(raw) == 28010
    cuda = [e["args"] for e in raw if e["args"].get("Device Type") == 1]
    got = m.filter(pl.col("device_type") == 1)
    assert got.height == len(cuda)
    assert got["reserved"].max() == max(a["Total Reserved"] for a in cuda) == 12782141440
    assert got["allocated"].max() == max(a["Total Allocated"] for a in cuda)
    assert got["bytes"].to_list() == [a["Bytes"] for a in cuda]  # order and sign (frees < 0) kept
    assert (got["bytes"] < 0).any() and (got["bytes"] > 0).any()
    assert tr.ranks["device_memory_bytes"].to_list() == [34089730048]  # deviceProperties, device 1


def test_v100_section_peaks_over_the_analysed_steps(corpus: Path) -> None:
    tr = load_trace([corpus / V100])
    steps = find_steps(classify(tr.events)).table
    sec = memory_section(tr, steps)["memory"]
    lo, hi = steps["win_start_ns"].min(), steps["win_end_ns"].max()
    inside = tr.memory.filter((pl.col("device_type") == 1) & (pl.col("ts_ns") >= lo)
                              & (pl.col("ts_ns") < hi))
    assert 0 < inside.height < tr.memory.height  # the window is a real cut of the trace
    assert sec["source"] == "allocator_events" and sec["scope"] == "window"
    assert sec["events"] == inside.height
    assert sec["peak_reserved_gib"] == round(inside["reserved"].max() / 2**30, 4)
    assert sec["peak_allocated_gib"] == round(inside["allocated"].max() / 2**30, 4)
    assert sec["device_gib"] == round(34089730048 / 2**30, 4)
    assert sec["reserved_share"] == round(inside["reserved"].max() / 34089730048, 4)
    line = summary_lines({"memory": sec})[0]
    assert line.startswith("device memory: peak reserved 11.90 GiB") and "of 31.7 GiB" in line


def test_cli_document_carries_memory_and_validates(corpus: Path) -> None:
    out = subprocess.run([sys.executable, "-m", "moetune", "diagnose", str(corpus / V100),
                          "--json"], capture_output=True, text=True, cwd=ROOT, timeout=300)
    assert out.returncode == 0, out.stderr
    doc = json.loads(out.stdout)
    jsonschema.validate(doc, SCHEMA)
    assert doc["memory"]["by_rank"]["1"]["device"] == 1


@pytest.mark.parametrize("rel", ["public/kineto/hta_a100_2rank_nccl.json.gz",
                                 "public/nsys/nsysai_mock.sqlite"])
def test_no_allocator_events_is_unknown_not_zero(corpus: Path, rel: str) -> None:
    tr = load_trace([corpus / rel])
    assert tr.memory.height == 0
    steps = find_steps(classify(tr.events)).table
    sec = memory_section(tr, steps)["memory"]
    assert sec["source"] == "none" and sec["peak_reserved_gib"] is None
    assert sec["reserved_share"] is None and summary_lines({"memory": sec}) == []


def test_nsys_device_memory_from_target_info(corpus: Path) -> None:
    tr = load_trace([corpus / "public/nsys/nsysai_mock.sqlite"])
    assert tr.ranks["device_memory_bytes"].to_list() == [10736893952] * tr.ranks.height


def _mem(rows: list[tuple]) -> pl.DataFrame:
    return pl.DataFrame(rows, schema=MEMORY_SCHEMA, orient="row")


def test_scope_falls_back_to_the_trace_and_the_rank_gpu_is_the_busiest_device() -> None:
    steps = pl.DataFrame({"rank": [0, 0], "step": [1, 2], "win_start_ns": [100, 200],
                          "win_end_ns": [200, 300]}, schema_overrides={"rank": pl.Int32})
    # rank 0: device 1 peaks higher than device 0 inside the window; CPU rows ignored
    m = _mem([(0, 150, 1, 0, 10, 10, 20), (0, 160, 1, 1, 30, 30, 50), (0, 250, 1, 1, -30, 0, 50),
              (0, 170, 0, -1, 999, 999, 10**12), (0, 400, 1, 1, 5, 99, 10**6)])
    p = peaks(m, steps)
    assert p.rows() == [(0, 1, "window", 2, 30, 50)]  # the 400 ns event is after the window
    # rank 1 has events, but none inside its steps: its peaks come from the whole trace
    steps1 = steps.with_columns(rank=pl.lit(1, dtype=pl.Int32))
    m1 = m.with_columns(rank=pl.lit(1, dtype=pl.Int32), ts_ns=pl.col("ts_ns") + 10_000)
    assert peaks(m1, steps1).rows() == [(1, 1, "trace", 3, 99, 10**6)]
    ranks = pl.DataFrame({"rank": [1], "device_memory_bytes": [4 * 10**6]},
                         schema_overrides={"rank": pl.Int32})
    sec = memory_section(Trace(events=pl.DataFrame(), memory=m1, ranks=ranks), steps1)["memory"]
    assert sec["scope"] == "trace" and sec["reserved_share"] == 0.25
    assert "whole trace" in summary_lines({"memory": sec})[0]


def test_nsys_driver_allocations_give_reserved_not_allocated() -> None:
    """fixtures/nsys/h200_mcore_hostbound_node: captured on the H200 with
    `--cuda-memory-usage=true` (capture range cudaProfilerApi, so every allocation predates the
    capture and is exported at start 0). Reserved = device + device-static bytes the driver handed
    out, checked against the SQLite table itself; allocated is not visible at that level."""
    import sqlite3

    from moetune.analyzer.diagnose import diagnose
    from moetune.analyzer.readers.nsys_source import sqlite_file

    path = ROOT / "fixtures/nsys/h200_mcore_hostbound_node.sqlite.gz"
    with sqlite_file(path) as db:
        con = sqlite3.connect(f"file:{db}?mode=ro", uri=True)
        want = con.execute("SELECT sum(CASE memoryOperationType WHEN 1 THEN -bytes ELSE bytes END) "
                           "FROM CUDA_GPU_MEMORY_USAGE_EVENTS WHERE memKind IN (2, 5)").fetchone()[0]
        con.close()
    tr = load_trace([path])
    assert tr.memory["allocated"].is_null().all() and (tr.memory["device_type"] == 1).all()
    assert tr.memory["reserved"].max() == want == 772_802_884
    doc = diagnose([path])
    jsonschema.validate(doc, SCHEMA)
    m = doc["memory"]
    assert m["source"] == "cuda_memory_usage" and m["scope"] == "window" and m["events"] == 0
    assert m["peak_reserved_gib"] == round(want / 2**30, 4) and m["peak_allocated_gib"] is None
    assert m["reserved_share"] == round(want / tr.ranks["device_memory_bytes"][0], 4)
    assert "allocated unknown" in summary_lines(doc)[0]


def test_level_carried_into_the_steps_counts() -> None:
    """8 GiB reserved at start-up and freed down to 2 inside the steps: the peak during the steps
    is the 8 held when they began, not the 2 + small allocations seen inside them."""
    g = 2**30
    mem = pl.DataFrame(
        {"rank": [0, 0, 0], "ts_ns": [0, 150, 160], "device_type": [1, 1, 1], "device": [0, 0, 0],
         "bytes": [8 * g, -6 * g, 1024], "allocated": [8 * g, 2 * g, 2 * g + 1024],
         "reserved": [8 * g, 2 * g, 2 * g + 1024]},
        schema=MEMORY_SCHEMA,
    )
    steps = pl.DataFrame({"rank": [0], "win_start_ns": [100], "win_end_ns": [200]},
                         schema={"rank": pl.Int32, "win_start_ns": pl.Int64, "win_end_ns": pl.Int64})
    row = peaks(mem, steps).row(0, named=True)
    assert row["scope"] == "window" and row["events"] == 2
    assert row["peak_reserved"] == 8 * g and row["peak_allocated"] == 8 * g
