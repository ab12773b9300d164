"""The packed (rank, correlation) key gives the same joins as the two-column key it replaces."""

from __future__ import annotations

from pathlib import Path

import polars as pl
from moetune.analyzer.classify import classify
from moetune.analyzer.frames import corr_key
from moetune.analyzer.readers import load_trace
from moetune.analyzer.steps import assign_steps, find_steps
from moetune.analyzer.walls import host_layers

ROOT = Path(__file__).resolve().parents[1]
TRACE = ROOT / "fixtures/traces/gpu_mcore_hostbound/trace.json.gz"


def test_corr_key_refuses_values_that_do_not_fit() -> None:
    ok = pl.DataFrame({"rank": [0, 3], "correlation": [1, 2**40 - 1]})
    assert corr_key(ok) is not None
    assert corr_key(ok, pl.DataFrame({"rank": [0], "correlation": [2**40]})) is None
    assert corr_key(pl.DataFrame({"rank": [-1], "correlation": [5]})) is None
    assert corr_key(pl.DataFrame({"rank": [2**23], "correlation": [5]})) is None
    nulls = pl.DataFrame({"rank": [0], "correlation": [None]}, schema={"rank": pl.Int32,
                                                                       "correlation": pl.Int64})
    assert corr_key(nulls) is not None
    key = ok.select(corr_key(ok)).to_series().to_list()
    assert key == [1, 3 * 2**40 + 2**40 - 1]


def test_packed_and_two_column_paths_agree_on_a_real_trace() -> None:
    ev = classify(load_trace([TRACE]).events)
    host = find_steps(ev).table.select("rank", "step", "start_ns", "end_ns")
    packed = assign_steps(ev, host)
    # correlations shifted past 2**40 force the two-column path; same rows must get same steps
    far = ev.with_columns(pl.col("correlation") + 2**41)
    plain = assign_steps(far, host)
    assert packed.get_column("step").null_count() < packed.height  # something was assigned
    assert packed.get_column("step").equals(plain.get_column("step"))
    a, b = host_layers(ev), host_layers(far)
    assert a["starved"].height > 100
    assert a["starved"].equals(b["starved"]) and a["sync"].equals(b["sync"])
