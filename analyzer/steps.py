"""Training steps: where each step starts and ends on the host and on the GPU, per rank.

Sources, in order: `ProfilerStep#N` annotations; host/NVTX annotations matching a step pattern
(`iteration N`, or the user's `--step-range NAME`); long GPU-idle gaps between repetitive GPU work;
else the whole trace as one step (with a warning). Patterns and thresholds live in
`kernel_classes.yaml` (`steps:`).

GPU-idle steps are per-rank segment ordinals: they are used only when every rank with GPU work
has them (else the whole trace is one step on every rank). A rank with GPU work but no step kept
(no annotation on it, outside `--window`) is named in `Steps.skipped` and a warning.

Incomplete steps are dropped: the last `ProfilerStep` of a rank when the profiler window cut it
(it ran fewer than `last_step_min_gpu_ops_share` of the GPU operations of the median step before
it), and a step that launched no GPU work. HTA drops the last step unconditionally; a schedule that
saves its trace between steps (Megatron-LM's) leaves it whole, so it is kept and analysed.

GPU events inherit the step of their launch (correlation → runtime row inside the host step);
events with no launch row go to the GPU-projected step that contains their start.

The attribution window of step i on the GPU is [gpu_start_i, gpu_start_{i+1}) where gpu_start is
the step's `gpu_user_annotation` start if the trace has one, else its first inherited GPU event.
The last of several steps has no next start: it ends at the later of its GPU projection's end and
its host range's end plus the rank's typical gap from a host step end to the next step's first GPU
work. A rank's only step ends where its GPU projection ends. So consecutive windows tile the GPU
timeline: GPU idle while the host prepares the next step is charged to the step that caused it.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

import polars as pl
from moetune.analyzer.classify import KernelClasses, load_classes
from moetune.analyzer.frames import GPU_KINDS, corr_key, lookup, min_by_key, require

from moetune.errors import UserError

STEP_COLS = ("rank", "step", "start_ns", "end_ns", "win_start_ns", "win_end_ns")


@dataclass(frozen=True, slots=True)
class Steps:
    """Complete steps kept for analysis (`table`) and how they were found."""

    table: pl.DataFrame  # rank, step, start_ns, end_ns (host), win_start_ns, win_end_ns (GPU window)
    source: str  # profiler_step | annotation | nvtx | gpu_idle | whole_trace
    found: list[int]
    dropped: list[int]
    warnings: tuple[str, ...] = field(default=())
    skipped: tuple[tuple[int, str], ...] = ()  # (rank, why): ranks with GPU work but no step kept

    @property
    def ids(self) -> list[int]:
        return sorted(set(self.table.get_column("step").to_list()))


def parse_window(text: str | None) -> tuple[int, int] | None:
    """`A:B` (inclusive step ids), `A:` or `:B`; `N` alone means one step."""
    if text is None or str(text).strip() == "":
        return None
    t = str(text).strip()
    m = re.fullmatch(r"(\d*)\s*[:\-]\s*(\d*)", t)
    if m and (m.group(1) or m.group(2)):
        lo = int(m.group(1)) if m.group(1) else 0
        hi = int(m.group(2)) if m.group(2) else 2**62
    elif t.isdigit():
        lo = hi = int(t)
    else:
        raise UserError(f"--window must look like A:B (step ids), got {text!r}")
    if lo > hi:
        raise UserError(f"--window {text!r}: first step is after the last")
    return lo, hi


def _annotation_steps(ev: pl.DataFrame, pattern: str, kinds: tuple[str, ...]) -> pl.DataFrame:
    """Host ranges whose name matches `pattern` (group 1 = step id): rank, step, start_ns, end_ns."""
    # the kind first: the pattern then runs on the few annotations, not on every name
    rows = ev.filter(pl.col("kind").is_in(kinds)).filter(pl.col("name").str.contains(pattern))
    return (
        rows.with_columns(pl.col("name").str.extract(pattern, 1).cast(pl.Int64).alias("step"))
        .filter(pl.col("step").is_not_null())
        .group_by(["rank", "step"])
        .agg(pl.col("ts_ns").min().alias("start_ns"), (pl.col("ts_ns") + pl.col("dur_ns")).max().alias("end_ns"))
        .sort(["rank", "step"])
    )


def _named_steps(ev: pl.DataFrame, name: str) -> pl.DataFrame:
    """`--step-range NAME`: `NAME N` ranges give step N; bare `NAME` ranges are numbered 0, 1, …"""
    numbered = _annotation_steps(ev, rf"^{re.escape(name)}[ _:#=]*(\d+)$", ("annotation",))
    if numbered.height:
        return numbered
    bare = ev.filter((pl.col("kind") == "annotation") & (pl.col("name") == name)).sort(["rank", "ts_ns"])
    return bare.select(
        "rank",
        pl.int_range(pl.len()).over("rank").cast(pl.Int64).alias("step"),
        pl.col("ts_ns").alias("start_ns"),
        (pl.col("ts_ns") + pl.col("dur_ns")).alias("end_ns"),
    )


def assign_steps(events: pl.DataFrame, host_steps: pl.DataFrame) -> pl.DataFrame:
    """GPU rows of `events` with a `step` column: the host step containing their launch call
    (same rank, same correlation), else null. Returns only GPU rows."""
    require(events, ("rank", "kind", "ts_ns", "correlation"), what="events")
    hs = host_steps.select("rank", "step", "start_ns", "end_ns").sort("start_ns")
    calls = (
        events.lazy().filter((pl.col("kind") == "runtime") & pl.col("correlation").is_not_null())
        .select("rank", "correlation", "ts_ns")
        .collect()
        .sort("ts_ns")
        .join_asof(
            hs, left_on="ts_ns", right_on="start_ns", by="rank", strategy="backward",
            check_sortedness=False,  # sorted globally by time, hence within each rank
        )
        .filter(pl.col("step").is_not_null() & (pl.col("ts_ns") < pl.col("end_ns")))
    )
    gpu = events.filter(pl.col("kind").is_in(GPU_KINDS))
    key = corr_key(calls, gpu)
    if key is None:
        launches = calls.group_by(["rank", "correlation"]).agg(pl.col("step").min())
        return gpu.join(launches, on=["rank", "correlation"], how="left", maintain_order="left")
    # sorted keys searched, not a hash join: millions of launches on a large export
    keys, step = min_by_key(calls, key, "step")
    return gpu.with_columns(lookup(keys, step, gpu.select(key).to_series()).alias("step"))


def _gpu_projection(events: pl.DataFrame, host: pl.DataFrame, source: str) -> pl.DataFrame:
    """Per (rank, step): gpu_start_ns, gpu_end_ns from GPU annotations or inherited GPU events."""
    # only the columns used below: the GPU rows of a large trace are millions
    narrow = events.select("rank", "kind", "ts_ns", "dur_ns", "correlation")
    gpu = assign_steps(narrow, host).filter(pl.col("step").is_not_null())
    inherited = gpu.group_by(["rank", "step"]).agg(
        pl.col("ts_ns").min().alias("ev_start"),
        (pl.col("ts_ns") + pl.col("dur_ns")).max().alias("ev_end"),
        pl.len().alias("gpu_ops"),
    )
    proj = host.join(inherited, on=["rank", "step"], how="left")
    if source == "profiler_step":
        ann = events.filter(
            (pl.col("kind") == "gpu_annotation") & pl.col("name").str.starts_with("ProfilerStep#")
        ).with_columns(pl.col("name").str.extract(r"#(\d+)$", 1).cast(pl.Int64).alias("step"))
        ann = ann.group_by(["rank", "step"]).agg(
            pl.col("ts_ns").min().alias("ann_start"),
            (pl.col("ts_ns") + pl.col("dur_ns")).max().alias("ann_end"),
        )
        proj = proj.join(ann, on=["rank", "step"], how="left")
    else:
        proj = proj.with_columns(
            pl.lit(None, dtype=pl.Int64).alias("ann_start"), pl.lit(None, dtype=pl.Int64).alias("ann_end")
        )
    return proj.with_columns(
        pl.coalesce("ann_start", "ev_start").alias("gpu_start_ns"),
        pl.max_horizontal("ann_end", "ev_end").alias("gpu_end_ns"),
        pl.col("gpu_ops").fill_null(0),
    ).select("rank", "step", "start_ns", "end_ns", "gpu_start_ns", "gpu_end_ns", "gpu_ops")


def _tile(proj: pl.DataFrame) -> pl.DataFrame:
    """Windows [gpu_start_i, gpu_start_{i+1}). The last of several steps has no next start: its
    window ends at the later of its GPU end and its host end plus the rank's typical gap from a
    step's host end to the next step's first GPU work (the tail every other window holds; a last
    window ending at its own last kernel ran 10-20 % short of the steps before it on the H200
    fixtures). A rank's only step ends at its GPU end."""
    p = proj.filter(pl.col("gpu_start_ns").is_not_null()).sort(["rank", "step"])
    nxt = pl.col("gpu_start_ns").shift(-1).over("rank")
    p = p.with_columns(nxt.alias("_next"))
    gap = (pl.col("_next") - pl.col("end_ns")).clip(lower_bound=0).median().over("rank").cast(pl.Int64)
    return p.with_columns(
        pl.col("gpu_start_ns").alias("win_start_ns"),
        pl.when(pl.col("_next").is_not_null() & (pl.col("_next") > pl.col("gpu_start_ns")))
        .then(pl.col("_next"))
        .otherwise(pl.when(gap.is_null()).then(pl.col("gpu_end_ns"))  # one step: its GPU end
                   .otherwise(pl.max_horizontal("gpu_end_ns", pl.col("end_ns") + gap)))
        .alias("win_end_ns"),
    ).drop("_next")


