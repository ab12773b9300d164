"""Which phase, layer and direction each piece of GPU work of a step belongs to.

The pieces (items) are the GPU rows of each rank's median step, plus `marker` ranges (host ranges
of a phase that launches no GPU work, e.g. an all-to-all at EP 1). Each is labelled, strongest
evidence first (analyzer/phases.yaml):

1. the innermost enclosing host range of its launch, on the launching thread, that names one
   phase (an NVTX range, a record_function or autograd-Function scope, a Python frame or
   module), or the GPU work's own kernel class or name when that names one phase;
2. else the ambiguous label (several phases: a GEMM, a softmax, an activation, an all-to-all);
3. else nothing (the work is filled in from its neighbours).

Then the layer pass's order decides (`resolve_stream`): the items of each launching thread are
read in forward order (forward work in launch order, recompute likewise, backward work in reverse
launch order, which mirrors the forward pass), cut into blocks at the norms that start each part
of a layer, each block given a kind (MoE, attention, dense MLP, loss, embedding) by its labels,
and its ambiguous and unlabelled items resolved along that kind's sequence. Layers are counted
along the same blocks: an attention block after a non-attention one starts the next layer, an
embedding starts a pass. Direction: backward when the launch is inside a backward op (the
`backward_ops` of kernel_classes.yaml), recompute when the recompute analysis says so
(walls.recompute_launches); with no host ranges at all (an nsys export without NVTX), the launching
thread tells: the thread that launched the step's first work runs forward, others backward.
"""

from __future__ import annotations

import re
from bisect import bisect_left
from dataclasses import dataclass
from itertools import pairwise

import numpy as np
import polars as pl
from moetune.analyzer.classify import KernelClasses, with_pg_role
from moetune.analyzer.enclosing_ranges import innermost, pack
from moetune.analyzer.frames import GPU_KINDS
from moetune.analyzer.phases_book import NONE, PhaseBook, kernel_labels, matcher, range_labels

HOST_KINDS = ("cpu_op", "annotation", "python")
# emit_nvtx / nsys --pytorch names an op "aten::mm, seq = 12, op_id = 34, sizes = [...]"
_NVTX_TAIL = re.compile(r",\s*(?:seq|op_id|sizes|input_op_ids|stream)\s*=.*$")
LAYER_KINDS = ("attention", "moe", "dense")

ITEM_SCHEMA = {
    "rank": pl.Int32, "item": pl.String, "ts_ns": pl.Int64, "end_ns": pl.Int64, "kind": pl.String,
    "wall": pl.String, "kclass": pl.String, "name": pl.String, "correlation": pl.Int64,
    "tid": pl.Int64, "launch_ts": pl.Int64, "launch_end": pl.Int64, "phase": pl.String,
    "layer": pl.Int32, "direction": pl.String, "source": pl.String,
}


@dataclass(frozen=True, slots=True)
class Labelled:
    """Items of the median steps with their phase, layer, direction and the label's source;
    `passes`: per rank, the layer count of each forward and backward pass seen (for whether
    layers are distinguishable)."""

    items: pl.DataFrame
    passes: dict[int, dict[str, list[int]]]
    layer_source: str | None  # "stack" (module ranges), "sequence" (counted), None (no layers)


def windows(steps: pl.DataFrame, median: pl.DataFrame) -> pl.DataFrame:
    """Each rank's median step: rank, step, host start/end and GPU window."""
    return steps.join(median.select("rank", "step"), on=["rank", "step"], how="semi").select(
        "rank", "step", "start_ns", "end_ns", "win_start_ns", "win_end_ns")


