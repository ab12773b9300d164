"""PyTorch profiler (Kineto) JSON → canonical frames (`moetune.analyzer.frames`).

Two readers, one result. The compiled scanner (`_kineto_scan.c`, see "compiled fast path" below)
reads well-formed files straight into Arrow columns, one thread per part of the event array; it
declines anything unusual, and the pure-Python reader described next reads those files (and every
file when the extension is not built). `tests/test_kineto_scan.py` holds the two to equal frames.

Speed matters (traces reach GBs): msgspec decodes straight into Structs that declare only the
fields we use, so unknown keys (`metadata`, env blocks, `Input Dims`, …) are skipped without ever
becoming Python objects, and columns are built with one list comprehension each. Only whitelisted
top-level fields (`distributedInfo`, `deviceProperties`, `baseTimeNanoseconds`) are decoded at all:
harness metadata may carry credentials (torch.profiler's `add_metadata_json` takes any top-level
key a harness hands it, and libkineto's output_json.cpp writes it verbatim). Files above
`RAW_MIN_BYTES` keep `traceEvents` as raw slices of the mmap and decode them `CHUNK` events at a
time, so only one chunk's Structs are alive (peak RSS −10…30 %; bench/README.md). On that path:

- each chunk is decoded in place: the file is mapped privately (copy-on-write, never written
  back) and `[`/`]` are written around the chunk's span, instead of joining its slices into a copy;
- every row gets `_LeanEvent` (two args); the other `_Args` fields are decoded only for the GPU
  and collective rows that use them (9–12 % of rows in the corpus), from their raw slices. A
  wrongly typed field that a row's category never uses (say `stream` on a cpu_op) is therefore not
  seen, and no longer sends the file through the lenient decode below; the frames are the same
  either way.

Robustness: a file whose fields have unexpected types (strings for numbers, lists for scalars,
`null` events) is re-decoded generically and sanitized field by field; invalid UTF-8 is decoded
with replacement characters; integers beyond int64 become null; malformed JSON or gzip is a
`UserError` naming the file and the byte position.
"""

from __future__ import annotations

import ctypes
import gzip
import mmap
import os
import re
import zlib
from collections.abc import Callable
from operator import attrgetter
from pathlib import Path
from typing import Any

import msgspec
import polars as pl
from moetune.analyzer.frames import (
    COMMS_SCHEMA,
    EVENTS_SCHEMA,
    FLOWS_SCHEMA,
    KIND,
    MEMORY_SCHEMA,
    RANKS_SCHEMA,
    Trace,
    conform,
    copy_mem_of_name,
)
from moetune.analyzer.readers.compressed import decompress
from moetune.analyzer.readers.cores import cpu_count

from moetune.errors import UserError, bad_json, compressed_with

# A JSON scalar as some writer may spell a number (old writers quote numbers; ROCm writes "0x0").
Num = int | float | str | None
# Split sizes and process-group ranks are strings in Kineto ("[0, 1]") but lists in some writers.
StrOrList = str | list[Any] | None

# a bare NaN / Infinity where a value belongs (not inside a string)
_NAN_LITERAL = re.compile(rb"([:\[,]\s*)-?(?:NaN|Infinity)(?=\s*[,\]}])")
MAX_DUR_NS = 7 * 24 * 3600 * 10**9  # HTA drops CUPTI-overflow durations above 7 days; so do we

KIND_OF_CAT: dict[str, str] = {
    "cpu_op": "cpu_op",
    "user_annotation": "annotation",
    "gpu_user_annotation": "gpu_annotation",
    "python_function": "python",
    "cuda_runtime": "runtime",
    "cuda_driver": "runtime",
    "Runtime": "runtime",
    "kernel": "kernel",
    "Kernel": "kernel",
    "gpu_memcpy": "memcpy",
    "Memcpy": "memcpy",
    "gpu_memset": "memset",
    "Memset": "memset",
    "cuda_sync": "sync",
}
# Rows that live on a GPU stream: pid = device, tid = stream in the file.
DEVICE_KINDS = ("kernel", "memcpy", "memset", "gpu_annotation", "sync")
SYNC_KIND_OF_NAME = {
    "Stream Sync": "stream_sync",
    "Event Sync": "event_sync",
    "Context Sync": "context_sync",
    "Stream Wait Event": "stream_wait_event",
}
COPY_KINDS_IN_NAME = ("HtoD", "DtoH", "DtoD", "HtoH", "PtoP")


# `[memory]` instants (profile_memory=True): the caching allocator's state after each event
_MEM_KEYS = {"mem_device_type": "Device Type", "mem_device": "Device Id", "mem_bytes": "Bytes",
             "total_allocated": "Total Allocated", "total_reserved": "Total Reserved"}


class _MemArgs(msgspec.Struct, frozen=True, gc=False, rename=_MEM_KEYS):
    mem_device_type: Num = None
    mem_device: Num = None
    mem_bytes: Num = None
    total_allocated: Num = None
    total_reserved: Num = None


