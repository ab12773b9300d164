"""Open trace files of any supported format and return one canonical `Trace`.

Formats are recognised by content, not only by name: gzip magic, SQLite header, JSON object.
A directory expands to the trace files inside it (one per rank).
"""

from __future__ import annotations

import gzip
import zlib
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from pathlib import Path

from moetune.analyzer.frames import Trace, concat_traces
from moetune.analyzer.readers.compressed import READ_COMPRESSED, decompress
from moetune.analyzer.readers.cores import cpu_count
from moetune.analyzer.readers.kineto import read_kineto
from moetune.analyzer.readers.kineto_scan import trim_heap
from moetune.analyzer.readers.nsys import read_nsys
from moetune.analyzer.run_identity import one_run

from moetune.errors import UserError, compressed_with

KINETO_SUFFIXES = (".json", ".json.gz", ".json.xz", ".json.bz2")
NSYS_SUFFIXES = (".sqlite", ".sqlite3", ".db", ".nsys-rep", ".qdrep")
SQLITE_MAGIC = b"SQLite format 3\x00"


def sniff(path: Path) -> str:
    """Return 'kineto', 'nsys' or 'nsys-rep' for a file, or raise UserError naming it."""
    name = path.name.lower()
    if name.endswith((".nsys-rep", ".qdrep")):
        return "nsys-rep"
    try:
        with path.open("rb") as fh:
            head = fh.read(64)
    except IsADirectoryError:
        raise UserError("is a directory where a file was expected", path=path) from None
    except OSError as exc:
        raise UserError(f"cannot read: {exc.strerror or exc}", path=path) from None
    if head.startswith(SQLITE_MAGIC):
        return "nsys"
    if head[:2] == b"\x1f\x8b":
        if name.endswith((".sqlite.gz", ".db.gz", ".sqlite3.gz")):
            return "nsys"
        return "kineto"
    if head.lstrip()[:1] == b"{":
        return "kineto"
    if not head:
        raise UserError("is empty", path=path)
    packed = compressed_with(head)
    # xz and bzip2 Kineto JSON is read as gzip is (the standard library has both); an nsys
    # export and zstd (no reader in this Python) are for the user to decompress first
    if packed and packed[0] in READ_COMPRESSED and ".sqlite" not in name and ".db" not in name:
        return "kineto"
    if packed:
        raise UserError(f"is compressed with {packed[0]}: decompress it first "
                        f"({packed[1]} {path.name})", path=path)
    raise UserError(
        "is not a trace moetune can read (expected Kineto .json/.json.gz or an nsys .sqlite export)",
        path=path,
    )


def expand(paths: Sequence[str | Path]) -> list[Path]:
    """Files to read: each path itself, or the trace files inside a directory (sorted)."""
    return expand_report(paths)[0]


def expand_report(paths: Sequence[str | Path]) -> tuple[list[Path], list[Path]]:
    """(files to read, small JSON files of a directory skipped as not traces). A run folder often
    holds a config or notes `.json` beside the rank traces; a file named explicitly is always read
    (and is an error when it is not a trace)."""
    if not paths:
        raise UserError("no trace file given")
    out: list[Path] = []
    skipped: list[Path] = []
    for raw in paths:
        p = Path(raw)
        if not p.exists():
            raise UserError("no such file or directory", path=p)
        if p.is_dir():
            found = sorted(
                f
                for f in p.iterdir()
                if f.is_file() and f.name.lower().endswith(KINETO_SUFFIXES + NSYS_SUFFIXES)
            )
            if not found:
                raise UserError("directory holds no trace files (.json, .json.gz, .sqlite)", path=p)
            keep = [f for f in found if not _small_non_trace(f)]
            if not keep:
                raise UserError("directory holds no trace files (its .json files have no traceEvents)",
                                path=p)
            skipped += [f for f in found if f not in keep]
            out.extend(keep)
        else:
            out.append(p)
    return out, skipped


def _small_non_trace(f: Path) -> bool:
    """A plain `.json` under 1 MiB with no `"traceEvents"` key in it (truth.json, a config)."""
    if not f.name.lower().endswith(".json"):
        return False
    try:
        if f.stat().st_size >= 1 << 20:
            return False
        return b'"traceEvents"' not in f.read_bytes()
    except OSError:
        return False


def is_gzip(path: Path) -> bool:
    with path.open("rb") as fh:
        return fh.read(2) == b"\x1f\x8b"


def open_bytes(path: Path) -> bytes:
    """Whole (decompressed) content of a file; corrupt gzip is a UserError naming the file."""
    try:
        if is_gzip(path):
            with gzip.open(path, "rb") as fh:
                return fh.read()
        data = path.read_bytes()
    except (OSError, EOFError, zlib.error) as exc:
        raise UserError(f"corrupt or truncated gzip ({exc})", path=path) from None
    return decompress(data, path)


def load_trace(paths: Sequence[str | Path], *, allow_mixed_runs: bool = False) -> Trace:
    """Read every path (files or directories of per-rank files) into one Trace.

    Ranks come from each file's own metadata where it has one; files without it are numbered in
    the order given. Files that cannot be ranks of one run (two claiming the same rank, capture
    windows apart, …: `moetune.analyzer.run_identity`) are an error unless `allow_mixed_runs`.
    """
    files, skipped = expand_report(paths)
    formats = [sniff(f) for f in files]
    kineto = [i for i, fmt in enumerate(formats) if fmt == "kineto"]
    read: dict[int, Trace] = {}
    if kineto:
        # Ranks' files are read side by side: the compiled scanner and polars release the GIL.
        # Each read gets its share of the cores; results are taken in file order, so of the
        # Kineto files the first bad one in that order is the error reported.
        cores = cpu_count()
        workers = min(len(kineto), cores)
        threads = max(1, cores // workers)
        if workers == 1:  # one file (or one core): no pool
            read |= {i: read_kineto(files[i], default_rank=i, threads=threads) for i in kineto}
        else:
            read |= _read_side_by_side([files[i] for i in kineto], kineto, workers, threads)
        trim_heap()  # the reads' freed C memory: to the OS, not kept beside polars' own heap
    for i, fmt in enumerate(formats):
        if fmt != "kineto":
            read[i] = read_nsys(files[i], first_rank=i)
    parts, mixed = one_run([read[i] for i in range(len(files))], files,
                           allow_mixed=allow_mixed_runs)
    trace = concat_traces(parts)
    notes = tuple(f"{f}: skipped, a .json with no traceEvents (not a trace)" for f in skipped)
    if notes or mixed:
        trace = replace(trace, warnings=notes + mixed + trace.warnings)
    return trace


def _read_side_by_side(files: list[Path], ranks: list[int], workers: int, threads: int
                       ) -> dict[int, Trace]:
    """Kineto files read by a thread pool, keyed by their default rank, in the given order."""
    with ThreadPoolExecutor(max_workers=workers) as pool:
        futures = {r: pool.submit(read_kineto, f, default_rank=r, threads=threads)
                   for f, r in zip(files, ranks, strict=True)}
        try:
            return {r: fut.result() for r, fut in futures.items()}
        finally:
            for fut in futures.values():
                fut.cancel()

