"""The Kineto reader's columns → canonical frames (`moetune.analyzer.frames`): events, collective
calls, flow endpoints, allocator samples, and the rank's row (from `distributedInfo` and
`deviceProperties`).
"""

from __future__ import annotations

from pathlib import Path

import polars as pl
from moetune.analyzer.frames import (
    COMMS_SCHEMA,
    EVENTS_SCHEMA,
    FLOWS_SCHEMA,
    KIND,
    MEMORY_SCHEMA,
    RANKS_SCHEMA,
    conform,
    copy_mem_of_name,
)
from moetune.analyzer.readers.kineto_format import (
    COPY_KINDS_IN_NAME,
    DEVICE_KINDS,
    PH_INSTANT,
    SYNC_KIND_OF_NAME,
    Num,
    _Device,
    _Dist,
)


def _events(timed: pl.LazyFrame, rank: int) -> pl.DataFrame:
    kind = (
        pl.when(pl.col("ph_code") == PH_INSTANT)
        .then(pl.lit("instant", dtype=KIND))
        .otherwise(pl.col("cat_kind"))
    )
    df = timed.with_columns(kind.alias("kind"))
    on_gpu = pl.col("kind").is_in(DEVICE_KINDS)
    df = df.with_columns(
        pl.lit(rank, dtype=pl.Int32).alias("rank"),
        pl.col("dur_ns").clip(lower_bound=0).fill_null(0),
        pl.when(on_gpu).then(pl.col("device").fill_null(pl.col("pid"))).alias("device"),
        pl.when(on_gpu).then(pl.col("stream").fill_null(pl.col("tid"))).alias("stream"),
        pl.when(pl.col("kind").is_in(["memcpy", "memset"])).then(pl.col("bytes")).alias("bytes"),
        # PyTorch 2.10+ writes -1 for a wait it could not resolve: unknown, not stream -1
        pl.when(pl.col("wait_on_stream") >= 0).then(pl.col("wait_on_stream")).alias("wait_stream"),
        pl.when(pl.col("wait_on_cuda_event_record_corr_id") >= 0)
        .then(pl.col("wait_on_cuda_event_record_corr_id")).alias("wait_correlation"),
    ).collect()
    # "Memcpy DtoH (Device -> Pageable)": the direction is chars 7-10 (a slice, not a regex).
    copy = pl.col("name").str.slice(7, 4)
    copy_kind = pl.when(copy.is_in(COPY_KINDS_IN_NAME)).then(copy).otherwise(pl.lit("other"))
    # ... and its memory kinds are the parenthesised endpoints (CUPTI's labels, as nsys has them)
    copy_mem_ = copy_mem_of_name(pl.col("name"))
    sync_kind = pl.col("name").replace_strict(
        SYNC_KIND_OF_NAME, default="other", return_dtype=pl.String
    )
    df = df.with_columns(
        _on_kind(df, "memcpy", copy_kind, EVENTS_SCHEMA["copy_kind"]).alias("copy_kind"),
        _on_kind(df, "memcpy", copy_mem_, EVENTS_SCHEMA["copy_mem"]).alias("copy_mem"),
        _on_kind(df, "sync", sync_kind, EVENTS_SCHEMA["sync_kind"]).alias("sync_kind"),
    )
    # Non-strict: a device id beyond Int32 (a corrupt arg) reads as unknown, as `_i32` does. Built
    # from the Series, not by `select`: a select aligns the columns' chunks first, copying every
    # string of `name` (+46 MB at the reader's peak on a 140 MB trace).
    cols = (df.get_column(c) for c in EVENTS_SCHEMA)
    return pl.DataFrame([s if s.dtype == t else s.cast(t, strict=False)
                         for s, t in zip(cols, EVENTS_SCHEMA.values(), strict=True)])


