"""Per-rank summary: what the cross-rank reduce needs from one rank's trace, small enough that
thousands of ranks fit on one machine (the map step of `moetune.scale`).

Every table carries `rank`; the summaries of many ranks are these tables concatenated. On disk
each table is one Parquet file under a directory keyed by the trace's content hash, so a re-run
reads summaries only.
"""

from __future__ import annotations

import hashlib
import shutil
import tempfile
from dataclasses import dataclass, field, fields, replace
from pathlib import Path

import polars as pl
from moetune.analyzer import device_memory
from moetune.analyzer.classify import KernelClasses, class_table, classify, load_classes
from moetune.analyzer.collectives import comm_instances
from moetune.analyzer.frames import GPU_KINDS, Trace
from moetune.analyzer.observed import in_windows
from moetune.analyzer.steps import find_steps
from moetune.analyzer.walls import (
    attribute_walls,
    fractions,
    median_step,
    recompute_launches,
    recompute_ops,
    wall_layers,
)

from moetune.errors import UserError

SUMMARY_VERSION = 3  # 3: the phases table

# Table schemas: the contract between the map (one rank) and the reduce (all ranks).
SCHEMAS: dict[str, pl.Schema] = {
    # GPU window of each analysed step, on the rank's own clock.
    "steps": pl.Schema({"rank": pl.Int32, "step": pl.Int64, "start_ns": pl.Int64,
                        "end_ns": pl.Int64}),
    # Seconds of each wall in each analysed step (wall names as in the diagnosis).
    "walls": pl.Schema({"rank": pl.Int32, "step": pl.Int64, "wall": pl.String, "s": pl.Float64}),
    # Communication kernels numbered per (rank, group) as `collectives.comm_instances` does, with
    # the collective's metadata where the trace links it (bytes moved, process group, splits).
    "collectives": pl.Schema({"rank": pl.Int32, "group": pl.String, "k": pl.Int64,
                              "ts_ns": pl.Int64, "end_ns": pl.Int64, "bytes": pl.Int64,
                              "collective": pl.String, "pg_name": pl.String,
                              "pg_desc": pl.String, "pg_ranks": pl.String,
                              "in_split": pl.String, "out_split": pl.String}),
    # Kernel-class totals over the analysed steps.
    "kernels": pl.Schema({"rank": pl.Int32, "cls": pl.String, "n": pl.Int64, "s": pl.Float64}),
    # Peak device memory and where the figure came from (allocator events, nsys, none).
    "memory": pl.Schema({"rank": pl.Int32, "peak_allocated": pl.Int64, "peak_reserved": pl.Int64,
                         "source": pl.String}),
    # Host-side causes of GPU idle time over the analysed steps.
    "host_idle": pl.Schema({"rank": pl.Int32, "cause": pl.String, "s": pl.Float64}),
    # The rank's median step (analyzer/phases.py): each phase's step time (`kind` phase) and the
    # step split HTA-style (`kind` part: step, compute, communication, memory, host, idle).
    "phases": pl.Schema({"rank": pl.Int32, "step": pl.Int64, "kind": pl.String, "name": pl.String,
                         "s": pl.Float64}),
    # One row per rank: where it came from.
    "meta": pl.Schema({"rank": pl.Int32, "file": pl.String, "sha256": pl.String,
                       "bytes": pl.Int64, "format": pl.String, "world_size": pl.Int32,
                       "clock_offset_ns": pl.Int64, "device_name": pl.String,
                       "summary_version": pl.Int32,
                       # where the rank number came from (frames.py `ranks.rank_from`):
                       # `file_order` ranks are renumbered where two files' ranks collide
                       "rank_from": pl.String}),
}


@dataclass(frozen=True, slots=True)
class Summaries:
    """Summary tables of one or many ranks (see `SCHEMAS`)."""

    steps: pl.DataFrame
    walls: pl.DataFrame
    collectives: pl.DataFrame
    kernels: pl.DataFrame
    memory: pl.DataFrame
    host_idle: pl.DataFrame
    meta: pl.DataFrame
    # the newest table: callers that build Summaries by hand without it get an empty one
    phases: pl.DataFrame = field(default_factory=lambda: pl.DataFrame(schema=SCHEMAS["phases"]))

    @classmethod
    def empty(cls) -> Summaries:
        return cls(**{name: pl.DataFrame(schema=schema) for name, schema in SCHEMAS.items()})

    @classmethod
    def concat(cls, parts: list[Summaries]) -> Summaries:
        """The tables of many ranks, one frame per table."""
        if not parts:
            return cls.empty()
        return cls(**{f.name: pl.concat([getattr(p, f.name) for p in parts], how="vertical")
                      for f in fields(cls)})

    @property
    def ranks(self) -> list[int]:
        return self.meta.get_column("rank").sort().to_list()