def _gpu_idle_steps(events: pl.DataFrame, cfg: dict) -> tuple[pl.DataFrame, list[str]]:
    """Split each rank's GPU timeline at long idle gaps; keep segments of typical size."""
    from moetune.analyzer.intervals import union

    gpu = events.lazy().filter(pl.col("kind").is_in(GPU_KINDS)).select(
        "rank", pl.col("ts_ns").alias("start_ns"), (pl.col("ts_ns") + pl.col("dur_ns")).alias("end_ns")
    ).collect()
    u = union(gpu, by=["rank"]).with_columns(
        (pl.col("start_ns") - pl.col("end_ns").shift(1).over("rank")).alias("gap")
    )
    min_gap = int(float(cfg.get("min_gap_us", 1000)) * 1000)
    factor = float(cfg.get("gap_factor", 20))
    tol = float(cfg.get("count_tolerance", 0.25))
    med = u.group_by("rank").agg(pl.col("gap").median().alias("med_gap"))
    u = u.join(med, on="rank", how="left").with_columns(
        ((pl.col("gap") >= min_gap) & (pl.col("gap") >= factor * pl.col("med_gap")))
        .fill_null(False)
        .alias("brk")
    )
    u = u.with_columns(pl.col("brk").cast(pl.Int64).cum_sum().over("rank").alias("step"))
    seg = u.group_by(["rank", "step"]).agg(
        pl.col("start_ns").min(), pl.col("end_ns").max(), pl.len().alias("n")
    ).sort(["rank", "step"])
    # Tile before dropping atypical segments: a step's window runs to the next one's first op.
    seg = seg.with_columns(
        pl.col("start_ns").alias("win_start_ns"),
        pl.coalesce(pl.col("start_ns").shift(-1).over("rank"), pl.col("end_ns")).alias("win_end_ns"),
    )
    if seg.group_by("rank").len().get_column("len").max() < 2:
        return seg.head(0), []
    med_n = seg.group_by("rank").agg(pl.col("n").median().alias("med_n"), pl.col("n").sum().alias("all_n"))
    seg = seg.join(med_n, on="rank").filter(
        (pl.col("n") - pl.col("med_n")).abs() <= tol * pl.col("med_n")
    )
    # repetitive work: ≥2 typical segments holding most of the rank's GPU activity
    cover = float(cfg.get("min_coverage", 0.5))
    ok = seg.group_by("rank").agg(pl.len().alias("k"), (pl.col("n").sum() / pl.col("all_n").first()).alias("c"))
    ok = ok.filter((pl.col("k") >= 2) & (pl.col("c") >= cover))
    seg = seg.join(ok.select("rank"), on="rank", how="semi")
    return seg.select(STEP_COLS).sort(["rank", "step"]), []


