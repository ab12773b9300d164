"""Canonical frames every reader produces and every analysis consumes (format-blind).

A reader (Kineto JSON, nsys SQLite) returns one `Trace`. All times are Int64 nanoseconds on the
capturing process's clock (`ts_ns`, `dur_ns`); rank is a column, never a dict of frames. Analyses
are pure functions over these frames: they never mutate them and check required columns with
`require()` first.

events: one row per timed event (CPU and GPU), all ranks.

| column          | dtype       | meaning |
|-----------------|-------------|---------|
| rank            | Int32       | global rank (distributedInfo / file order / nsys process+device) |
| kind            | Enum KINDS  | normalized category, see KINDS |
| name            | String      | op / kernel / API name (nsys: version suffix `_v7000` stripped) |
| ts_ns, dur_ns   | Int64       | start and duration, ns |
| pid, tid        | Int64       | host process / thread; for GPU rows pid = device id, tid = stream |
| device          | Int32       | GPU ordinal for GPU rows (kernel, memcpy, memset, gpu_annotation, graph), else null |
| stream          | Int64       | CUDA stream for GPU rows, else null |
| correlation     | Int64       | launch (runtime row) ↔ GPU rows; graph replays share one correlation |
| external_id     | Int64       | Kineto `External id` (cpu_op ↔ launch ↔ GPU), else null |
| bytes           | Int64       | memcpy / memset size |
| copy_kind       | Enum COPY_KINDS | memcpy direction (HtoD, DtoH, DtoD, PtoP, HtoH, other) |
| copy_mem        | Enum COPY_MEMS | memcpy memory kind, see `copy_mem` (pageable, pinned, managed, device); null when unknown |
| graph_id        | Int64       | CUDA graph id (Kineto `graph id`, nsys graphId / GRAPH_TRACE graphId) |
| graph_node_id   | Int64       | CUDA graph node id (non-null and non-zero only for graph-replayed work) |
| sync_kind       | Enum SYNC_KINDS | for kind == "sync": what waited |
| wait_stream     | Int64       | stream a `stream_wait_event` sync waited on (when known) |
| wait_correlation| Int64       | correlation of the `cudaEventRecord` a sync waited on (when known) |

comms: collective metadata (Kineto `record_param_comms`, nsys NCCL NVTX), one row per call.

| column | dtype | meaning |
|---|---|---|
| rank | Int32 | |
| ts_ns, dur_ns | Int64 | the host call |
| external_id, correlation | Int64 | links to the launch / kernel where known |
| collective | String | e.g. `allreduce`, `all_to_all`, `_allgather_base`, `send` |
| in_nelems, out_nelems, group_size | Int64 | |
| dtype | String | |
| in_split, out_split | String | per-peer split sizes as written (`"[]"` when absent) |
| pg_name, pg_desc, pg_ranks | String | process group |
| seq | Int64 | collective sequence number in its group (when the writer gives it) |

flows: Kineto `s`/`f` flow events (ac2g launch→GPU, fwdbwd), one row per endpoint.

| column | dtype | meaning |
|---|---|---|
| rank | Int32 | |
| flow_id | Int64 | |
| cat | String | `ac2g`, `fwdbwd`, `async_cpu_to_gpu`, … |
| phase | String | `s` or `f` |
| ts_ns | Int64 | |
| pid, tid | Int64 | |

ranks: one row per rank (whitelisted metadata only; never the capturing host's environment).

| column | dtype | meaning |
|---|---|---|
| rank | Int32 | |
| world_size | Int32 | |
| source | String | file the rank came from (as given by the user) |
| format | String | `kineto` or `nsys` |
| backend | String | distributed backend (`nccl`, `gloo`, …) |
| device_name | String | e.g. `NVIDIA H200` |
| num_sms | Int32 | |
| compute_capability | String | e.g. `9.0` |
| nccl_version | String | |
| clock_offset_ns | Int64 | add to ts_ns to put this rank on a shared clock (0 when unknown) |
| graph_trace_mode | String | nsys `graph` / `node`; Kineto `node` (kernels always listed) |
| device_memory_bytes | Int64 | total memory of the rank's GPU (Kineto `totalGlobalMem`, nsys `TARGET_INFO_GPU.totalMemory`) |
| rank_from | String | where the rank number came from: `distributedInfo` (Kineto), `nccl` (nsys `ncclCommInitRank`), or `file_order` (none in the file: numbered in the order given) |

memory: caching-allocator events (Kineto `[memory]` instants, written with `profile_memory=True`),
one row per allocation or free; empty when the profile has none (nsys exports: not read).

| column | dtype | meaning |
|---|---|---|
| rank | Int32 | |
| ts_ns | Int64 | |
| device_type | Int32 | c10 DeviceType: 0 CPU, 1 CUDA |
| device | Int32 | device ordinal |
| bytes | Int64 | this allocation (> 0) or free (< 0) |
| allocated, reserved | Int64 | the allocator's totals after it (`Total Allocated`, `Total Reserved`) |
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

import polars as pl

KINDS: tuple[str, ...] = (
    "cpu_op",          # Kineto cpu_op
    "annotation",      # host ranges: Kineto user_annotation (ProfilerStep#N, nccl:*), nsys NVTX
    "gpu_annotation",  # ranges projected on a GPU stream (Kineto gpu_user_annotation)
    "python",          # Kineto python_function (with_stack)
    "runtime",         # CUDA runtime and driver API calls (cudaLaunchKernel, cuLaunchKernel, cudaGraphLaunch…)
    "kernel",          # GPU kernels
    "memcpy",          # GPU copies
    "memset",          # GPU memsets
    "sync",            # host blocked on GPU work (cuda_sync / CUPTI synchronization records)
    "graph",           # whole graph replay on the GPU (nsys graph-level trace mode only)
    "instant",         # instant markers (Iteration Start, Record Window End)
    "other",
)
KIND = pl.Enum(list(KINDS))

COPY_KINDS: tuple[str, ...] = ("HtoD", "DtoH", "DtoD", "HtoH", "PtoP", "other")
COPY_KIND = pl.Enum(list(COPY_KINDS))

# The memory a copy moves through: the host end's kind (pageable, managed, pinned) when one end is
# host memory, `device` when both ends are on a GPU. Pageable copies are staged by the driver
# through a pinned buffer and block the host, so they are told apart from pinned ones.
COPY_MEMS: tuple[str, ...] = ("pageable", "pinned", "managed", "device")
COPY_MEM = pl.Enum(list(COPY_MEMS))
# CUDA's endpoint labels (CUPTI memory kinds as Kineto names them, "Memcpy DtoH (Device ->
# Pageable)", and nsys ENUM_CUDA_MEM_KIND labels) → COPY_MEMS; any other label is unknown.
MEM_OF_LABEL: dict[str, str] = {
    "pageable": "pageable", "pinned": "pinned", "managed": "managed", "managed static": "managed",
    "device": "device", "device static": "device", "array": "device",
}

SYNC_KINDS: tuple[str, ...] = (
    "stream_sync",
    "event_sync",
    "context_sync",
    "stream_wait_event",
    "other",
)
SYNC_KIND = pl.Enum(list(SYNC_KINDS))

GPU_KINDS: tuple[str, ...] = ("kernel", "memcpy", "memset", "graph")

EVENTS_SCHEMA = pl.Schema(
    {
        "rank": pl.Int32,
        "kind": KIND,
        "name": pl.String,
        "ts_ns": pl.Int64,
        "dur_ns": pl.Int64,
        "pid": pl.Int64,
        "tid": pl.Int64,
        "device": pl.Int32,
        "stream": pl.Int64,
        "correlation": pl.Int64,
        "external_id": pl.Int64,
        "bytes": pl.Int64,
        "copy_kind": COPY_KIND,
        "copy_mem": COPY_MEM,
        "graph_id": pl.Int64,
        "graph_node_id": pl.Int64,
        "sync_kind": SYNC_KIND,
        "wait_stream": pl.Int64,
        "wait_correlation": pl.Int64,
    }
)

COMMS_SCHEMA = pl.Schema(
    {
        "rank": pl.Int32,
        "ts_ns": pl.Int64,
        "dur_ns": pl.Int64,
        "external_id": pl.Int64,
        "correlation": pl.Int64,
        "collective": pl.String,
        "in_nelems": pl.Int64,
        "out_nelems": pl.Int64,
        "group_size": pl.Int64,
        "dtype": pl.String,
        "in_split": pl.String,
        "out_split": pl.String,
        "pg_name": pl.String,
        "pg_desc": pl.String,
        "pg_ranks": pl.String,
        "seq": pl.Int64,
    }
)

FLOWS_SCHEMA = pl.Schema(
    {
        "rank": pl.Int32,
        "flow_id": pl.Int64,
        "cat": pl.String,
        "phase": pl.String,
        "ts_ns": pl.Int64,
        "pid": pl.Int64,
        "tid": pl.Int64,
    }
)

RANKS_SCHEMA = pl.Schema(
    {
        "rank": pl.Int32,
        "world_size": pl.Int32,
        "source": pl.String,
        "format": pl.String,
        "backend": pl.String,
        "device_name": pl.String,
        "num_sms": pl.Int32,
        "compute_capability": pl.String,
        "nccl_version": pl.String,
        "clock_offset_ns": pl.Int64,
        "graph_trace_mode": pl.String,
        "device_memory_bytes": pl.Int64,
        "rank_from": pl.String,
    }
)

MEMORY_SCHEMA = pl.Schema(
    {
        "rank": pl.Int32,
        "ts_ns": pl.Int64,
        "device_type": pl.Int32,
        "device": pl.Int32,
        "bytes": pl.Int64,
        "allocated": pl.Int64,
        "reserved": pl.Int64,
    }
)


def copy_mem(src: pl.Expr, dst: pl.Expr) -> pl.Expr:
    """`copy_mem` of copies whose endpoint labels (String, CUDA's spelling: "Pageable", "Device
    Static", …) are `src` and `dst`: the host end decides, the slowest first (pageable, then
    managed, then pinned); `device` when both ends are device memory; null when an end is unknown."""
    def mem(label: pl.Expr) -> pl.Expr:
        return label.str.to_lowercase().str.strip_chars().replace_strict(
            MEM_OF_LABEL, default=None, return_dtype=pl.String)

    s, d = mem(src), mem(dst)
    either = lambda k: (s == k) | (d == k)  # noqa: E731
    out = pl.when(s.is_null() | d.is_null()).then(pl.lit(None, dtype=pl.String))
    for k in ("pageable", "managed", "pinned"):
        out = out.when(either(k)).then(pl.lit(k))
    return out.otherwise(pl.lit("device")).cast(COPY_MEM)


# Kineto names a copy by its direction and endpoints: "Memcpy DtoH (Device -> Pageable)"
COPY_ENDS_IN_NAME = r"\((?P<src>[A-Za-z ]+) -> (?P<dst>[A-Za-z ]+)\)$"


def copy_mem_of_name(name: pl.Expr) -> pl.Expr:
    """`copy_mem` of copies named the Kineto way (the nsys reader writes the same names); null
    for a name without endpoints."""
    ends = name.str.extract_groups(COPY_ENDS_IN_NAME)
    return copy_mem(ends.struct.field("src"), ends.struct.field("dst"))


def empty(schema: pl.Schema) -> pl.DataFrame:
    return pl.DataFrame(schema=schema)


def conform(df: pl.DataFrame, schema: pl.Schema) -> pl.DataFrame:
    """Return `df` with exactly `schema`'s columns, in order and dtype; missing columns are null.
    A value the dtype cannot hold (an id beyond Int32 in a corrupt trace) becomes null: input is
    untrusted, and a failed cast would surface as a polars traceback."""
    cols = []
    for name, dtype in schema.items():
        if name in df.columns:
            cols.append(pl.col(name).cast(dtype, strict=False))
        else:
            cols.append(pl.lit(None, dtype=dtype).alias(name))
    return df.lazy().select(cols).collect() if df.width else pl.DataFrame(schema=schema)


def require(df: pl.DataFrame, columns: Iterable[str], *, what: str = "frame") -> None:
    """Fail early, naming the missing columns, instead of deep inside an expression."""
    missing = [c for c in columns if c not in df.columns]
    if missing:
        raise KeyError(f"{what} lacks column(s) {', '.join(missing)}")


@dataclass(frozen=True, slots=True)
class Trace:
    """Everything read from one or more trace files (one or many ranks)."""

    events: pl.DataFrame
    comms: pl.DataFrame = field(default_factory=lambda: empty(COMMS_SCHEMA))
    flows: pl.DataFrame = field(default_factory=lambda: empty(FLOWS_SCHEMA))
    ranks: pl.DataFrame = field(default_factory=lambda: empty(RANKS_SCHEMA))
    warnings: tuple[str, ...] = ()
    memory: pl.DataFrame = field(default_factory=lambda: empty(MEMORY_SCHEMA))

    @property
    def gpu(self) -> pl.DataFrame:
        """GPU work rows (kernels, copies, memsets, graph replays)."""
        return self.events.filter(pl.col("kind").is_in(GPU_KINDS))

    @property
    def formats(self) -> list[str]:
        return sorted(set(self.ranks.get_column("format").drop_nulls().to_list()))


CORR_KEY = "_rc_key"
_CORR_BITS = 40  # CUPTI correlation ids are 32-bit; ranks get the 23 bits above


def corr_key(*frames: pl.DataFrame) -> pl.Expr | None:
    """(rank, correlation) packed into one Int64 column `CORR_KEY` when every value of the
    frames fits (0 ≤ correlation < 2**40, 0 ≤ rank < 2**23), else None. Single-key joins and
    group-bys run ~2× faster than two-key ones on the millions of launch rows of a large trace."""
    for df in frames:
        b = df.select(pl.col("correlation").min().alias("c0"), pl.col("correlation").max().alias("c1"),
                      pl.col("rank").min().alias("r0"), pl.col("rank").max().alias("r1")).row(0)
        if any(v is not None and (v < 0 or v >= lim)
               for v, lim in zip(b, (1 << _CORR_BITS, 1 << _CORR_BITS, 1 << 23, 1 << 23),
                                 strict=True)):
            return None
    return (pl.col("rank").cast(pl.Int64) * (1 << _CORR_BITS) + pl.col("correlation")).alias(CORR_KEY)


def min_by_key(df: pl.DataFrame, key: pl.Expr, value: str | pl.Expr) -> tuple[pl.Series, pl.Series]:
    """The smallest `value` per packed `key` (`corr_key`), as two aligned Series sorted by key,
    each key once: the table `lookup` searches (a sort, no hash table: joins and group-bys by
    key over millions of launch rows are what made large exports slow)."""
    v = value if isinstance(value, pl.Expr) else pl.col(value)
    t = df.select(key, v.alias("_v")).filter(pl.col(CORR_KEY).is_not_null()).sort(CORR_KEY)
    keys = t.get_column(CORR_KEY)
    if keys.len() > 1 and (keys.diff() == 0).any():  # a key twice (rare): its smallest value
        t = t.with_columns(pl.col(CORR_KEY).set_sorted()).group_by(
            CORR_KEY, maintain_order=True).agg(pl.col("_v").min())
    return t.get_column(CORR_KEY), t.get_column("_v")


def lookup(keys: pl.Series, values: pl.Series, wanted: pl.Series) -> pl.Series:
    """`values` at the position of each of `wanted` in `keys` (from `min_by_key`), null where it
    is absent or null: a left join by binary search that keeps `wanted`'s order."""
    n = keys.len()
    if n == 0 or wanted.len() == 0:
        return pl.Series(values.name, [None] * wanted.len(), dtype=values.dtype)
    w = wanted.fill_null(-1)  # packed keys are ≥ 0: never found
    at = keys.search_sorted(w, side="left").clip(upper_bound=n - 1)
    hit = pl.DataFrame({"f": keys.gather(at) == w, "v": values.gather(at)})
    return hit.select(pl.when(pl.col("f")).then(pl.col("v"))).to_series().alias(values.name)


def concat_traces(traces: Iterable[Trace]) -> Trace:
    """Merge traces of different ranks (each already carries its rank column)."""
    ts = list(traces)
    if len(ts) == 1:
        return ts[0]
    # One chunk per events column: the ranks' frames are chunked differently, and every later
    # operation would otherwise align them again (4 ranks of 35 MB: −25 MB peak, no slower).
    return Trace(
        events=pl.concat([t.events for t in ts], how="vertical", rechunk=True),
        comms=pl.concat([t.comms for t in ts], how="vertical"),
        flows=pl.concat([t.flows for t in ts], how="vertical"),
        ranks=pl.concat([t.ranks for t in ts], how="vertical").sort("rank"),
        warnings=tuple(w for t in ts for w in t.warnings),
        memory=pl.concat([t.memory for t in ts], how="vertical"),
    )