# Element sizes of the dtypes collectives are written with (Kineto `record_param_comms` names the
# c10 scalar type; NCCL NVTX payloads its own spellings): bytes = elements × size; null otherwise.
DTYPE_BYTES: dict[str, int] = {
    "Byte": 1, "Char": 1, "Bool": 1, "Float8_e4m3fn": 1, "Float8_e5m2": 1, "Float8_e4m3fnuz": 1,
    "Float8_e5m2fnuz": 1, "Short": 2, "Half": 2, "BFloat16": 2, "Int": 4, "Float": 4,
    "UInt32": 4, "Long": 8, "Double": 8, "UInt64": 8, "ComplexFloat": 8, "ComplexDouble": 16,
    "ncclInt8": 1, "ncclUint8": 1, "ncclFloat16": 2, "ncclBfloat16": 2, "ncclInt32": 4,
    "ncclUint32": 4, "ncclFloat32": 4, "ncclInt64": 8, "ncclUint64": 8, "ncclFloat64": 8,
}
HOST_CAUSES: dict[str, str] = {  # host_idle.cause → the per-step column it sums
    "launch_starved": "launch_starved_ns", "sync_blocked": "sync_blocked_ns",
    "other": "other_idle_ns",
}
NS = 1e-9


def summarize(path: str | Path, *, default_rank: int = 0, window: str | None = None,
              step_range: str | None = None, sha256: str | None = None,
              classes: KernelClasses | None = None) -> Summaries:
    """One trace file (Kineto, or an nsys export of one or several ranks) → its ranks' tables.

    The diagnosis pipeline's own functions compute every figure (classify, find_steps,
    attribute_walls, class_table, device_memory.peaks, comm_instances), so a rank's summary
    says what `moetune diagnose` says of it. `default_rank`: the rank of a file whose metadata
    names none (the readers' file-order numbering); `sha256`: the file's digest when the caller
    has it (hashed here otherwise).
    """
    from moetune.analyzer.readers import sniff
    from moetune.analyzer.readers.kineto import read_kineto
    from moetune.analyzer.readers.nsys import read_nsys

    p = Path(path)
    fmt = sniff(p)
    trace = (read_kineto(p, default_rank=default_rank, threads=1) if fmt == "kineto"
             else read_nsys(p, first_rank=default_rank))
    try:
        size = p.stat().st_size
    except OSError as exc:
        raise UserError(f"cannot read: {exc.strerror or exc}", path=p) from None
    return summarize_trace(trace, file=p.name, sha256=sha256 or file_sha256(p), size=size,
                           window=window, step_range=step_range, classes=classes)


def summarize_trace(trace: Trace, *, file: str, sha256: str, size: int,
                    window: str | None = None, step_range: str | None = None,
                    classes: KernelClasses | None = None) -> Summaries:
    """`summarize` for an already-read Trace (`file`, `sha256`, `size`: its source, for meta)."""
    cl = classes or load_classes()
    if not trace.events.select(pl.col("kind").is_in(GPU_KINDS).any()).item():
        raise UserError("has no GPU events (CPU-only profile?)", path=file)
    events = classify(trace.events, classes=cl)
    rc_ops = recompute_ops(events, classes=cl)
    rc = recompute_launches(events, ops=rc_ops)
    layers = wall_layers(events, recompute=rc)
    steps = find_steps(events, window=window, step_range=step_range, classes=cl, source_file=file)
    per_step = attribute_walls(events, steps.table, layers=layers)
    gpu = in_windows(events, steps.table)
    ranks = trace.ranks.sort("rank")
    return Summaries(
        phases=_phases(trace, events, steps.table, per_step, rc, cl),
        steps=_conform(steps.table.select("rank", "step", start_ns="win_start_ns",
                                          end_ns="win_end_ns"), "steps"),
        walls=_walls(per_step),
        collectives=_collectives(replace(trace, events=events)),
        kernels=_conform(gpu.with_columns(pl.col("rank").cast(pl.Int32)).group_by("rank")
                         .map_groups(lambda g: class_table(g).with_columns(
                             rank=pl.lit(g.get_column("rank")[0], dtype=pl.Int32)))
                         .select("rank", cls="kclass", n="count", s=pl.col("time_ns") * NS)
                         if gpu.height else pl.DataFrame(schema=SCHEMAS["kernels"]), "kernels"),
        memory=_memory(trace, steps.table, ranks.get_column("rank").to_list()),
        host_idle=_conform(per_step.group_by("rank").agg(
            [(pl.col(c).sum() * NS).alias(k) for k, c in HOST_CAUSES.items()])
            .unpivot(index="rank", variable_name="cause", value_name="s"), "host_idle"),
        meta=_conform(ranks.select(
            "rank",
            file=pl.lit(file), sha256=pl.lit(sha256), bytes=pl.lit(size, dtype=pl.Int64),
            format=pl.col("format").fill_null("kineto"), world_size="world_size",
            clock_offset_ns=pl.col("clock_offset_ns").fill_null(0), device_name="device_name",
            summary_version=pl.lit(SUMMARY_VERSION, dtype=pl.Int32),
            rank_from=(pl.col("rank_from") if "rank_from" in ranks.columns
                       else pl.lit(None, dtype=pl.String))), "meta"),
    )


