"""The Kineto reader's compiled fast path: what `_kineto_scan.c` is asked to read (its slots, in
its order), and its columns turned into the frames `kineto_columns._columns` builds.

The scanner reads well-formed files straight into Arrow columns, one thread per part of the event
array; it declines anything unusual, and the pure-Python reader (`kineto_decode.py`,
`kineto_columns.py`) reads those files (and every file when the extension is not built).
`tests/test_kineto_scan.py` holds the two to equal frames.
"""

from __future__ import annotations

import mmap
from typing import Any

import msgspec
import polars as pl
from moetune.analyzer.frames import KIND
from moetune.analyzer.readers.cores import cpu_count
from moetune.analyzer.readers.kineto_format import (
    _ARG_KEY_OF,
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
    PH_INSTANT,
    PH_TIMED,
    Num,
    _Device,
    _Dist,
    _Doc,
)

try:  # built from `_kineto_scan.c` at install; without a C compiler the Python reader does it all
    from moetune.analyzer.readers import _kineto_scan
except ImportError:  # pragma: no cover - exercised by the equality tests' pure-Python runs
    _kineto_scan = None  # type: ignore[assignment]

# The scanner's slots, in its order (`_kineto_scan.c`: E_* and A_* enums); the JSON keys come from
# the Structs (kineto_format.py), so a renamed key is changed in one place for both paths.
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
    """The frames `kineto_columns._columns` would build, and the whitelisted top-level fields,
    from the compiled scanner; None when it is not built or declines the file (then the Python
    reader reads it and owns every warning and error)."""
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
