"""Cross-rank view on the 2-rank NCCL trace (rank 0) and clock-shifted copies of it."""

from __future__ import annotations

from pathlib import Path

import polars as pl
import pytest
from moetune.analyzer.clocks import align_clocks
from moetune.analyzer.frames import Trace, concat_traces
from moetune.analyzer.graph import build_graph
from moetune.analyzer.ranks import ranks_section, stragglers, summary_lines

ROOT = Path(__file__).resolve().parents[1]
SHIFT = 123_456_789  # ns, rank 1's clock runs this far ahead


@pytest.fixture(scope="module")
def rank0(corpus: Path) -> Trace:
    from moetune.analyzer.readers import load_trace

    return load_trace([corpus / "public/kineto/hta_a100_2rank_nccl.json.gz"])


def _copy(tr: Trace, rank: int, shift: int, *, events: pl.DataFrame | None = None) -> Trace:
    r = pl.lit(rank, dtype=pl.Int32)
    ev = tr.events if events is None else events
    return Trace(
        events=ev.with_columns(rank=r, ts_ns=pl.col("ts_ns") + shift),
        comms=tr.comms.with_columns(rank=r, ts_ns=pl.col("ts_ns") + shift),
        flows=tr.flows.with_columns(rank=r, ts_ns=pl.col("ts_ns") + shift),
        ranks=tr.ranks.with_columns(rank=r),
    )


def _nccl(ev: pl.DataFrame) -> pl.Expr:
    return (pl.col("kind") == "kernel") & pl.col("name").str.starts_with("ncclKernel")


def test_alignment_recovers_shift_exactly(rank0: Trace) -> None:
    both = concat_traces([rank0, _copy(rank0, 1, SHIFT)])
    al = align_clocks(both)
    assert al.method == "collective_end"
    assert al.offsets_ns == {0: 0, 1: -SHIFT}
    assert al.pairs == {1: 21}  # 15 all-reduce + 6 broadcast kernels matched
    sec = ranks_section(both)["ranks"]
    assert sec["count"] == 2 and sec["stragglers"] is None  # 2 ranks: no outlier test
    assert sec["stragglers_unobservable"].startswith("2 ranks with a step time")
    assert sec["step_time_s_by_rank"]["0"] == sec["step_time_s_by_rank"]["1"]
    sk = sec["collective_arrival_skew_s"]
    assert (sk["p50"], sk["max"], sk["instances"]) == (0.0, 0.0, 21)
    assert set(sk["by_collective"]) == {"0:allreduce", "0:broadcast"}  # pg "0", from metadata


def test_arrival_skew_of_early_starts(rank0: Trace) -> None:
    """Rank 1 enters every collective 50 µs earlier and waits: same end, start − 50 µs."""
    early = rank0.events.with_columns(
        ts_ns=pl.when(_nccl(rank0.events)).then(pl.col("ts_ns") - 50_000).otherwise("ts_ns"),
        dur_ns=pl.when(_nccl(rank0.events)).then(pl.col("dur_ns") + 50_000).otherwise("dur_ns"),
    )
    both = concat_traces([rank0, _copy(rank0, 1, SHIFT, events=early)])
    sec = ranks_section(both)["ranks"]
    assert sec["alignment"]["offsets_ns"] == {"0": 0, "1": -SHIFT}  # ends still agree
    sk = sec["collective_arrival_skew_s"]
    assert sk["p50"] == pytest.approx(50e-6) and sk["max"] == pytest.approx(50e-6)
    assert sk["by_collective"]["0:allreduce"]["last_arrival"] == {"0": 15}
    assert summary_lines({"ranks": sec})[1].startswith("  collective arrival skew p50 50.0 µs")


def test_collective_edges_from_last_arrival(rank0: Trace) -> None:
    early = rank0.events.with_columns(
        ts_ns=pl.when(_nccl(rank0.events)).then(pl.col("ts_ns") - 50_000).otherwise("ts_ns"),
        dur_ns=pl.when(_nccl(rank0.events)).then(pl.col("dur_ns") + 50_000).otherwise("dur_ns"),
    )
    both = concat_traces([rank0, _copy(rank0, 1, SHIFT, events=early)])
    g = build_graph(both)
    assert g.edge_counts()["collective"] == 21
    ranks = dict(zip(g.nodes["node"].to_list(), g.nodes["rank"].to_list(), strict=True))
    # rank 0 arrived last everywhere: every edge goes rank 0 → rank 1
    assert {(ranks[u], ranks[v]) for u, v, k in g.g.edges(data="kind") if k == "collective"} == {
        (0, 1)}


def test_mismatched_collectives_degrade(rank0: Trace) -> None:
    """Rank 1 lacks its first all-reduce kernel: that group cannot be matched by index (15 vs
    14) and is left unlinked and counted; broadcasts still align the clocks exactly."""
    ev = rank0.events.with_row_index("_i")
    first = ev.filter(_nccl(ev) & pl.col("name").str.contains("AllReduce")).sort("ts_ns")["_i"][0]
    fewer = ev.filter(pl.col("_i") != first).drop("_i")
    both = concat_traces([rank0, _copy(rank0, 1, SHIFT, events=fewer)])
    sec = ranks_section(both)["ranks"]
    assert sec["alignment"]["offsets_ns"] == {"0": 0, "1": -SHIFT}
    assert sec["unlinked"]["collectives_unmatched"] == 29  # 15 + 14 all-reduce kernels
    assert set(sec["collective_arrival_skew_s"]["by_collective"]) == {"0:broadcast"}
    g = build_graph(both)
    assert g.edge_counts()["collective"] == 6  # the 6 broadcasts only
    assert g.unlinked["collectives_unmatched"] == 29