def label_items(events: pl.DataFrame, win: pl.DataFrame, *, book: PhaseBook,
                classes: KernelClasses, comms: pl.DataFrame, recompute: pl.DataFrame | None,
                formats: dict[int, str], layers_per_pass: int | None = None) -> Labelled:
    """The median steps' GPU work (and phase markers) with phase, layer, direction, source.

    The items are the GPU rows inside a rank's median GPU window and those launched in its host
    step: the window may leave out the start of the step's work (a profiler's GPU range can
    start late), and the layer pass is only read right from its beginning."""
    runtime = events.lazy().filter((pl.col("kind") == "runtime") & pl.col("correlation").is_not_null())
    launches = (per_rank(runtime, win.select("rank", pl.col("start_ns").alias("_lo"),
                                             pl.col("end_ns").alias("_hi")),
                         lambda lo, hi: (pl.col("ts_ns") >= lo) & (pl.col("ts_ns") < hi))
                .group_by("rank", "correlation")
                .agg(pl.col("tid").first(), pl.col("ts_ns").min().alias("launch_ts"),
                     (pl.col("ts_ns") + pl.col("dur_ns")).min().alias("launch_end")).collect())
    gpu = _gpu_items(events, win, comms, launches)
    ranges = _host_ranges(events, gpu, win, book=book, classes=classes, formats=formats)
    markers = _markers(ranges, win)
    items = pl.concat([gpu, markers], how="diagonal_relaxed")
    items = _with_range_labels(items, ranges)
    items = _with_kernel_labels(items, book)
    items = _with_direction(items, ranges, recompute)
    return _resolve(items, book, layers_per_pass)


# ------------------------------------------------------------------------------ the items


def _gpu_items(events: pl.DataFrame, win: pl.DataFrame, comms: pl.DataFrame,
               launches: pl.DataFrame) -> pl.DataFrame:
    """GPU rows overlapping the window or launched in the host step, with their launch."""
    # eager steps: on these few rows a lazy plan of the joins costs more than the joins
    gpu = (events.lazy().filter(pl.col("kind").is_in(GPU_KINDS) & (pl.col("dur_ns") > 0))
           .select("rank", "ts_ns", (pl.col("ts_ns") + pl.col("dur_ns")).alias("end_ns"),
                   pl.col("kind").cast(pl.String), pl.col("wall").cast(pl.String), "kclass", "name",
                   "correlation").collect()
           .join(win.select("rank", "win_start_ns", "win_end_ns"), on="rank", how="inner")
           .join(launches, on=["rank", "correlation"], how="left"))
    gpu = gpu.filter(((pl.col("ts_ns") < pl.col("win_end_ns")) & (pl.col("end_ns") > pl.col("win_start_ns")))
                     | pl.col("launch_ts").is_not_null()).drop("win_start_ns", "win_end_ns")
    return with_pg_role(gpu, comms).with_columns(pl.lit("gpu").alias("item"))


