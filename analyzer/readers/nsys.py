"""Nsight Systems SQLite export → canonical `Trace` (same frames as the Kineto reader).

Mapping (tables of the Nsight Systems SQLite export, NVIDIA Nsight Systems User Guide):

- CUPTI_ACTIVITY_KIND_KERNEL → `kernel` (demangled name; graphNodeId/graphId when non-zero)
- CUPTI_ACTIVITY_KIND_GRAPH_TRACE → `graph` (graph-level trace mode: one row per replay)
- CUPTI_ACTIVITY_KIND_MEMCPY / _MEMSET → `memcpy` / `memset`, named like Kineto's
- CUPTI_ACTIVITY_KIND_RUNTIME → `runtime`, version suffix stripped (`cudaLaunchKernel_v7000` →
  `cudaLaunchKernel`); pure query calls Kineto never records are dropped (NOISE_APIS)
- CUPTI_ACTIVITY_KIND_SYNCHRONIZATION → `sync`, named like Kineto's cuda_sync rows
- NVTX_EVENTS ranges → `annotation`, marks → `instant`; NCCL API ranges also → comms rows

Ranks: one per (process, device) pair that ran GPU work, numbered from `first_rank` in
(device, pid) order, unless every process carries an NCCL `ncclCommInitRank` payload naming its
rank. A process that launched kernels but has no GPU row in the export is named in a warning. GPU and sync rows have pid = device and tid = stream (as in Kineto); host rows keep the
host pid/tid (globalTid decoded as the Nsight Systems docs' SQLite examples do: pid =
globalTid / 0x1000000 % 0x1000000, tid = globalTid % 0x1000000).
"""

from __future__ import annotations

import json
import os
import re
import struct
import subprocess
import sys
import tempfile
from pathlib import Path

import polars as pl
from moetune.analyzer.frames import (
    COMMS_SCHEMA,
    EVENTS_SCHEMA,
    MEMORY_SCHEMA,
    RANKS_SCHEMA,
    Trace,
    conform,
    copy_mem,
    empty,
)
from moetune.analyzer.readers.kineto import MAX_DUR_NS
from moetune.analyzer.readers.nsys_db import NSYS_MARKERS, Db
from moetune.analyzer.readers.nsys_source import sqlite_file

from moetune.errors import UserError

KERNEL = "CUPTI_ACTIVITY_KIND_KERNEL"
RUNTIME = "CUPTI_ACTIVITY_KIND_RUNTIME"
MEMCPY = "CUPTI_ACTIVITY_KIND_MEMCPY"
MEMSET = "CUPTI_ACTIVITY_KIND_MEMSET"
SYNC = "CUPTI_ACTIVITY_KIND_SYNCHRONIZATION"
GRAPH = "CUPTI_ACTIVITY_KIND_GRAPH_TRACE"
CUDA_EVENT = "CUPTI_ACTIVITY_KIND_CUDA_EVENT"
NVTX = "NVTX_EVENTS"

I64 = pl.Int64
NONE_U32 = 0xFFFFFFFF  # CUPTI's "no id" for stream / event ids
PID_SQL = "((({c}) >> 24) & 16777215)"  # globalPid / globalTid → OS pid (module docstring)
TID_SQL = "(({c}) & 16777215)"


def pid_tid(gtid: str) -> tuple[pl.Expr, pl.Expr]:
    """PID_SQL / TID_SQL as polars expressions on column `gtid` (floor division is SQLite's
    arithmetic shift), for a table read with one value per row to convert, not two."""
    c = pl.col(gtid)
    return (c.floordiv(1 << 24) & 0xFFFFFF).alias("hpid"), (c & 0xFFFFFF).alias("tid")

# Runtime/driver calls that only query state. Kineto does not record them and nsys records them
# nested inside launches (cuKernelGetName inside every cudaLaunchKernel), so keeping them would
# double host time and make nsys and Kineto host walls disagree. Matched after suffix stripping.
NOISE_APIS = re.compile(
    r"^(cuKernelGet\w*|cuKernelSetAttribute|cuFuncGet\w*|cuGetProcAddress|cuOccupancy\w*"
    r"|cudaOccupancy\w*|cudaStreamIsCapturing|cudaStreamGetCaptureInfo\w*"
    r"|cudaThreadExchangeStreamCaptureMode|cudaGetDevice\w*|cudaGetLastError|cudaPeekAtLastError"
    r"|cudaGetFuncBySymbol|cudaGetDriverEntryPoint\w*|cuCtxGetCurrent|cuCtxGetDevice"
    r"|cuDevicePrimaryCtxGetState|cuPointerGetAttributes?|cudaPointerGetAttributes"
    r"|cuModuleGetLoadingMode|cuDeviceGetAttribute|cudaFuncGetAttributes)$"
)
VERSION_SUFFIX = r"(_v\d+)+$"  # cudaLaunchKernel_v7000, cudaStreamGetCaptureInfo_v2_v11030

COPY_KIND_BY_ID = {1: "HtoD", 2: "DtoH", 8: "DtoD", 9: "HtoH", 10: "PtoP"}
MEM_KIND_NAMES = {0: "Pageable", 1: "Pinned", 2: "Device", 3: "Array", 4: "Managed",
                  5: "Device Static", 6: "Managed Static"}  # ENUM_CUDA_MEM_KIND (fallback)
