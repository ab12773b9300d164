"""Cross-rank reduce (analyzer/cross_rank.py) on a synthetic job made by bench/make_rank_job.py
from the real H200 EP=2 trace (known clock offsets, slow rank, overloaded EP rank) and on the real
2-rank H200 fixtures."""

from __future__ import annotations

import importlib.util
import itertools
import json
import sys
from dataclasses import replace
from pathlib import Path
from typing import Any

import jsonschema
import polars as pl
import pytest
from moetune.analyzer.clocks import align_clocks
from moetune.analyzer.cross_rank import cross_rank
from moetune.analyzer.rank_summary import Summaries, summarize
from moetune.analyzer.readers import load_trace
from moetune.analyzer.readers.kineto import read_kineto

ROOT = Path(__file__).resolve().parents[1]
SCHEMA = json.loads((ROOT / "schemas/diagnosis.schema.json").read_text())["properties"][
    "cross_rank"]
EP2 = ROOT / "fixtures/traces/gpu_ep2_alltoall_overlap"
RANKS, EP = 16, 4


def _generator() -> Any:
    spec = importlib.util.spec_from_file_location("make_rank_job", ROOT / "bench/make_rank_job.py")
    assert spec and spec.loader
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod  # its dataclasses resolve their annotations through it
    spec.loader.exec_module(mod)
    return mod


def _summaries(files: list[Path]) -> Summaries:
    return Summaries.concat([summarize(f, default_rank=i) for i, f in enumerate(files)])


@pytest.fixture(scope="module")
def job(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, Any], Summaries]:
    out = tmp_path_factory.mktemp("job")
    assert _generator().main([str(out), "--ranks", str(RANKS), "--ep", str(EP), "--seed", "3",
                              "--jobs", "1"]) == 0
    truth = json.loads((out / "truth.json").read_text())
    return out, truth, _summaries(sorted(out.glob("rank*.pt.trace.json.gz")))


@pytest.fixture(scope="module")
def job_doc(job: tuple[Path, dict[str, Any], Summaries]) -> dict[str, Any]:
    return cross_rank(job[2])["cross_rank"]


def test_offsets_recovered_within_1us(job: tuple[Path, dict[str, Any], Summaries],
                                      job_doc: dict[str, Any]) -> None:
    truth = job[1]
    al = job_doc["alignment"]
    assert al["method"] == "collective_end" and al["unaligned"] == [] and al["components"] == 1
    assert set(al["offsets_ns"]) == set(truth["expected_alignment_ns"])
    err = {r: abs(al["offsets_ns"][r] - truth["expected_alignment_ns"][r]) for r in al["offsets_ns"]}
    assert max(err.values()) <= 1000, err
    # the injected offsets are tens of ms: a result near 0 could not pass by chance
    assert max(abs(v) for v in truth["expected_alignment_ns"].values()) > 1_000_000
    assert al["residual_s"]["max"] <= 1e-6


def test_straggler_and_overloaded_ep_rank_named(job: tuple[Path, dict[str, Any], Summaries],
                                                job_doc: dict[str, Any]) -> None:
    truth = job[1]
    slow, over = truth["slow_rank"], truth["overloaded_rank"]
    st = job_doc["stragglers"]
    assert slow in st["ranks"] and slow in st["by_compute_time"]
    ep = job_doc["ep_imbalance"]
    assert [o["rank"] for o in ep["overloaded"]] == [over]
    assert ep["overloaded"][0]["basis"] == "a2a_received_rows"
    assert ep["groups"] == RANKS // EP
    # the overloaded rank is slow too (its experts take longer), and said to be so by its load
    detail = {d["rank"]: d for d in st["detail"]}
    assert detail[slow]["explained_by"] is None
    if over in detail:
        assert detail[over]["explained_by"] == "ep_overload"
    # the slow rank is who the others wait for most
    assert job_doc["process_groups"]["held_back"][0]["rank"] == slow
    assert job_doc["step_time"]["slowest_rank"] == slow


def test_overload_by_expert_share_without_splits(job: tuple[Path, dict[str, Any], Summaries]
                                                 ) -> None:
    """Without all-to-all splits the expert-GEMM share names the overloaded rank, not the slow
    one (whose expert GEMMs are as stretched as the rest of its compute)."""
    s = job[2]
    s = replace(s, collectives=s.collectives.with_columns(out_split=pl.lit(None, pl.String)))
    ep = cross_rank(s)["cross_rank"]["ep_imbalance"]
    assert [(o["rank"], o["basis"]) for o in ep["overloaded"]] == [
        (job[1]["overloaded_rank"], "expert_compute_share")]


def test_critical_path_tiles_the_median_step(job: tuple[Path, dict[str, Any], Summaries],
                                             job_doc: dict[str, Any]) -> None:
    cp = job_doc["critical_path"]
    assert cp["last_finishing_rank"] == job[1]["slow_rank"]
    segs = cp["segments"]
    assert segs[0]["from_s"] == 0 and segs[-1]["to_s"] == pytest.approx(cp["span_s"], abs=1e-9)
    for a, b in itertools.pairwise(segs):
        assert a["to_s"] == pytest.approx(b["from_s"], abs=1e-9)
        assert a["exit_via"] is not None and a["rank"] != b["rank"]
    assert segs[-1]["exit_via"] is None and segs[-1]["rank"] == cp["last_finishing_rank"]
    assert cp["granularity"] == "collective" and cp["reread_ranks"] == []


