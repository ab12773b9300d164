"""Launchers on real subprocesses: local, torchrun command, Slurm through fake sbatch/squeue/sacct
executables on PATH (real programs, not mocks), NeMo-Run where it imports."""

from __future__ import annotations

import os
import stat
import sys
import textwrap
import time
from pathlib import Path

import pytest
from moetune.executor.launchers import ENV_PROFILES, RunSpec, get_launcher
from moetune.executor.launchers.slurm import sbatch_script
from moetune.executor.logparse import parse_file

from moetune.errors import UserError

ROOT = Path(__file__).resolve().parents[1]
MULTICAST_OFF = ENV_PROFILES["no-nvlink-multicast"]
KEYS = [*MULTICAST_OFF, "CANDIDATE_X"]
PRINT_ENV = f"import os; print({{k: os.environ.get(k) for k in {KEYS!r}}})"


def test_local_run_gets_no_env_profile_by_default(tmp_path: Path, monkeypatch: pytest.MonkeyPatch
                                                  ) -> None:
    """A user's run keeps NVLS: the multicast-off variables are not forced on it."""
    for k in MULTICAST_OFF:
        monkeypatch.delenv(k, raising=False)
    log = tmp_path / "run.log"
    spec = RunSpec(argv=(sys.executable, "-c", PRINT_ENV), log_path=log, env={"CANDIDATE_X": "7"})
    res = get_launcher("local").launch(spec).wait()
    assert res.returncode == 0 and not res.timed_out
    text = log.read_text()
    assert "'CANDIDATE_X': '7'" in text
    assert all(f"'{k}': None" in text for k in MULTICAST_OFF), text


def test_local_runs_with_env_profile_and_log(tmp_path: Path) -> None:
    log = tmp_path / "run.log"
    spec = RunSpec(argv=(sys.executable, "-c", PRINT_ENV), log_path=log,
                   env={"CANDIDATE_X": "7", "NCCL_NVLS_ENABLE": "1"},
                   env_profile="no-nvlink-multicast")
    res = get_launcher("local").launch(spec).wait()
    assert res.returncode == 0 and not res.timed_out
    text = log.read_text()
    # the profile wins even over a candidate that tries to turn NVLS back on
    assert "'NCCL_NVLS_ENABLE': '0'" in text and "'CANDIDATE_X': '7'" in text
    assert "'TORCH_SYMM_MEM_DISABLE_MULTICAST': '1'" in text and "'NVSHMEM_DISABLE_NVLS': '1'" in text


def test_unknown_env_profile_is_user_error(tmp_path: Path) -> None:
    spec = RunSpec(argv=(sys.executable, "-c", "pass"), log_path=tmp_path / "x.log",
                   env_profile="nope")
    with pytest.raises(UserError, match="unknown environment profile 'nope'"):
        get_launcher("local").launch(spec)


def test_gpu_scripts_keep_multicast_off_in_every_process() -> None:
    """Our own device scripts run on lent machines that require multicast off: env.sh exports the
    three variables (every child, each candidate the loop launches, inherits them), and every
    script under bench/gpu sources it."""
    gpu = ROOT / "bench" / "gpu"
    env_sh = (gpu / "env.sh").read_text()
    for k, v in MULTICAST_OFF.items():
        assert f"{k}={v}" in env_sh and "export" in env_sh.split(f"{k}={v}")[0].rsplit("\n", 1)[-1]
    for script in gpu.glob("*.sh"):
        if script.name != "env.sh":
            assert "source bench/gpu/env.sh" in script.read_text(), script


def test_local_timeout_kills_the_process_group(tmp_path: Path) -> None:
    pidfile = tmp_path / "child.pid"
    code = (f"import subprocess, sys, time; p = subprocess.Popen([sys.executable, '-c', "
            f"'import time; time.sleep(60)']); open({str(pidfile)!r}, 'w').write(str(p.pid)); "
            "time.sleep(60)")
    spec = RunSpec(argv=(sys.executable, "-c", code), log_path=tmp_path / "hang.log", timeout_s=2.0)
    t0 = time.monotonic()
    res = get_launcher("local").launch(spec).wait()
    assert res.timed_out and time.monotonic() - t0 < 20
    child = int(pidfile.read_text())
    time.sleep(0.3)
    assert not _running(child)  # the grandchild died with the group


