"""Device memory from the caching allocator's own events: the peak the analysed steps reached.

PyTorch writes a `[memory]` instant for every allocation and free when profiled with
`profile_memory=True`, carrying the allocator's totals after it (`Total Allocated`: tensors
alive; `Total Reserved`: what the caching allocator holds from the driver, i.e. what an OOM is
about). The peak of `reserved` over the analysed steps, against the GPU's total memory, is the
headroom a memory-spending change (larger micro-batch, less recompute, no offload) can use; a
peak near the total is the memory wall itself. Traces without those events (the default, and
every nsys export: its `CUDA_GPU_MEMORY_USAGE_EVENTS` needs `--cuda-memory-usage=true` and is not
read yet) give `source: "none"` and nulls: unknown, never zero.

Per rank: the CUDA device (`device_type` 1) with the largest reserved peak; its events inside
[first analysed step start, last analysed step end), else (no event there) all of the rank's
events, said in `scope`. Multi-rank: the worst rank (largest reserved share, else largest peak).
"""

from __future__ import annotations

from typing import Any

import polars as pl

from analyzer.frames import MEMORY_SCHEMA, Trace, require

CUDA = 1
GIB = 2**30


def peaks(memory: pl.DataFrame, steps: pl.DataFrame) -> pl.DataFrame:
    """One row per rank: device, scope, events, peak_allocated, peak_reserved (bytes)."""
    require(memory, MEMORY_SCHEMA.names(), what="memory")
    cuda = memory.filter((pl.col("device_type") == CUDA) & pl.col("reserved").is_not_null())
    if cuda.height == 0:
        return pl.DataFrame(schema={"rank": pl.Int32, "device": pl.Int32, "scope": pl.String,
                                    "events": pl.UInt32, "peak_allocated": pl.Int64,
                                    "peak_reserved": pl.Int64})
    span = steps.group_by("rank").agg(pl.col("win_start_ns").min().alias("lo"),
                                      pl.col("win_end_ns").max().alias("hi"))
    cuda = cuda.join(span, on="rank", how="left").with_columns(
        inside=(pl.col("ts_ns") >= pl.col("lo")) & (pl.col("ts_ns") < pl.col("hi")))
    per = cuda.group_by("rank", "device").agg(
        pl.col("inside").fill_null(False).any().alias("_any"),
        pl.len().alias("_n_all"),
        pl.col("inside").fill_null(False).sum().cast(pl.UInt32).alias("_n_in"),
        pl.col("allocated").filter(pl.col("inside")).max().alias("_a_in"),
        pl.col("reserved").filter(pl.col("inside")).max().alias("_r_in"),
        pl.col("allocated").max().alias("_a_all"),
        pl.col("reserved").max().alias("_r_all"),
    )
    per = per.select(
        "rank", "device",
        pl.when("_any").then(pl.lit("window")).otherwise(pl.lit("trace")).alias("scope"),
        pl.when("_any").then("_n_in").otherwise(pl.col("_n_all").cast(pl.UInt32)).alias("events"),
        pl.when("_any").then("_a_in").otherwise("_a_all").alias("peak_allocated"),
        pl.when("_any").then("_r_in").otherwise("_r_all").alias("peak_reserved"),
    )
    # the rank's GPU: the device whose reserved peak is largest (ties: lowest ordinal)
    return (per.sort("rank", "peak_reserved", "device", descending=[False, True, False])
            .unique("rank", keep="first", maintain_order=True))


def memory_section(trace: Trace, steps: pl.DataFrame) -> dict[str, Any]:
    """`{"memory": {...}}` for the diagnosis document (paths read by rules: memory.source,
    memory.peak_reserved_gib, memory.device_gib, memory.reserved_share)."""
    per = peaks(trace.memory, steps)
    if per.height == 0:
        return {"memory": {"source": "none", "scope": None, "events": 0,
                           "peak_allocated_gib": None, "peak_reserved_gib": None,
                           "device_gib": None, "reserved_share": None, "by_rank": {}}}
    total = {}
    if "device_memory_bytes" in trace.ranks.columns:
        total = {int(r): v for r, v in trace.ranks.select("rank", "device_memory_bytes").iter_rows()
                 if v}
    by_rank: dict[str, dict[str, Any]] = {}
    for rank, device, scope, n, alloc, res in per.iter_rows():
        dev = total.get(int(rank))
        by_rank[str(rank)] = {
            "device": device, "scope": scope, "events": int(n),
            "peak_allocated_gib": _gib(alloc), "peak_reserved_gib": _gib(res),
            "device_gib": _gib(dev), "reserved_share": round(res / dev, 4) if dev and res else None,
        }
    worst = max(by_rank.values(), key=lambda r: (r["reserved_share"] or -1.0,
                                                 r["peak_reserved_gib"] or 0.0))
    return {"memory": {
        "source": "allocator_events",
        "scope": worst["scope"],
        "events": sum(r["events"] for r in by_rank.values()),
        **{k: worst[k] for k in ("peak_allocated_gib", "peak_reserved_gib", "device_gib",
                                 "reserved_share")},
        "by_rank": by_rank,
    }}


def diagnosis_section(trace: Trace, steps: Any, ctx: Any) -> dict[str, Any]:
    """`analyzer.diagnose.SECTIONS` hook."""
    table = steps.table if hasattr(steps, "table") else steps
    return memory_section(trace, table)


def summary_lines(section: dict[str, Any]) -> list[str]:
    m = section.get("memory")
    if not m or m["source"] == "none":
        return []
    line = (f"device memory: peak reserved {m['peak_reserved_gib']:.2f} GiB, allocated "
            f"{m['peak_allocated_gib']:.2f} GiB")
    if m["device_gib"]:
        line += f" of {m['device_gib']:.1f} GiB"
        if m["reserved_share"] is not None:
            line += f" ({m['reserved_share']:.0%} reserved)"
    if m["scope"] == "trace":
        line += " (whole trace: no allocator event inside the analysed steps)"
    return [line]


def _gib(b: int | None) -> float | None:
    return None if b is None else round(b / GIB, 4)
