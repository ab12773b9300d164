"""The wall of each event (compute, communication, memory, host) for analyses that may run on a
trace the classifier has not seen yet: its `wall` column when present, else the classifier, else
name rules."""

from __future__ import annotations

import polars as pl
from moetune.analyzer.classify import classify
from moetune.analyzer.frames import GPU_KINDS

# Fallback kernel → wall rules, used only until analyzer/classify.py provides `wall`.
_COMM_PATTERN = r"(?i)^(nccl|ncclDev|ncclKernel)|nccl|deep_ep::|hybrid_ep::|nvshmem|userbuffers|kuserbuffers|^rccl"


def wall_of(events: pl.DataFrame) -> pl.Series:
    """Wall of each event: the classifier's `wall` column when present, else name rules.

    The classifier (analyzer/classify.py, kernel_classes.yaml) decides GPU rows; host rows are
    `host`. Without classifier input columns, a name fallback: copies/memsets → memory; NCCL,
    DeepEP, HybridEP, NVSHMEM, userbuffers kernels → communication; other GPU work → compute.
    """
    if "wall" in events.columns:
        wall = events.get_column("wall").cast(pl.String)
    elif {"copy_kind", "bytes", "sync_kind"} <= set(events.columns):
        wall = classify(events).get_column("wall").cast(pl.String)
    else:
        wall = None
    if wall is not None:
        gpu = events.get_column("kind").is_in(list(GPU_KINDS))
        return wall.zip_with(gpu, pl.Series(["host"] * events.height)).rename("wall")
    kind = pl.col("kind")
    return events.select(
        pl.when(kind.is_in(["memcpy", "memset"]))
        .then(pl.lit("memory"))
        .when((kind == "kernel") & pl.col("name").str.contains(_COMM_PATTERN))
        .then(pl.lit("communication"))
        .when(kind.is_in(list(GPU_KINDS)))
        .then(pl.lit("compute"))
        .otherwise(pl.lit("host"))
        .alias("wall")
    ).to_series()