def _on_kind(df: pl.DataFrame, kind: str, expr: pl.Expr, dtype: pl.DataType) -> pl.Series:
    """`expr` (over `name`) on the rows of one kind, null elsewhere: the string work runs on those
    few rows only (`when(kind).then(expr)` would evaluate `expr` on every row)."""
    out = pl.repeat(None, df.height, dtype=dtype, eager=True)
    idx = (df.get_column("kind") == kind).arg_true()
    if idx.len():
        vals = df.select(pl.col("name").gather(idx)).select(expr.cast(dtype)).to_series()
        out = out.scatter(idx, vals)
    return out


def _memory(mem: pl.DataFrame, rank: int) -> pl.DataFrame:
    """Allocator events (`[memory]` instants) in file order, per MEMORY_SCHEMA."""
    return conform(
        mem.sort("row").select(
            pl.lit(rank, dtype=pl.Int32).alias("rank"),
            "ts_ns",
            pl.col("mem_device_type").alias("device_type"),
            pl.col("mem_device").alias("device"),
            pl.col("mem_bytes").alias("bytes"),
            pl.col("total_allocated").alias("allocated"),
            pl.col("total_reserved").alias("reserved"),
        ),
        MEMORY_SCHEMA,
    )


def _flows(flow: pl.DataFrame, rank: int) -> pl.DataFrame:
    """Flow endpoints (the side frame of `s`/`f`/`t` rows, ts already in ns) per FLOWS_SCHEMA."""
    df = flow.filter(pl.col("ts_ns").is_not_null())
    df = df.with_columns(
        pl.lit(rank, dtype=pl.Int32).alias("rank"),
        pl.col("id").alias("flow_id"),
        pl.col("ph").alias("phase"),
    )
    return conform(df, FLOWS_SCHEMA)


COMM_ANNOTATION = r"^(?:nccl|gloo|ucc|mpi|xccl|hccl):(.+)$"


def _comms(meta: pl.DataFrame, events: pl.DataFrame, rank: int) -> pl.DataFrame:
    """One row per collective call.

    1. `record_param_comms` cpu_ops with metadata (correlation taken from the NCCL kernel the
       writer copied the same metadata onto, joined by External id);
    2. NCCL kernels with metadata whose host call is not in the file;
    3. where a call has no metadata at all (old traces), its `nccl:<coll>` / `gloo:<coll>`
       annotation (the profiling title PyTorch's c10d gives the call, ProcessGroupNCCL.cpp:
       `nccl:all_reduce`, …), collective = the suffix, other fields null.
    """
    cols = [
        "ts_ns",
        "dur_ns",
        "pid",
        "tid",
        "external_id",
        "correlation",
        "collective",
        "in_nelems",
        "out_nelems",
        "group_size",
        "dtype",
        "in_split",
        "out_split",
        "pg_name",
        "pg_desc",
        "pg_ranks",
        "seq",
    ]
    host = meta.filter(pl.col("cat_kind") == "cpu_op").select(cols)
    gpu = meta.filter(pl.col("cat_kind") == "kernel").select(cols)
    kern_corr = (
        gpu.filter(pl.col("external_id").is_not_null())
        .group_by("external_id")
        .agg(pl.col("correlation").min().alias("_corr"))
    )
    host = (
        host.join(kern_corr, on="external_id", how="left")
        .with_columns(pl.col("correlation").fill_null(pl.col("_corr")))
        .drop("_corr")
    )
    gpu_only = gpu.join(host.select("external_id").drop_nulls(), on="external_id", how="anti")

    ann = (
        events.filter(pl.col("kind") == "annotation")
        .with_columns(pl.col("name").str.extract(COMM_ANNOTATION).alias("collective"))
        .filter(pl.col("collective").is_not_null())
        .select("ts_ns", "dur_ns", "pid", "tid", "external_id", "collective")
    )
    if ann.height and host.height:
        ann = ann.filter(~_overlaps_any(ann, host))
    out = pl.concat(
        [
            host.drop("pid", "tid"),
            gpu_only.drop("pid", "tid"),
            _conform_partial(ann.drop("pid", "tid"), host.drop("pid", "tid")),
        ],
        how="vertical_relaxed",
    )
    out = out.with_columns(pl.lit(rank, dtype=pl.Int32).alias("rank")).sort("ts_ns")
    return conform(out, COMMS_SCHEMA)