def find_steps(
    events: pl.DataFrame,
    *,
    window: str | tuple[int, int] | None = None,
    step_range: str | None = None,
    classes: KernelClasses | None = None,
    source_file: str | None = None,
) -> Steps:
    """Find complete steps per rank and their GPU windows; apply `window` (step ids A:B)."""
    require(events, ("rank", "kind", "name", "ts_ns", "dur_ns", "correlation"), what="events")
    cfg = (classes or load_classes()).steps
    warnings: list[str] = []
    dropped: list[int] = []
    source = ""
    host = pl.DataFrame()
    if step_range:
        host = _named_steps(events, step_range)
        source = "annotation"
        if host.height == 0:
            raise UserError(f"no annotation named {step_range!r} (--step-range)", path=source_file)
    else:
        host = _annotation_steps(events, cfg.get("profiler_step", r"^ProfilerStep#(\d+)$"), ("annotation",))
        source = "profiler_step"
        if host.height == 0:
            for pat in cfg.get("annotations", []):
                host = _annotation_steps(events, pat, ("annotation",))
                if host.height:
                    source = "annotation"
                    break
    found = sorted(set(host.get_column("step").to_list())) if host.height else []
    if host.height:
        proj = _gpu_projection(events, host, source)
        if source == "profiler_step":
            share = float(cfg.get("last_step_min_gpu_ops_share", 0.5))
            dropped = _cut_last_steps(proj, share)
            if dropped:
                warnings.append(
                    f"dropped incomplete step(s) {_fmt_ids(dropped)} (the profiler window cut the "
                    f"last ProfilerStep: it ran under {share:.0%} of the GPU operations of the "
                    "median step before it)")
        tiled = _tile(proj)
        no_gpu = proj.filter(pl.col("gpu_start_ns").is_null() & ~pl.col("step").is_in(dropped))
        if no_gpu.height:
            steps_wo = sorted(set(no_gpu.get_column("step").to_list()))
            warnings.append(f"steps {_fmt_ids(steps_wo)} launched no GPU work; skipped")
            dropped = sorted(set(dropped) | set(steps_wo))
        table = tiled.join(
            pl.DataFrame({"step": dropped}, schema={"step": pl.Int64}), on="step", how="anti"
        )
    else:
        seg, w = _gpu_idle_steps(events, cfg.get("gpu_idle", {}))
        warnings += w
        # Segment numbers are per-rank ordinals: with structure on some ranks only, steps would
        # be compared across ranks that have none; the whole trace is one step on every rank.
        without = sorted(_gpu_ranks(events) - set(seg["rank"].to_list())) if seg.height else []
        if seg.height and not without:
            source = "gpu_idle"
            found = sorted(set(seg.get_column("step").to_list()))
            table = seg
            warnings.append(
                "no step annotations (ProfilerStep#N, iteration N): steps inferred from GPU-idle gaps"
            )
        else:
            source = "whole_trace"
            table = _whole_trace(events)
            found = [0] if table.height else []
            if table.height and without:
                with_ = sorted(set(seg["rank"].to_list()))
                warnings.append(
                    f"no step annotations; repetitive GPU-idle structure on rank(s) "
                    f"{_fmt_ids(with_)} only, not on {_fmt_ids(without)}: the whole trace is one "
                    "step on every rank"
                )
            elif table.height:
                warnings.append(
                    "no step annotations and no repetitive GPU-idle structure: the whole trace is one step"
                )
    table = table.select(STEP_COLS).sort(["rank", "step"])
    if table.height == 0:
        raise UserError("has no complete training step to analyze", path=source_file)
    skipped = {r: _no_step_reason(source, step_range)
               for r in sorted(_gpu_ranks(events) - set(table["rank"].to_list()))}
    win = parse_window(window) if isinstance(window, str) or window is None else window
    if win is not None:
        lo, hi = win
        kept = table.filter(pl.col("step").is_between(lo, hi))
        if kept.height == 0:
            raise UserError(
                f"the steady window {lo}:{hi} (--window, or the contract's window.steady) selects "
                f"no complete step (complete: {_fmt_ids(sorted(set(table['step'])))})",
                path=source_file,
            )
        for r in sorted(set(table["rank"].to_list()) - set(kept["rank"].to_list())):
            skipped[r] = f"no complete step in the steady window {lo}:{hi}"
        table = kept
    for why in sorted(set(skipped.values())):
        ranks = [r for r, w in skipped.items() if w == why]
        warnings.append(f"rank(s) {_fmt_ids(ranks)} not analysed: {why}")
    return Steps(table=table, source=source, found=found, dropped=dropped, warnings=tuple(warnings),
                 skipped=tuple(sorted(skipped.items())))


