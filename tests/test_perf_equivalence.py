"""The fast interval paths (as-of clipping/locating, group-free sweep and union) give exactly what
the straightforward rows × windows joins and group_bys gave, on random and on real corpus data.

The reference functions below are the pre-optimisation implementations, kept here as oracles.
"""

from __future__ import annotations

import itertools
from pathlib import Path

import polars as pl
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from moetune.analyzer.classify import classify
from moetune.analyzer.diagnose import diagnose
from moetune.analyzer.frames import GPU_KINDS
from moetune.analyzer.intervals import END, START, clip, disjoint, locate, sweep, union
from moetune.analyzer.readers import load_trace
from moetune.analyzer.steps import find_steps

A100 = "public/kineto/hta_a100_2rank_nccl.json.gz"


# ---------------------------------------------------------------- reference (old) implementations

def ref_union(df: pl.DataFrame, by: list[str]) -> pl.DataFrame:
    d = df.select([*by, START, END]).filter(pl.col(END) > pl.col(START)).sort([*by, START, END])
    prev_end = pl.col(END).cum_max().shift(1).over(by)
    brk = (prev_end.is_null() | (pl.col(START) > prev_end)).cast(pl.Int64)
    return (
        d.with_columns(brk.alias("_brk"))
        .with_columns(pl.col("_brk").cum_sum().over(by).alias("_run"))
        .group_by([*by, "_run"], maintain_order=True)
        .agg(pl.col(START).min(), pl.col(END).max())
        .drop("_run")
        .sort([*by, START])
    )


def ref_clip(df: pl.DataFrame, w: pl.DataFrame) -> pl.DataFrame:
    j = df.join(w.select("rank", "step", "win_start_ns", "win_end_ns"), on="rank")
    j = j.filter((pl.col(START) < pl.col("win_end_ns")) & (pl.col(END) > pl.col("win_start_ns")))
    return j.with_columns(
        pl.max_horizontal(START, "win_start_ns").alias(START),
        pl.min_horizontal(END, "win_end_ns").alias(END),
    ).drop("win_start_ns", "win_end_ns")


def ref_locate(df: pl.DataFrame, w: pl.DataFrame, at: str) -> pl.DataFrame:
    return (
        df.join(w.select("rank", "step", "win_start_ns", "win_end_ns"), on="rank")
        .filter((pl.col(at) >= pl.col("win_start_ns")) & (pl.col(at) < pl.col("win_end_ns")))
        .drop("win_start_ns", "win_end_ns")
    )


def _canon(df: pl.DataFrame) -> pl.DataFrame:
    d = df.select(sorted(df.columns))
    return d.sort(d.columns, nulls_last=True)


# ---------------------------------------------------------------- random data

spans = st.lists(
    st.tuples(st.integers(0, 2), st.integers(0, 1000), st.integers(-5, 300)),
    min_size=0, max_size=60,
)


def _iv(rows: list[tuple[int, int, int]]) -> pl.DataFrame:
    return pl.DataFrame(
        [(r, s, s + d) for r, s, d in rows],
        schema={"rank": pl.Int32, START: pl.Int64, END: pl.Int64}, orient="row",
    )


def _windows(cuts: list[int], overlap: bool) -> pl.DataFrame:
    rows = []
    for rank in range(3):
        pts = sorted(set(cuts))
        for i, (a, b) in enumerate(itertools.pairwise(pts)):
            rows.append((rank, i, a, b + (50 if overlap and i % 2 else 0)))
    return pl.DataFrame(rows, schema={"rank": pl.Int32, "step": pl.Int64, "win_start_ns": pl.Int64,
                                      "win_end_ns": pl.Int64}, orient="row")


@settings(max_examples=40, deadline=None)
@given(spans, st.lists(st.integers(0, 1300), min_size=2, max_size=8), st.booleans())
def test_clip_and_locate_match_cross_join(rows, cuts, overlap) -> None:
    df, w = _iv(rows), _windows(cuts, overlap)
    assert _canon(clip(df, w, on=["rank"], window_cols=["step"])).equals(_canon(ref_clip(df, w)))
    dfi = df.with_row_index("i")
    got = locate(dfi, w, on=["rank"], at=START, keep=["step"])
    assert _canon(got).equals(_canon(ref_locate(dfi, w, START)))
    # locate keeps the input's row order (the hash join's order was an implementation detail)
    assert got["i"].is_sorted()