# CUPTI syncType → (sync_kind, Kineto cuda_sync event name)
SYNC_BY_TYPE = {
    1: ("event_sync", "Event Sync"),
    2: ("stream_wait_event", "Stream Wait Event"),
    3: ("stream_sync", "Stream Sync"),
    4: ("context_sync", "Context Sync"),
}
# Runtime API (suffix stripped) → sync_kind, overriding CUPTI's syncType when they disagree.
SYNC_BY_API = {
    "cudaStreamSynchronize": "stream_sync",
    "cudaEventSynchronize": "event_sync",
    "cudaEventQuery": "event_sync",
    "cudaStreamWaitEvent": "stream_wait_event",
    "cudaDeviceSynchronize": "context_sync",
    "cudaCtxSynchronize": "context_sync",
    "cuStreamSynchronize": "stream_sync",
    "cuEventSynchronize": "event_sync",
    "cuStreamWaitEvent": "stream_wait_event",
    "cuCtxSynchronize": "context_sync",
}
NVTX_RANGES = (59, 60, 70, 71)  # push/pop and start/end ranges (NVTX and NVTXt)
NVTX_MARKS = (34, 65)
# NCCL API NVTX range → collective (Kineto spelling where one exists)
NCCL_API = {
    "ncclAllReduce": "allreduce",
    "ncclAllGather": "allgather",
    "ncclReduceScatter": "reduce_scatter",
    "ncclBroadcast": "broadcast",
    "ncclBcast": "broadcast",
    "ncclReduce": "reduce",
    "ncclSend": "send",
    "ncclRecv": "recv",
    "ncclAllToAll": "all_to_all",
    "ncclAlltoAll": "all_to_all",
    "ncclGather": "gather",
    "ncclScatter": "scatter",
}
# What a missing table costs the analysis (named in the Trace warning).
MISSING_MEANS = {
    KERNEL: "no per-kernel rows",
    RUNTIME: "no launch or host API rows",
    MEMCPY: "no copies",
    MEMSET: "no memsets",
    SYNC: "no host synchronization rows",
    NVTX: "no NVTX ranges: no iteration ranges, no NCCL API calls",
    "StringIds": "kernel and API names unknown",
    "TARGET_INFO_GPU": "device name, SM count and compute capability unknown",
    "TARGET_INFO_SESSION_START_TIME": "clock offset unknown, ranks from separate reports unaligned",
}
GRAPH_MODE_WARNING = (
    "nsys captured CUDA graphs in graph-level mode (--cuda-graph-trace=graph): each replay is one "
    "opaque `graph` row, so the kernel classes inside replays (GEMM, communication, copies) are "
    "invisible and their time counts as compute; re-capture with --cuda-graph-trace=node to see them"
)


def read_nsys(path: Path, *, first_rank: int) -> Trace:
    """Read one nsys export (.sqlite, .sqlite.gz, or .nsys-rep via `nsys export`)."""
    path = Path(path)
    with sqlite_file(path) as db_path:
        db = Db.open(db_path, shown=path)
        try:
            return _read(db, path, first_rank)
        finally:
            db.close()


def _read(db: Db, path: Path, first_rank: int) -> Trace:
    if not any(t in db.tables for t in NSYS_MARKERS) and not any(
        t.startswith("CUPTI_ACTIVITY_KIND_") for t in db.tables
    ):
        raise UserError(
            "is a SQLite database but not an Nsight Systems export (no CUPTI_ACTIVITY_KIND_*, "
            "NVTX_EVENTS or StringIds tables)",
            path=path,
        )
    strings = _strings(db)
    side = _start_side_fetch(db) if _worth_a_worker(db) else None
    if side is None:
        (kernels, graphs), (memsets, memcpys) = _worker_share(db, strings), _copies(db)
    try:
        runtime = _runtime(db, strings)
        nvtx = _nvtx(db, strings)
        if side is not None:
            # The copies are read here while the worker reads the kernels (the larger share).
            # Schema notes keep the order of reading the worker's tables first.
            marks = len(db.missing_tables), len(db.missing_columns)
            memsets, memcpys = _copies(db)
            later = db.missing_tables[marks[0]:], db.missing_columns[marks[1]:]
            del db.missing_tables[marks[0]:], db.missing_columns[marks[1]:]
            got, side = _finish_side_fetch(db, *side), None
            kernels, graphs = got if got is not None else _worker_share(db, strings)
            db.missing_tables += [t for t in later[0] if t not in db.missing_tables]
            db.missing_columns += [c for c in later[1] if c not in db.missing_columns]
            if "name_id" in kernels.columns:  # names joined here share one string buffer
                kernels = _name(kernels, strings, "name_id")
    finally:
        if side is not None:  # this process failed first: stop the worker, remove its files
            side[0].kill()
            side[0].wait()
            side[1].cleanup()
    if kernels.height == 0 and graphs.height == 0:
        raise UserError(
            "holds no GPU kernels or graph replays (CPU-only capture, or CUDA tracing was off: "
            "profile with `nsys profile -t cuda,nvtx`)",
            path=path,
        )
    gpu = [f for f in (kernels, graphs, memcpys, memsets) if f.height]
    gpu_all = pl.concat(gpu, how="diagonal_relaxed")
    del memcpys, memsets
    sync = _syncs(db, runtime)

    real = _nccl_init_ranks(db)
    pairs, named = _rank_pairs(gpu_all, real, first_rank)
    unranked = _launched_without_gpu_rows(runtime, pairs)
    gpu_all = _rank_gpu(gpu_all, pairs)
    runtime = _rank_host(runtime, pairs, gpu_all)
    sync = _rank_sync(sync, pairs)
    nvtx = _rank_host(nvtx, pairs, None)

    mode = _graph_trace_mode(db, kernels, graphs)
    replays = graphs.height + _graph_launches(runtime)
    nccl = _uses_nccl(gpu_all, nvtx)
    comms = _comms(nvtx, runtime)
    del kernels, graphs  # the parts below are the only copies kept while events are built
    parts = [p.drop("hpid") for p in (gpu_all, runtime, sync, nvtx) if p.height]
    del gpu_all, runtime, sync, nvtx
    events = conform(pl.concat(parts, how="diagonal_relaxed"), EVENTS_SCHEMA)
    del parts
    # Time order (as the Kineto reader gives); one key keeps the sort cheap on 10M-row exports.
    # `sort("ts_ns")` one column at a time: each sorted column replaces its unsorted one, so the
    # peak holds the frame plus a column, not two frames (the read's peak on a 1 GB export
    # −1.4 GB). Each column is made one chunk first: a gather across the ~100 chunks of the
    # concatenated Arrow batches looks up the chunk of every row (2.5× the time of both steps).
    # All-null columns (the constants `conform` added, graph ids of an eager capture) need no
    # order: they become constants, one chunk like the rest.
    order = events.get_column("ts_ns").arg_sort()
    for name in events.columns:
        col = events.get_column(name)
        events = events.with_columns(
            col.rechunk().gather(order) if col.null_count() < col.len()
            else pl.lit(None, dtype=col.dtype).alias(name))
    del order, col
    # nsys times count from the session start: a start over 7 days before it or a span over 7 days
    # (the Kineto reader's CUPTI-overflow bound) is a damaged row, dropped and counted
    impossible = (pl.col("ts_ns") < -MAX_DUR_NS) | (pl.col("dur_ns") > MAX_DUR_NS)
    n_impossible = events.select(impossible.fill_null(False).sum()).item()
    if n_impossible:
        events = events.filter(~impossible.fill_null(False))

    world = int(real["nranks"].max()) if real is not None and real.height else None
    ranks = _ranks(db, pairs, path, mode, nccl=nccl, world=world, named=named)

    warnings: list[str] = [
        f"{path.name}: {n_impossible} event(s) with an impossible time (a start over 7 days "
        "before the capture, or a duration over 7 days) dropped"] if n_impossible else []
    warnings += [
        f"{path.name}: process {pid} launched {n:,} kernel(s) but the export holds none of its GPU "
        "work (CUPTI records lost, or its kernels ran outside the capture): not analysed as a rank"
        for pid, n in unranked
    ]
    if mode == "graph" and replays:
        warnings.append(f"{path.name}: {GRAPH_MODE_WARNING}")
    if db.missing_tables:
        lost = "; ".join(f"{t} ({MISSING_MEANS.get(t, 'its rows')})" for t in db.missing_tables)
        warnings.append(f"{path.name}: export lacks table(s) {lost}")
    if db.missing_columns:
        warnings.append(
            f"{path.name}: export lacks column(s) {', '.join(db.missing_columns)} "
            "(older or synthetic nsys schema); those fields are null"
        )
    return Trace(events=events, comms=comms, ranks=ranks, warnings=tuple(warnings),
                 memory=_memory(db, pairs))