def test_session_start_offsets_win(rank0: Trace) -> None:
    r1 = _copy(rank0, 1, SHIFT)
    r1 = Trace(events=r1.events, comms=r1.comms, flows=r1.flows,
               ranks=r1.ranks.with_columns(clock_offset_ns=pl.lit(-SHIFT, dtype=pl.Int64)))
    al = align_clocks(concat_traces([rank0, r1]))
    assert (al.method, al.offsets_ns) == ("session_start", {0: 0, 1: -SHIFT})


def test_straggler_rule() -> None:
    # robust z = 0.6745·(x − median)/max(MAD, 1 % of median)
    strag, z = stragglers({0: 1.00, 1: 1.00, 2: 1.00, 3: 1.10})
    assert strag == [3] and z[3] == pytest.approx(0.6745 * 0.10 / 0.01, abs=1e-3)
    assert stragglers({0: 1.0, 1: 1.02, 2: 0.99, 3: 1.01})[0] == []
    assert stragglers({0: 1.0, 1: 5.0}) == ([], {})  # two ranks: undecidable


def test_stretched_rank_is_a_straggler(rank0: Trace) -> None:
    t0 = rank0.events["ts_ns"].min()
    slow = rank0.events.with_columns(
        ts_ns=t0 + ((pl.col("ts_ns") - t0) * 11) // 10, dur_ns=(pl.col("dur_ns") * 11) // 10)
    tr = concat_traces([rank0, _copy(rank0, 1, 0), _copy(rank0, 2, 0),
                        _copy(rank0, 3, 0, events=slow)])
    sec = ranks_section(tr)["ranks"]
    assert sec["stragglers"] == [3]
    s = sec["step_time_s_by_rank"]
    assert s["3"] == pytest.approx(1.1 * s["0"], rel=1e-6)


def _said(argv: list[str]) -> tuple[dict, str]:
    """The diagnosis of `argv` as JSON (schema-checked) and its terminal text."""
    import json

    import jsonschema

    from tests.golden import run_cli

    code, text, err = run_cli(["diagnose", "--json", *argv])
    assert code == 0, err
    doc = json.loads(text)
    jsonschema.validate(doc, json.loads((ROOT / "schemas/diagnosis.schema.json").read_text()))
    code, text, err = run_cli(["diagnose", *argv])
    assert code == 0, err
    return doc, text


def test_two_rank_export_says_unobservable_everywhere(corpus: Path) -> None:
    """A real 2-GPU nsys export: with two ranks neither can be told apart as the outlier, so the
    document and the terminal say unobservable and why, never "none" (issue 28)."""
    doc, text = _said([str(corpus / "public/nsys/nsysai_2gpu_training_before.sqlite")])
    r = doc["ranks"]
    assert r["count"] == 2 and r["stragglers"] is None
    why = "2 ranks with a step time: it takes 3 to tell an outlier from its peers"
    assert r["stragglers_unobservable"] == why
    assert f"stragglers: unobservable ({why})" in text and "stragglers: none" not in text


@pytest.fixture(scope="module")
def unjoined(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Three ranks of one job (distributedInfo ranks 0–2 of 3) that share no collective: copies
    of the real single-GPU hostbound trace, whose process groups hold one rank each."""
    import gzip
    import json

    src = ROOT / "fixtures/traces/gpu_mcore_hostbound/trace.json.gz"
    doc = json.loads(gzip.decompress(src.read_bytes()))
    out = tmp_path_factory.mktemp("unjoined")
    for r in range(3):
        doc["distributedInfo"] = {**doc["distributedInfo"], "rank": r, "world_size": 3}
        (out / f"rank{r}.pt.trace.json.gz").write_bytes(gzip.compress(json.dumps(doc).encode()))
    return out


@pytest.mark.parametrize("many", [False, True], ids=["in-process", "summaries"])
def test_ranks_no_collective_joins_are_not_compared(unjoined: Path, tmp_path: Path,
                                                    many: bool) -> None:
    """Three ranks on no shared clock: the straggler rule has no peers to compare, in process
    (`ranks`) and on the many-ranks path (`ranks` and `cross_rank`), JSON and terminal alike."""
    doc, text = _said([str(unjoined), *(["--cache", str(tmp_path)] if many else [])])
    why = "no 3 ranks joined by collectives to compare"
    assert doc["ranks"]["stragglers"] is None and doc["ranks"]["stragglers_unobservable"] == why
    assert f"stragglers: unobservable ({why})" in text and "stragglers: none" not in text
    if many:
        st = doc["cross_rank"]["stragglers"]
        assert st["ranks"] is None and st["unobservable"] == why
        assert f"cross-rank: 3 ranks · alignment none (2 unaligned) · stragglers: unobservable ({why})" in text