class _Args(
    _MemArgs,
    frozen=True,
    gc=False,
    rename={
        "external_id": "External id",
        "graph_id": "graph id",
        "graph_node_id": "graph node id",
        "collective": "Collective name",
        "in_nelems": "In msg nelems",
        "out_nelems": "Out msg nelems",
        "group_size": "Group size",
        "in_split": "In split size",
        "out_split": "Out split size",
        "pg_name": "Process Group Name",
        "pg_desc": "Process Group Description",
        "pg_ranks": "Process Group Ranks",
        "seq": "Seq",
        **_MEM_KEYS,
    },
):
    """Every arg we read (the allocator's five come from `_MemArgs`)."""

    external_id: Num = None
    correlation: Num = None
    device: Num = None
    stream: Num = None
    bytes: Num = None
    graph_id: Num = None
    graph_node_id: Num = None
    wait_on_stream: Num = None
    wait_on_cuda_event_record_corr_id: Num = None
    collective: Num = None
    in_nelems: Num = None
    out_nelems: Num = None
    group_size: Num = None
    dtype: Num = None
    in_split: StrOrList = None
    out_split: StrOrList = None
    pg_name: Num = None
    pg_desc: Num = None
    pg_ranks: StrOrList = None
    seq: Num = None


_NO_ARGS = _Args()
_ARG_FIELDS = _Args.__struct_fields__
_ARG_KEYS = {_Args.__struct_encode_fields__[i]: f for i, f in enumerate(_ARG_FIELDS)}
_ARG_KEY_OF = {f: k for k, f in _ARG_KEYS.items()}


class _Event(msgspec.Struct, gc=False):
    ph: Num = None
    cat: Num = None
    name: Num = None
    pid: Num = None
    tid: Num = None
    ts: Num = None
    dur: Num = None
    id: Num = None
    args: _Args = _NO_ARGS


_EVENT_FIELDS = tuple(f for f in _Event.__struct_fields__ if f != "args")


class _LeanArgs(msgspec.Struct, frozen=True, gc=False, rename={"external_id": "External id"}):
    """The two args every row needs; the rest (`_Args`) are decoded for GPU/collective rows only
    (9–12 % of rows), from their raw slices: smaller Structs, fewer ints to build and free.
    (Adding the five allocator fields here cost every row +13 % CPU; `[memory]` rows are decoded
    a second time instead, with `_MemOnly`.)"""

    external_id: Num = None
    correlation: Num = None


class _MemOnly(msgspec.Struct, gc=False):
    args: _MemArgs = _MemArgs()


_NO_LEAN_ARGS = _LeanArgs()


class _LeanEvent(_Event, gc=False):
    """`_Event` with only the args every row needs."""

    args: _LeanArgs = _NO_LEAN_ARGS  # type: ignore[assignment]


class _ArgsOnly(msgspec.Struct, gc=False):
    args: _Args = _NO_ARGS


class _Device(msgspec.Struct, gc=False):
    id: Num = None
    name: Num = None
    totalGlobalMem: Num = None
    numSms: Num = None
    computeMajor: Num = None
    computeMinor: Num = None


class _Dist(msgspec.Struct, gc=False):
    backend: Num = None
    rank: Num = None
    world_size: Num = None
    nccl_version: Num = None


class _Doc(msgspec.Struct, gc=False):
    traceEvents: list[_Event] | None = None
    deviceProperties: list[_Device] | None = None
    distributedInfo: _Dist | None = None
    baseTimeNanoseconds: Num = None


_DOC_DECODER = msgspec.json.Decoder(_Doc)


class _RawDoc(msgspec.Struct, gc=False):
    """Fast path: events left as raw JSON slices, decoded `CHUNK` at a time so that only one
    chunk's Structs (≈0.5 KB per event with their ints and strings) are alive at once."""

    traceEvents: list[msgspec.Raw] | None = None
    deviceProperties: list[_Device] | None = None
    distributedInfo: _Dist | None = None
    baseTimeNanoseconds: Num = None


_RAW_DOC_DECODER = msgspec.json.Decoder(_RawDoc)
_EVENTS_DECODER = msgspec.json.Decoder(list[_LeanEvent])
_ARGS_DECODER = msgspec.json.Decoder(_ArgsOnly)
_MEM_DECODER = msgspec.json.Decoder(_MemOnly)
CHUNK = 32768
RAW_MIN_BYTES = 16 << 20  # ≈ 64k events of Kineto's ~250 bytes


class _SlowPath(Exception):
    """A chunk the typed decoder rejects: the whole file goes through `_decode` instead."""