def _conform_partial(df: pl.DataFrame, like: pl.DataFrame) -> pl.DataFrame:
    return df.select(
        pl.col(c).cast(t) if c in df.columns else pl.lit(None, dtype=t).alias(c)
        for c, t in like.schema.items()
    )


def _overlaps_any(ann: pl.DataFrame, host: pl.DataFrame) -> pl.Series:
    """For each annotation: does a metadata-carrying host call on the same thread overlap it?"""
    h = host.select("pid", "tid", "ts_ns", (pl.col("ts_ns") + pl.col("dur_ns")).alias("_end")).sort(
        "ts_ns"
    )
    a = ann.with_row_index("_i").with_columns((pl.col("ts_ns") + pl.col("dur_ns")).alias("_aend"))
    a = a.with_columns(pl.col("pid").fill_null(-1), pl.col("tid").fill_null(-1)).sort("ts_ns")
    h = h.with_columns(pl.col("pid").fill_null(-1), pl.col("tid").fill_null(-1))
    back = a.join_asof(
        h.rename({"ts_ns": "_hts"}),
        left_on="ts_ns",
        right_on="_hts",
        by=["pid", "tid"],
        strategy="backward",
        check_sortedness=False,
    )
    fwd = a.join_asof(
        h.rename({"ts_ns": "_hts"}),
        left_on="ts_ns",
        right_on="_hts",
        by=["pid", "tid"],
        strategy="forward",
        check_sortedness=False,
    )
    hit_b = back.select("_i", (pl.col("_end") > pl.col("ts_ns")).fill_null(False).alias("b"))
    hit_f = fwd.select("_i", (pl.col("_hts") < pl.col("_aend")).fill_null(False).alias("f"))
    hits = hit_b.join(hit_f, on="_i").sort("_i")
    return hits.get_column("b") | hits.get_column("f")


def _ranks(
    dist: _Dist | None, devices: list[_Device], events: pl.DataFrame, rank: int, path: Path,
    *, declared: bool,
) -> pl.DataFrame:
    used = (
        events.filter(pl.col("kind").is_in(["kernel", "memcpy", "memset"]))
        .get_column("device")
        .drop_nulls()
        .mode()
    )
    dev_id = used.sort().item(0) if used.len() else None
    dev = next((d for d in devices if _as_int(d.id) == dev_id), devices[0] if devices else None)
    cc = None
    if dev is not None and dev.computeMajor is not None:
        cc = f"{_as_int(dev.computeMajor)}.{_as_int(dev.computeMinor) or 0}"
    row = {
        "rank": rank,
        "world_size": _i32(dist.world_size) if dist else None,
        "source": str(path),
        "format": "kineto",
        "backend": _str_or_none(dist.backend) if dist else None,
        "device_name": _str_or_none(dev.name) if dev else None,
        "num_sms": _i32(dev.numSms) if dev else None,
        "compute_capability": cc,
        "nccl_version": _str_or_none(dist.nccl_version) if dist else None,
        "clock_offset_ns": 0,
        "graph_trace_mode": "node",  # Kineto lists every graph-replayed kernel
        "device_memory_bytes": _as_int(dev.totalGlobalMem) if dev else None,
        "rank_from": "distributedInfo" if declared else "file_order",
    }
    return pl.DataFrame([row], schema=RANKS_SCHEMA)


def _as_int(v: Num) -> int | None:
    try:
        return int(float(v)) if isinstance(v, str) else (int(v) if v is not None else None)
    except (TypeError, ValueError, OverflowError):
        return None


def _i32(v: Num) -> int | None:
    """An Int32 frame field; absurd values (a corrupt header) read as unknown."""
    i = _as_int(v)
    return i if i is not None and -(2**31) <= i < 2**31 else None


def _str_or_none(v: Num) -> str | None:
    return None if v is None else str(v)
