"""The launcher interface: `command(spec) -> list[str]` and `launch(spec) -> RunHandle`.

Every launcher builds the environment with `run_env` — the caller's environment, the candidate's
additions, then the variables of the spec's environment profile, if it names one — and writes the
run's combined stdout/stderr to
`spec.log_path`. A handle can be polled, waited on with a timeout (then killed: a hang is a
result, not a wait forever) and killed.
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

from moetune.errors import UserError

# Environment profiles a user opts into (`--env-profile NAME`, or the contract's `env_profile`).
# `no-nvlink-multicast`: NVLS collectives and symmetric-memory multicast off, for shared machines
# where multicast can take GPUs out of service; it also turns off NVLS speed-ups, so it is never a
# default on users' clusters.
ENV_PROFILES: Mapping[str, Mapping[str, str]] = {
    "no-nvlink-multicast": {
        "NCCL_NVLS_ENABLE": "0",
        "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1",
        "NVSHMEM_DISABLE_NVLS": "1",
    },
}


@dataclass(frozen=True, slots=True)
class RunSpec:
    argv: tuple[str, ...]                 # the training command (script or module and its args)
    log_path: Path
    env: Mapping[str, str] = field(default_factory=dict)
    cwd: Path | None = None
    timeout_s: float | None = None
    nproc_per_node: int = 1
    nodes: int = 1
    name: str = "run"
    slurm_options: Mapping[str, str] = field(default_factory=dict)  # extra #SBATCH --key=value
    env_profile: str | None = None        # a name of ENV_PROFILES, applied last


@dataclass(frozen=True, slots=True)
class RunResult:
    returncode: int | None
    timed_out: bool
    wall_s: float
    log_path: Path


def profile_env(name: str | None) -> Mapping[str, str]:
    """The variables of an environment profile ({} for None)."""
    if name is None:
        return {}
    if name not in ENV_PROFILES:
        raise UserError(f"unknown environment profile {name!r} (known: {', '.join(ENV_PROFILES)})")
    return ENV_PROFILES[name]


def run_env(spec: RunSpec, base: Mapping[str, str] | None = None) -> dict[str, str]:
    env = dict(os.environ if base is None else base)
    env.update(spec.env)
    env.update(profile_env(spec.env_profile))  # last: a candidate cannot undo the profile
    return env


def open_log(path: Path):
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        return path.open("ab")
    except OSError as exc:
        raise UserError(f"cannot write run log: {exc.strerror or exc}", path=path) from None


class RunHandle(Protocol):
    log_path: Path

    def poll(self) -> int | None: ...
    def wait(self, timeout_s: float | None = None) -> RunResult: ...
    def kill(self) -> None: ...


class Launcher(Protocol):
    name: str

    def command(self, spec: RunSpec) -> list[str]: ...
    def launch(self, spec: RunSpec) -> RunHandle: ...


class ProcessHandle:
    """A local process group (the command and everything it forks)."""

    def __init__(self, argv: Sequence[str], spec: RunSpec, env: Mapping[str, str]) -> None:
        self.log_path = spec.log_path
        self.timeout_s = spec.timeout_s
        self._t0 = time.monotonic()
        with open_log(spec.log_path) as log:
            try:
                self.proc = subprocess.Popen(
                    list(argv), stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                    env=dict(env), cwd=spec.cwd, start_new_session=True,
                )
            except OSError as exc:
                raise UserError(f"cannot start {argv[0]}: {exc.strerror or exc}") from None
        self.pid = self.proc.pid

    def poll(self) -> int | None:
        return self.proc.poll()

    def kill(self) -> None:
        """SIGTERM the process group, SIGKILL what is left after 5 s."""
        if self.proc.poll() is not None:
            return
        for sig, grace in ((signal.SIGTERM, 5.0), (signal.SIGKILL, 5.0)):
            try:
                os.killpg(self.proc.pid, sig)
            except ProcessLookupError:
                return
            try:
                self.proc.wait(grace)
                return
            except subprocess.TimeoutExpired:
                continue

    def wait(self, timeout_s: float | None = None) -> RunResult:
        limit = timeout_s if timeout_s is not None else self.timeout_s
        timed_out = False
        try:
            rc: int | None = self.proc.wait(limit)
        except subprocess.TimeoutExpired:
            timed_out = True
            self.kill()
            rc = self.proc.poll()
        return RunResult(rc, timed_out, time.monotonic() - self._t0, self.log_path)
