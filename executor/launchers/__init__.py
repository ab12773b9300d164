"""Launchers behind one interface (see base.py): local, torchrun, slurm, nemo_run.

`LAUNCHERS` is the one list of them: `get_launcher`, the CLI's `--launcher` choices
(moetune/commands/run_cmd.py, shared by `run` and `tune`) and docs/extending.md read it, and
tests/test_extension_points.py fails when a launcher module is not in it. A launcher is a module
here with a class implementing `base.Launcher`; registering it is one line below.
"""

from __future__ import annotations

import importlib

from moetune.executor.launchers.base import (
    ENV_PROFILES,
    Launcher,
    RunResult,
    RunSpec,
    profile_env,
    run_env,
)

from moetune.errors import UserError

# name → (module under moetune.executor.launchers, class); imported only when chosen, so a
# launcher's optional package (nemo_run) costs nothing to the others
LAUNCHERS: dict[str, tuple[str, str]] = {
    "local": ("local", "LocalLauncher"),
    "torchrun": ("torchrun", "TorchrunLauncher"),
    "slurm": ("slurm", "SlurmLauncher"),
    "nemo_run": ("nemo_run", "NemoRunLauncher"),
}
NAMES = tuple(LAUNCHERS)


def launcher_class(name: str) -> type:
    """The class registered as `name`; UserError naming the known ones otherwise."""
    if name not in LAUNCHERS:
        raise UserError(f"unknown launcher {name!r} (one of {', '.join(NAMES)})")
    module, cls = LAUNCHERS[name]
    return getattr(importlib.import_module(f"{__name__}.{module}"), cls)


def get_launcher(name: str, **options) -> Launcher:
    """A launcher by name; `options` go to its constructor (e.g. slurm's `poll_s`)."""
    return launcher_class(name)(**options)


__all__ = ["ENV_PROFILES", "LAUNCHERS", "NAMES", "Launcher", "RunResult", "RunSpec", "get_launcher",
           "launcher_class", "profile_env", "run_env"]