MEMORY_USAGE = "CUDA_GPU_MEMORY_USAGE_EVENTS"  # only with `nsys profile --cuda-memory-usage=true`
DEVICE_MEM_KINDS = "2, 5"  # ENUM_CUDA_MEM_KIND: Device, Device Static (not pinned/pageable host)
DEALLOCATION = 1  # ENUM_CUDA_DEV_MEM_EVENT_OPER


def _memory(db: Db, pairs: pl.DataFrame) -> pl.DataFrame:
    """Device memory the driver handed each (process, GPU), after every allocation and free:
    what PyTorch's caching allocator reserved plus NCCL / cuBLAS buffers, i.e. `reserved`. The
    tensors alive inside it are not visible at this level, so `allocated` is null. Allocations
    made before the capture started are exported with start 0: the level the capture began at."""
    if not db.has(MEMORY_USAGE, warn=False):
        return pl.DataFrame(schema=MEMORY_SCHEMA)
    t = MEMORY_USAGE
    cols = {
        "ts_ns": ("start", I64),
        "hpid": (_hpid(db, t), I64),
        "device": (db.col(t, "deviceId"), I64),
        "size": (db.col(t, "bytes"), I64),
        "op": (db.col(t, "memoryOperationType"), I64),
    }
    df = db.table_frame(t, cols, where=f"WHERE memKind IN ({DEVICE_MEM_KINDS})")
    if df.height == 0:
        return pl.DataFrame(schema=MEMORY_SCHEMA)
    signed = pl.when(pl.col("op") == DEALLOCATION).then(-pl.col("size")).otherwise(pl.col("size"))
    df = (df.with_row_index("_i").sort("ts_ns", "_i")
          .with_columns(signed.alias("bytes"))
          .with_columns(pl.col("bytes").cum_sum().over("hpid", "device").alias("reserved")))
    df = _rank_gpu(df, pairs).filter(pl.col("rank").is_not_null())
    return conform(df.with_columns(pl.lit(1, dtype=pl.Int32).alias("device_type"),
                                   pl.lit(None, dtype=pl.Int64).alias("allocated")), MEMORY_SCHEMA)


# --- a second process for large exports ---------------------------------------------------------
#
# Reading is bound by turning SQLite values into Python objects (one core). On a large export a
# worker process (nsys_worker.py) reads the kernels and graph replays while this process reads
# runtime, NVTX and the copies; frames come back as Arrow IPC files. Small exports stay
# in-process (a worker costs ~0.5 s to start).

PARALLEL_MIN_ROWS = 1_500_000


def _worth_a_worker(db: Db) -> bool:
    if os.environ.get("MOETUNE_NSYS_WORKERS", "2") == "1" or (os.cpu_count() or 1) < 2:
        return False
    rows = 0
    for t in (KERNEL, RUNTIME):
        if db.has(t, warn=False):  # max(rowid): O(log n); nsys tables are append-only
            rows += int(db.scalar(f'SELECT coalesce(max(rowid), 0) FROM "{t}"') or 0)
    return rows >= PARALLEL_MIN_ROWS


def _worker_share(db: Db, strings: pl.DataFrame | None) -> tuple[pl.DataFrame, pl.DataFrame]:
    """Kernels and graph replays: about as much reading as runtime, NVTX and the copies."""
    return _kernels(db, strings), _graph_replays(db)


def _copies(db: Db) -> tuple[pl.DataFrame, pl.DataFrame]:
    return _memsets(db), _memcpys(db)


SIDE_FRAMES = ("kernels", "graphs")  # what the worker writes (_worker_share)


def slim_side_frame(df: pl.DataFrame) -> tuple[pl.DataFrame, dict | None]:
    """What the worker writes of a GPU frame, and how `_restore_side_frame` rebuilds the rest:
    `pid` / `tid` (copies of device / stream, `_gpu_common`), `kind` (one value per frame) and
    all-null Int64 columns (graph ids of an eager capture) cost nothing to make again but
    nearly half of the bytes written, read back and deleted on a 1 GB export."""
    if df.height == 0 or not {"kind", "pid", "tid"} <= set(df.columns):
        return df, None
    nulls = [c for c, t in df.schema.items()
             if t == I64 and c not in ("pid", "tid") and df.get_column(c).null_count() == df.height]
    layout = {"columns": df.columns, "kind": df.get_column("kind")[0], "nulls": nulls}
    return df.drop("pid", "tid", "kind", *nulls), layout


def _restore_side_frame(df: pl.DataFrame, layout: dict | None) -> pl.DataFrame:
    if layout is None:
        return df
    return df.with_columns(
        pl.lit(layout["kind"]).alias("kind"), pl.col("device").alias("pid"),
        pl.col("stream").alias("tid"), *(pl.lit(None, dtype=I64).alias(c) for c in layout["nulls"]),
    ).select(layout["columns"])


def _start_side_fetch(db: Db) -> tuple[subprocess.Popen, tempfile.TemporaryDirectory]:
    tmp = tempfile.TemporaryDirectory(prefix="moetune-nsys-", ignore_cleanup_errors=True)
    cmd = [sys.executable, "-m", "moetune.analyzer.readers.nsys_worker", str(db.path), str(db.shown),
           tmp.name]
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return proc, tmp