def _host_ranges(events: pl.DataFrame, gpu: pl.DataFrame, win: pl.DataFrame, *, book: PhaseBook,
                 classes: KernelClasses, formats: dict[int, str]) -> pl.DataFrame:
    """Host ranges (of the launching span of each rank) that carry a label, a boundary, a layer or
    the backward flag: rank, tid, start, end, kind, name and those columns, sorted by (rank, tid,
    start, −end) so that an enclosing range comes before the ranges it holds."""
    span = (gpu.lazy().filter(pl.col("launch_ts").is_not_null()).group_by("rank")
            .agg(pl.col("launch_ts").min().alias("_lo"), pl.col("launch_end").max().alias("_hi"))
            .join(win.lazy().select("rank", "start_ns", "end_ns"), on="rank", how="full",
                  coalesce=True)
            .select("rank", pl.min_horizontal("_lo", "start_ns").alias("_lo"),
                    pl.max_horizontal("_hi", "end_ns").alias("_hi")))
    host_rows = pl.col("kind").is_in(HOST_KINDS) & pl.col("dur_ns").is_not_null()
    # the host rows of the span first (integer compares), then their distinct names: most are
    # ops no signature names, dropped by name before any other work on them
    host = per_rank(events.lazy().filter(host_rows), span.collect(),
                    lambda lo, hi: (pl.col("ts_ns") <= hi) & (pl.col("ts_ns") + pl.col("dur_ns") >= lo)
                    ).select("rank", "tid", "ts_ns", "dur_ns", pl.col("kind").cast(pl.String),
                             "name").collect()
    raw = host.get_column("name").unique().drop_nulls().to_list()
    norm = {n: _NVTX_TAIL.sub("", n) for n in raw}
    labels = range_labels(sorted(set(norm.values())), book)
    bwd = matcher(classes.backward_ops)
    keep = [n for n in raw if norm[n] in labels or bwd(norm[n])]
    rows = [(n, *labels.get(norm[n], (NONE, NONE, False, False, None)), bwd(norm[n])) for n in keep]
    lab = pl.DataFrame(rows, schema={"name": pl.String, "def_sig": pl.Int32, "amb_sig": pl.Int32,
                                     "boundary": pl.Boolean, "marker": pl.Boolean,
                                     "layer": pl.Int32, "backward": pl.Boolean}, orient="row")
    fmt = pl.col("rank").replace_strict(formats, default="kineto", return_dtype=pl.String)
    src = (pl.when(pl.col("kind") == "python").then(pl.lit("stack"))
           .when((pl.col("kind") == "annotation") & (fmt == "nsys")).then(pl.lit("nvtx"))
           .otherwise(pl.lit("scope")))
    out = (host.filter(pl.col("name").is_in(keep)).join(lab, on="name", how="inner")
           .with_columns(pl.col("ts_ns").alias("start"), (pl.col("ts_ns") + pl.col("dur_ns")).alias("end"),
                         src.alias("source"))
           .drop("ts_ns", "dur_ns"))
    # (rank, tid, start, −end) by one stable numpy sort of the integer columns
    low = np.iinfo(np.int64).min  # a null thread first, as a polars sort puts it
    keys = [out.get_column(c).fill_null(low).to_numpy() for c in ("end", "start", "tid", "rank")]
    return out[np.lexsort([-keys[0], *keys[1:]])]


FEW_RANKS = 16  # up to this many ranks a filter expression per rank, more: a join


def per_rank(lf: pl.LazyFrame, bounds: pl.DataFrame, cond) -> pl.LazyFrame:
    """The rows of `lf` for which `cond(lo, hi)` holds with their rank's bounds (`bounds`: rank,
    _lo, _hi; a rank with a null bound keeps none). With few ranks one filter over the rows,
    no join: the join's fixed cost is most of the time on one diagnosis' few ranks."""
    if bounds.height > FEW_RANKS:
        return (lf.join(bounds.lazy(), on="rank", how="inner")
                .filter(cond(pl.col("_lo"), pl.col("_hi"))).drop("_lo", "_hi"))
    keep = pl.lit(False)
    for rank, lo, hi in bounds.select("rank", "_lo", "_hi").iter_rows():
        if lo is not None and hi is not None:
            keep = keep | ((pl.col("rank") == rank) & cond(pl.lit(lo), pl.lit(hi)))
    return lf.filter(keep)


def _markers(ranges: pl.DataFrame, win: pl.DataFrame) -> pl.DataFrame:
    """Marker ranges starting in a rank's median host step, as GPU-less items at their start."""
    m = (ranges.filter(pl.col("marker"))
         .join(win.select("rank", "start_ns", "end_ns"), on="rank", how="inner")
         .filter((pl.col("start") >= pl.col("start_ns")) & (pl.col("start") < pl.col("end_ns"))))
    return m.select("rank", pl.lit("marker").alias("item"), pl.col("start").alias("ts_ns"),
                    pl.col("start").alias("end_ns"), pl.lit("marker").alias("kind"), "name", "tid",
                    pl.col("start").alias("launch_ts"), pl.col("end").alias("launch_end"))