def read_kineto(path: Path, *, default_rank: int, threads: int | None = None) -> Trace:
    """Read one Kineto trace (`.json` or `.json.gz`) into canonical frames.

    The rank is `distributedInfo.rank` when the file has one, else `default_rank`. `threads`:
    at most this many for the compiled scanner (default: every core this process may use).
    """
    path = Path(path)
    data = _open(path)
    scanned = _scan(data, threads)
    if scanned is not None:  # the compiled fast path read it
        raw, side, doc = scanned
        warnings: list[str] = []
    else:
        doc, warnings = _decode_top(data, path)
        if doc.traceEvents is None:
            raise UserError("not a Kineto trace (no traceEvents list)", path=path)
        try:
            raw, side = _columns(doc.traceEvents, data)
        except _SlowPath:  # some event has unexpected types or bad UTF-8: the whole file, leniently
            doc, warnings = _decode(data, path)
            raw, side = _columns(doc.traceEvents, data)
    del data
    rank = _i32(doc.distributedInfo.rank if doc.distributedInfo else None)
    declared = rank is not None  # run identity (analyzer/run_identity.py) trusts only these
    rank = default_rank if rank is None else rank
    base_ns = _as_int(doc.baseTimeNanoseconds) or 0

    dist, devices = doc.distributedInfo, doc.deviceProperties or []
    del doc  # drop the per-event objects before the frames are derived
    raw = raw.with_columns(
        _ns(pl.col("ts"), base_ns).alias("ts_ns"),
        _ns(pl.col("dur"), 0).alias("dur_ns"),
    ).drop("ts", "dur")

    is_timed = pl.col("ph_code").is_between(PH_TIMED, PH_INSTANT)
    absurd = (pl.col("dur_ns") > MAX_DUR_NS).fill_null(False)
    negative = (pl.col("dur_ns") < 0).fill_null(False)  # a broken writer: no such interval
    keep = is_timed & pl.col("ts_ns").is_not_null() & ~absurd & ~negative
    no_ts, n_absurd, n_negative, n_keep = raw.select(
        no_ts=(is_timed & pl.col("ts_ns").is_null()).sum(), absurd=(is_timed & absurd).sum(),
        negative=(is_timed & negative).sum(), keep=keep.sum(),
    ).row(0)
    if no_ts:
        warnings.append(f"{no_ts} event(s) without a usable timestamp dropped")
    if n_absurd:
        warnings.append(f"{n_absurd} event(s) with duration > 7 days dropped (CUPTI overflow)")
    if n_negative:
        warnings.append(f"{n_negative} event(s) with a negative duration dropped")
    flows = _flows(side["flow"].with_columns(_ns(pl.col("ts"), base_ns).alias("ts_ns")), rank)
    # The scanner's rows are all timed: usually nothing to drop, and then no copy to make.
    timed = raw if n_keep == raw.height else raw.filter(keep)
    del raw  # lower peak memory: only the timed rows are needed from here on
    # Collective metadata and allocator rows: the few rows with them picked first (a join of all
    # timed rows costs a transient copy), before the GPU columns are stacked on (after that, the
    # frame's chunks differ between columns and a filter would first copy them all into one).
    meta = timed.filter(pl.col("row").is_in(side["meta"].get_column("row").implode()))
    meta = meta.join(side["meta"], on="row", how="inner")
    mem = timed.select("row", "ts_ns").join(side["mem"], on="row", how="inner")
    # The GPU args join as columns of their own, aligned through the row numbers alone: the
    # timed columns are shared, not copied by the join (−1 copy of the frame at the peak).
    gpu = timed.select("row").join(side["gpu"], on="row", how="left", maintain_order="left")
    timed = timed.hstack(gpu.drop("row"))
    # Lazy for the events frame: derivations and the final casts run as one query.
    events = _events(timed.lazy(), rank)
    del timed, gpu, side  # before the comms and ranks frames are built: lower peak memory
    comms = _comms(meta, events, rank)
    ranks = _ranks(dist, devices, events, rank, path, declared=declared)
    # each warning names its file: among several ranks' files, which one was damaged
    return Trace(events=events, comms=comms, flows=flows, ranks=ranks,
                 warnings=tuple(f"{path.name}: {w}" for w in warnings), memory=_memory(mem, rank))


# --------------------------------------------------------------------------- reading and decoding


def _open(path: Path) -> bytes | mmap.mmap:
    """The file's JSON bytes: gunzipped, or a private map of the file (never written back)."""
    try:
        with path.open("rb") as fh:
            if fh.read(2) == b"\x1f\x8b":
                fh.seek(0)
                try:
                    return gzip.decompress(fh.read())
                except (OSError, EOFError, zlib.error) as exc:
                    raise UserError(f"corrupt or truncated gzip ({exc})", path=path) from None
            if os.fstat(fh.fileno()).st_size == 0:
                raise UserError("is empty", path=path)
            fh.seek(0)
            head = fh.read(8)
            if compressed_with(head):  # xz, bzip2: read whole, as gzip is
                fh.seek(0)
                return decompress(fh.read(), path)
            # No `with`: the raw event slices are views of the map, which lives as long as
            # they do (and no 1× copy of the file is made). ACCESS_COPY is a private map:
            # `_decode_chunk` writes brackets into it, the file itself is never written.
            return mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_COPY)
    except FileNotFoundError:
        raise UserError("no such file", path=path) from None
    except IsADirectoryError:
        raise UserError("is a directory where a file was expected", path=path) from None
    except OSError as exc:
        raise UserError(f"cannot read: {exc.strerror or exc}", path=path) from None


def _decode_top(data: bytes | mmap.mmap, path: Path) -> tuple[_Doc | _RawDoc, list[str]]:
    """Decode the file's top level with `traceEvents` as raw JSON slices (decoded in chunks by
    `_columns`); a file the fast path rejects is decoded whole by `_decode` (lenient, exact
    error messages)."""
    # Small files: one typed decode (the raw slices' extra pass would not pay for itself).
    decoder = _RAW_DOC_DECODER if len(data) > RAW_MIN_BYTES else _DOC_DECODER
    try:
        try:
            return decoder.decode(data), []
        except msgspec.DecodeError:  # includes ValidationError
            return _decode(data, path)
    except RecursionError:  # msgspec's depth limit: a trace's events are flat, this is not one
        raise UserError("is not a Kineto trace (JSON nested too deeply)", path=path) from None


