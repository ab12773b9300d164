"""Device memory from the allocator's (or the driver's) events: the peak the analysed steps reached.

PyTorch writes a `[memory]` instant for every allocation and free when profiled with
`profile_memory=True`, carrying the allocator's totals after it (`Total Allocated`: tensors
alive; `Total Reserved`: what the caching allocator holds from the driver, i.e. what an OOM is
about). The peak of `reserved` over the analysed steps, against the GPU's total memory, is the
headroom a memory-spending change (larger micro-batch, less recompute, no offload) can use; a
peak near the total is the memory wall itself. nsys exports captured with
`--cuda-memory-usage=true` give the same `reserved` from the driver's side (every cudaMalloc /
cudaFree: the allocator's segments plus NCCL and cuBLAS buffers) but not `allocated`:
`source: "cuda_memory_usage"`. Traces with neither (the default) give `source: "none"` and
nulls: unknown, never zero.

The level carried into the analysed steps counts: a peak is the larger of the last value before
the first step and the values inside (memory held since start-up and not touched inside the
steps is still held).

Per rank: the CUDA device (`device_type` 1) with the largest reserved peak; its level over
[first analysed step start, last analysed step end) from the events inside and the last before
(`scope: window`), else (all events after the steps) all of the rank's events (`scope: trace`).
Multi-rank: the worst rank (largest reserved share, else largest peak).
"""

from __future__ import annotations

from typing import Any

import polars as pl
from moetune.analyzer.frames import MEMORY_SCHEMA, Trace, require

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
        inside=(pl.col("ts_ns") >= pl.col("lo")) & (pl.col("ts_ns") < pl.col("hi")),
        before=pl.col("ts_ns") < pl.col("lo"),
    ).with_row_index("_i").sort("rank", "device", "ts_ns", "_i")
    per = cuda.group_by("rank", "device").agg(
        # the level during the steps is known from events inside them or the last one before
        (pl.col("inside").fill_null(False).any() | pl.col("before").fill_null(False).any()).alias("_any"),
        pl.len().alias("_n_all"),
        pl.col("inside").fill_null(False).sum().cast(pl.UInt32).alias("_n_in"),
        pl.max_horizontal(pl.col("allocated").filter(pl.col("inside")).max(),
                          pl.col("allocated").filter(pl.col("before")).last()).alias("_a_in"),
        pl.max_horizontal(pl.col("reserved").filter(pl.col("inside")).max(),
                          pl.col("reserved").filter(pl.col("before")).last()).alias("_r_in"),
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
    memory.peak_reserved_gib, memory.device_gib, memory.reserved_share). Without allocator
    events `device_gib` still says the GPU's size when the trace's device properties do."""
    per = peaks(trace.memory, steps)
    total = {}
    if "device_memory_bytes" in trace.ranks.columns:
        total = {int(r): v for r, v in trace.ranks.select("rank", "device_memory_bytes").iter_rows()
                 if v}
    if per.height == 0:  # the peaks are unknown; the GPU's size may still be known
        return {"memory": {"source": "none", "scope": None, "events": 0,
                           "peak_allocated_gib": None, "peak_reserved_gib": None,
                           "device_gib": _gib(max(total.values())) if total else None,
                           "reserved_share": None, "by_rank": {}}}
    by_rank: dict[str, dict[str, Any]] = {}
    for rank, device, scope, n, alloc, res in per.iter_rows():
        dev = total.get(int(rank))
        by_rank[str(rank)] = {
            "device": device, "scope": scope, "events": int(n),
            "peak_allocated_gib": _gib(alloc), "peak_reserved_gib": _gib(res),
            "device_gib": _gib(dev), "reserved_share": round(res / dev, 4) if dev and res else None,
            "fragmentation": round(res / alloc, 4) if res and alloc else None,
        }
    worst = max(by_rank.values(), key=lambda r: (r["reserved_share"] or -1.0,
                                                 r["peak_reserved_gib"] or 0.0))
    # the caching allocator's own events carry `allocated`; the driver's (nsys) do not
    source = ("allocator_events" if trace.memory.get_column("allocated").is_not_null().any()
              else "cuda_memory_usage")
    return {"memory": {
        "source": source,
        "scope": worst["scope"],
        "events": sum(r["events"] for r in by_rank.values()),
        **{k: worst[k] for k in ("peak_allocated_gib", "peak_reserved_gib", "device_gib",
                                 "reserved_share", "fragmentation")},
        "by_rank": by_rank,
    }}


def diagnosis_section(trace: Trace, steps: Any, ctx: Any) -> dict[str, Any]:
    """`moetune.analyzer.diagnose.SECTIONS` hook."""
    table = steps.table if hasattr(steps, "table") else steps
    return memory_section(trace, table)


SOURCE_WORDS = {"allocator_events": "the trace's allocator events",
                "cuda_memory_usage": "the trace's driver allocations",
                "log": "the run's log", "snapshot": "the memory snapshot"}


def summary_lines(section: dict[str, Any]) -> list[str]:
    m = section.get("memory")
    if not m or m["source"] == "none" or (m.get("peak_reserved_gib") is None and \
            m.get("peak_allocated_gib") is None):
        return []
    alloc, res = m["peak_allocated_gib"], m.get("peak_reserved_gib")
    line = ("device memory: peak reserved "
            + (f"{res:.2f} GiB" if res is not None else "unknown") + ", allocated "
            + (f"{alloc:.2f} GiB" if alloc is not None else "unknown (driver-level events)"))
    if m["device_gib"]:
        line += f" of {m['device_gib']:.1f} GiB"
        if m["reserved_share"] is not None:
            line += f" ({m['reserved_share']:.0%} reserved)"
    if m["scope"] == "trace":
        line += " (whole trace: no allocator event before or inside the analysed steps)"
    src = SOURCE_WORDS.get(m["source"], m["source"])
    files = ", ".join(m.get("files") or [])
    where = {"log": f" (max since start, after iteration {m.get('iteration')})",
             "snapshot": " (over the recorded history)"}.get(m["source"], "")
    line += f"; source: {src}{f' {files}' if files else ''}{where}"
    out = [line]
    for o in m.get("other_sources") or []:
        out.append(f"  also {SOURCE_WORDS.get(o['source'], o['source'])}: allocated "
                   f"{_num(o['peak_allocated_gib'])} GiB, reserved {_num(o['peak_reserved_gib'])}"
                   " GiB")
    for site in (m.get("largest") or [])[:3]:
        out.append(f"  largest at the peak (snapshot): {site['site']} {site['gib']:.2f} GiB in "
                   f"{site['allocations']} allocation(s)")
    out += [f"  note: {n}" for n in m.get("notes") or []]
    return out


def _num(x: float | None) -> str:
    return "?" if x is None else f"{x:.2f}"


def _gib(b: int | None) -> float | None:
    return None if b is None else round(b / GIB, 4)