def test_critical_path_rereads_only_path_ranks(job: tuple[Path, dict[str, Any], Summaries]
                                               ) -> None:
    out, _, s = job
    files = sorted(out.glob("rank*.pt.trace.json.gz"))
    asked: list[int] = []

    def load(r: int) -> Any:
        asked.append(r)
        return read_kineto(files[r], default_rank=r)

    cp = cross_rank(s, load_rank=load)["cross_rank"]["critical_path"]
    assert asked == cp["reread_ranks"] == cp["ranks"]
    assert cp["granularity"] == "critical_path"
    for seg in cp["segments"]:  # the rank's own path tiles each segment
        assert sum(seg["walls_s"].values()) == pytest.approx(seg["to_s"] - seg["from_s"], abs=2e-6)


def test_components_without_a_joining_group(job: tuple[Path, dict[str, Any], Summaries]) -> None:
    """EP collectives alone join no two EP groups: each aligns within itself, the rest are
    listed as unaligned to the reference rank, never given a guessed offset."""
    truth, s = job[1], job[2]
    ep_only = s.collectives.filter(pl.col("pg_desc") == "EXPERT_MODEL_PARALLEL_GROUP")
    al = cross_rank(replace(s, collectives=ep_only))["cross_rank"]["alignment"]
    assert al["components"] == RANKS // EP
    assert al["unaligned"] == list(range(EP, RANKS))
    inj = {int(r): v for r, v in truth["clock_offset_ns"].items()}
    for r in range(RANKS):
        base = r // EP * EP  # the component's lowest rank is its reference
        assert abs(al["offsets_ns"][str(r)] - (inj[base] - inj[r])) <= 1000


def test_output_validates(job_doc: dict[str, Any]) -> None:
    jsonschema.validate(job_doc, SCHEMA)


def test_one_rank_is_unobservable(job: tuple[Path, dict[str, Any], Summaries]) -> None:
    s = job[2]
    one = Summaries(**{f: getattr(s, f).filter(pl.col("rank") == 0)
                       for f in ("steps", "walls", "collectives", "kernels", "memory",
                                 "host_idle", "meta")})
    doc = cross_rank(one)["cross_rank"]
    assert doc["ranks"] == 1 and "one rank" in doc["unobservable"]
    assert set(doc) == {"ranks", "unobservable"}
    jsonschema.validate(doc, SCHEMA)


@pytest.mark.parametrize("case", ["gpu_ep2_alltoall_overlap", "gpu_ep2_allgather"])
def test_real_two_ranks_agree_with_align_clocks(case: str) -> None:
    d = ROOT / "fixtures/traces" / case
    files = [d / "rank0.pt.trace.json.gz", d / "rank1.pt.trace.json.gz"]
    doc = cross_rank(_summaries(files))["cross_rank"]
    jsonschema.validate(doc, SCHEMA)
    old = align_clocks(load_trace(files))
    assert old.method == doc["alignment"]["method"] == "collective_end"
    new = doc["alignment"]["offsets_ns"]
    assert new["0"] == 0 and abs(new["1"] - old.offsets_ns[1]) <= 1000
    assert old.offsets_ns[1] != 0  # a real offset, not a trivially equal zero
    # two ranks cannot tell a straggler from its peer
    assert doc["stragglers"]["ranks"] is None and "unobservable" in doc["stragglers"]
    assert doc["critical_path"]["ranks"]


def test_diff_of_two_jobs_names_what_moved(job: tuple[Path, dict[str, Any], Summaries],
                                           tmp_path: Path) -> None:
    """`moetune diff` of two rank directories (the many-ranks path): the document's
    `cross_rank` part says which stragglers and overloaded EP ranks are new and which gone."""
    import subprocess

    other = tmp_path / "other"
    assert _generator().main([str(other), "--ranks", str(RANKS), "--ep", str(EP), "--seed", "11",
                              "--jobs", "1"]) == 0
    ta, tb = job[1], json.loads((other / "truth.json").read_text())
    r = subprocess.run([sys.executable, "-m", "moetune", "diff", str(job[0]), str(other),
                        "--cache", str(tmp_path / "cache"), "--json"],
                       capture_output=True, text=True, cwd=ROOT, timeout=600)
    assert r.returncode == 0, r.stderr[-2000:]
    doc = json.loads(r.stdout)
    jsonschema.validate(doc, json.loads((ROOT / "schemas/diff.schema.json").read_text()))
    cr = doc["cross_rank"]
    assert cr["ranks"] == {"a": RANKS, "b": RANKS, "delta": 0}
    over = cr["overloaded_ep_ranks"]
    assert over["a"] == [ta["overloaded_rank"]] and over["b"] == [tb["overloaded_rank"]]
    if ta["overloaded_rank"] != tb["overloaded_rank"]:
        assert over["new"] == [tb["overloaded_rank"]] and over["gone"] == [ta["overloaded_rank"]]
    assert ta["slow_rank"] in cr["stragglers"]["a"] and tb["slow_rank"] in cr["stragglers"]["b"]
    text = subprocess.run([sys.executable, "-m", "moetune", "diff", str(job[0]), str(other),
                           "--cache", str(tmp_path / "cache")],
                          capture_output=True, text=True, cwd=ROOT, timeout=600)
    assert text.returncode == 0, text.stderr[-2000:]
    assert f"overloaded EP ranks {ta['overloaded_rank']} → {tb['overloaded_rank']}" in text.stdout