def _decode(data: bytes | mmap.mmap, path: Path) -> tuple[_Doc, list[str]]:
    warnings: list[str] = []
    try:
        return _DOC_DECODER.decode(data), warnings
    except msgspec.ValidationError:
        pass  # valid JSON, unexpected types somewhere: sanitize generically below
    except msgspec.DecodeError as exc:
        if not bytes(data[:4096]).strip() and not bytes(data).strip():
            raise UserError("is empty", path=path) from None
        fixed, n_nan = _NAN_LITERAL.subn(rb"\1null", bytes(data))
        if n_nan:  # Python's json.dump writes NaN/Infinity, which JSON does not allow
            warnings.append(f"{n_nan} NaN/Infinity value(s) read as unknown")
            try:
                doc, more = _decode(fixed, path)
            except UserError:
                raise bad_json(fixed, path) from None
            return doc, warnings + more
        if "UTF-8" not in str(exc):
            raise bad_json(data, path) from None
        data = bytes(data).decode("utf-8", errors="replace").encode("utf-8")
        warnings.append("invalid UTF-8 replaced by U+FFFD")
        try:
            return _DOC_DECODER.decode(data), warnings
        except msgspec.ValidationError:
            pass
        except msgspec.DecodeError:
            raise bad_json(data, path) from None
    try:
        obj = msgspec.json.decode(data)
        if not isinstance(obj, dict) or not isinstance(obj.get("traceEvents"), list):
            raise UserError("not a Kineto trace (no traceEvents list)", path=path)
        doc = _sanitize(obj)
    except msgspec.DecodeError:  # pragma: no cover - typed decode accepted the syntax
        raise bad_json(data, path) from None
    except RecursionError:  # a trace's events are flat: this is not one (and must not crash)
        raise UserError("is not a Kineto trace (JSON nested too deeply)", path=path) from None
    warnings.append("fields with unexpected types ignored (lenient decode)")
    return doc, warnings


def _scalar(v: Any) -> Num:
    return v if isinstance(v, int | float | str) and not isinstance(v, bool) else None


def _str_or_list(v: Any) -> StrOrList:
    return v if isinstance(v, str | list) else None


def _sanitize(obj: dict[str, Any]) -> _Doc:
    """Whitelisted fields only, each coerced to the type the typed decoder expects."""
    events = []
    for e in obj["traceEvents"]:
        if not isinstance(e, dict):
            continue
        a = e.get("args")
        args = None
        if isinstance(a, dict):
            kw = {}
            for key, field in _ARG_KEYS.items():
                if key in a:
                    conv = (
                        _str_or_list if field in ("in_split", "out_split", "pg_ranks") else _scalar
                    )
                    kw[field] = conv(a[key])
            args = _Args(**kw)
        events.append(
            _Event(**{f: _scalar(e.get(f)) for f in _EVENT_FIELDS}, args=args or _NO_ARGS)
        )
    devs = obj.get("deviceProperties")
    devices = [
        _Device(**{f: _scalar(d.get(f)) for f in _Device.__struct_fields__})
        for d in (devs if isinstance(devs, list) else [])
        if isinstance(d, dict)
    ]
    di = obj.get("distributedInfo")
    dist = (
        _Dist(**{f: _scalar(di.get(f)) for f in _Dist.__struct_fields__})
        if isinstance(di, dict)
        else None
    )
    return _Doc(
        traceEvents=events,
        deviceProperties=devices,
        distributedInfo=dist,
        baseTimeNanoseconds=_scalar(obj.get("baseTimeNanoseconds")),
    )


def _as_int(v: Num) -> int | None:
    try:
        return int(float(v)) if isinstance(v, str) else (int(v) if v is not None else None)
    except (TypeError, ValueError, OverflowError):
        return None


# --------------------------------------------------------------------------- columns


def _num_series(name: str, values: list[Any], dtype: pl.DataType) -> pl.Series:
    """Typed column; strings that are numbers are parsed, anything else (or beyond int64) → null."""
    if dtype == pl.Float64 and values and values[0].__class__ is int:
        # Integer µs (older writers): polars builds Int64 from Python ints 3× faster than Float64,
        # and the cast rounds exactly like float(int). Any float/str/huge int: the path below
        # (the first value decides whether to try: a failed strict build costs 4× a good one).
        try:
            return pl.Series(name, values, dtype=pl.Int64, strict=True).cast(pl.Float64)
        except (TypeError, ValueError, OverflowError, pl.exceptions.PolarsError):
            pass
    try:
        return pl.Series(name, values, dtype=dtype, strict=False)
    except (TypeError, ValueError, OverflowError, pl.exceptions.PolarsError):
        pass
    # Mixed ints/floats/strings, or ints beyond 64 bits: normalise in Python (rare files only).
    out: list[float | None] = []
    for v in values:
        if isinstance(v, str):
            try:
                v = float(v)
            except ValueError:
                v = None
        elif isinstance(v, int) and not -(2**63) <= v < 2**63:
            v = None
        out.append(v)
    return pl.Series(name, out, dtype=pl.Float64, strict=False).cast(dtype, strict=False)