def _with_range_labels(items: pl.DataFrame, ranges: pl.DataFrame) -> pl.DataFrame:
    """Per item, from the innermost enclosing range of its launch that has each: its definite
    label and source, ambiguous label and source, boundary (the range's start as its key),
    layer, and whether it is in a backward op."""
    cols = ranges.select("def_sig", "amb_sig", "boundary", "layer", "backward", "source", "start")
    d_sig, a_sig = cols.get_column("def_sig").to_numpy(), cols.get_column("amb_sig").to_numpy()
    lay = cols.get_column("layer")
    masks = {"d": d_sig != NONE, "a": a_sig != NONE, "b": cols.get_column("boundary").to_numpy(),
             "l": lay.is_not_null().to_numpy(), "w": cols.get_column("backward").to_numpy()}
    pk = pack(items, ranges, "launch_ts") if ranges.height and items.height else None
    at = {k: innermost(items, ranges, mask=m, packed=pk) for k, m in masks.items()}

    def take(series: pl.Series, idx: np.ndarray, name: str) -> pl.Series:
        if series.len() == 0:
            return pl.Series(name, [None] * len(idx), dtype=series.dtype)
        at = pl.Series(idx, dtype=pl.Int64)
        return series.gather(at.set(at < 0, None).cast(pl.UInt32)).alias(name)  # −1: null

    src = cols.get_column("source")
    return items.with_columns(
        take(cols.get_column("def_sig"), at["d"], "r_def"), take(src, at["d"], "r_def_src"),
        take(cols.get_column("amb_sig"), at["a"], "r_amb"), take(src, at["a"], "r_amb_src"),
        take(cols.get_column("start"), at["b"], "r_bnd"), take(lay, at["l"], "r_layer"),
        pl.Series("r_bwd", at["w"] >= 0))


def _with_kernel_labels(items: pl.DataFrame, book: PhaseBook) -> pl.DataFrame:
    """`k_def`, `k_amb`, `k_bnd` of each item's GPU key (kclass, name, pg_role): labelled once per
    distinct key, handed to the items by row number (no join on three string columns)."""
    by = ["kclass", "name", "pg_role"]
    groups = items.select(by).with_row_index("_i").group_by(by).agg("_i")
    keys = groups.select(by).rows()
    lab = kernel_labels(keys, book)
    k_def = np.full(items.height, NONE, dtype=np.int32)
    k_amb = np.full(items.height, NONE, dtype=np.int32)
    k_bnd = np.zeros(items.height, dtype=bool)
    rows = groups.get_column("_i").explode().to_numpy()
    code = np.repeat(np.arange(len(keys)), groups.get_column("_i").list.len().to_numpy())
    per = np.array([lab[k] for k in keys], dtype=np.int64).reshape(len(keys), 3)
    k_def[rows], k_amb[rows], k_bnd[rows] = per[code, 0], per[code, 1], per[code, 2] != 0
    marker = (items.get_column("item") == "marker").to_numpy()
    k_def[marker] = NONE
    k_amb[marker] = NONE
    return items.with_columns(pl.Series("k_def", k_def), pl.Series("k_amb", k_amb),
                              pl.Series("k_bnd", k_bnd))


def _with_direction(items: pl.DataFrame, ranges: pl.DataFrame,
                    recompute: pl.DataFrame | None) -> pl.DataFrame:
    """`direction`: recompute, backward or forward (see the module doc)."""
    rc = pl.lit(False)
    if recompute is not None and recompute.height:
        items = items.join(recompute.select("rank", "correlation").unique()
                           .with_columns(pl.lit(True).alias("_rc")), on=["rank", "correlation"],
                           how="left", maintain_order="left")
        rc = pl.col("_rc").fill_null(False) & (pl.col("item") == "gpu")
    ranked = set(ranges.filter(pl.col("backward")).get_column("rank").unique().to_list())
    # ranks whose trace shows no backward op: the launching thread is all there is to go on
    by_thread = (items.filter(~pl.col("rank").is_in(list(ranked)) & pl.col("tid").is_not_null())
                 .sort("launch_ts").group_by("rank", maintain_order=True)
                 .agg(pl.col("tid").first().alias("_main")))
    items = items.join(by_thread, on="rank", how="left", maintain_order="left")
    bwd = pl.col("r_bwd").fill_null(False) | (
        pl.col("_main").is_not_null() & pl.col("tid").is_not_null() & (pl.col("tid") != pl.col("_main")))
    return items.with_columns(
        pl.when(rc).then(pl.lit("recompute")).when(bwd).then(pl.lit("backward"))
        .otherwise(pl.lit("forward")).alias("direction")).drop("_rc", "_main", strict=False)


