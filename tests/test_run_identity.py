"""Files given as ranks must be ranks of one run (issue #17, item 1): what the traces carry
(`distributedInfo`, world size, capture time, host process, step ids) decides, one line and exit 2
otherwise; `--allow-mixed-runs` merges them anyway and says so."""

from __future__ import annotations

import gzip
import json
import subprocess
import sys
from pathlib import Path

import jsonschema
import pytest
from moetune.analyzer.readers import load_trace
from moetune.analyzer.run_identity import Part, conflict, too_many

from moetune.errors import UserError

ROOT = Path(__file__).resolve().parents[1]
TRACES = ROOT / "fixtures" / "traces"
EP2 = TRACES / "gpu_ep2_alltoall_overlap"
SCHEMA = json.loads((ROOT / "schemas/diagnosis.schema.json").read_text())


def moetune(*args: str | Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "moetune", "diagnose", *map(str, args)], cwd=ROOT,
                          capture_output=True, text=True, timeout=300)


def refused(r: subprocess.CompletedProcess[str], *names: str) -> str:
    assert r.returncode == 2, r.stderr
    assert r.stdout == "" and "Traceback" not in r.stderr
    line = r.stderr.strip()
    assert "\n" not in line and line.startswith("moetune: ")
    assert all(n in line for n in names), line
    assert "are not ranks of one run" in line or "not ranks of one run" in line
    return line


def rewrite(src: Path, dst: Path, edit) -> Path:
    """A faithful copy of a real trace with one field edited (the rest byte-for-byte data)."""
    doc = json.loads(gzip.decompress(src.read_bytes()))
    edit(doc)
    dst.write_bytes(gzip.compress(json.dumps(doc).encode(), compresslevel=1))
    return dst


# --- real traces of unrelated runs --------------------------------------------------------------


def test_single_gpu_run_beside_a_distributed_one_is_refused_in_one_line() -> None:
    """The issue's pair: a GEMM micro-benchmark (no distributedInfo) and a Megatron run
    (distributedInfo rank 0 of 1), captured 108 s apart on one host."""
    line = refused(moetune(TRACES / "gpu_gemm_bf16", TRACES / "gpu_mcore_hostbound"),
                   "gpu_gemm_bf16/trace.json.gz", "gpu_mcore_hostbound/trace.json.gz")
    assert "the second has distributedInfo" in line and "--allow-mixed-runs" in line


def test_two_captures_of_one_process_are_not_two_ranks() -> None:
    """Two benchmarks run one after the other in host process 461, 108 ms apart: no distributedInfo,
    same ProfilerStep ids, within two hosts' clock slack; the shared pid and the disjoint windows
    say one process was profiled twice."""
    line = refused(moetune(TRACES / "gpu_gemm_bf16", TRACES / "gpu_experts_sequential"),
                   "gpu_gemm_bf16", "gpu_experts_sequential")
    assert "one host process (pid 461) captured twice, 108 ms apart" in line


def test_same_rank_twice_is_refused() -> None:
    line = refused(moetune(TRACES / "gpu_mcore_computebound", TRACES / "gpu_mcore_hostbound"),
                   "gpu_mcore_computebound", "gpu_mcore_hostbound")
    assert "both are rank 0" in line


def test_rank_files_of_two_ep2_runs_are_refused_by_capture_time() -> None:
    """rank 0 of one EP=2 job and rank 1 of another: same world size, ranks 0 and 1, same NCCL,
    same step id; only the capture windows (24.8 s apart) tell them apart."""
    line = refused(moetune(TRACES / "gpu_ep2_allgather/rank0.pt.trace.json.gz",
                           TRACES / "gpu_ep2_alltoall_overlap/rank1.pt.trace.json.gz"),
                   "gpu_ep2_allgather/rank0", "gpu_ep2_alltoall_overlap/rank1")
    assert "captured 24.8 s apart" in line


@pytest.mark.corpus
def test_public_traces_of_unrelated_runs_are_refused(corpus: Path) -> None:
    k, n = corpus / "public/kineto", corpus / "public/nsys"
    line = refused(moetune(k / "tracelens_h100_qwen05b_inference.json.gz",
                           k / "hta_mi250_minitoy.json.gz"), "tracelens_h100", "hta_mi250")
    assert "captured 151 days apart" in line
    refused(moetune(k / "hta_alexnet.json.gz", k / "hta_simple_add.json.gz"), "both are rank 0")
    # a directory of unrelated nsys exports: named by their capture sessions, not a rank clash
    line = refused(moetune(n), "nsysai_2gpu_training_before.sqlite",
                   "nsysai_h100_2gpu_inference.sqlite")
    assert "captured 2 days apart" in line


# --- ranks of one run are accepted --------------------------------------------------------------


def test_ranks_of_one_ep2_job_are_one_run() -> None:
    tr = load_trace([EP2])
    assert tr.ranks.select("rank", "rank_from", "world_size").rows() == [
        (0, "distributedInfo", 2), (1, "distributedInfo", 2)]
    assert not any("ranks of one run" in w for w in tr.warnings)


@pytest.mark.corpus
def test_one_export_with_two_ranks_is_one_run(corpus: Path) -> None:
    tr = load_trace([corpus / "public/nsys/nsysai_2gpu_training_before.sqlite"])
    assert tr.ranks["rank"].to_list() == [0, 1]


# --- faithfully edited copies of the EP=2 job ---------------------------------------------------


def _world(n: int):
    def edit(doc: dict) -> None:
        doc["distributedInfo"]["world_size"] = n
    return edit


