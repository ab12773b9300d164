"""`moetune diff`: two runs side by side, on real pairs of traces and ledger runs."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import jsonschema
import pytest

from moetune.cli import main
from moetune.compare import diff_analyses, step_delta, step_stats

ROOT = Path(__file__).resolve().parent.parent
TR = ROOT / "fixtures" / "traces"
EAGER = TR / "grid_host_mbs8_grp_rcnone_a2a_eager"
LOCAL = TR / "grid_host_mbs8_grp_rcnone_a2a_local"
MEM = TR / "grid_mem_mbs4_grp_rcnone_a2a_eager"
SEQ = TR / "gpu_experts_sequential"
GRP = TR / "gpu_experts_grouped_mm"
LEDGER = ROOT / "fixtures" / "ledgers" / "h200_tune_session_a.sqlite"
SCHEMA = json.loads((ROOT / "schemas" / "diff.schema.json").read_text())


def _diff(capsys: pytest.CaptureFixture[str], *args: str, rc: int = 0) -> tuple[dict[str, Any], str]:
    assert main(["diff", *args, "--json"]) == rc
    out = capsys.readouterr()
    doc = json.loads(out.out)  # stdout holds the document alone
    jsonschema.validate(doc, SCHEMA)
    return doc, out.err


def test_graph_replay_pair(capsys: pytest.CaptureFixture[str]) -> None:
    doc, _ = _diff(capsys, str(EAGER / "trace.json.gz"), str(LOCAL / "trace.json.gz"))
    assert doc["comparable"] and doc["source"] == "traces"
    facts = {f["fact"]: f for f in doc["observed"]}
    assert facts["cuda_graph_replay"]["text"] == "graph replay: no → yes"
    lp = doc["launches_per_step"]
    assert lp["b"] < lp["a"]  # the graphs replace launches
    ops = {r["name"]: r for r in doc["ops"]}
    assert ops["_CudagraphReplayNode"]["status"] == "appeared"
    st = doc["step_time"]
    assert st["a"]["n"] == 1 and st["a"]["noise_s"] is None and st["delta_s"] is not None
    assert st["beyond_noise"] is None and st["slower_beyond_noise_pct"] is None


def test_gate_undecided_with_one_step_per_run(capsys: pytest.CaptureFixture[str]) -> None:
    """One analysed step on each side (real H200 traces, graph replay → eager: +17.8 %): the noise
    is unknown, so `--fail-if-slower 5` cannot call the slowdown beyond it and exits 3 (not 1,
    not 0), saying why; a limit the measured slowdown stays within passes whatever the noise."""
    a, b = str(LOCAL / "trace.json.gz"), str(EAGER / "trace.json.gz")
    doc, _ = _diff(capsys, b, a, "--fail-if-slower", "5", rc=3)
    st = doc["step_time"]
    assert st["delta_pct"] == pytest.approx(17.8, abs=0.1) and st["beyond_noise"] is None
    assert st["noise_unknown"] == ("A has 1 analysed step and B has 1 analysed step: "
                                   "step-to-step noise is unknown")
    assert main(["diff", b, a, "--fail-if-slower", "5"]) == 3
    out = capsys.readouterr()
    assert "beyond the noise" not in out.err and "cannot decide: B is 17.8 % slower than A" in out.err
    assert "± noise unknown (1 step)" in out.out and "noise unknown: a change cannot be told" in out.out
    assert main(["diff", b, a, "--fail-if-slower", "20"]) == 0  # 17.8 % ≤ 20 % at any noise


def test_grouped_gemm_pair_and_gate(capsys: pytest.CaptureFixture[str]) -> None:
    doc, _ = _diff(capsys, str(SEQ), str(GRP), "--fail-if-slower", "5")  # B faster: passes
    st = doc["step_time"]
    assert st["a"]["n"] == 4 and st["b"]["median_s"] < st["a"]["median_s"]  # ProfilerSteps 3-6, all whole
    assert st["beyond_noise"] and st["speedup"] > 0 and st["slower_beyond_noise_pct"] == 0
    classes = {r["kclass"]: r for r in doc["classes"]}
    assert classes["compute.gemm.bf16"]["status"] == "disappeared"
    assert classes["compute.gemm.grouped_cutlass"]["status"] == "appeared"
    assert any(f["text"] == "grouped GEMM: no → yes" for f in doc["observed"])
    kernels = {r["status"] for r in doc["kernels"]}
    assert {"appeared", "disappeared"} <= kernels
    assert {r["name"]: r["status"] for r in doc["ops"]}["aten::_grouped_mm"] == "appeared"
    # reversed, B is the slow one: the CI gate fails with exit 1 and says why on one line
    assert main(["diff", str(GRP), str(SEQ), "--fail-if-slower", "5"]) == 1
    out = capsys.readouterr()
    assert "slower than A beyond the noise" in out.err
    assert "graph replay" not in out.out and "grouped GEMM: yes → no" in out.out


def test_not_comparable(capsys: pytest.CaptureFixture[str]) -> None:
    doc, err = _diff(capsys, str(EAGER), str(MEM), "--contract-a", str(EAGER / "train.log"),
                     "--contract-b", str(MEM / "train.log"))
    assert doc["comparable"] is False
    assert any(w.startswith("different model: num_layers 3 vs 8") for w in doc["warnings"])
    assert "warning: different model" in err


def test_model_unknown_without_contracts(capsys: pytest.CaptureFixture[str]) -> None:
    doc, err = _diff(capsys, str(EAGER), str(MEM))
    assert "model shape not compared" in err and doc["comparable"]  # not known to differ


def test_ledger_runs(capsys: pytest.CaptureFixture[str]) -> None:
    doc, err = _diff(capsys, "1", "3", "--ledger", str(LEDGER))
    assert doc["source"] == "ledger" and doc["kernels"] is None
    assert doc["step_time"]["a"]["n"] == 5 and doc["step_time"]["a"]["median_s"] == 0.4441
    assert doc["step_time"]["b"]["median_s"] == 0.1507 and doc["step_time"]["speedup"] > 1
    assert doc["memory"]["peak_allocated_gib"]["b"] > doc["memory"]["peak_allocated_gib"]["a"]
    assert "not compared (ledger runs record no trace)" in err


@pytest.mark.parametrize("args, says", [
    (["1", "3", "--ledger", "/nonexistent/ledger.sqlite"], "no ledger here"),
    (["1", "999", "--ledger", str(LEDGER)], "has no run 999"),
    (["1", "x", "--ledger", str(LEDGER)], "is not a run id"),
    ([str(TR / "cpu_moe"), str(SEQ)], "no GPU events"),
    ([str(SEQ), str(GRP), "--contract-a", "NOTES"], "neither a contract"),
])
def test_bad_input(capsys: pytest.CaptureFixture[str], tmp_path: Path, args: list[str],
                   says: str) -> None:
    notes = tmp_path / "notes.txt"
    notes.write_text("a run I liked\n")
    assert main(["diff", *[str(notes) if a == "NOTES" else a for a in args]]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and says in err[0], err


def test_pure_function_on_golden_documents() -> None:
    """The report's entry point: two diagnosis documents in, the diff document out."""
    gold = [json.loads((TR / name / "golden" / "diagnose.json").read_text())["document"]
            for name in ("gpu_graphs_eager", "gpu_graphs_replay")]
    doc = diff_analyses(*gold, labels=("eager", "replay"))
    jsonschema.validate(doc, SCHEMA)
    assert doc["kernels"] is None  # the golden documents carry no `top` section
    assert any(f["text"] == "graph replay: no → yes" for f in doc["observed"])
    assert doc["a"]["label"] == "eager"


