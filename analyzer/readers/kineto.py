"""PyTorch profiler (Kineto) JSON → canonical frames (`moetune.analyzer.frames`): `read_kineto`.

Two readers, one result. The compiled scanner (`kineto_scan.py`, over `_kineto_scan.c`) reads
well-formed files straight into Arrow columns, one thread per part of the event array; it declines
anything unusual, and the pure-Python reader reads those files (and every file when the extension
is not built). `tests/test_kineto_scan.py` holds the two to equal frames. Speed matters: traces
reach GBs.

The reader's modules, in the order a file goes through them:

- `kineto_format.py`: the fields read (msgspec Structs), the categories and phases mapped;
- `kineto_scan.py`: the compiled fast path (file → columns);
- `kineto_decode.py`: the Python path's file → decoded document (typed, else lenient);
- `kineto_columns.py`: decoded events → columns and side frames, in chunks for large files;
- `kineto_frames.py`: columns → the canonical frames;

and this one, which drops the rows that are no interval and joins the side frames. Names with a
leading underscore are the reader's own: shared among these modules, used by nothing else (but
the tests).
"""

from __future__ import annotations

from pathlib import Path

import polars as pl
from moetune.analyzer.frames import Trace
from moetune.analyzer.readers.kineto_columns import _columns, _SlowPath
from moetune.analyzer.readers.kineto_decode import _decode, _decode_top, _open
from moetune.analyzer.readers.kineto_format import PH_INSTANT, PH_TIMED
from moetune.analyzer.readers.kineto_frames import (
    _as_int,
    _comms,
    _events,
    _flows,
    _i32,
    _memory,
    _ranks,
)
from moetune.analyzer.readers.kineto_scan import _scan

from moetune.errors import UserError

MAX_DUR_NS = 7 * 24 * 3600 * 10**9  # HTA drops CUPTI-overflow durations above 7 days; so do we


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


def _ns(us: pl.Expr, base_ns: int) -> pl.Expr:
    """µs (int epoch or float with ns decimals) → Int64 ns without float64 rounding at 1e18."""
    whole = us.floor()
    return (
        whole.cast(pl.Int64, strict=False) * 1000
        + ((us - whole) * 1000).round().cast(pl.Int64, strict=False)
        + base_ns
    )
