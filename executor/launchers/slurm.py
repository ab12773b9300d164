"""Slurm: write an sbatch script, submit with `sbatch --parsable`, poll `squeue`, then `sacct`.

`command(spec)` is the `sbatch` invocation; the script (beside the log) exports the safe
environment and the candidate's variables, then runs the command under `srun --label` so every
line carries Slurm's `N: ` rank prefix, which the log parser strips. Output goes to
`spec.log_path` (`#SBATCH --output`), so the log is collected where the other launchers put it.
"""

from __future__ import annotations

import shlex
import subprocess
import time
from pathlib import Path

from moetune.executor.launchers.base import RunResult, RunSpec, profile_env

from moetune.errors import UserError

TERMINAL = {"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "OUT_OF_MEMORY", "NODE_FAIL",
            "PREEMPTED", "BOOT_FAIL", "DEADLINE"}


def sbatch_script(spec: RunSpec) -> str:
    lines = [
        "#!/bin/bash",
        f"#SBATCH --job-name=moetune-{spec.name}",
        f"#SBATCH --nodes={spec.nodes}",
        "#SBATCH --ntasks-per-node=1",
        f"#SBATCH --output={spec.log_path}",
        "#SBATCH --open-mode=append",
    ]
    if spec.timeout_s:
        minutes = max(1, int(spec.timeout_s // 60) + 1)
        lines.append(f"#SBATCH --time={minutes}")
    for key, value in spec.slurm_options.items():
        lines.append(f"#SBATCH --{key}={value}" if value != "" else f"#SBATCH --{key}")
    lines.append("set -o pipefail")
    for key, value in {**spec.env, **profile_env(spec.env_profile)}.items():
        lines.append(f"export {key}={shlex.quote(str(value))}")
    if spec.cwd:
        lines.append(f"cd {shlex.quote(str(spec.cwd))}")
    argv = list(spec.argv)
    run = shlex.join(argv) if argv and argv[0] == "srun" else "srun --label " + shlex.join(argv)
    lines.append(run)
    return "\n".join(lines) + "\n"


def _run(argv: list[str], what: str) -> str:
    try:
        out = subprocess.run(argv, capture_output=True, text=True, timeout=60)
    except FileNotFoundError:
        raise UserError(f"{argv[0]} not found: is this a Slurm login node?") from None
    except subprocess.TimeoutExpired:
        raise UserError(f"{what} did not answer within 60 s") from None
    if out.returncode != 0:
        raise UserError(f"{what} failed: {(out.stderr or out.stdout).strip()[:200]}")
    return out.stdout


class SlurmHandle:
    def __init__(self, job_id: str, spec: RunSpec, poll_s: float) -> None:
        self.job_id, self.log_path, self.timeout_s = job_id, spec.log_path, spec.timeout_s
        self.poll_s = poll_s
        self._t0 = time.monotonic()
        self.state: str | None = None
        self.exit_code: int | None = None

    def _sacct(self) -> tuple[str | None, int | None]:
        out = _run(["sacct", "-n", "-P", "-X", "-j", self.job_id, "-o", "State,ExitCode"],
                   "sacct")
        for line in out.splitlines():
            if "|" not in line:
                continue
            state, code = line.split("|", 1)
            state = state.split()[0] if state.strip() else ""
            rc = int(code.split(":")[0]) if code.split(":")[0].isdigit() else None
            return state, rc
        return None, None

    def poll(self) -> int | None:
        if self.state in TERMINAL:
            return self.exit_code
        out = _run(["squeue", "-h", "-j", self.job_id, "-o", "%T"], "squeue").strip()
        if out and out.split()[0] not in TERMINAL:
            self.state = out.split()[0]
            return None
        state, rc = self._sacct()
        if state in TERMINAL:
            self.state = state
            self.exit_code = rc if state == "COMPLETED" or rc else (rc or 1)
            return self.exit_code
        return None

    def kill(self) -> None:
        _run(["scancel", self.job_id], "scancel")

    def wait(self, timeout_s: float | None = None) -> RunResult:
        limit = timeout_s if timeout_s is not None else self.timeout_s
        while self.poll() is None:
            if limit is not None and time.monotonic() - self._t0 > limit:
                self.kill()
                return RunResult(None, True, time.monotonic() - self._t0, self.log_path)
            time.sleep(self.poll_s)
        return RunResult(self.exit_code, False, time.monotonic() - self._t0, self.log_path)


class SlurmLauncher:
    name = "slurm"

    def __init__(self, poll_s: float = 10.0) -> None:
        self.poll_s = poll_s

    def script_path(self, spec: RunSpec) -> Path:
        return spec.log_path.with_suffix(".sbatch")

    def command(self, spec: RunSpec) -> list[str]:
        return ["sbatch", "--parsable", str(self.script_path(spec))]

    def launch(self, spec: RunSpec) -> SlurmHandle:
        path = self.script_path(spec)
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(sbatch_script(spec))
        except OSError as exc:
            raise UserError(f"cannot write sbatch script: {exc.strerror or exc}", path=path) from None
        out = _run(self.command(spec), "sbatch").strip()
        job_id = out.split(";")[0].strip()  # --parsable: `jobid[;cluster]`
        if not job_id.isdigit():
            raise UserError(f"sbatch printed no job id: {out[:100]!r}")
        return SlurmHandle(job_id, spec, self.poll_s)