# ------------------------------------------------------------------------------ the layer pass


@dataclass(slots=True)
class _Run:
    start: int          # first item (stream position)
    stop: int
    definite: str | None
    cands: tuple[str, ...] | None
    weak: bool          # the ambiguous label never sets a block's kind
    closes: bool        # the definite label's phase ends here
    boundary: object    # a hashable key, or None
    source: str | None
    phase: str | None = None
    src: str | None = None
    layer: int | None = None


def _resolve(items: pl.DataFrame, book: PhaseBook, layers_per_pass: int | None) -> Labelled:
    sig = book.signatures
    k_src = pl.lit("kernel")
    # definite: the work's own kernel, else the innermost definite range; ambiguous likewise
    items = items.with_columns(
        pl.when(pl.col("k_def").fill_null(NONE) != NONE).then(pl.col("k_def"))
        .otherwise(pl.col("r_def").fill_null(NONE)).alias("_def"),
        pl.when(pl.col("k_def").fill_null(NONE) != NONE).then(k_src)
        .otherwise(pl.col("r_def_src")).alias("_def_src"),
        pl.when(pl.col("r_amb").fill_null(NONE) != NONE).then(pl.col("r_amb"))
        .otherwise(pl.col("k_amb").fill_null(NONE)).alias("_amb"),
        pl.when(pl.col("r_bnd").is_not_null()).then(pl.col("r_bnd"))
        .when(pl.col("k_bnd")).then(pl.lit(-2)).otherwise(None).alias("_bnd"),
    )
    # stream order: per (rank, tid, forward/recompute/backward stream), forward order of the pass
    stream = pl.when(pl.col("direction") == "backward").then(pl.lit(2)).when(
        pl.col("direction") == "recompute").then(pl.lit(1)).otherwise(pl.lit(0))
    t = pl.coalesce("launch_ts", "ts_ns")
    order = pl.when(stream == 2).then(-t).otherwise(t)
    order2 = pl.when(stream == 2).then(-pl.col("ts_ns")).otherwise(pl.col("ts_ns"))
    items = items.with_columns(stream.alias("_stream"), order.alias("_o1"), order2.alias("_o2"),
                               pl.col("tid").fill_null(-1).alias("_tid"))
    # one stable numpy sort of the five keys, one gather (a polars multi-key sort row-encodes)
    keys = [items.get_column(c).to_numpy() for c in ("_o2", "_o1", "_stream", "_tid", "rank")]
    items = items[np.lexsort(keys)]
    # Runs: consecutive items of one stream with the same labels, found by polars; Python walks
    # the runs only (a pass has far fewer runs than kernels).
    closes = [i for i, s in enumerate(sig) if s.closes]
    cl = pl.col("_def").is_in(closes) if closes else pl.lit(False)
    cols = ["rank", "_tid", "_stream", "_def", "_def_src", "_amb", "_bnd"]
    brk = pl.any_horizontal([pl.col(c).ne_missing(pl.col(c).shift(1)) for c in cols])
    items = items.with_columns(cl.alias("_cl")).with_columns(
        (brk | pl.col("_cl") | pl.col("_cl").shift(1)).fill_null(True).alias("_brk"))
    items = items.with_columns(pl.col("_brk").cum_sum().alias("_run"))
    heads = items.filter(pl.col("_brk")).select(
        *cols, "_cl", pl.any_horizontal([pl.col(c).ne_missing(pl.col(c).shift(1))
                                         for c in cols[:3]]).fill_null(True).alias("_new"))
    nrun = heads.height
    streams = [*np.flatnonzero(heads.get_column("_new").to_numpy()).tolist(), nrun]
    stream_keys = heads.filter(pl.col("_new")).select(cols[:3]).rows()  # one per stream
    # per signature index (NONE, −1, reads the sentinel at the end)
    first = [x.phases[0] if x.phases else None for x in sig] + [None]
    cands = [x.phases for x in sig] + [None]
    weak = [x.weak for x in sig] + [False]
    # each run's fields, as lists (a run with a definite label carries no candidates)
    de, am = heads.get_column("_def").to_list(), heads.get_column("_amb").to_list()
    d_of = [first[x] for x in de]
    c_of = [None if d is not None else cands[x] for d, x in zip(d_of, am, strict=True)]
    w_of = [d is None and weak[x] for d, x in zip(d_of, am, strict=True)]
    s_of = [s if d is not None else None
            for d, s in zip(d_of, heads.get_column("_def_src").to_list(), strict=True)]
    cl_of = heads.get_column("_cl").to_list()
    b_of = heads.get_column("_bnd").to_list()
    phase: list[str | None] = [None] * nrun
    src: list[str | None] = [None] * nrun
    layer = np.full(nrun + 1, -1, dtype=np.int64)
    passes: dict[int, dict[str, list[int]]] = {}
    for (start, stop), (rank, _, st) in zip(pairwise(streams), stream_keys, strict=True):
        runs = [_Run(i, i + 1, d_of[i], c_of[i], w_of[i], bool(cl_of[i]), b_of[i], s_of[i])
                for i in range(start, stop)]
        counts = resolve_stream(runs, book, layers_per_pass)
        if st != 1:
            passes.setdefault(int(rank), {}).setdefault("backward" if st == 2 else "forward",
                                                        []).extend(counts)
        phase[start:stop] = [r.phase for r in runs]
        src[start:stop] = [r.src for r in runs]
        layer[start:stop] = [-1 if r.layer is None else r.layer for r in runs]
    run = items.get_column("_run").to_numpy() - 1
    items = items.with_columns(
        pl.Series("phase", phase, dtype=pl.String).gather(run).alias("phase"),
        pl.Series("source", src, dtype=pl.String).gather(run).alias("source"),
        pl.Series("_seq_layer", layer[run], dtype=pl.Int32))
    in_layers = frozenset(p.phase for p in book.phases if p.part in ("layer", "moe"))
    return _layers(items, passes, layers_per_pass, in_layers)