def _str_series(name: str, values: list[Any]) -> pl.Series:
    try:
        return pl.Series(name, values, dtype=pl.String)
    except (TypeError, pl.exceptions.PolarsError):
        return pl.Series(name, [None if v is None else str(v) for v in values], dtype=pl.String)


GPU_CATS = (
    "kernel",
    "Kernel",
    "gpu_memcpy",
    "Memcpy",
    "gpu_memset",
    "Memset",
    "cuda_sync",
    "gpu_user_annotation",
)
# `ph` and `cat` are hashed once per row, into the codes every later mask reads (flows, timed
# rows, instants, GPU rows, kernels, kind): string `is_in`s cost ~10 ns a row each.
PH_TIMED, PH_INSTANT, PH_FLOW = 1, 2, 3
PH_CODE = {"X": 1, "C": 1, "B": 1, "E": 1, "i": 2, "I": 2, "s": 3, "f": 3, "t": 3}
GPU_CAT_KINDS = sorted({KIND_OF_CAT[c] for c in GPU_CATS})  # cat ∈ GPU_CATS ⇔ kind ∈ these
_IS_FLOW = pl.col("ph_code") == PH_FLOW
GPU_ARG_FIELDS = (
    "device",
    "stream",
    "bytes",
    "graph_id",
    "graph_node_id",
    "wait_on_stream",
    "wait_on_cuda_event_record_corr_id",
)
# Collective metadata (`record_param_comms` and NCCL kernels), after `collective` itself.
META_INT_FIELDS = ("in_nelems", "out_nelems", "group_size", "seq")
META_STR_FIELDS = ("dtype", "pg_name", "pg_desc")
META_SPLIT_FIELDS = ("in_split", "out_split", "pg_ranks")  # Kineto strings; lists in some writers
COMM_EVENT = "record_param_comms"  # the host op PyTorch puts collective metadata on
MEMORY_EVENT = "[memory]"
MEMORY_ARG_FIELDS = ("mem_device_type", "mem_device", "mem_bytes", "total_allocated",
                     "total_reserved")


# --------------------------------------------------------------------------- compiled fast path

try:  # built from `_kineto_scan.c` at install; without a C compiler the Python reader does it all
    from moetune.analyzer.readers import _kineto_scan
except ImportError:  # pragma: no cover - exercised by the equality tests' pure-Python runs
    _kineto_scan = None  # type: ignore[assignment]

# The scanner's slots, in its order (`_kineto_scan.c`: E_* and A_* enums); the JSON keys come from
# the Structs above, so a renamed key is changed in one place for both paths.
_SCAN_EVENT_KEYS = ("ph", "cat", "name", "pid", "tid", "ts", "dur", "id", "args")
_SCAN_META = ("collective", *META_INT_FIELDS, *META_STR_FIELDS, *META_SPLIT_FIELDS)
_SCAN_ARG_FIELDS = ("external_id", "correlation", *GPU_ARG_FIELDS, *_SCAN_META, *MEMORY_ARG_FIELDS)
_SCAN_TOP = {"deviceProperties": list[_Device] | None, "distributedInfo": _Dist | None,
             "baseTimeNanoseconds": Num}
_SCAN_TABLES = {
    # timed rows only (ph X/B/E/C/i/I): flow endpoints have their table, metadata rows none
    "main": ("row", "ph_code", "cat_code", "name", "pid", "tid", "ts", "dur", "external_id",
             "correlation"),
    "flow": ("row", "id", "ph", "cat", "ts", "pid", "tid"),
    "gpu": ("row", *GPU_ARG_FIELDS),
    "meta": ("row", *_SCAN_META),
    "mem": ("row", *MEMORY_ARG_FIELDS),
}
USE_COMPILED = True  # False: always the Python reader (the equality tests compare both)
_KIND_INDEX = {k: i for i, k in enumerate(KIND.categories)}  # the Enum's physical codes


# What the scanner reads and how it sorts rows, in its argument order (`scan.__doc__`): built once.
_SCAN_SPEC = (
    tuple(k.encode() for k in _SCAN_EVENT_KEYS),
    tuple(_ARG_KEY_OF[f].encode() for f in _SCAN_ARG_FIELDS),
    tuple(k.encode() for k in _SCAN_TOP),
    (tuple(p.encode() for p in PH_CODE), bytes(PH_CODE.values()), 0),
    (tuple(c.encode() for c in KIND_OF_CAT), bytes(_KIND_INDEX[k] for k in KIND_OF_CAT.values()),
     _KIND_INDEX["other"]),
    sum(1 << _KIND_INDEX[k] for k in GPU_CAT_KINDS),
    _KIND_INDEX["kernel"],
    sum(1 << code for code in set(PH_CODE.values()) if PH_TIMED <= code <= PH_INSTANT),
    PH_FLOW,
    COMM_EVENT.encode(),
    MEMORY_EVENT.encode(),
)


class _ArrowColumn:
    """One column the scanner built, handed to polars through the Arrow PyCapsule interface
    (zero-copy: polars takes over the buffers)."""

    __slots__ = ("_pair",)

    def __init__(self, pair: tuple[Any, Any]) -> None:
        self._pair = pair

    def __arrow_c_array__(self, requested_schema: Any = None) -> tuple[Any, Any]:
        return self._pair