def test_noise() -> None:
    a = step_stats([0.100, 0.104, 0.102])
    assert a == {"n": 3, "median_s": 0.102, "min_s": 0.1, "max_s": 0.104, "noise_s": 0.002}
    inside = step_delta(a, step_stats([0.103, 0.105, 0.104]))  # +2 ms, noise 2 + 1 ms
    assert inside["beyond_noise"] is False and inside["slower_beyond_noise_pct"] == 0
    slower = step_delta(a, step_stats([0.120, 0.120]))
    assert slower["beyond_noise"] and slower["slower_beyond_noise_pct"] == pytest.approx(15.69, abs=0.01)
    assert step_delta(a, step_stats([]))["delta_s"] is None
    one = step_delta(a, step_stats([0.2]))  # B: one step, its noise unknown
    assert step_stats([0.2])["noise_s"] is None and one["delta_pct"] == pytest.approx(96.08)
    assert one["beyond_noise"] is None and one["slower_beyond_noise_pct"] is None
    assert one["noise_unknown"] == "B has 1 analysed step: step-to-step noise is unknown"


def test_stragglers_unobservable_on_a_side() -> None:
    """A side whose cross-rank view could not judge stragglers is null, not "none": nothing is
    called new or gone against it, and the terminal says unobservable."""
    from moetune.render import cross_rank_diff_lines

    unjudged = {"cross_rank": {"ranks": 3, "stragglers": {
        "rule": "…", "ranks": None, "unobservable": "no 3 ranks joined by collectives to compare"}}}
    judged = {"cross_rank": {"ranks": 4, "stragglers": {"rule": "…", "ranks": [3]}}}
    doc = diff_analyses(unjudged, judged)
    jsonschema.validate(doc, SCHEMA)
    assert doc["cross_rank"]["stragglers"] == {"a": None, "b": [3], "new": None, "gone": None}
    assert "  stragglers unobservable → 3 · overloaded EP ranks none → none" in \
        cross_rank_diff_lines(doc["cross_rank"])
    both = diff_analyses(judged, judged)["cross_rank"]["stragglers"]
    assert both == {"a": [3], "b": [3], "new": [], "gone": []}