def _phases(trace: Trace, events: pl.DataFrame, steps: pl.DataFrame, per_step: pl.DataFrame,
            recompute: pl.DataFrame, classes: KernelClasses) -> pl.DataFrame:
    """The `phases` table: each rank's median step by phase and by part (analyzer/phases.py)."""
    from moetune.analyzer.phases import rank_rows
    from moetune.analyzer.phases_book import load_phases
    from moetune.analyzer.phases_sequence import label_items, windows
    from moetune.analyzer.phases_table import phase_times

    med = median_step(per_step)
    if med.height == 0:
        return pl.DataFrame(schema=SCHEMAS["phases"])
    win = windows(steps, med)
    formats = {int(r): str(f or "kineto") for r, f in trace.ranks.select("rank", "format").iter_rows()}
    lab = label_items(events, win, book=load_phases(), classes=classes, comms=trace.comms,
                      recompute=recompute, formats=formats)
    add, _ = phase_times(lab.items, win)
    rows = []
    for r in rank_rows(med, add):
        rows += [{"rank": r["rank"], "step": r["step"], "kind": "part", "name": k[:-2], "s": r[k]}
                 for k in ("step_s", "compute_s", "communication_s", "memory_s", "host_s", "idle_s")]
        rows += [{"rank": r["rank"], "step": r["step"], "kind": "phase", "name": p, "s": s}
                 for p, s in r["phases"].items()]
    return _conform(pl.DataFrame(rows, schema=SCHEMAS["phases"]), "phases")


def _conform(df: pl.DataFrame, table: str) -> pl.DataFrame:
    """`df` with exactly the table's columns, in order and cast to its dtypes."""
    schema = SCHEMAS[table]
    return df.select([pl.col(c).cast(t) for c, t in schema.items()]).sort(
        [c for c in ("rank", "step", "group", "k", "wall", "cls", "cause", "kind", "name")
         if c in schema])


def _walls(per_step: pl.DataFrame) -> pl.DataFrame:
    """Exposed seconds of each wall in each step: the diagnosis' `fractions` times the step."""
    rows = [{"rank": r["rank"], "step": r["step"], "wall": w, "s": f * (r["wall_ns"] or 0) * NS}
            for r in per_step.to_dicts() for w, f in fractions(r).items()]
    return _conform(pl.DataFrame(rows, schema=SCHEMAS["walls"]) if rows
                    else pl.DataFrame(schema=SCHEMAS["walls"]), "walls")