# The event array is cut into one part per core, each of at least this many bytes. Scanner +
# frames, best of 7, 2 cores: 9.8 MB file 16.5 ms in one part, 13.5 in two of 4.9 MB; 34.8 MB
# file 50.2 → 33.7 ms; 1 MB parts gained nothing more (bench/README.md).
SCAN_PART_BYTES = 4 << 20
SCAN_THREADS: int | None = None  # tests: force this many (else `threads`, else every core)


def trim_heap() -> None:
    """Hand the C heap's free pages back to the OS after reading (see `_kineto_scan.trim`)."""
    if _kineto_scan is not None:
        _kineto_scan.trim()


def _scan_columns(data: bytes | mmap.mmap, threads: int | None = None
                  ) -> dict[str, Any] | str | None:
    """The scanner's raw output: capsule columns per table and part, and top-level spans; or the
    reason it declined the file (a string); or None when it is not built or switched off."""
    if _kineto_scan is None or not USE_COMPILED:
        return None
    cores = SCAN_THREADS or threads or cpu_count()
    threads = max(1, min(cores, len(data) // SCAN_PART_BYTES))
    release = isinstance(data, mmap.mmap) and hasattr(mmap, "MADV_DONTNEED")
    return _kineto_scan.scan(data, *_SCAN_SPEC, release, threads, SCAN_PART_BYTES)


def _scan(data: bytes | mmap.mmap, threads: int | None = None
          ) -> tuple[pl.DataFrame, dict[str, pl.DataFrame], _Doc] | None:
    """The frames `_columns` would build, and the whitelisted top-level fields, from the compiled
    scanner; None when it is not built or declines the file (then the Python reader reads it and
    owns every warning and error)."""
    out = _scan_columns(data, threads)
    if not isinstance(out, dict):
        return None
    top = {}
    with memoryview(data) as view:
        for (key, typ), span in zip(_SCAN_TOP.items(), out["spans"], strict=True):
            try:
                top[key] = None if span is None else msgspec.json.decode(view[span[0]:span[1]],
                                                                         type=typ)
            except msgspec.DecodeError:
                return None
    tables: dict[str, list[pl.DataFrame]] = {name: [] for name in _SCAN_TABLES}
    base = 0  # rows are numbered from 0 in each part
    for part in out["parts"]:
        for name, cols in _SCAN_TABLES.items():
            df = pl.DataFrame([pl.Series(_ArrowColumn(pair)).alias(col)
                               for col, pair in zip(cols, part[name], strict=True)])
            if base:
                df = df.with_columns(pl.col("row") + pl.lit(base, dtype=pl.UInt32))
            tables[name].append(df)
        base += part["events"]
    frames = {name: pl.concat(dfs) for name, dfs in tables.items()}
    raw = frames.pop("main").with_columns(
        pl.col("cat_code").replace_strict(dict(enumerate(_KIND_INDEX)), return_dtype=KIND)
        .alias("cat_kind")
    ).drop("cat_code")
    return raw, frames, _Doc(**top)


def _columns(
    evs: list[msgspec.Raw] | list[_Event], data: bytes | mmap.mmap
) -> tuple[pl.DataFrame, dict[str, pl.DataFrame]]:
    """The columns of all events, built `CHUNK` events at a time (raw slices decoded per chunk,
    so the Structs of one chunk only are alive); `_SlowPath` if a chunk fails typed decoding."""
    parts: list[tuple[pl.DataFrame, dict[str, pl.DataFrame]]] = []
    origin = _address(data) if evs and isinstance(evs[0], msgspec.Raw) else None
    for base in range(0, len(evs), CHUNK):
        chunk = evs[base : base + CHUNK]
        if isinstance(chunk[0], msgspec.Raw):
            rows: list[_LeanEvent] | list[_Event] = _decode_chunk(chunk, data, origin)
            args_of = _raw_args(chunk)
        else:
            rows, args_of = chunk, _struct_args(chunk)
        parts.append(_chunk_columns(rows, base, args_of))
        if origin is not None:
            _release_pages(data, origin, chunk[-1])
        del chunk, rows, args_of
    if len(parts) == 1:
        return parts[0]
    if not parts:
        return _chunk_columns([], 0, _struct_args([]))
    return pl.concat([p[0] for p in parts]), {
        k: pl.concat([p[1][k] for p in parts]) for k in parts[0][1]
    }


def _release_pages(data: bytes | mmap.mmap, origin: int, last: msgspec.Raw) -> None:
    """Drop the map's pages up to the last whole page before `last` ends: the chunk is in
    frames now, so its bytes need not stay resident (−1× the file at the reader's peak). The map
    is private and file-backed: a page touched again (a raw slice, the lenient fallback) is read
    back from the file, as it was."""
    if not isinstance(data, mmap.mmap) or not hasattr(mmap, "MADV_DONTNEED"):
        return
    end = (_address(last) or origin) - origin + len(last)
    end -= end % mmap.PAGESIZE
    if end > 0:
        data.madvise(mmap.MADV_DONTNEED, 0, end)


class _PyBuffer(ctypes.Structure):
    """CPython's `Py_buffer` (stable ABI), to read where a buffer's bytes live."""

    _fields_ = (
        ("buf", ctypes.c_void_p),
        ("obj", ctypes.c_void_p),
        ("len", ctypes.c_ssize_t),
        ("itemsize", ctypes.c_ssize_t),
        ("readonly", ctypes.c_int),
        ("ndim", ctypes.c_int),
        ("format", ctypes.c_char_p),
        ("shape", ctypes.c_void_p),
        ("strides", ctypes.c_void_p),
        ("suboffsets", ctypes.c_void_p),
        ("internal", ctypes.c_void_p),
    )


try:  # own function objects (`pythonapi[...]`): the attribute ones are shared process-wide
    _get_buffer = ctypes.pythonapi["PyObject_GetBuffer"]
    _get_buffer.argtypes = (ctypes.py_object, ctypes.POINTER(_PyBuffer), ctypes.c_int)
    _get_buffer.restype = ctypes.c_int
    _release_buffer = ctypes.pythonapi["PyBuffer_Release"]
    _release_buffer.argtypes = (ctypes.POINTER(_PyBuffer),)
    _release_buffer.restype = None
except AttributeError:  # pragma: no cover - not CPython: chunks are joined instead
    _get_buffer = None


def _address(obj: Any) -> int | None:
    """Address of the first byte of a buffer (None if it has none we may write around)."""
    if _get_buffer is None or not isinstance(obj, mmap.mmap | msgspec.Raw):
        return None  # bytes (gzip): immutable, chunks are joined instead
    view = _PyBuffer()
    try:
        _get_buffer(obj, ctypes.byref(view), 0)
    except (BufferError, TypeError, ValueError):  # pragma: no cover - both types export buffers
        return None
    try:
        return view.buf
    finally:
        _release_buffer(ctypes.byref(view))


def _decode_chunk(
    chunk: list[msgspec.Raw], data: bytes | mmap.mmap, origin: int | None
) -> list[_LeanEvent]:
    """Typed decode of consecutive raw events. They are slices of one JSON array in the (private)
    map, separated by commas and blanks only: writing `[` before the first and `]` after the last
    makes that span itself a JSON array, decoded in place instead of joined into a copy (the join
    cost as much as a third of the decode). Bytes are put back before returning."""
    try:
        if origin is not None and isinstance(data, mmap.mmap):
            start = (_address(chunk[0]) or 0) - origin
            end = (_address(chunk[-1]) or 0) - origin + len(chunk[-1])
            if 0 < start < end < len(data):
                before, after = data[start - 1], data[end]
                data[start - 1], data[end] = 0x5B, 0x5D  # "[", "]"
                try:
                    with memoryview(data) as view, view[start - 1 : end + 1] as span:
                        evs = _EVENTS_DECODER.decode(span)
                finally:
                    data[start - 1], data[end] = before, after
                if len(evs) == len(chunk):
                    return evs
        return _EVENTS_DECODER.decode(b"[" + b",".join(chunk) + b"]")
    except msgspec.DecodeError:  # includes ValidationError
        raise _SlowPath from None


# (row indices, allocator fields only?) → those rows' args (`_Args`, or `_MemArgs` when only the
# allocator fields are asked for: `_Args` has them too)
ArgsOf = Callable[[list[int], bool], list[Any]]


def _struct_args(evs: list[_Event]) -> ArgsOf:
    return lambda idx, mem=False: [evs[i].args for i in idx]


def _raw_args(chunk: list[msgspec.Raw]) -> ArgsOf:
    """The args of the given rows, decoded from their raw slices."""

    def args_of(idx: list[int], mem: bool = False) -> list[Any]:
        # One decode per row: these rows are scattered (never two in a row in real traces), and
        # joining their slices into one array cost more than the per-call overhead.
        decode = (_MEM_DECODER if mem else _ARGS_DECODER).decode
        try:
            return [decode(chunk[i]).args for i in idx]
        except msgspec.DecodeError:  # includes ValidationError
            raise _SlowPath from None

    return args_of


def _chunk_columns(
    evs: list[_LeanEvent] | list[_Event], base: int, args_of: ArgsOf
) -> tuple[pl.DataFrame, dict[str, pl.DataFrame]]:
    """One column per field we use, straight from the Structs; rows numbered from `base`.

    Full passes only for fields every event needs; fields of a few categories (GPU args, flow ids,
    collective metadata) are read for those rows alone, found by a vectorized filter.
    """
    df = pl.DataFrame(
        [
            _str_series("ph", [e.ph for e in evs]),
            _str_series("cat", [e.cat for e in evs]),
            _str_series("name", [e.name for e in evs]),
            _id_series("pid", [e.pid for e in evs]),
            _id_series("tid", [e.tid for e in evs]),
            _num_series("ts", [e.ts for e in evs], pl.Float64),
            _num_series("dur", [e.dur for e in evs], pl.Float64),
            _num_series("external_id", [e.args.external_id for e in evs], pl.Int64),
            _num_series("correlation", [e.args.correlation for e in evs], pl.Int64),
        ]
    )
    df = _with_codes(df)
    masks = df.select(
        flow=_IS_FLOW,
        gpu=pl.col("cat_kind").is_in(GPU_CAT_KINDS),
        comm=(pl.col("cat_kind") == "kernel") | (pl.col("name") == COMM_EVENT),
        mem=pl.col("name") == MEMORY_EVENT,
    )
    # Fields of a few categories go to small side frames keyed by row, joined where needed
    # (cheaper than full-length null columns). Index with plain lists: iterating a polars
    # Series from Python is per-element slow.
    needed = pl.col("gpu") | pl.col("comm")
    flow_idx, mem_idx, need = masks.select(
        pl.col("flow").arg_true().implode(), pl.col("mem").arg_true().implode(),
        needed.arg_true().implode().alias("need")
    ).row(0)
    # Positions within `need` of the GPU rows and of the collective candidates.
    gpu_pos, comm_pos = (
        masks.filter(needed)
        .select(pl.col("gpu").arg_true().implode(), pl.col("comm").arg_true().implode())
        .row(0)
    )
    df = df.with_row_index("row", offset=base)
    flow = pl.DataFrame(
        [
            _row_series(flow_idx, base),
            _num_series("id", [evs[i].id for i in flow_idx], pl.Int64),
            _str_series("ph", [evs[i].ph for i in flow_idx]),
            _str_series("cat", [evs[i].cat for i in flow_idx]),
            _num_series("ts", [evs[i].ts for i in flow_idx], pl.Float64),
            _id_series("pid", [evs[i].pid for i in flow_idx]),
            _id_series("tid", [evs[i].tid for i in flow_idx]),
        ]
    )
    # The full args of GPU and collective rows, once; then each side frame's share of them.
    need_args = args_of(need, False)
    sub = [need_args[j] for j in gpu_pos]
    gpu = pl.DataFrame(
        [
            _row_series([need[j] for j in gpu_pos], base),
            *(_num_series(f, list(map(attrgetter(f), sub)), pl.Int64) for f in GPU_ARG_FIELDS),
        ]
    )

    # Collective metadata: a small side frame keyed by row, joined only by the comms builder.
    keep = [j for j in comm_pos if need_args[j].collective is not None]
    sub = [need_args[j] for j in keep]
    meta = pl.DataFrame(
        [
            _row_series([need[j] for j in keep], base),
            _str_series("collective", [a.collective for a in sub]),
            *(_num_series(f, list(map(attrgetter(f), sub)), pl.Int64) for f in META_INT_FIELDS),
            *(_str_series(f, list(map(attrgetter(f), sub))) for f in META_STR_FIELDS),
            *(
                _str_series(f, [_split_str(getattr(a, f)) for a in sub])
                for f in META_SPLIT_FIELDS
            ),
        ]
    )
    sub = args_of(mem_idx, True)
    mem = pl.DataFrame(
        [
            _row_series(mem_idx, base),
            *(_num_series(f, list(map(attrgetter(f), sub)), pl.Int64) for f in MEMORY_ARG_FIELDS),
        ]
    )
    return df, {"flow": flow, "gpu": gpu, "meta": meta, "mem": mem}


def _with_codes(df: pl.DataFrame) -> pl.DataFrame:
    """`ph` and `cat` → the codes every later mask reads (flow rows keep theirs in a side frame)."""
    return df.with_columns(
        pl.col("ph").replace_strict(PH_CODE, default=0, return_dtype=pl.UInt8).alias("ph_code"),
        pl.col("cat")
        .replace_strict(KIND_OF_CAT, default="other", return_dtype=KIND)
        .alias("cat_kind"),
    ).drop("ph", "cat")


def _row_series(idx: list[int], base: int) -> pl.Series:
    s = pl.Series("row", idx, dtype=pl.UInt32)
    return (s + base).cast(pl.UInt32) if base else s


def _split_str(v: StrOrList) -> str | None:
    return str(v) if isinstance(v, list) else v


def _id_series(name: str, values: list[Any]) -> pl.Series:
    """pid/tid: ints, except strings for the "Spans"/"Traces" rows (Kineto writes them last) and
    "stream 7"-style tids in old files, parsed here for those rows. Structs never hold bools, so
    a strict build succeeds exactly when every value is an int64 or None (polars' fast path)."""
    try:
        return pl.Series(name, values, dtype=pl.Int64, strict=True)
    except (TypeError, OverflowError, pl.exceptions.PolarsError):
        pass
    ints = [v if v.__class__ is int else None for v in values]
    s = pl.Series(name, ints, dtype=pl.Int64, strict=False)
    if s.null_count():
        idx = s.is_null().arg_true()
        raw = [values[i] for i in idx.to_list()]
        parsed = _str_series(name, raw).str.extract(r"(-?\d+)\s*$").cast(pl.Int64, strict=False)
        s = s.scatter(idx, parsed)
    return s


def _ns(us: pl.Expr, base_ns: int) -> pl.Expr:
    """µs (int epoch or float with ns decimals) → Int64 ns without float64 rounding at 1e18."""
    whole = us.floor()
    return (
        whole.cast(pl.Int64, strict=False) * 1000
        + ((us - whole) * 1000).round().cast(pl.Int64, strict=False)
        + base_ns
    )


# --------------------------------------------------------------------------- frames


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


def _i32(v: Num) -> int | None:
    """An Int32 frame field; absurd values (a corrupt header) read as unknown."""
    i = _as_int(v)
    return i if i is not None and -(2**31) <= i < 2**31 else None


def _str_or_none(v: Num) -> str | None:
    return None if v is None else str(v)