def _finish_side_fetch(
    db: Db, proc: subprocess.Popen, tmp: tempfile.TemporaryDirectory
) -> tuple[pl.DataFrame, ...] | None:
    """The worker's frames, or None (caller reads in-process) if the worker failed to run."""
    out = Path(tmp.name)
    try:
        proc.wait()
        if (out / "error.txt").exists():
            raise UserError((out / "error.txt").read_text())
        if proc.returncode != 0 or not (out / "notes.json").exists():
            return None
        notes = json.loads((out / "notes.json").read_text())
        layouts = notes.get("layouts") or {}
        frames = tuple(_restore_side_frame(pl.read_ipc(out / f"{n}.arrow").rechunk(), layouts.get(n))
                       for n in SIDE_FRAMES)
    finally:
        if proc.poll() is None:
            proc.kill()
        tmp.cleanup()
    for t in notes["tables"]:
        if t not in db.missing_tables:
            db.missing_tables.append(t)
    for c in notes["columns"]:
        if c not in db.missing_columns:
            db.missing_columns.append(c)
    return frames  # type: ignore[return-value]


# --- string table -------------------------------------------------------------------------------


def _strings(db: Db) -> pl.DataFrame:
    if not db.has("StringIds"):
        return pl.DataFrame(schema={"id": I64, "value": pl.String})
    return db.query('SELECT id, value FROM "StringIds"', {"id": I64, "value": pl.String})


def _name(df: pl.DataFrame, strings: pl.DataFrame, id_col: str, out: str = "name") -> pl.DataFrame:
    """Resolve a StringIds id column to text (polars join: names become shared string views)."""
    lookup = strings.rename({"id": id_col, "value": out})
    ids = lookup.get_column(id_col)
    if ids.n_unique() < lookup.height:  # a damaged export: rows as joined
        return df.join(lookup, on=id_col, how="left", maintain_order="left").drop(id_col)
    # Ids unique: the other columns are not copied. Small ids (nsys numbers its strings from a
    # few hundred up): a table by id and a gather, not a hash join of millions of rows.
    size = int(ids.max() or 0) + 1
    if ids.len() and ids.min() >= 0 and size <= 4 * ids.len() + 4096:
        table = pl.repeat(None, size, dtype=pl.String, eager=True).scatter(ids, lookup.get_column(out))
        at = pl.col(id_col)
        pos = df.select(pl.when((at >= 0) & (at < size)).then(at).cast(pl.UInt32)).to_series()
        return df.drop(id_col).with_columns(table.gather(pos).alias(out))
    names = df.select(id_col).join(lookup, on=id_col, how="left", maintain_order="left")
    return df.drop(id_col).with_columns(names.get_column(out))


# --- GPU activity -------------------------------------------------------------------------------


def _hpid(db: Db, table: str) -> str:
    return PID_SQL.format(c='"globalPid"') if db.has_col(table, "globalPid") else "NULL"


def _gpu_cols(db: Db, table: str) -> dict[str, tuple[str, pl.DataType]]:
    """Columns every GPU activity table shares (name → SQL expression, dtype)."""
    return {
        "ts_ns": ("start", I64),
        "end": ('"end"', I64),
        "device": (db.col(table, "deviceId"), I64),
        "stream": (db.col(table, "streamId"), I64),
        "correlation": (db.col(table, "correlationId"), I64),
        "hpid": (_hpid(db, table), I64),
    }


GPU_CONSTANT_OK = ("device", "hpid", "graph_node_id", "graph_id", "src", "dst", "mem")


def _kernels(db: Db, strings: pl.DataFrame | None) -> pl.DataFrame:
    """Kernel rows; with `strings` None the `name_id` column is left for the caller to resolve."""
    if not db.has(KERNEL):
        return pl.DataFrame()
    name_col = next(
        (c for c in ("demangledName", "shortName", "mangledName") if db.has_col(KERNEL, c)), None
    )
    if name_col is None:
        db.col(KERNEL, "demangledName")
    cols = _gpu_cols(db, KERNEL) | {
        "name_id": (f'"{name_col}"' if name_col else "NULL", I64),
        "graph_node_id": (db.col(KERNEL, "graphNodeId"), I64),
        "graph_id": (db.col(KERNEL, "graphId", warn=False), I64),
    }
    df = db.table_frame(KERNEL, cols, constant_ok=GPU_CONSTANT_OK)
    if strings is not None:
        df = _name(df, strings, "name_id")
    return _gpu_common(df, "kernel").with_columns(
        # node-level trace: graph kernels carry non-zero ids; eager kernels 0 or null
        pl.when(pl.col("graph_node_id") != 0).then(pl.col("graph_node_id")).alias("graph_node_id"),
        pl.when(pl.col("graph_id") != 0).then(pl.col("graph_id")).alias("graph_id"),
    )


def _graph_replays(db: Db) -> pl.DataFrame:
    if not db.has(GRAPH, warn=False):
        return pl.DataFrame()
    cols = _gpu_cols(db, GRAPH) | {"graph_id": (db.col(GRAPH, "graphId"), I64)}
    df = db.table_frame(GRAPH, cols, constant_ok=GPU_CONSTANT_OK)
    df = df.with_columns(
        pl.format("CUDA graph {}", pl.col("graph_id").fill_null(-1)).alias("name")
    )
    return _gpu_common(df, "graph")


def _memcpys(db: Db) -> pl.DataFrame:
    if not db.has(MEMCPY):
        return pl.DataFrame()
    cols = _gpu_cols(db, MEMCPY) | {
        "bytes": (db.col(MEMCPY, "bytes"), I64),
        "copy_id": (db.col(MEMCPY, "copyKind"), I64),
        "src": (db.col(MEMCPY, "srcKind", warn=False), I64),
        "dst": (db.col(MEMCPY, "dstKind", warn=False), I64),
        "graph_node_id": (db.col(MEMCPY, "graphNodeId", warn=False), I64),
    }
    df = db.table_frame(MEMCPY, cols, constant_ok=GPU_CONSTANT_OK)
    mem = _mem_kind_names(db)
    kind = pl.col("copy_id").replace_strict(COPY_KIND_BY_ID, default="other", return_dtype=pl.String)
    src = pl.col("src").replace_strict(mem, default=None, return_dtype=pl.String)
    dst = pl.col("dst").replace_strict(mem, default=None, return_dtype=pl.String)
    ends = ["copy_id", "src", "dst"]
    # Labelled once per distinct (direction, source, destination) and joined back: the string
    # work per copy was ~1 s of the read of a 1 GB export (0.9 M copies, a handful of keys).
    labels = df.select(ends).unique().with_columns(
        kind.alias("copy_kind"), copy_mem(src, dst).alias("copy_mem")
    ).with_columns(
        # Kineto spelling: "Memcpy DtoH (Device -> Pageable)"
        pl.when(src.is_not_null() & dst.is_not_null())
        .then(pl.format("Memcpy {} ({} -> {})", pl.col("copy_kind"), src, dst))
        .otherwise(pl.format("Memcpy {}", pl.col("copy_kind")))
        .alias("name"),
    )
    df = df.join(labels, on=ends, how="left", nulls_equal=True, maintain_order="left").with_columns(
        pl.when(pl.col("graph_node_id") != 0).then(pl.col("graph_node_id")).alias("graph_node_id"),
    )
    return _gpu_common(df.drop(ends), "memcpy")