def _cut_last_steps(proj: pl.DataFrame, share: float) -> list[int]:
    """Last ProfilerSteps the profiler window cut: on a rank with ≥2 steps, the last one ran fewer
    than `share` of the GPU operations of the median step before it. A schedule that stops
    between steps (Megatron-LM's: `prof.step()` at the top of each iteration, the trace saved at
    the next one's) leaves the last step whole, and it is analysed."""
    ranked = proj.sort(["rank", "step"]).with_columns(
        pl.col("step").max().over("rank").alias("last"), pl.len().over("rank").alias("n"))
    before = ranked.filter(pl.col("step") != pl.col("last")).group_by("rank").agg(
        pl.col("gpu_ops").median().alias("typical"))
    cut = ranked.filter((pl.col("n") >= 2) & (pl.col("step") == pl.col("last"))).join(
        before, on="rank").filter(pl.col("gpu_ops") < share * pl.col("typical"))
    return sorted(set(cut.get_column("step").to_list()))


def _gpu_ranks(events: pl.DataFrame) -> set[int]:
    """Ranks with GPU work: each should have a step, or be named as skipped."""
    return set(events.lazy().filter(pl.col("kind").is_in(GPU_KINDS))
               .select(pl.col("rank").unique()).collect()["rank"].drop_nulls().to_list())


def _no_step_reason(source: str, step_range: str | None) -> str:
    what = {"profiler_step": "ProfilerStep#N annotation",
            "annotation": f"{step_range!r} range" if step_range else "step annotation (iteration N)",
            "gpu_idle": "GPU-idle step structure"}.get(source, "step")
    return f"its GPU work lies in no complete {what} (steps come from other ranks' {what}s)"


def _whole_trace(events: pl.DataFrame) -> pl.DataFrame:
    gpu = events.filter(pl.col("kind").is_in(GPU_KINDS))
    return gpu.group_by("rank").agg(
        pl.lit(0, dtype=pl.Int64).alias("step"),
        pl.col("ts_ns").min().alias("start_ns"),
        (pl.col("ts_ns") + pl.col("dur_ns")).max().alias("end_ns"),
    ).with_columns(pl.col("start_ns").alias("win_start_ns"), pl.col("end_ns").alias("win_end_ns"))


def _fmt_ids(ids: list[int]) -> str:
    if not ids:
        return "none"
    if ids == list(range(ids[0], ids[-1] + 1)) and len(ids) > 2:
        return f"{ids[0]}–{ids[-1]}"
    return ", ".join(str(i) for i in ids)
