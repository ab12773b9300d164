"""The fast paths of the wall attribution (issue #19) against the general ones they stand in for:
packed-key unions, coverage sums instead of elementary segments, launch ends found by binary
search instead of hash joins, and the recompute ops read once per diagnosis."""

from __future__ import annotations

import random
from pathlib import Path

import polars as pl
import pytest
from moetune.analyzer import intervals, walls
from moetune.analyzer.frames import corr_key, lookup, min_by_key
from moetune.analyzer.intervals import END, LAYER, START

SCHEMA = {"rank": pl.Int32, LAYER: pl.UInt8, START: pl.Int64, END: pl.Int64}


def _intervals(rng: random.Random, n: int, *, ranks: tuple[int, int] = (-2, 3), t0: int = 0
               ) -> pl.DataFrame:
    rows = []
    for _ in range(n):
        s = t0 + rng.randint(-50, 400)
        rows.append((rng.randint(*ranks), rng.randint(0, 3), s, s + rng.randint(-5, 60)))
    return pl.DataFrame(rows, schema=SCHEMA, orient="row")


@pytest.mark.parametrize("seed", range(40))
def test_packed_union_equals_the_general_union(seed: int, monkeypatch: pytest.MonkeyPatch) -> None:
    rng = random.Random(seed)
    df = _intervals(rng, rng.randint(0, 80), t0=rng.choice([0, 1_700_000_000_000_000_000]))
    for by in ([], ["rank"], ["rank", LAYER], [LAYER, "rank"]):
        fast = intervals.union(df, by=by)
        with monkeypatch.context() as m:
            m.setattr(intervals, "_union_packed", lambda d, keys: None)
            slow = intervals.union(df, by=by)
        assert fast.schema == slow.schema
        assert fast.equals(slow), by


def test_packed_union_declines_what_it_cannot_pack() -> None:
    df = pl.DataFrame({"k": ["a", "b"], START: [0, 5], END: [10, 20]})
    assert intervals._union_packed(df, ["k"]) is None  # a string key
    nulls = pl.DataFrame({"k": [1, None], START: [0, 5], END: [10, 20]})
    assert intervals._union_packed(nulls, ["k"]) is None
    assert intervals.union(nulls, by=["k"]).height == 2
    wide = pl.DataFrame({"k": [0, 1 << 40], START: [0, 0], END: [1 << 30, 1 << 30]})
    assert intervals._union_packed(wide, ["k"]) is None  # does not fit in 62 bits
    assert intervals.union(wide, by=["k"]).height == 2


def _windows(rng: random.Random, ranks: list[int], *, touching: bool) -> pl.DataFrame:
    rows = []
    for r in ranks:
        t = rng.randint(-60, 0)
        for step in range(rng.randint(1, 4)):
            length = rng.randint(1, 150)
            rows.append((r, step, t, t + length))
            t += length + (0 if touching else rng.randint(0, 30))
    df = pl.DataFrame(rows, schema={"rank": pl.Int32, "step": pl.Int64, "win_start_ns": pl.Int64,
                                    "win_end_ns": pl.Int64}, orient="row")
    return df.with_columns(pl.lit(0, dtype=pl.Int64).alias("start_ns"),
                           pl.lit(0, dtype=pl.Int64).alias("end_ns"))


NAMES = ["c", "rc", "comm", "mem", "off", "offpg", "sync", "starved"]


@pytest.mark.parametrize("seed", range(30))
def test_coverage_sums_equal_the_segments(seed: int, monkeypatch: pytest.MonkeyPatch) -> None:
    rng = random.Random(seed)
    ranks = sorted(rng.sample(range(-1, 4), rng.randint(1, 3)))
    steps = _windows(rng, ranks, touching=rng.random() < 0.5)
    layers = {}
    for name in NAMES:
        iv = _intervals(rng, rng.randint(0, 25), ranks=(min(ranks), max(ranks)))
        layers[name] = iv.select("rank", START, END)
    events = pl.DataFrame(schema={"rank": pl.Int32, "kind": pl.String, "ts_ns": pl.Int64,
                                  "dur_ns": pl.Int64, "rclass": pl.String})
    fast = walls.attribute_walls(events, steps, layers=layers)
    with monkeypatch.context() as m:
        m.setattr(walls, "_coverage", lambda *a, **k: None)
        slow = walls.attribute_walls(events, steps, layers=layers)
    assert fast.equals(slow)