def _memsets(db: Db) -> pl.DataFrame:
    if not db.has(MEMSET):
        return pl.DataFrame()
    cols = _gpu_cols(db, MEMSET) | {
        "bytes": (db.col(MEMSET, "bytes"), I64),
        "mem": (db.col(MEMSET, "memKind", warn=False), I64),
        "graph_node_id": (db.col(MEMSET, "graphNodeId", warn=False), I64),
    }
    df = db.table_frame(MEMSET, cols, constant_ok=GPU_CONSTANT_OK)
    mem = pl.col("mem").replace_strict(_mem_kind_names(db), default=None, return_dtype=pl.String)
    df = df.with_columns(
        pl.format("Memset ({})", mem).fill_null("Memset").alias("name"),
        pl.when(pl.col("graph_node_id") != 0).then(pl.col("graph_node_id")).alias("graph_node_id"),
    )
    return _gpu_common(df.drop("mem"), "memset")


def _gpu_common(df: pl.DataFrame, kind: str) -> pl.DataFrame:
    """Shared shape of GPU rows: duration, Kineto-style pid = device and tid = stream."""
    return df.with_columns(
        pl.lit(kind).alias("kind"),
        (pl.col("end") - pl.col("ts_ns")).clip(lower_bound=0).alias("dur_ns"),
        pl.col("device").alias("pid"),
        pl.col("stream").alias("tid"),
    ).drop("end")


def _mem_kind_names(db: Db) -> dict[int, str]:
    if db.has("ENUM_CUDA_MEM_KIND", warn=False) and db.has_col("ENUM_CUDA_MEM_KIND", "label"):
        rows = db.rows('SELECT id, label FROM "ENUM_CUDA_MEM_KIND"')
        found = {int(i): str(label) for i, label in rows if i is not None and label}
        if found:
            return found
    return MEM_KIND_NAMES


# --- host activity ------------------------------------------------------------------------------


def _runtime(db: Db, strings: pl.DataFrame) -> pl.DataFrame:
    if not db.has(RUNTIME):
        return pl.DataFrame()
    # Resolve and filter names on the (small) string table, then let SQLite skip noise rows.
    names = strings.with_columns(pl.col("value").str.replace(VERSION_SUFFIX, "").alias("value"))
    noise = names.filter(pl.col("value").str.contains(NOISE_APIS.pattern))["id"].to_list()
    where = f"WHERE nameId NOT IN ({','.join(map(str, noise))})" if noise else ""
    tid = db.col(RUNTIME, "globalTid")
    cols = {
        "ts_ns": ("start", I64),
        "end": ('"end"', I64),
        "gtid": (tid, I64),  # split here, not in SQL: one value per row to convert, not two
        "correlation": (db.col(RUNTIME, "correlationId"), I64),
        "name_id": ("nameId", I64),
    }
    df = db.table_frame(RUNTIME, cols, where=where)
    df = df.select("ts_ns", "end", *pid_tid("gtid"), "correlation", "name_id")
    df = _name(df, names, "name_id")
    return df.with_columns(
        pl.lit("runtime").alias("kind"),
        (pl.col("end") - pl.col("ts_ns")).clip(lower_bound=0).alias("dur_ns"),
        pl.col("hpid").alias("pid"),
    ).drop("end")


def _graph_launches(runtime: pl.DataFrame) -> int:
    if not runtime.height:
        return 0
    return runtime.filter(pl.col("name").str.starts_with("cudaGraphLaunch")).height


def _syncs(db: Db, runtime: pl.DataFrame) -> pl.DataFrame:
    if not db.has(SYNC):
        return pl.DataFrame()
    cols = _gpu_cols(db, SYNC) | {
        "sync_type": (db.col(SYNC, "syncType"), I64),
        "event_sync_id": (db.col(SYNC, "eventSyncId", warn=False), I64),
    }
    df = db.table_frame(SYNC, cols)
    kinds = {k: v[0] for k, v in SYNC_BY_TYPE.items()}
    names = {k: v[1] for k, v in SYNC_BY_TYPE.items()}
    df = df.with_columns(
        pl.lit("sync").alias("kind"),
        (pl.col("end") - pl.col("ts_ns")).clip(lower_bound=0).alias("dur_ns"),
        pl.col("sync_type").replace_strict(kinds, default="other", return_dtype=pl.String)
        .alias("sync_kind"),
        pl.col("sync_type").replace_strict(names, default="Sync", return_dtype=pl.String)
        .alias("name"),
        pl.when(pl.col("stream") != NONE_U32).then(pl.col("stream")).alias("stream"),
    ).drop("end", "sync_type")
    if runtime.height:
        # The API that blocked is authoritative: nsys 2026.1 (corpus nsysai_mock) records a
        # cudaStreamSynchronize with syncType 2 (stream wait event), which would hide a host block.
        api = (
            runtime.filter(pl.col("name").is_in(list(SYNC_BY_API)))
            .select("hpid", "correlation", pl.col("name").alias("api"))
            .unique(["hpid", "correlation"], keep="first")
        )
        df = df.join(api, on=["hpid", "correlation"], how="left", nulls_equal=True,
                     maintain_order="left")
        by_api = pl.col("api").replace_strict(SYNC_BY_API, default=None, return_dtype=pl.String)
        names = {v[0]: v[1] for v in SYNC_BY_TYPE.values()}
        df = df.with_columns(pl.coalesce(by_api, "sync_kind").alias("sync_kind")).with_columns(
            pl.when(pl.col("api").is_not_null())
            .then(pl.col("sync_kind").replace_strict(names, default="Sync", return_dtype=pl.String))
            .otherwise(pl.col("name"))
            .alias("name")
        ).drop("api")
    # As in Kineto's cuda_sync rows: pid = device, tid = stream; the blocked host thread is the
    # runtime call with the same correlation.
    df = df.with_columns(pl.col("device").alias("pid"), pl.col("stream").alias("tid"))
    return _sync_targets(db, df)


