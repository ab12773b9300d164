"""Decoded Kineto events → the reader's columns: one frame of the fields every row has (`ph` and
`cat` as codes), and side frames keyed by row for the fields of a few categories (flow endpoints,
GPU args, collective metadata, allocator state).

Columns are built with one list comprehension each; numbers written as strings are parsed, and
integers beyond int64 become null. Files above `kineto_decode.RAW_MIN_BYTES` keep `traceEvents`
as raw slices of the mmap and are decoded here `CHUNK` events at a time, so only one chunk's
Structs are alive (peak RSS −10…30 %; bench/README.md). On that path:

- each chunk is decoded in place: the file is mapped privately (copy-on-write, never written
  back) and `[`/`]` are written around the chunk's span, instead of joining its slices into a copy;
- every row gets `_LeanEvent` (two args); the other `_Args` fields are decoded only for the GPU
  and collective rows that use them (9–12 % of rows in the corpus), from their raw slices. A
  wrongly typed field that a row's category never uses (say `stream` on a cpu_op) is therefore not
  seen, and no longer sends the file through the lenient decode; the frames are the same
  either way.

A chunk the typed decoder rejects raises `_SlowPath`: the caller decodes the whole file leniently
(`kineto_decode._decode`) and builds the columns again.
"""

from __future__ import annotations

import ctypes
import mmap
from collections.abc import Callable
from operator import attrgetter
from typing import Any

import msgspec
import polars as pl
from moetune.analyzer.frames import KIND
from moetune.analyzer.readers.kineto_format import (
    COMM_EVENT,
    GPU_ARG_FIELDS,
    GPU_CAT_KINDS,
    KIND_OF_CAT,
    MEMORY_ARG_FIELDS,
    MEMORY_EVENT,
    META_INT_FIELDS,
    META_SPLIT_FIELDS,
    META_STR_FIELDS,
    PH_CODE,
    PH_FLOW,
    StrOrList,
    _ArgsOnly,
    _Event,
    _LeanEvent,
    _MemOnly,
)

_EVENTS_DECODER = msgspec.json.Decoder(list[_LeanEvent])
_ARGS_DECODER = msgspec.json.Decoder(_ArgsOnly)
_MEM_DECODER = msgspec.json.Decoder(_MemOnly)
CHUNK = 32768
_IS_FLOW = pl.col("ph_code") == PH_FLOW


class _SlowPath(Exception):
    """A chunk the typed decoder rejects: the whole file goes through `kineto_decode._decode`
    instead."""


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