def test_coverage_declines_overlapping_windows() -> None:
    wid = pl.DataFrame({"rank": [0, 0], "step": [0, 1], "win_start_ns": [0, 5],
                        "win_end_ns": [10, 20], "_wid": [1, 2]})
    u = pl.DataFrame({"rank": [0], START: [0], END: [3], LAYER: [0]},
                     schema={"rank": pl.Int64, START: pl.Int64, END: pl.Int64, LAYER: pl.UInt8})
    assert walls._coverage(u, wid, names=["c", "win"]) is None


@pytest.mark.parametrize("seed", range(30))
def test_launch_ends_searched_equal_the_joined(seed: int) -> None:
    rng = random.Random(seed)
    n = rng.randint(0, 60)
    # ops in (rank, start) order with ties, as host_layers makes them
    ops = sorted((rng.randint(0, 2), rng.randint(0, 40) * 10) for _ in range(n))
    rows, gap = [], {}
    for rank, start in ops:
        g = gap.setdefault((rank, start), start - rng.randint(1, 30))
        corr = rng.choice([None, *range(30)])
        rows.append((rank, corr, start, g))
    ops_df = pl.DataFrame(rows, schema={"rank": pl.Int32, "correlation": pl.Int64, START: pl.Int64,
                                        "gap_start": pl.Int64}, orient="row")
    calls = pl.DataFrame(
        [(rng.randint(0, 2), rng.randint(0, 30), rng.randint(0, 400), rng.randint(0, 50))
         for _ in range(rng.randint(0, 70))],
        schema={"rank": pl.Int32, "correlation": pl.Int64, "ts_ns": pl.Int64, "dur_ns": pl.Int64},
        orient="row")
    key = corr_key(calls, ops_df)
    assert key is not None
    assert walls._starved_searched(calls, ops_df, key).equals(walls._starved_joined(calls, ops_df))


def test_a_diagnosis_reads_the_recompute_ops_once(monkeypatch: pytest.MonkeyPatch) -> None:
    """The wall attribution and the what-if replay share one pass over the host rows (the
    diagnosis hands the recompute launches to its sections through the context)."""
    from moetune.analysis import analyze

    calls = []
    real = walls._recompute_ops
    monkeypatch.setattr(walls, "_recompute_ops", lambda e, cl: calls.append(1) or real(e, cl))
    doc = analyze(Path(__file__).resolve().parents[1] / "fixtures" / "traces"
                  / "gpu_mcore_recompute_full" / "trace.json.gz").diagnosis
    assert doc["whatif"]["transforms"]["recompute_off"]  # the replay did read recompute
    assert len(calls) == 1


@pytest.mark.parametrize("seed", range(20))
def test_lookup_by_binary_search_equals_a_left_join(seed: int) -> None:
    rng = random.Random(seed)
    table = pl.DataFrame(
        [(rng.randint(0, 2), rng.choice([None, *range(20)]), rng.randint(-5, 50))
         for _ in range(rng.randint(0, 40))],
        schema={"rank": pl.Int32, "correlation": pl.Int64, "v": pl.Int64}, orient="row")
    wanted = pl.DataFrame(
        [(rng.randint(0, 3), rng.choice([None, *range(25)])) for _ in range(rng.randint(0, 40))],
        schema={"rank": pl.Int32, "correlation": pl.Int64}, orient="row")
    key = corr_key(table, wanted)
    assert key is not None
    keys, values = min_by_key(table, key, "v")
    got = lookup(keys, values, wanted.select(key).to_series())
    want = wanted.join(table.filter(pl.col("correlation").is_not_null())
                       .group_by("rank", "correlation").agg(pl.col("v").min()),
                       on=["rank", "correlation"], how="left", maintain_order="left")
    assert got.dtype == pl.Int64
    assert got.to_list() == want.get_column("v").to_list()