def _sync_targets(db: Db, df: pl.DataFrame) -> pl.DataFrame:
    """Event syncs: which stream / record call they waited on, via CUDA_EVENT.eventSyncId."""
    ok = (
        db.has(CUDA_EVENT, warn=False)
        and db.has_col(CUDA_EVENT, "eventSyncId")
        and "event_sync_id" in df.columns
        and df["event_sync_id"].is_not_null().any()
    )
    if ok:
        ev = db.query(
            f"SELECT {_hpid(db, CUDA_EVENT)}, eventSyncId, correlationId, streamId "
            f"FROM {CUDA_EVENT} WHERE eventSyncId IS NOT NULL AND eventSyncId != {NONE_U32}",
            {"hpid": I64, "event_sync_id": I64, "wait_correlation": I64, "wait_stream": I64},
        ).unique(["hpid", "event_sync_id"], keep="last")
        df = df.join(ev, on=["hpid", "event_sync_id"], how="left", nulls_equal=True,
                     maintain_order="left")
    return df.drop("event_sync_id")


def _nvtx(db: Db, strings: pl.DataFrame) -> pl.DataFrame:
    if not db.has(NVTX):
        return pl.DataFrame()
    types = ",".join(map(str, NVTX_RANGES + NVTX_MARKS))
    tid = db.col(NVTX, "globalTid")
    text = db.col(NVTX, "text")
    text_id = db.col(NVTX, "textId")
    sql = (
        f'SELECT start, "end", eventType, {PID_SQL.format(c=tid)}, {TID_SQL.format(c=tid)}, '
        f"{text}, {text_id} FROM {NVTX} WHERE eventType IN ({types})"
    )
    df = db.query(
        sql,
        {"ts_ns": I64, "end": I64, "event_type": I64, "hpid": I64, "tid": I64,
         "text": pl.String, "text_id": I64},
    )
    df = _name(df, strings, "text_id", out="id_text")
    is_mark = pl.col("event_type").is_in(list(NVTX_MARKS))
    df = df.with_columns(
        pl.coalesce("text", "id_text").fill_null("").alias("name"),
        pl.when(is_mark).then(pl.lit("instant")).otherwise(pl.lit("annotation")).alias("kind"),
        pl.when(is_mark | pl.col("end").is_null())
        .then(pl.lit(0, dtype=I64))
        .otherwise((pl.col("end") - pl.col("ts_ns")).clip(lower_bound=0))
        .alias("dur_ns"),
        pl.col("hpid").alias("pid"),
    )
    # A range never closed in the capture window has no end: keep it as an instant-like marker.
    return df.drop("end", "event_type", "text", "id_text")


# --- ranks --------------------------------------------------------------------------------------