@settings(max_examples=40, deadline=None)
@given(spans, spans)
def test_union_and_sweep_match_reference(a, b) -> None:
    da, db = _iv(a), _iv(b)
    assert union(da, by=["rank"]).rows() == ref_union(da, ["rank"]).rows()
    seg = sweep({"a": da, "b": db}, by=["rank"])
    # reference sweep: every elementary segment between the union boundaries of both layers
    ua, ub = ref_union(da, ["rank"]), ref_union(db, ["rank"])
    def cov(u: pl.DataFrame, rank: int, s: int, e: int) -> bool:
        return any(r == rank and x <= s and e <= y for r, x, y in u.rows())

    for (rank, s, e, in_a, in_b) in seg.rows():
        assert s < e and (in_a or in_b)
        assert cov(ua, rank, s, e) == in_a and cov(ub, rank, s, e) == in_b
    covered = sum(e - s for _, s, e, _, _ in seg.rows())
    both = ref_union(pl.concat([da, db]), ["rank"])
    assert covered == sum(e - s for _, s, e in both.rows())


def test_disjoint_detects_overlap_and_empty_windows() -> None:
    w = _windows([0, 10, 20, 30], overlap=False)
    assert disjoint(w, on=["rank"], start="win_start_ns", end="win_end_ns")
    assert not disjoint(_windows([0, 10, 20, 30], overlap=True), on=["rank"],
                        start="win_start_ns", end="win_end_ns")
    empty = w.with_columns(pl.col("win_start_ns").alias("win_end_ns"))
    assert not disjoint(empty, on=["rank"], start="win_start_ns", end="win_end_ns")


# ---------------------------------------------------------------- real data

@pytest.fixture(scope="module")
def a100(corpus: Path) -> tuple[pl.DataFrame, pl.DataFrame]:
    events = classify(load_trace([corpus / A100]).events)
    return events, find_steps(events).table


def test_fast_paths_equal_reference_on_corpus_trace(a100) -> None:
    events, steps = a100
    gpu = events.filter(pl.col("kind").cast(pl.String).is_in(GPU_KINDS))
    iv = gpu.select("rank", pl.col("ts_ns").alias(START), (pl.col("ts_ns") + pl.col("dur_ns")).alias(END))
    u = union(iv, by=["rank"])
    assert u.rows() == ref_union(iv, ["rank"]).rows()
    assert u.height == 3_481  # merged GPU busy runs, both ranks (the reference gives the same)
    w = steps.select("rank", "step", "win_start_ns", "win_end_ns")
    assert disjoint(w, on=["rank"], start="win_start_ns", end="win_end_ns")
    assert _canon(clip(u, w, on=["rank"], window_cols=["step"])).equals(_canon(ref_clip(u, w)))
    located = locate(gpu, w, on=["rank"], at="ts_ns", keep=["step"])
    assert _canon(located).equals(_canon(ref_locate(gpu, w, "ts_ns")))


def test_diagnosis_numbers_unchanged(corpus: Path) -> None:
    """Numbers of the document produced before the performance work (commit 1e96336), same file
    and same steps: 4-5, as then (step 6, whole, is analysed by default now)."""
    doc = diagnose([corpus / A100], window="4:5")
    assert doc["steps"] == [4, 5]
    assert doc["step_time_s"] == 0.219732
    assert doc["walls"] == {"communication": 0.048, "compute": 0.1749, "host": 0.7737, "memory": 0.0035}
    assert doc["host"]["kernels_per_step"] == 900.0
    # the host's recoverable time is the step replayed with the host at zero (issue 28 item 13):
    # 0.219478 counted all host time on the path, 0.170001 (issue #17) only that with the GPU
    # idle; neither is what an instant host gains
    assert doc["critical_path"]["recoverable_s"]["host"] == 0.179598
    assert doc["blocking"]["communication_busy_s"] == 0.0123
    assert doc["blocking"]["communication_hidden_s"] == 0.00176
    assert doc["evidence"]["top_kernels"][0]["time_s"] == 0.024212


@pytest.mark.parametrize("rel", [A100, "public/nsys/nsysai_2gpu_training_before.sqlite"])
def test_classify_packed_key_equals_six_key_join(corpus: Path, rel: str,
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    """classify's one UInt64 key per row (`_packed_key`) gives every row the classes the join on
    the six key columns gave."""
    import moetune.analyzer.classify as classify_mod

    events = load_trace([corpus / rel]).events
    packed = classify(events)
    monkeypatch.setattr(classify_mod, "_packed_key", lambda ev, thresholds: None)
    assert packed.equals(classify(events))
    assert packed.get_column("kclass").null_count() < packed.height
