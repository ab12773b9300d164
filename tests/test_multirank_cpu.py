"""Multi-rank on the CPU: torchrun --nproc-per-node 2, gloo, expert parallelism 2, one Kineto
trace per rank that analyzer.readers.load_trace reads back as ranks 0 and 1."""

from __future__ import annotations

from pathlib import Path

import pytest

pytest.importorskip("torch")

from moetune.analyzer.readers import load_trace
from moetune.executor.launchers import RunSpec, get_launcher
from moetune.executor.logparse import parse_file

ROOT = Path(__file__).resolve().parents[1]
ARGS = ("python", "-m", "moetune.executor.workloads.moe_gpt", "--num-layers", "1", "--hidden-size", "32",
        "--num-attention-heads", "2", "--num-experts", "4", "--seq-length", "16",
        "--vocab-size", "64", "--expert-model-parallel-size", "2", "--train-iters", "4",
        "--micro-batch-size", "2")


def _run(tmp_path: Path, dispatcher: str, profile: bool) -> tuple[Path, Path]:
    prof = tmp_path / f"trace-{dispatcher}"
    argv = (*ARGS, "--moe-token-dispatcher-type", dispatcher)
    if profile:
        argv += ("--profile", "--profile-step-start", "1", "--profile-step-end", "3",
                 "--profile-dir", str(prof))
    log = tmp_path / f"{dispatcher}.log"
    spec = RunSpec(argv=argv, log_path=log, cwd=ROOT, nproc_per_node=2, timeout_s=240)
    res = get_launcher("torchrun").launch(spec).wait()
    assert res.returncode == 0, log.read_text()[-3000:]
    return log, prof


@pytest.mark.slow
def test_two_ranks_ep2_traces_and_same_loss_both_dispatchers(tmp_path: Path) -> None:
    log_a2a, prof = _run(tmp_path, "alltoall", profile=True)
    log_ag, _ = _run(tmp_path, "allgather", profile=False)
    files = sorted(prof.glob("*.json.gz"))
    assert [f.name for f in files] == ["rank0.pt.trace.json.gz", "rank1.pt.trace.json.gz"]
    trace = load_trace([prof])
    ranks = trace.ranks
    assert ranks.get_column("rank").to_list() == [0, 1]
    assert ranks.get_column("world_size").to_list() == [2, 2]
    assert ranks.get_column("backend").to_list() == ["gloo", "gloo"]
    names = trace.events.get_column("name")
    # token dispatch really crossed ranks: gloo all_to_all ranges on both ranks
    a2a = trace.events.filter(names == "gloo:all_to_all")
    assert sorted(a2a.get_column("rank").unique().to_list()) == [0, 1]
    # the two dispatchers compute the same function: same losses, bit for bit or nearly
    la = parse_file(log_a2a).iterations.get_column("lm_loss").to_list()
    lg = parse_file(log_ag).iterations.get_column("lm_loss").to_list()
    assert len(la) == 4 and la == pytest.approx(lg, rel=1e-5)
    it = parse_file(log_a2a).iterations
    assert it.get_column("rank").null_count() == it.height  # no prefixes without --tee
    assert it.get_column("global_batch_size").to_list() == [4] * 4  # MBS 2 × DP 2
