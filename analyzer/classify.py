"""Kernel, copy and runtime-call classes as data: event names → `kclass`, `wall`, `rclass`.

The rules live in `analyzer/kernel_classes.yaml` (validated by schemas/kernel_classes.schema.json);
this module only turns them into polars expressions. Traces hold thousands of distinct names but
millions of events, so rules run on the unique (kind, name, copy_kind, copy_mem, size bucket) keys
and the result is joined back.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import Any

import polars as pl
from moetune.analyzer.frames import EVENTS_SCHEMA, require

from moetune.errors import UserError
from moetune.resources import data, schema
from moetune.schema_check import first_error
from moetune.vocabulary import WALLS
from moetune.yamlio import read_catalog

CLASSES_PATH = data("moetune.analyzer", "kernel_classes.yaml")
SCHEMA_PATH = schema("kernel_classes")

WALL = pl.Enum(list(WALLS))
RCLASSES: tuple[str, ...] = (
    "launch",
    "graph_launch",
    "sync",
    "memcpy_api",
    "event_record",
    "stream_wait_event",
    "other",
)
RCLASS = pl.Enum(list(RCLASSES))
GPU_RULE_KINDS = ("kernel", "memcpy", "memset", "graph")
RULED_KINDS = (*GPU_RULE_KINDS, "runtime", "sync")  # the kinds any rule classifies


@dataclass(frozen=True, slots=True)
class KernelClasses:
    """Validated rule lists, in YAML order (first match wins)."""

    gpu: tuple[dict[str, Any], ...]
    runtime: tuple[dict[str, Any], ...]
    recompute_regions: dict[str, list[str]]
    backward_ops: dict[str, list[str]]
    steps: dict[str, Any]
    source: str
    process_groups: tuple[dict[str, Any], ...] = ()
    forward_ops: dict[str, list[str]] = field(default_factory=dict)
    repack_ops: dict[str, list[str]] = field(default_factory=dict)

    @property
    def size_thresholds(self) -> list[int]:
        return sorted({int(r["min_bytes"]) for r in self.gpu if "min_bytes" in r})

    @property
    def kclasses(self) -> list[str]:
        return sorted({r["kclass"] for r in self.gpu})


def load_classes(path: str | Path | None = None) -> KernelClasses:
    """Read and validate a kernel-classes YAML (the shipped one by default)."""
    return _load(str(Path(path) if path else CLASSES_PATH))


@lru_cache(maxsize=8)
def _load(path: str) -> KernelClasses:
    doc = read_catalog(path, "kernel classes")
    validate_classes(doc, path)  # every load, the shipped file too (moetune.schema_check: ~1 ms)
    rec = doc.get("recompute") or {}
    return KernelClasses(
        gpu=tuple(doc["gpu"]),
        runtime=tuple(doc["runtime"]),
        recompute_regions=rec.get("regions", {}),
        backward_ops=rec.get("backward_ops", {}),
        steps=doc.get("steps") or {},
        source=Path(path).name,
        process_groups=tuple(doc.get("process_groups") or ()),
        forward_ops=rec.get("forward_ops", {}),
        repack_ops=rec.get("repack_ops", {}),
    )


def validate_classes(doc: Any, path: str | Path) -> None:
    """UserError naming the first place where `doc` breaks schemas/kernel_classes.schema.json."""
    err = first_error(doc, _schema())
    if err:
        where = "/".join(str(p) for p in err[0]) or "(top)"
        raise UserError(f"invalid kernel classes at {where}: {err[1]}", path=path)


@lru_cache(maxsize=1)
def _schema() -> dict[str, Any]:
    return json.loads(SCHEMA_PATH.read_text())


def match_expr(match: dict[str, list[str]], col: str = "name") -> pl.Expr:
    """Boolean expression: any prefix / substring / case-insensitive substring / regex fits."""
    c = pl.col(col).fill_null("")
    parts: list[pl.Expr] = []
    parts += [c.str.starts_with(p) for p in match.get("prefix", [])]
    parts += [c.str.contains(s, literal=True) for s in match.get("contains", [])]
    if match.get("icontains"):
        low = c.str.to_lowercase()
        parts += [low.str.contains(s.lower(), literal=True) for s in match["icontains"]]
    parts += [c.str.contains(r) for r in match.get("regex", [])]
    if not parts:
        return pl.lit(False)
    return pl.any_horizontal(parts)


def with_pg_role(gpu: pl.DataFrame, comms: pl.DataFrame, classes: KernelClasses | None = None
                 ) -> pl.DataFrame:
    """GPU rows plus `pg_role`: the role (kernel_classes.yaml `process_groups`) of the process
    group their collective ran on, joined through the launch correlation; null where the trace
    names no group (older PyTorch, non-Megatron groups, non-collective kernels)."""
    rules = (classes or load_classes()).process_groups
    need = {"rank", "correlation", "pg_desc"}
    if not rules or comms.height == 0 or not need <= set(comms.columns):
        return gpu.with_columns(pl.lit(None, dtype=pl.String).alias("pg_role"))
    role = pl.lit(None, dtype=pl.String)
    for rule in reversed(rules):
        role = pl.when(match_expr(rule["match"], col="pg_desc")).then(pl.lit(rule["role"])).otherwise(role)
    roles = (comms.filter(pl.col("correlation").is_not_null() & pl.col("pg_desc").is_not_null())
             .select("rank", pl.col("correlation").cast(pl.Int64), role.alias("pg_role"))
             .unique(["rank", "correlation"], keep="first"))
    return gpu.join(roles, on=["rank", "correlation"], how="left")


def _gpu_rule_expr(rule: dict[str, Any]) -> pl.Expr:
    cond = pl.col("kind").is_in(rule.get("kinds", ["kernel"]))
    if "copy_kinds" in rule:
        cond = cond & pl.col("copy_kind").cast(pl.String).is_in(rule["copy_kinds"])
    if "copy_mems" in rule:
        cond = cond & pl.col("copy_mem").cast(pl.String).is_in(rule["copy_mems"]).fill_null(False)
    if "min_bytes" in rule:
        cond = cond & (pl.col("_size_bucket") >= int(rule["min_bytes"]))
    return cond & match_expr(rule["match"])


def _size_bucket(thresholds: list[int]) -> pl.Expr:
    """Largest rule threshold a copy reaches (0 below all), so uniqueness stays cheap."""
    b = pl.col("bytes").fill_null(0)
    out: pl.Expr = pl.lit(0, dtype=pl.Int64)
    for t in thresholds:  # ascending: later thresholds overwrite
        out = pl.when(b >= t).then(pl.lit(t, dtype=pl.Int64)).otherwise(out)
    return out


def classify_keys(keys: pl.DataFrame, classes: KernelClasses) -> pl.DataFrame:
    """Classify unique keys (kind, name, copy_kind, copy_mem, sync_kind, _size_bucket) → kclass,
    wall, rclass, blocking.

    The first rule that fits wins. Its index comes from one flat `coalesce` per rule list, and the
    rule's outputs are gathered by that index: nested when/then chains (one per output column) cost
    polars ~25 ms to plan on any input, a fixed cost that was a sixth of a small trace's diagnosis.
    """
    kind = pl.col("kind")
    is_gpu, is_rt, is_sync = kind.is_in(GPU_RULE_KINDS), kind == "runtime", kind == "sync"

    def first(conds: list[pl.Expr]) -> pl.Expr:
        if not conds:
            return pl.lit(None, dtype=pl.UInt32)
        return pl.coalesce([pl.when(c).then(pl.lit(i, dtype=pl.UInt32)) for i, c in enumerate(conds)])

    def pick(values: list[Any], dtype: pl.DataType, idx: str) -> pl.Expr:
        return pl.lit(pl.Series(values, dtype=dtype)).gather(pl.col(idx))

    gpu, rt = classes.gpu, classes.runtime
    ruled = keys.with_columns(
        first([is_gpu & _gpu_rule_expr(r) for r in gpu]).alias("_g"),
        first([is_rt & match_expr(r["match"]) for r in rt]).alias("_r"),
    )
    # CUPTI sync records are host waits, except stream-wait-event (a GPU-side dependency).
    sync_blocks = pl.col("sync_kind").cast(pl.String).fill_null("other") != "stream_wait_event"
    return ruled.with_columns(
        pick([r["kclass"] for r in gpu], pl.String, "_g").alias("kclass"),
        pick([r["wall"] for r in gpu], pl.String, "_g").cast(WALL).alias("wall"),
        pl.when(is_sync).then(pl.lit("sync"))
        .otherwise(pick([r["rclass"] for r in rt], pl.String, "_r")).cast(RCLASS).alias("rclass"),
        pl.when(is_sync).then(sync_blocks)
        .otherwise(pick([bool(r.get("blocking", False)) for r in rt], pl.Boolean, "_r"))
        .fill_null(False).alias("blocking"),
    ).drop("_g", "_r")


KEY = "_class_key"


def _packed_key(ev: pl.DataFrame, thresholds: list[int]) -> pl.Expr | None:
    """The classification keys of `ev` (kind, name as Categorical, copy_kind, copy_mem,
    sync_kind, _size_bucket) packed into one UInt64 column `KEY`: each field's code + 1 (0 for
    null) in its own bits, the size bucket by its rank among 0 and `thresholds`. None when a key
    is not of the dtype this packing knows or the fields need more than 64 bits."""
    enums = ("kind", "copy_kind", "copy_mem", "sync_kind")
    if not all(isinstance(ev.schema[c], pl.Enum) for c in enums) or not isinstance(
            ev.schema["name"], pl.Categorical):
        return None
    fields: list[tuple[pl.Expr, int]] = [
        ((pl.col(c).to_physical().cast(pl.UInt64) + 1).fill_null(0),
         (len(ev.schema[c].categories) + 1).bit_length()) for c in enums]
    fields.append(((pl.col("name").to_physical().cast(pl.UInt64) + 1).fill_null(0), 33))
    # a bucket is 0 or a threshold: its rank among those values stands for it
    values, b = sorted({0, *thresholds}), pl.col("_size_bucket")
    rank = pl.sum_horizontal([(b >= v).cast(pl.UInt64) for v in values])
    fields.append((rank, (len(values) + 1).bit_length()))
    if sum(bits for _, bits in fields) > 64:
        return None
    key, shift = pl.lit(0, dtype=pl.UInt64), 0
    for expr, bits in fields:
        key = key + expr * pl.lit(1 << shift, dtype=pl.UInt64)
        shift += bits
    return key.alias(KEY)


def classify(events: pl.DataFrame, *, classes: KernelClasses | None = None) -> pl.DataFrame:
    """Return `events` plus `kclass` (String), `wall` (Enum), `rclass` (Enum), `blocking` (Boolean).

    GPU rows get kclass/wall (never null: the YAML ends in catch-alls); runtime and sync rows get
    rclass/blocking; other rows get nulls and blocking=False.
    """
    require(events, ("kind", "name", "copy_kind", "bytes", "sync_kind"), what="events")
    cl = classes or load_classes()
    key_cols = ["kind", "name", "copy_kind", "copy_mem", "sync_kind", "_size_bucket"]
    # frames made before copies had a memory kind: unknown, never a failure
    mem = pl.col("copy_mem") if "copy_mem" in events.columns else pl.lit(None, EVENTS_SCHEMA["copy_mem"])
    # Only GPU, runtime and sync rows have classes (cpu ops, annotations … get nulls): the rest,
    # most rows of a trace, are not hashed. Names as categorical codes: `unique` and the join
    # hash integers, not strings; the rules still see the strings.
    ruled = pl.col("kind").is_in(RULED_KINDS)
    at = events.select(ruled.arg_true()).to_series()
    ev = events.lazy().filter(ruled).select(
        "kind", pl.col("name").cast(pl.Categorical), "copy_kind", mem.alias("copy_mem"), "sync_kind",
        _size_bucket(cl.size_thresholds).alias("_size_bucket"),
    ).collect()
    key = _packed_key(ev, cl.size_thresholds)
    if key is not None:
        # One UInt64 per row stands for its six keys: the distinct keys and the join back hash
        # one column instead of six (classify 2.8 → 2.0 s on the 11 M rows of a 1 GB nsys export).
        ev = ev.with_columns(key)
        first = ev.filter(pl.col(KEY).is_first_distinct())
        classified = classify_keys(first.with_columns(pl.col("name").cast(pl.String)), cl)
        new = ev.select(KEY).join(classified.drop(key_cols), on=KEY, how="left",
                                  maintain_order="left")
    else:
        classified = classify_keys(ev.unique().with_columns(pl.col("name").cast(pl.String)), cl)
        classified = classified.with_columns(pl.col("name").cast(pl.Categorical))
        new = ev.join(classified, on=key_cols, how="left", nulls_equal=True, maintain_order="left")
    # Back to full length, the event columns shared, not copied.
    n = events.height
    cols = [pl.repeat(None, n, dtype=new.schema[c], eager=True).alias(c).scatter(at, new[c])
            for c in ("kclass", "wall", "rclass")]
    blocking = pl.repeat(False, n, dtype=pl.Boolean, eager=True).alias("blocking")
    return events.hstack([*cols, blocking.scatter(at, new["blocking"])])


@dataclass(frozen=True, slots=True)
class Claim:
    """Which entry of the classes file classified one event name: first match wins, so a later
    entry that also fits (`shadowed`) never sees the name."""

    name: str
    kind: str
    section: str                 # "gpu" or "runtime": the list of kernel_classes.yaml it is in
    entry: int | None            # 1-based position in that list; None: no entry fits
    line: int | None             # line of that entry in the file
    label: str | None            # its kclass (gpu) or rclass (runtime)
    wall: str | None
    blocking: bool
    shadowed: tuple[tuple[int, int | None, str], ...]  # (entry, line, label) of later fits
    source: str

    def sentence(self) -> str:
        if self.entry is None:
            return f"no {self.section} entry of {self.source} fits (unclassified)"
        at = f" (line {self.line})" if self.line else ""
        return f"classified by entry {self.entry} of {self.section} in {self.source}{at}"


def claim(name: str, *, kind: str = "kernel", copy_kind: str | None = None,
          copy_mem: str | None = None, nbytes: int | None = None, path: str | Path | None = None
          ) -> Claim:
    """The entry of kernel_classes.yaml (or `path`) that classifies one event, and the later
    entries it hides; the same first-match rule as `classify` (tests/test_classify.py holds
    them equal). For `moetune classify` and the classes' own tests, not the diagnosis path."""
    from moetune.yamlio import read_yaml

    file = Path(path) if path else CLASSES_PATH
    cl = load_classes(file)
    _, lines = read_yaml(file)
    section = "runtime" if kind == "runtime" else "gpu"
    if section == "gpu" and kind not in GPU_RULE_KINDS:
        raise UserError(f"kind {kind!r} has no classes (one of {', '.join((*GPU_RULE_KINDS, 'runtime'))})")
    key = pl.DataFrame({"kind": [kind], "name": [name], "copy_kind": [copy_kind],
                        "copy_mem": [copy_mem], "bytes": [nbytes]},
                       schema={"kind": pl.String, "name": pl.String, "copy_kind": pl.String,
                               "copy_mem": pl.String, "bytes": pl.Int64})
    if kind == "memcpy":  # direction and memory kinds read from the name, as the readers do
        from moetune.analyzer.frames import copy_mem_of_name
        from moetune.analyzer.readers.kineto_format import COPY_KINDS_IN_NAME

        key = key.with_columns(
            pl.col("copy_kind").fill_null(pl.when(pl.col("name").str.slice(7, 4).is_in(
                COPY_KINDS_IN_NAME)).then(pl.col("name").str.slice(7, 4)).otherwise(pl.lit("other"))),
            pl.col("copy_mem").fill_null(copy_mem_of_name(pl.col("name")).cast(pl.String)))
    key = key.with_columns(_size_bucket(cl.size_thresholds).alias("_size_bucket"))
    entries = cl.gpu if section == "gpu" else cl.runtime
    exprs = [_gpu_rule_expr(r) if section == "gpu" else match_expr(r["match"]) for r in entries]
    try:
        hits = key.select(e.alias(f"_{i}") for i, e in enumerate(exprs)).row(0) if exprs else ()
    except pl.exceptions.PolarsError as exc:  # e.g. a regex of a user's file that does not compile
        raise UserError(f"cannot match with its {section} entries: {str(exc)[:300]}",
                        path=file) from None
    fits = [i for i, hit in enumerate(hits) if hit]
    label_key = "kclass" if section == "gpu" else "rclass"

    def where(i: int) -> tuple[int, int | None, str]:
        return i + 1, lines.get((section, i)), entries[i][label_key]

    if not fits:
        return Claim(name, kind, section, None, None, None, None, False, (), cl.source)
    first = entries[fits[0]]
    entry, line, label = where(fits[0])
    return Claim(name, kind, section, entry, line, label, first.get("wall"),
                 bool(first.get("blocking", False)), tuple(where(i) for i in fits[1:]), cl.source)


def class_table(events: pl.DataFrame) -> pl.DataFrame:
    """Per kclass: count and summed GPU time (ns), sorted by time. Needs classify() output."""
    require(events, ("kclass", "wall", "dur_ns"), what="classified events")
    return (
        events.filter(pl.col("kclass").is_not_null())
        .group_by("kclass")
        .agg(
            pl.len().alias("count"),
            pl.col("dur_ns").sum().alias("time_ns"),
            pl.col("wall").first().cast(pl.String).alias("wall"),
        )
        .sort(["time_ns", "kclass"], descending=[True, False])
    )


__all__ = [
    "EVENTS_SCHEMA",
    "RCLASS",
    "RCLASSES",
    "WALL",
    "WALLS",
    "Claim",
    "KernelClasses",
    "claim",
    "class_table",
    "classify",
    "classify_keys",
    "load_classes",
    "match_expr",
]