def resolve_stream(runs: list[_Run], book: PhaseBook, layers_per_pass: int | None = None
                   ) -> list[int]:
    """Give every run of one forward-order stream its phase, source and layer (in place); returns
    the layer count of each pass seen (a pass: from an embedding to the next, or the stream)."""
    blocks = _blocks(runs, book)
    spreads = {p.phase: p.spreads for p in book.phases}
    counts: list[int] = []
    layer, prev = 0, None
    prev_kind: str | None = None
    prev_phase: str | None = None
    for kind, block in blocks:
        if kind is not None and kind.kind == "embedding":
            if layer:  # a pass ends (a second embedding block right after one ends none)
                counts.append(layer)
            layer, prev = 0, None
        elif kind is not None and kind.kind in LAYER_KINDS:
            mlp = kind.kind != "attention"
            if (not mlp and prev != "attention") or (mlp and prev in ("moe", "dense")) or layer == 0:
                layer += 1
            prev = kind.kind
        elif kind is not None and kind.kind == "loss":
            prev = "loss"
        # an MLP part's leading norm closes the attention before it (Megatron's pre-MLP norm)
        before = prev_phase if (kind is not None and kind.kind in ("moe", "dense")
                                and prev_kind == "attention") else None
        _resolve_block(block, kind, spreads, before)
        prev_kind = kind.kind if kind is not None else None
        prev_phase = next((r.phase for r in reversed(block) if r.phase), None)
        if kind is not None and kind.kind in LAYER_KINDS:
            n = layer if not layers_per_pass else (layer - 1) % layers_per_pass + 1
            for r in block:
                r.layer = n
    if layer:
        counts.append(layer)
    return counts