def test_differing_world_sizes_are_refused(tmp_path: Path) -> None:
    r1 = rewrite(EP2 / "rank1.pt.trace.json.gz", tmp_path / "rank1.json.gz", _world(4))
    line = refused(moetune(EP2 / "rank0.pt.trace.json.gz", r1), "rank0.pt.trace.json.gz", "rank1")
    assert "world sizes differ (2 and 4)" in line


def test_more_ranks_than_the_world_size_is_refused(tmp_path: Path) -> None:
    """The EP=2 job's rank 1 given twice more as ranks 2 and 3: four ranks of a world of 2."""
    def as_rank(r: int):
        def edit(doc: dict) -> None:
            doc["distributedInfo"]["rank"] = r
        return edit
    extra = [rewrite(EP2 / "rank1.pt.trace.json.gz", tmp_path / f"rank{r}.json.gz", as_rank(r))
             for r in (2, 3)]
    with pytest.raises(UserError, match=r"declares world size 2, but the inputs hold 4 ranks \(0–3\)"):
        load_trace([EP2 / "rank0.pt.trace.json.gz", EP2 / "rank1.pt.trace.json.gz", *extra])


def test_step_ids_that_share_none_are_refused(tmp_path: Path) -> None:
    def later(doc: dict) -> None:
        for e in doc["traceEvents"]:
            if str(e.get("name", "")).startswith("ProfilerStep#"):
                e["name"] = "ProfilerStep#9"
    r1 = rewrite(EP2 / "rank1.pt.trace.json.gz", tmp_path / "rank1.json.gz", later)
    line = refused(moetune(EP2 / "rank0.pt.trace.json.gz", r1))
    assert "their profiler steps share no id (5 and 9)" in line


# --- --allow-mixed-runs -------------------------------------------------------------------------


def test_allow_mixed_runs_renumbers_and_warns() -> None:
    r = moetune(TRACES / "gpu_mcore_computebound", TRACES / "gpu_mcore_hostbound", "--json",
                "--allow-mixed-runs")
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    jsonschema.validate(doc, SCHEMA)
    assert doc["ranks_analyzed"] == [0, 1] and doc["ranks"]["count"] == 2
    w = doc["warnings"]
    assert any("are not ranks of one run: both are rank 0; analysed together as asked" in x for x in w)
    assert any(x.endswith("gpu_mcore_hostbound/trace.json.gz: rank 0 → 1 (its rank was taken by "
                          "an earlier file)") for x in w)
    assert "warning: " in r.stderr and "not ranks of one run" in r.stderr


# --- the rules, one by one ----------------------------------------------------------------------


def _part(file: str, ranks: tuple[int, ...] = (0,), *, declared: bool = False, world: int | None = None,
          distributed: bool | None = None, span: tuple[int, int] | None = None,
          pids: frozenset[int] = frozenset(), steps: frozenset[int] = frozenset()) -> Part:
    return Part(file, ranks, declared, world, distributed, span, pids, steps)


T0 = 1_790_000_000 * 10**9  # a wall-clock time (ns since the epoch)


def test_absent_evidence_refuses_nothing() -> None:
    """No metadata, no wall clock, no steps: nothing says these are two runs."""
    assert conflict(_part("a", (0,)), _part("b", (1,))) is None
    # rank numbers by file order are not claims: the same number is no clash
    assert conflict(_part("a", (0,)), _part("b", (0,))) is None
    assert too_many([_part("a"), _part("b")], [0, 1]) is None


def test_overlapping_windows_and_clock_slack_are_one_run() -> None:
    a = _part("a", span=(T0, T0 + 10**9), pids=frozenset({7}))
    assert conflict(a, _part("b", (1,), span=(T0 + 5 * 10**8, T0 + 2 * 10**9), pids=frozenset({7}))) is None
    # 1.5 s apart on two hosts (other pids): within what two hosts' clocks can disagree by
    assert conflict(a, _part("b", (1,), span=(T0 + 25 * 10**8, T0 + 3 * 10**9))) is None
    assert "captured 3.0 s apart" in conflict(a, _part("b", (1,), span=(T0 + 4 * 10**9, T0 + 5 * 10**9)))


def test_relative_clocks_are_not_compared(tmp_path: Path) -> None:
    """Without baseTimeNanoseconds the EP=2 job's ts (µs of a monotonic clock) is no wall
    clock: shifted by an hour, rank 1 is still not refused on time."""
    def relative(doc: dict) -> None:
        del doc["baseTimeNanoseconds"]
        for e in doc["traceEvents"]:
            if isinstance(e.get("ts"), (int, float)):
                e["ts"] += 3600e6
    r1 = rewrite(EP2 / "rank1.pt.trace.json.gz", tmp_path / "rank1.json.gz", relative)
    tr = load_trace([EP2 / "rank0.pt.trace.json.gz", r1])
    assert tr.ranks["rank"].to_list() == [0, 1]


@pytest.mark.corpus
def test_ranks_numbered_by_order_do_not_collide(corpus: Path) -> None:
    """A 2-rank export then a 1-rank export with no rank metadata and no session clock (nothing
    tells them apart): the second file's rank follows the first's two (it was numbered from its
    file index, 1, and refused as "rank 1 appears in several files")."""
    n = corpus / "public/nsys"
    tr = load_trace([n / "nsysai_2gpu_training_before.sqlite", n / "nsysai_synthetic_healthy.sqlite"])
    assert [(r, Path(s).name) for r, s in tr.ranks.select("rank", "source").rows()] == [
        (0, "nsysai_2gpu_training_before.sqlite"), (1, "nsysai_2gpu_training_before.sqlite"),
        (2, "nsysai_synthetic_healthy.sqlite")]
    assert tr.events["rank"].unique().sort().to_list() == [0, 1, 2]
    assert not any("rank" in w and "→" in w for w in tr.warnings)  # undeclared: renumbered silently
