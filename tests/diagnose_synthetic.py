"""Small hand-built event frames for the diagnose tests (times in ns, numbers chosen by hand)."""

from __future__ import annotations

from typing import Any

import polars as pl
from moetune.analyzer.frames import EVENTS_SCHEMA, RANKS_SCHEMA, Trace, conform, copy_mem_of_name

GEMM = "sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x128x64"
NCCL = "ncclDevKernel_AllReduce_Sum_bf16_RING_LL(ncclDevComm*, unsigned long, ncclWork*)"


def ev(kind: str, name: str, ts: int, dur: int, **kw: Any) -> dict[str, Any]:
    row = {"rank": 0, "kind": kind, "name": name, "ts_ns": ts, "dur_ns": dur, "pid": 1, "tid": 1}
    if kind in ("kernel", "memcpy", "memset"):
        row |= {"pid": 0, "tid": kw.get("stream", 7), "device": 0, "stream": 7}
    row |= kw
    return row


def launch(corr: int, ts: int, dur: int = 10, name: str = "cudaLaunchKernel", **kw: Any) -> dict[str, Any]:
    return ev("runtime", name, ts, dur, correlation=corr, **kw)


def frame(rows: list[dict[str, Any]]) -> pl.DataFrame:
    """Rows as the readers give them: a copy's memory kind, unless given, is read from its name."""
    df = conform(pl.DataFrame(rows, infer_schema_length=None), EVENTS_SCHEMA)
    return df.with_columns(pl.when(pl.col("kind") == "memcpy").then(
        pl.col("copy_mem").fill_null(copy_mem_of_name(pl.col("name")))).alias("copy_mem"))


def trace(rows: list[dict[str, Any]], rank: int = 0, source: str = "synthetic.json") -> Trace:
    ranks = conform(pl.DataFrame({"rank": [rank], "source": [source], "format": ["kineto"]}), RANKS_SCHEMA)
    return Trace(events=frame(rows), ranks=ranks)


def three_steps() -> list[dict[str, Any]]:
    """Step 1 window [100, 1100): compute 300, comm exposed 200 (busy 300), memory exposed 50
    (busy 100), idle 450 = launch-starved 260 + sync-blocked 100 + other 90.
    Step 2 window [1100, 2100): compute 100, idle 900 = launch-starved 820 + other 80.
    Step 3 is the last ProfilerStep and the profiler window cut it: 1 GPU op, under half the
    median of steps 1-2 (4 and 1), so it is dropped."""
    return [
        ev("annotation", "ProfilerStep#1", 0, 1000),
        ev("annotation", "ProfilerStep#2", 1000, 1000),
        ev("annotation", "ProfilerStep#3", 2000, 1000),
        launch(1, 10), ev("kernel", GEMM, 100, 200, correlation=1),
        launch(2, 20), ev("kernel", NCCL, 200, 300, correlation=2, stream=20),
        launch(3, 30, name="cudaMemcpyAsync"),
        ev("memcpy", "Memcpy DtoD (Device -> Device)", 450, 100, correlation=3, copy_kind="DtoD", bytes=4096),
        launch(4, 650, 40), ev("kernel", GEMM, 700, 100, correlation=4),
        ev("runtime", "cudaStreamSynchronize", 800, 100, correlation=99),
        launch(5, 1010), ev("kernel", GEMM, 1100, 100, correlation=5),
        launch(6, 2010), ev("kernel", GEMM, 2100, 100, correlation=6),
    ]