def _rank_pairs(gpu: pl.DataFrame, real: pl.DataFrame | None, first_rank: int
                ) -> tuple[pl.DataFrame, bool]:
    """(hpid, device) → rank: NCCL's own rank when every pair has one (True), else numbered from
    first_rank in (device, pid) order (False). Every (process, device) pair with GPU work is a
    rank: none is left out."""
    key = _pair_key(gpu)
    if key is None:
        pairs = gpu.select("hpid", "device").unique()
    else:  # one Int64 column made unique instead of two
        k = gpu.select(key).unique().to_series()
        pairs = pl.DataFrame([(k // (1 << PAIR_BITS)).cast(gpu.schema["hpid"]).alias("hpid"),
                              (k % (1 << PAIR_BITS)).cast(gpu.schema["device"]).alias("device")])
    pairs = pairs.sort(["device", "hpid"], nulls_last=True)
    pairs = pairs.with_columns(
        (pl.int_range(pl.len(), dtype=pl.Int32) + first_rank).alias("rank")
    )
    if real is not None and real.height:
        joined = pairs.join(real, on=["hpid", "device"], how="left", nulls_equal=True)
        if joined["nccl_rank"].is_not_null().all() and joined["nccl_rank"].n_unique() == len(joined):
            pairs = joined.with_columns(pl.col("nccl_rank").cast(pl.Int32).alias("rank"))
            return pairs.drop("nccl_rank", "nranks"), True
    return pairs, False


LAUNCH_APIS = r"^cu(da)?(LaunchKernel|LaunchCooperativeKernel|GraphLaunch)"


def _launched_without_gpu_rows(runtime: pl.DataFrame, pairs: pl.DataFrame) -> list[tuple[int, int]]:
    """(pid, launches) of processes that launched kernels but have no GPU row in the export:
    their host rows are dropped with the other GPU-less processes, so they are named instead."""
    if not runtime.height or pairs["hpid"].is_null().all():
        return []
    # the process test first: the name pattern then runs on the few rows of GPU-less processes
    lost = (
        runtime.select("hpid", "name")
        .filter(~pl.col("hpid").is_in(pairs["hpid"].drop_nulls().implode()))
        .filter(pl.col("name").str.contains(LAUNCH_APIS))
        .group_by("hpid").len().sort("hpid")
    )
    return [(int(h), int(n)) for h, n in lost.iter_rows() if h is not None]


def _nccl_init_ranks(db: Db) -> pl.DataFrame | None:
    """(hpid, device, nccl_rank, nranks) from `ncclCommInitRank` NVTX payloads, where the capture
    recorded them (NCCL ≥2.19 with NVTX payloads). The payload layout comes from the export's
    own NVTX_PAYLOAD_SCHEMA_ENTRIES; the global communicator is the one with the most ranks."""
    ent = "NVTX_PAYLOAD_SCHEMA_ENTRIES"
    if not (db.has(NVTX, warn=False) and db.has_col(NVTX, "binaryData")
            and db.has(ent, warn=False) and {"name", "offset"} <= set(db.tables[ent])):
        return None
    offsets = {
        str(name): int(off)
        for name, off in db.rows(f'SELECT name, "offset" FROM "{ent}"')
        if name in ("No. of ranks", "Rank", "CUDA device") and off is not None
    }
    if len(offsets) < 3:
        return None
    tid = db.col(NVTX, "globalTid", warn=False)
    text = "n.text" if db.has_col(NVTX, "text") else "NULL"
    join = "LEFT JOIN StringIds s ON s.id = n.textId" if db.has_col(NVTX, "textId") and db.has(
        "StringIds", warn=False) else ""
    label = f"coalesce({text}, s.value)" if join else text
    rows = db.rows(
        f"SELECT {PID_SQL.format(c='n.' + tid)}, n.binaryData FROM {NVTX} n {join} "
        f"WHERE {label} LIKE 'ncclCommInitRank%' AND n.binaryData IS NOT NULL"
    )
    found: dict[tuple[int, int], tuple[int, int]] = {}
    for hpid, blob in rows:
        try:
            nranks = struct.unpack_from("<i", blob, offsets["No. of ranks"])[0]
            rank = struct.unpack_from("<i", blob, offsets["Rank"])[0]
            dev = struct.unpack_from("<i", blob, offsets["CUDA device"])[0]
        except (struct.error, TypeError):
            continue
        if not 0 <= rank < nranks:
            continue
        key = (hpid, dev)
        if key not in found or found[key][1] < nranks:
            found[key] = (rank, nranks)
    if not found:
        return None
    return pl.DataFrame(
        [(h, d, r, n) for (h, d), (r, n) in found.items()],
        schema={"hpid": I64, "device": I64, "nccl_rank": I64, "nranks": I64},
        orient="row",
    )


PAIR_BITS = 21  # device ids below 2**21; the OS pid (24 bits, PID_SQL) above them


def _pair_key(df: pl.DataFrame) -> pl.Expr | None:
    """(hpid, device) of `df` as one Int64 column `_pair`, or None when a value is missing or out
    of range (0 ≤ hpid < 2**24, 0 ≤ device < 2**PAIR_BITS): a unique or a lookup over millions of
    GPU rows hashes one column, not two."""
    h, d = pl.col("hpid"), pl.col("device")
    b = df.select((h.null_count() + d.null_count()).alias("n"), h.min().alias("h0"),
                  h.max().alias("h1"), d.min().alias("d0"), d.max().alias("d1")).row(0)
    if b[0] or b[1] is None or b[1] < 0 or b[2] >= 1 << 24 or b[3] < 0 or b[4] >= 1 << PAIR_BITS:
        return None
    return (h * (1 << PAIR_BITS) + d).alias("_pair")


def _rank_gpu(gpu: pl.DataFrame, pairs: pl.DataFrame) -> pl.DataFrame:
    if pairs.height == 1:  # the common single-GPU capture: skip a join over every GPU row
        return gpu.with_columns(pl.lit(pairs["rank"][0], dtype=pl.Int32).alias("rank"))
    key, known = _pair_key(gpu), _pair_key(pairs)
    if key is not None and known is not None:  # each pair once: a lookup of one packed key
        rank = key.replace_strict(pairs.select(known).to_series(), pairs.get_column("rank"),
                                  default=None, return_dtype=pairs.schema["rank"])
        return gpu.with_columns(rank.alias("rank"))
    # Each (hpid, device) pair once: only the keys go through the join, not every GPU column.
    rank = gpu.select("hpid", "device").join(pairs, on=["hpid", "device"], how="left",
                                             nulls_equal=True, maintain_order="left")
    return gpu.with_columns(rank.get_column("rank"))


def _process_rank(pairs: pl.DataFrame) -> pl.DataFrame:
    return pairs.group_by("hpid").agg(pl.col("rank").min())


def _rank_host(df: pl.DataFrame, pairs: pl.DataFrame, gpu: pl.DataFrame | None) -> pl.DataFrame:
    """Host rows → rank of their process; in a process driving several GPUs, runtime calls take
    the rank of the device their correlated GPU work ran on. Processes without GPU work are
    dropped, unless the export has no process ids on GPU rows (then all host rows are its)."""
    if not df.height:
        return df
    proc = _process_rank(pairs)
    if proc["hpid"].is_null().all():
        return df.with_columns(pl.lit(proc["rank"].min(), dtype=pl.Int32).alias("rank"))
    if proc.height == 1 and df["hpid"].n_unique() == 1 and df["hpid"][0] == proc["hpid"][0]:
        out = df.with_columns(pl.lit(proc["rank"][0], dtype=pl.Int32).alias("rank"))
    else:  # an inner join by hpid (one row per process): only the key goes through it
        rank = df.select("hpid").join(proc, on="hpid", how="left", maintain_order="left")
        out = df.with_columns(rank.get_column("rank"))
        if out.get_column("rank").null_count():
            out = out.filter(pl.col("rank").is_not_null())
    multi = pairs.group_by("hpid").len().filter(pl.col("len") > 1)
    if gpu is not None and multi.height and "correlation" in out.columns:
        by_corr = (
            gpu.filter(pl.col("hpid").is_in(multi["hpid"].implode()))
            .select("hpid", "correlation", pl.col("rank").alias("dev_rank"))
            .unique(["hpid", "correlation"], keep="first")
        )
        out = out.join(by_corr, on=["hpid", "correlation"], how="left", maintain_order="left")
        out = out.with_columns(pl.coalesce("dev_rank", "rank").alias("rank")).drop("dev_rank")
    return out


def _rank_sync(df: pl.DataFrame, pairs: pl.DataFrame) -> pl.DataFrame:
    if not df.height:
        return df
    out = df.join(pairs, on=["hpid", "device"], how="left", nulls_equal=True,
                  maintain_order="left")
    proc = _process_rank(pairs).rename({"rank": "proc_rank"})
    if proc["hpid"].is_null().all():
        return out.with_columns(pl.coalesce("rank", pl.lit(proc["proc_rank"].min())).alias("rank"))
    out = out.join(proc, on="hpid", how="left", maintain_order="left")
    return (
        out.with_columns(pl.coalesce("rank", "proc_rank").alias("rank"))
        .drop("proc_rank")
        .filter(pl.col("rank").is_not_null())
    )


def _uses_nccl(gpu: pl.DataFrame, nvtx: pl.DataFrame) -> bool:
    # a test over two columns, not a filter that copies every column of the matching rows
    if gpu.select(((pl.col("kind") == "kernel") & pl.col("name").str.starts_with("nccl")).any()
                  ).item():
        return True
    return bool(nvtx.height) and bool(nvtx.filter(pl.col("name").is_in(list(NCCL_API))).height)


def _graph_trace_mode(db: Db, kernels: pl.DataFrame, graphs: pl.DataFrame) -> str | None:
    """`graph` or `node` as captured (META_DATA_CAPTURE), else inferred from the rows present."""
    for table in ("META_DATA_CAPTURE", "META_DATA_EXPORT", "EXPORT_META_DATA"):
        if not db.has(table, warn=False) or not {"name", "value"} <= set(db.tables[table]):
            continue
        # Only this key is read: the table also holds the capturing host's environment.
        rows = db.rows(
            f"SELECT value FROM \"{table}\" WHERE name LIKE '%CUDA_GRAPH_TRACE_OPTIONS:MODE' LIMIT 1"
        )
        if rows and rows[0][0]:
            mode = str(rows[0][0]).strip().lower()
            if mode in ("graph", "node"):
                return mode
    if graphs.height:
        return "graph"
    if kernels.height and kernels["graph_node_id"].is_not_null().any():
        return "node"
    return None


def _ranks(
    db: Db, pairs: pl.DataFrame, path: Path, mode: str | None, *, nccl: bool, world: int | None,
    named: bool,
) -> pl.DataFrame:
    gpus = _gpu_info(db)
    offset = 0
    if db.has("TARGET_INFO_SESSION_START_TIME") and db.has_col(
        "TARGET_INFO_SESSION_START_TIME", "utcEpochNs"
    ):
        value = db.scalar('SELECT utcEpochNs FROM "TARGET_INFO_SESSION_START_TIME" LIMIT 1')
        offset = int(value) if isinstance(value, int) else 0
    rows = []
    n = pairs.height
    for hpid, device, rank in pairs.select("hpid", "device", "rank").iter_rows():
        info = _gpu_for(gpus, hpid, device)
        rows.append(
            {
                "rank": rank,
                # NCCL's communicator size, else the ranks of a multi-process capture
                "world_size": world or (n if n > 1 else None),
                "source": str(path),
                "format": "nsys",
                "backend": "nccl" if nccl else None,
                "device_name": info.get("name"),
                "num_sms": info.get("sms"),
                "compute_capability": info.get("cc"),
                "nccl_version": None,
                "clock_offset_ns": offset,
                "graph_trace_mode": mode,
                "device_memory_bytes": info.get("mem"),
                "rank_from": "nccl" if named else "file_order",
            }
        )
    return conform(pl.DataFrame(rows, schema_overrides=dict(RANKS_SCHEMA)), RANKS_SCHEMA)


def _gpu_info(db: Db) -> dict[str, list[dict]]:
    """TARGET_INFO_GPU rows (name, SMs, cc) and TARGET_INFO_CUDA_DEVICE's (pid, cuda id) → gpu."""
    gpus: list[dict] = []
    t = "TARGET_INFO_GPU"
    if db.has(t):
        cols = db.tables[t]
        sel = [c if c in cols else "NULL" for c in
               ("id", "name", "smCount", "computeMajor", "computeMinor", "cuDevice", "totalMemory")]
        for gid, name, sms, major, minor, cudev, mem in db.rows(
                f'SELECT {", ".join(sel)} FROM "{t}"'):
            gpus.append({
                "id": gid, "name": name, "sms": sms, "cudev": cudev, "mem": mem,
                "cc": f"{major}.{minor}" if major is not None and minor is not None else None,
            })
    devs: list[dict] = []
    t = "TARGET_INFO_CUDA_DEVICE"
    if db.has(t, warn=False) and {"gpuId", "cudaId"} <= set(db.tables[t]):
        pid = "pid" if db.has_col(t, "pid") else "NULL"
        sms = "numMultiprocessors" if db.has_col(t, "numMultiprocessors") else "NULL"
        for gid, cid, p, n in db.rows(f'SELECT gpuId, cudaId, {pid}, {sms} FROM "{t}"'):
            devs.append({"gpu": gid, "cuda": cid, "pid": p, "sms": n})
    return {"gpus": gpus, "devs": devs}


def _gpu_for(info: dict[str, list[dict]], hpid: int | None, device: int | None) -> dict:
    gpus, devs = info["gpus"], info["devs"]
    dev = next((d for d in devs if d["cuda"] == device and d["pid"] in (hpid, None)), None)
    dev = dev or next((d for d in devs if d["cuda"] == device), None)
    gpu = None
    if dev is not None:
        gpu = next((g for g in gpus if g["id"] == dev["gpu"]), None)
    gpu = gpu or next((g for g in gpus if g["cudev"] is not None and g["cudev"] == device), None)
    gpu = gpu or next((g for g in gpus if g["id"] == device), None)
    if gpu is None and len(gpus) == 1:
        gpu = gpus[0]
    out = dict(gpu or {})
    if out.get("sms") is None and dev is not None:
        out["sms"] = dev["sms"]
    return out


# --- comms --------------------------------------------------------------------------------------


def _comms(nvtx: pl.DataFrame, runtime: pl.DataFrame) -> pl.DataFrame:
    """One row per NCCL API call seen as an NVTX range (NCCL emits these with NVTX enabled).

    `correlation` is the first kernel launch inside the call on the same thread (ungrouped
    collectives launch there; grouped send/recv launch in ncclGroupEnd, so theirs stays null).
    """
    if not nvtx.height:
        return empty(COMMS_SCHEMA)
    calls = nvtx.filter(
        (pl.col("kind") == "annotation") & pl.col("name").is_in(list(NCCL_API))
    ).with_columns(
        pl.col("name").replace_strict(NCCL_API, return_dtype=pl.String).alias("collective"),
        pl.lit("[]").alias("in_split"),
        pl.lit("[]").alias("out_split"),
    )
    if calls.height and runtime.height:
        launches = (
            runtime.filter(pl.col("name").str.contains(r"^cu(da)?LaunchKernel"))
            .select("hpid", "tid", pl.col("ts_ns").alias("launch_ns"), "correlation")
            .sort("launch_ns")
        )
        calls = (
            calls.sort("ts_ns")
            .join_asof(launches, left_on="ts_ns", right_on="launch_ns", by=["hpid", "tid"],
                       strategy="forward", check_sortedness=False)
            .with_columns(
                pl.when(pl.col("launch_ns") < pl.col("ts_ns") + pl.col("dur_ns"))
                .then(pl.col("correlation"))
                .alias("correlation")
            )
        )
    return conform(calls, COMMS_SCHEMA).sort(["rank", "ts_ns"])