MERGE_RUNS = 4  # a block of no kind this short is part of the next (a QK norm inside attention)


def _blocks(runs: list[_Run], book: PhaseBook) -> list[tuple[object, list[_Run]]]:
    """Runs cut at boundaries; a short block of no kind is read with the next (at the end, with
    the one before it); a longer one stays a block of no kind (a model that is not a transformer:
    its labelled work stands, the rest is `other`)."""
    raw: list[list[_Run]] = []
    prev_b: object = None
    for r in runs:
        if (r.boundary is not None and r.boundary != prev_b) or not raw:
            raw.append([r])
        else:
            raw[-1].append(r)
        prev_b = r.boundary
    merged: list[list[_Run]] = []
    carry: list[_Run] = []
    for b in raw:
        b = carry + b
        carry = []
        if _kind(b, book) is None and len(b) <= MERGE_RUNS:
            carry = b
        else:
            merged.append(b)
    if carry:
        if merged:
            merged[-1].extend(carry)
        else:
            merged.append(carry)
    return [(_kind(b, book), b) for b in merged]


def _kind(block: list[_Run], book: PhaseBook):  # -> Block | None
    """The first block kind one of the block's definite labels is in, else the first kind that
    holds every phase its ambiguous labels have in common (a GEMM and a softmax: attention),
    else the first that has a phase for each of them, else None."""
    defs = {r.definite for r in block if r.definite is not None}
    if defs:
        for k in book.blocks:
            if not defs.isdisjoint(k.when):
                return k
    sets = list({r.cands for r in block if r.cands is not None and not r.weak})
    sets = [set(c) for c in sets]
    if not sets:
        return None
    common = set.intersection(*sets)
    if common:
        return next((k for k in book.blocks if common <= k.when), None)
    # no phase in common (a MoE layer's backward seen by its kernels alone: GEMMs, a softmax,
    # sorts, scatters): the first kind that has a phase for every one of them
    return next((k for k in book.blocks if all(s & k.when for s in sets)), None)


def _sequence(block: list[_Run], kind) -> tuple[str, ...]:
    """The kind's sequence less the phases whose `requires` the block does not meet (the piece
    must come before any piece that can only be of a later phase)."""
    seq: tuple[str, ...] = kind.sequence
    for phase, cands in kind.requires:
        if phase not in seq:
            continue
        later = set(seq[seq.index(phase) + 1:])
        met = False
        for r in block:  # up to the first piece that can only be of a later phase
            if r.definite in later or (r.cands is not None and phase not in r.cands
                                       and later & set(r.cands)):
                break
            if r.cands is not None and set(r.cands) == cands:
                met = True
                break
        if not met:
            seq = tuple(p for p in seq if p != phase)
    return seq


