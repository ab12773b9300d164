"""executor/trainer.py: how tune and run speak to Megatron-LM, Megatron-Bridge and the workload.

Megatron-LM itself cannot run on a CPU; what these tests hold is what it takes from us: every
flag a profile or harnessed run adds is one Megatron-LM's own parser has at the pinned commit
(analyzer/megatron_arguments.json), and the traces are read where Megatron-LM's `trace_handler`
writes them (`<tensorboard-dir>/../torch_profile/rank-N.json.gz`, megatron/training/training.py).
The GPU end of it is bench/gpu/mlm_grid.sh and docs/executor.md."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from moetune.analyzer.contract import megatron_arguments
from moetune.executor.candidate import Launch, parse_change
from moetune.executor.trainer import can_profile, dialect_of

ROOT = Path(__file__).resolve().parents[1]
MLM = ["torchrun", "--nproc-per-node", "8", "/opt/Megatron-LM/pretrain_gpt.py", "--num-layers", "3", "--micro-batch-size", "1", "--global-batch-size", "8", "--train-iters", "500000", "--log-interval", "100", "--profile", "--use-pytorch-profiler", "--profile-step-start", "5", "--profile-step-end", "7", "--tensorboard-dir", "/data/tb", "--bf16"]
BRIDGE = ["torchrun", "--nproc-per-node", "8", "scripts/training/run_recipe.py", "--recipe", "qwen3_30b_a3b_pretrain_config", "train.micro_batch_size=1", "model.moe_grouped_gemm=true", "profiling.use_pytorch_profiler=true"]
TRACE = ROOT / "fixtures" / "traces" / "mlm_host_mbs8_rcnone" / "trace.json.gz"


def _flags(argv: tuple[str, ...]) -> set[str]:
    return {w.split("=", 1)[0] for w in argv if w.startswith("--")}


def test_megatron_lm_profile_run_uses_megatrons_own_flags(tmp_path: Path) -> None:
    d = dialect_of(MLM)
    assert d.name == "megatron-lm" and can_profile(MLM)
    harnessed = d.harness(Launch(tuple(MLM)), 17)
    # a measured run: the user's profiler flags are gone, every iteration is logged
    assert "--profile" not in harnessed.argv and "--use-pytorch-profiler" not in harnessed.argv
    a = harnessed.argv
    assert a[a.index("--train-iters") + 1] == "17" and a[a.index("--log-interval") + 1] == "1"
    run = tmp_path / "r0_profile_baseline_0"
    prof = d.profile(harnessed, run, 16, 17).argv
    assert prof[prof.index("--profile-step-start") + 1] == "16"
    assert prof[prof.index("--profile-step-end") + 1] == "17"
    assert prof[prof.index("--tensorboard-dir") + 1] == str(run / "tb")  # the user's /data/tb: no
    assert prof.count("--tensorboard-dir") == 1
    known = {f for e in megatron_arguments()["arguments"].values() for f in e["flags"]}
    script = prof.index("/opt/Megatron-LM/pretrain_gpt.py")
    assert _flags(prof[script + 1:]) <= known  # nothing the parser would refuse
    # where Megatron-LM writes: `<tensorboard-dir>/../torch_profile/rank-N.json.gz`, every rank
    (run / "tb").mkdir(parents=True)
    written = run / "tb" / ".." / "torch_profile"
    written.mkdir()
    for rank in (0, 1):
        shutil.copy(TRACE, written / f"rank-{rank}.json.gz")
    (run / "tb" / "events.out.tfevents.1").write_text("tensorboard, not a trace")
    assert [Path(t).name for t in d.traces(run)] == ["rank-0.json.gz", "rank-1.json.gz"]


def test_changes_are_megatron_flags_or_bridge_overrides() -> None:
    mbs8 = parse_change("micro_batch_size=8")
    a = dialect_of(MLM).apply(Launch(tuple(MLM)), mbs8).argv
    assert a[a.index("--micro-batch-size") + 1] == "8" and a.count("--micro-batch-size") == 1
    b = dialect_of(BRIDGE)
    assert b.name == "megatron-bridge" and can_profile(BRIDGE)
    changed = b.apply(Launch(tuple(BRIDGE)), mbs8).argv
    assert "train.micro_batch_size=8" in changed and "train.micro_batch_size=1" not in changed
    assert "--micro-batch-size" not in changed
    assert b.current(Launch(tuple(BRIDGE)), parse_change("moe_grouped_gemm=false").knob) is True
    env = b.apply(Launch(tuple(BRIDGE)), parse_change("NCCL_NVLS_ENABLE=0"))
    assert env.env == {"NCCL_NVLS_ENABLE": "0"} and env.argv == tuple(BRIDGE)


def test_bridge_profile_run_and_harness(tmp_path: Path) -> None:
    b = dialect_of(BRIDGE)
    h = b.harness(Launch(tuple(BRIDGE)), 17).argv
    assert "train.train_iters=17" in h and "logger.log_interval=1" in h
    assert not any(w.startswith("profiling.") for w in h)  # the user's profiling overrides go
    p = b.profile(Launch(h), tmp_path / "run", 16, 17).argv
    assert {"profiling.use_pytorch_profiler=true", "profiling.profile_step_start=16",
            "profiling.profile_step_end=17", "profiling.profile_ranks=[]",
            f"logger.tensorboard_dir={tmp_path / 'run' / 'tb'}"} <= set(p)
    assert b.traces(tmp_path / "run") == []  # nothing written yet: nothing found


def test_a_change_bridge_cannot_take_is_a_user_error() -> None:
    from moetune.errors import UserError
    from moetune.knobs import load

    assert load().knobs["fake_process_group"].bridge is None
    with pytest.raises(UserError, match="fake_process_group has no Megatron-Bridge override"):
        dialect_of(BRIDGE).apply(Launch(tuple(BRIDGE)), parse_change("fake_process_group=true"))


def test_workload_and_user_templates() -> None:
    w = ["python", "-m", "moetune.executor.workloads.moe_gpt", "--micro-batch-size", "1"]
    d = dialect_of(w)
    assert d.name == "workload"
    p = d.profile(d.harness(Launch(tuple(w)), 11), Path("/r"), 10, 11).argv
    assert p[p.index("--profile-dir") + 1] == "/r/trace" and "--tensorboard-dir" not in p
    other = ["python", "train.py"]
    assert not can_profile(other)
    assert can_profile(other, "--prof {dir}")
    t = dialect_of(other, "--prof {dir} --from {start} --to {end}")
    assert t.profile(Launch(tuple(other)), Path("/r"), 4, 5).argv[-6:] == (
        "--prof", "/r/tb", "--from", "4", "--to", "5")