def _running(pid: int) -> bool:
    """Alive and not a zombie waiting for its (new) parent to reap it."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except FileNotFoundError:
        return False
    return state != "Z"


def test_missing_program_is_user_error(tmp_path: Path) -> None:
    with pytest.raises(UserError, match="cannot start"):
        get_launcher("local").launch(RunSpec(argv=("/nonexistent/prog",), log_path=tmp_path / "l"))


def test_torchrun_command_shape(tmp_path: Path) -> None:
    spec = RunSpec(argv=("python", "-m", "moetune.executor.workloads.moe_gpt", "--train-iters", "2"),
                   log_path=tmp_path / "l", nproc_per_node=2)
    cmd = get_launcher("torchrun").command(spec)
    assert cmd[:6] == [sys.executable, "-m", "torch.distributed.run", "--standalone",
                       "--nproc-per-node", "2"]
    assert cmd[6:] == ["-m", "moetune.executor.workloads.moe_gpt", "--train-iters", "2"]


# Megatron-format output without the cost of importing torch in a test
MEGATRON_LINES = (
    "from executor.workloads import megatron_log as m\n"
    "for i in (1, 2, 3):\n"
    "    print(m.iteration_line(iteration=i, train_iters=3, consumed_samples=i, elapsed_ms=9.0,"
    " tflops=1.0, lr=1e-3, global_batch_size=1, losses={'lm loss': 2.0}, loss_scale=1.0,"
    " grad_norm=1.0, skipped=0, nan=0))\n"
    "print('[after training is done] datetime: 2026-01-01 00:00:00.000000 ')\n"
)

FAKE = {
    # sbatch --parsable SCRIPT: run the script in the background, output where #SBATCH says
    "sbatch": """
        import os, re, shlex, subprocess, sys
        state = os.environ["FAKE_SLURM"]
        script = sys.argv[-1]
        out = re.search(r"^#SBATCH --output=(.*)$", open(script).read(), re.M).group(1)
        jid = str(1000 + len([f for f in os.listdir(state) if f.isdigit()]))
        rc = shlex.quote(os.path.join(state, jid + ".rc"))
        # like slurmd: run the batch script, record its exit code when it ends
        p = subprocess.Popen(["bash", "-c", f"bash {shlex.quote(script)}; echo $? > {rc}"],
                             stdout=open(out, "ab"), stderr=subprocess.STDOUT,
                             start_new_session=True)
        open(os.path.join(state, jid), "w").write(str(p.pid))
        print(f"{jid};fakecluster")
    """,
    "squeue": """
        import os, sys
        jid = sys.argv[sys.argv.index("-j") + 1]
        state = os.environ["FAKE_SLURM"]
        if not os.path.exists(os.path.join(state, jid + ".rc")):
            print("RUNNING")
    """,
    "sacct": """
        import os, sys
        jid = sys.argv[sys.argv.index("-j") + 1]
        rcf = os.path.join(os.environ["FAKE_SLURM"], jid + ".rc")
        if os.path.exists(rcf):
            rc = int(open(rcf).read())
            st = "COMPLETED" if rc == 0 else ("CANCELLED" if rc < 0 else "FAILED")
            print(f"{st}|{max(rc, 0)}:0")
    """,
    "scancel": """
        import os, signal, sys
        state = os.environ["FAKE_SLURM"]
        pid = int(open(os.path.join(state, sys.argv[1])).read())
        os.killpg(pid, signal.SIGTERM)
        open(os.path.join(state, sys.argv[1] + ".rc"), "w").write("-15")
    """,
    # srun --label CMD…: run it with Slurm's `0: ` task prefix on every line
    "srun": """
        import subprocess, sys
        args = [a for a in sys.argv[1:] if a != "--label"]
        p = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        for line in p.stdout:
            sys.stdout.write("0: " + line)
            sys.stdout.flush()
        sys.exit(p.wait())
    """,
}


@pytest.fixture
def fake_slurm(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    bindir, state = tmp_path / "bin", tmp_path / "state"
    bindir.mkdir()
    state.mkdir()
    for name, body in FAKE.items():
        exe = bindir / name
        exe.write_text(f"#!{sys.executable}\n" + textwrap.dedent(body))
        exe.chmod(exe.stat().st_mode | stat.S_IEXEC)
    monkeypatch.setenv("PATH", f"{bindir}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setenv("FAKE_SLURM", str(state))
    return state


def test_slurm_submit_poll_collect(tmp_path: Path, fake_slurm: Path) -> None:
    log = tmp_path / "runs" / "job.log"
    spec = RunSpec(argv=(sys.executable, "-c", MEGATRON_LINES),
                   log_path=log, env={"CANDIDATE_X": "1"}, cwd=ROOT, timeout_s=120, name="job",
                   slurm_options={"partition": "gpu", "exclusive": ""})
    script = sbatch_script(spec)
    assert "#SBATCH --partition=gpu" in script and "#SBATCH --exclusive" in script
    assert "NCCL_NVLS_ENABLE" not in script and "srun --label " in script
    from dataclasses import replace

    opted = sbatch_script(replace(spec, env_profile="no-nvlink-multicast"))
    assert "export NCCL_NVLS_ENABLE=0" in opted
    launcher = get_launcher("slurm", poll_s=0.2)
    handle = launcher.launch(spec)
    assert handle.job_id == "1000"
    res = handle.wait()
    assert res.returncode == 0 and not res.timed_out
    parsed = parse_file(log)  # `0: ` prefixes from srun --label
    assert parsed.iterations.get_column("iteration").to_list() == [1, 2, 3]
    assert set(parsed.iterations.get_column("rank").to_list()) == {0} and parsed.completed


def test_slurm_timeout_cancels(tmp_path: Path, fake_slurm: Path) -> None:
    spec = RunSpec(argv=(sys.executable, "-c", "import time; time.sleep(60)"),
                   log_path=tmp_path / "hang.log", timeout_s=1.0, name="hang")
    res = get_launcher("slurm", poll_s=0.2).launch(spec).wait()
    assert res.timed_out
    time.sleep(0.5)
    assert (fake_slurm / "1000.rc").exists()  # the job really ended after scancel


def test_slurm_without_sbatch_is_user_error(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))
    with pytest.raises(UserError, match="sbatch not found"):
        get_launcher("slurm").launch(RunSpec(argv=("true",), log_path=tmp_path / "l"))


def test_nemo_run(tmp_path: Path) -> None:
    from moetune.executor.launchers.nemo_run import available

    if not available():
        with pytest.raises(UserError, match="nemo_run"):
            get_launcher("nemo_run").launch(RunSpec(argv=("true",), log_path=tmp_path / "l"))
        pytest.skip("nemo_run not installed: only the clear error is checked")
    spec = RunSpec(argv=(sys.executable, "-c", "print('hello from nemo_run')"),
                   log_path=tmp_path / "n.log", timeout_s=300)
    res = get_launcher("nemo_run").launch(spec).wait()
    assert res.returncode == 0 and "hello from nemo_run" in (tmp_path / "n.log").read_text()