def test_configuration_delta_first(capsys: pytest.CaptureFixture[str]) -> None:
    """Issue 30 item 6: every comparison says first what configuration changed: from two Megatron
    logs (grid MBS 1 sequential → MBS 2 grouped), two contracts (EP 2 without → with overlapped
    gradient reduction), two ledger runs' command lines; and that it is unknown without them."""
    a, b = TR / "grid_host_mbs1_seq_rcfull_a2a_eager", TR / "grid_host_mbs2_grp_rcfull_a2a_eager"
    logs = [str(a / "trace.json.gz"), str(b / "trace.json.gz"), "--contract-a",
            str(a / "train.log"), "--contract-b", str(b / "train.log")]
    doc, _ = _diff(capsys, *logs)
    assert doc["config"]["a_from"] == doc["config"]["b_from"] == "log"
    assert [c["text"] for c in doc["config"]["changes"]] == [
        "micro_batch_size: 1 → 2", "moe_grouped_gemm: false → true", "train_iters: 5 → 12"]
    assert main(["diff", *logs]) == 0
    lines = capsys.readouterr().out.splitlines()  # captured: not a TTY, as through a pipe
    assert lines[1] == ("configuration (from A's log and B's log): micro_batch_size: 1 → 2, "
                        "moe_grouped_gemm: false → true, train_iters: 5 → 12")
    assert lines[2].startswith("step time: ")
    no, yes = TR / "gpu_ep2_alltoall_nooverlap", TR / "gpu_ep2_alltoall_overlap"
    doc, _ = _diff(capsys, str(no), str(yes), "--contract-a", str(no / "golden" / "contract.yaml"),
                   "--contract-b", str(yes / "golden" / "contract.yaml"))
    assert [c["text"] for c in doc["config"]["changes"]] == ["overlap_grad_reduce: false → true"]
    assert doc["config"]["a_from"] == "contract"  # profile_dir differs too: a path, left out
    doc, _ = _diff(capsys, "1", "3", "--ledger", str(LEDGER))
    assert doc["config"]["a_from"] == "command line"
    # run 1 was the profiled baseline: its profiler flags are part of what differs
    assert [c["text"] for c in doc["config"]["changes"]] == [
        "micro_batch_size: 1 → 2", "nvtx_ranges: true → unset", "profile: true → unset"]
    doc, _ = _diff(capsys, str(EAGER / "trace.json.gz"), str(LOCAL / "trace.json.gz"))
    assert doc["config"] == {"a_from": None, "b_from": None, "changes": None}
    assert main(["diff", str(EAGER / "trace.json.gz"), str(LOCAL / "trace.json.gz")]) == 0
    assert capsys.readouterr().out.splitlines()[1] == (
        "configuration: not compared (no contract or Megatron log for A and B)")


def test_logs_given_as_references_state_the_configuration(capsys: pytest.CaptureFixture[str]
                                                          ) -> None:
    """`--log-a/--log-b` (each run's reference: its steady step and memory) are Megatron logs with
    their argument dumps: the configuration delta reads them as it reads `--contract-a/-b` (it
    once said 'not compared (no contract or Megatron log for A and B)' beside them)."""
    a, b = TR / "mlm_host_mbs1_rcfull", TR / "mlm_host_mbs8_rcnone"  # Megatron-LM, H200
    traces = [str(a / "trace.json.gz"), str(b / "trace.json.gz")]
    as_contracts, _ = _diff(capsys, *traces, "--contract-a", str(a / "train.log"),
                            "--contract-b", str(b / "train.log"))
    as_logs, _ = _diff(capsys, *traces, "--log-a", str(a / "train.log"),
                         "--log-b", str(b / "train.log"))
    assert as_logs["config"] == as_contracts["config"]
    assert as_logs["config"]["a_from"] == as_logs["config"]["b_from"] == "log"
    assert [c["text"] for c in as_logs["config"]["changes"]] == [
        "eval_micro_batch_size: 1 → 8", "micro_batch_size: 1 → 8",
        "recompute_granularity: full → unset", "recompute_method: uniform → unset",
        "recompute_num_layers: 1 → unset"]
    assert not any(w.startswith("model shape not compared") for w in as_logs["warnings"])


def test_a_log_with_no_unprofiled_iteration_still_states_its_configuration(
        capsys: pytest.CaptureFixture[str]) -> None:
    """A five-iteration log whose every iteration is warm-up or profiled has no reference step;
    the comparison measures the traces' own steps, so it still reads the log's arguments and
    memory (it once refused the log that `--contract-a` takes)."""
    a, b = TR / "grid_host_mbs1_seq_rcfull_a2a_eager", TR / "mlm_host_mbs8_rcnone"
    doc, _ = _diff(capsys, str(a / "trace.json.gz"), str(b / "trace.json.gz"),
                   "--log-a", str(a / "train.log"), "--log-b", str(b / "train.log"))
    assert doc["config"]["a_from"] == "log"
    assert "micro_batch_size: 1 → 8" in [c["text"] for c in doc["config"]["changes"]]