def _collectives(trace: Trace) -> pl.DataFrame:
    """`comm_instances` with the metadata of the collective each kernel ran (linked as the
    instances' groups are: by correlation, else by external id)."""
    inst = comm_instances(trace)
    if inst.height == 0:
        return pl.DataFrame(schema=SCHEMAS["collectives"])
    ev = trace.events.with_row_index("node").select(
        pl.col("node").cast(pl.Int64), "correlation",
        *(["external_id"] if "external_id" in trace.events.columns else []))
    inst = inst.join(ev, on="node", how="left")
    meta_cols = ["collective", "pg_name", "pg_desc", "pg_ranks", "in_split", "out_split",
                 "bytes"]
    c = trace.comms
    if c.height and {"collective", "in_nelems", "out_nelems", "dtype"} <= set(c.columns):
        size = pl.col("dtype").replace_strict(DTYPE_BYTES, default=None, return_dtype=pl.Int64)
        meta = c.select(
            "rank", "correlation", "external_id",
            *[pl.col(k).cast(pl.String) if k in c.columns else pl.lit(None, pl.String).alias(k)
              for k in meta_cols[:-1]],
            bytes=pl.max_horizontal("in_nelems", "out_nelems") * size)
        by_corr = meta.drop_nulls("correlation").unique(["rank", "correlation"], keep="first")
        by_ext = meta.drop_nulls("external_id").unique(["rank", "external_id"], keep="first")
        inst = inst.join(by_corr.drop("external_id"), on=["rank", "correlation"], how="left")
        if "external_id" in inst.columns:
            ext = by_ext.drop("correlation").rename({k: f"{k}_x" for k in meta_cols})
            inst = inst.join(ext, on=["rank", "external_id"], how="left").with_columns(
                [pl.coalesce(k, f"{k}_x").alias(k) for k in meta_cols])
    else:
        inst = inst.with_columns(
            [pl.lit(None, dtype=SCHEMAS["collectives"][k]).alias(k) for k in meta_cols])
    return _conform(inst, "collectives")


def _memory(trace: Trace, steps: pl.DataFrame, ranks: list[int]) -> pl.DataFrame:
    """Peak device memory per rank (`device_memory.peaks`), `source: none` (nulls) without."""
    per = device_memory.peaks(trace.memory, steps)
    has_alloc = trace.memory.get_column("allocated").is_not_null()
    src = {int(r): ("allocator_events" if a else "cuda_memory_usage")
           for r, a in trace.memory.with_columns(a=has_alloc).group_by("rank")
           .agg(pl.col("a").any()).iter_rows()}
    got = {int(r): (a, v) for r, a, v in per.select("rank", "peak_allocated", "peak_reserved")
           .iter_rows()}
    rows = [{"rank": r, "peak_allocated": got.get(r, (None, None))[0],
             "peak_reserved": got.get(r, (None, None))[1],
             "source": src.get(r, "none") if r in got else "none"} for r in ranks]
    return _conform(pl.DataFrame(rows, schema=SCHEMAS["memory"]), "memory")


def file_sha256(path: str | Path) -> str:
    """sha256 of a file's content (the cache key of its summary)."""
    h = hashlib.sha256()
    try:
        with Path(path).open("rb") as fh:
            for chunk in iter(lambda: fh.read(1 << 20), b""):
                h.update(chunk)
    except OSError as exc:
        raise UserError(f"cannot read: {exc.strerror or exc}", path=path) from None
    return h.hexdigest()


def write(summaries: Summaries, directory: str | Path) -> Path:
    """Each table as `<directory>/<table>.parquet`; written to a temporary sibling and renamed,
    so a reader (or a second worker summarising the same file) never sees half a summary."""
    d = Path(directory)
    d.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{d.name}.", dir=d.parent))
    try:
        for f in fields(Summaries):
            getattr(summaries, f.name).write_parquet(tmp / f"{f.name}.parquet", statistics=False)
        try:
            tmp.rename(d)
        except OSError:  # another writer won the race: its summary is the same
            if not (d / "meta.parquet").exists():
                raise
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
    return d


def read(directories: str | Path | list[str | Path], *, source: str | None = None
         ) -> Summaries:
    """The summaries written by `write` in one directory or many (concatenated, in the order
    given). `source`: also a column of that name in every table, the directory of each row."""
    dirs = [Path(directories)] if isinstance(directories, str | Path) else [
        Path(d) for d in directories]
    if not dirs:
        return Summaries.empty()
    out = {}
    for name, schema in SCHEMAS.items():
        files = [d / f"{name}.parquet" for d in dirs]
        try:
            df = pl.read_parquet(files, include_file_paths=source)
        except (OSError, pl.exceptions.ComputeError) as exc:
            raise UserError(f"unreadable summary table {name} ({exc})".splitlines()[0],
                            path=dirs[0] if len(dirs) == 1 else dirs[0].parent) from None
        cols = [pl.col(c).cast(t) for c, t in schema.items()]
        if source is not None:
            cols.append(pl.col(source).str.strip_suffix(f"/{name}.parquet"))
        out[name] = df.select(cols)
    return Summaries(**out)
