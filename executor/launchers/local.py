"""Run the command as it is, as one local process group."""

from __future__ import annotations

from moetune.executor.launchers.base import ProcessHandle, RunSpec, run_env


class LocalLauncher:
    name = "local"

    def command(self, spec: RunSpec) -> list[str]:
        return list(spec.argv)

    def launch(self, spec: RunSpec) -> ProcessHandle:
        return ProcessHandle(self.command(spec), spec, run_env(spec))
