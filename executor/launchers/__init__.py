"""Launchers behind one interface (see base.py): local, torchrun, slurm, nemo_run."""

from __future__ import annotations

from moetune.executor.launchers.base import (
    ENV_PROFILES,
    Launcher,
    RunResult,
    RunSpec,
    profile_env,
    run_env,
)

from moetune.errors import UserError

NAMES = ("local", "torchrun", "slurm", "nemo_run")


def get_launcher(name: str, **options) -> Launcher:
    if name == "local":
        from moetune.executor.launchers.local import LocalLauncher

        return LocalLauncher()
    if name == "torchrun":
        from moetune.executor.launchers.torchrun import TorchrunLauncher

        return TorchrunLauncher()
    if name == "slurm":
        from moetune.executor.launchers.slurm import SlurmLauncher

        return SlurmLauncher(**options)
    if name == "nemo_run":
        from moetune.executor.launchers.nemo_run import NemoRunLauncher

        return NemoRunLauncher()
    raise UserError(f"unknown launcher {name!r} (one of {', '.join(NAMES)})")


__all__ = ["ENV_PROFILES", "NAMES", "Launcher", "RunResult", "RunSpec", "get_launcher", "profile_env",
           "run_env"]