def _resolve_block(block: list[_Run], kind, spreads: dict[str, bool], before: str | None = None
                   ) -> None:
    """Phases along the block's sequence: a definite label stands (and moves the cursor on); an
    ambiguous one takes its first phase at or after the cursor and not past the next definite
    label's (the pass runs in order), else the nearest phase behind the cursor (a dispatcher that
    orders its steps otherwise), else that next label's phase; unlabelled work takes the last
    spreading phase, or the first one after it at the block's start."""
    seq: tuple[str, ...] = _sequence(block, kind) if kind is not None else ()
    at = {q: j for j, q in enumerate(seq)}
    nxt = [len(seq)] * (len(block) + 1)
    for i in range(len(block) - 1, -1, -1):
        nxt[i] = at.get(block[i].definite, nxt[i + 1])  # type: ignore[arg-type]
    options: dict[tuple[str, ...], list[int]] = {}
    cursor = -1
    last: str | None = before
    pending: list[_Run] = []
    for i, r in enumerate(block):
        ph: str | None = None
        if r.definite is not None:
            ph, r.src = r.definite, r.source
            j = at.get(ph)
            if j is not None and j > cursor:
                cursor = j
        elif r.cands is not None:
            opts = options.get(r.cands)
            if opts is None:
                opts = options[r.cands] = [j for j, q in enumerate(seq) if q in r.cands]
            if opts:
                at_or_after = bisect_left(opts, cursor)  # opts ascend
                if at_or_after < len(opts) and opts[at_or_after] <= nxt[i]:
                    cursor = opts[at_or_after]  # the first at or after the cursor
                elif at_or_after:  # a phase already passed (the all-gather dispatcher permutes
                    cursor = opts[at_or_after - 1]  # after its gather): the nearest behind
                elif nxt[i] < len(seq):
                    cursor = nxt[i]
                else:
                    cursor = opts[0]
                ph, r.src = seq[cursor], "sequence"
        if ph is None:
            if last is not None:
                r.phase, r.src = last, "sequence"
            else:
                pending.append(r)
            continue
        r.phase = ph
        if spreads.get(ph, True):
            for p in pending:
                p.phase, p.src = ph, "sequence"
            pending = []
            last = None if r.closes else ph
    for p in pending:
        p.phase, p.src = ((seq[0], "sequence") if seq and spreads.get(seq[0], True)
                          else ("other", None))
    if kind is None:  # no pass to read the block by: what no signature names is unattributed
        for r in block:
            if r.definite is None:
                r.phase, r.src = "other", None


def _layers(items: pl.DataFrame, passes: dict[int, dict[str, list[int]]],
            layers_per_pass: int | None, in_layers: frozenset[str]) -> Labelled:
    """Layer per item: a layer range's index (stack) where there is one, else the counted one;
    recompute work takes the layer of the backward work it is followed by on its thread. Only
    the phases of a layer (`in_layers`: parts layer and moe) keep one: the embedding, the loss
    and the step's reduction and optimizer run outside every layer, whatever ran before them."""
    has_stack = items.select(pl.col("r_layer").is_not_null().any()).item()
    seq = pl.when(pl.col("_seq_layer") >= 0).then(pl.col("_seq_layer"))
    lay = (pl.when(pl.col("r_layer").is_not_null()).then(pl.col("r_layer") + 1).otherwise(seq)
           if has_stack else seq)
    items = items.with_columns(lay.cast(pl.Int32).alias("layer"))
    rc = items.filter(pl.col("direction") == "recompute")
    if rc.height:
        bwd = (items.filter((pl.col("direction") == "backward") & pl.col("layer").is_not_null()
                            & pl.col("launch_ts").is_not_null())
               .select("rank", "tid", pl.col("launch_ts").alias("_t"), pl.col("layer").alias("_bl"))
               .sort("_t"))
        nxt = (items.with_row_index("_r").filter(pl.col("direction") == "recompute")
               .select("_r", "rank", "tid", pl.col("launch_ts").fill_null(pl.col("ts_ns")).alias("_t"))
               .sort("_t").join_asof(bwd, on="_t", by=["rank", "tid"], strategy="forward",
                                     check_sortedness=False))
        items = items.with_row_index("_r").join(nxt.select("_r", "_bl"), on="_r", how="left",
                                                maintain_order="left").with_columns(
            pl.when(pl.col("direction") == "recompute").then(pl.col("_bl"))
            .otherwise(pl.col("layer")).alias("layer")).drop("_r", "_bl")
    items = items.with_columns(pl.when(pl.col("phase").is_in(list(in_layers)))
                               .then(pl.col("layer")).alias("layer"))
    any_layer = items.select(pl.col("layer").is_not_null().any()).item()
    source = ("stack" if has_stack else "sequence") if any_layer else None
    keep = [c for c in ITEM_SCHEMA if c in items.columns]
    return Labelled(items.select(keep), passes, source)
