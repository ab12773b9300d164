"""NeMo-Run: the same command as a `nemo_run.Script` on a `LocalExecutor` (torchrun launcher).

The experiment runs in its own Python process (so the handle is the same as the local one: log,
poll, timeout, kill); the command is only available where `nemo_run` imports.
"""

from __future__ import annotations

import json
import sys

from moetune.executor.launchers.base import ProcessHandle, RunSpec, run_env

from moetune.errors import UserError

_DRIVER = """
import json, sys
import nemo_run as run
spec = json.loads(sys.argv[1])
script = run.Script(inline=spec["inline"])
executor = run.LocalExecutor(ntasks_per_node=spec["nproc"], launcher="torchrun",
                             env_vars=spec["env"])
with run.Experiment(spec["name"], executor=executor, log_level="WARN") as exp:
    exp.add(script, tail_logs=True)
    exp.run(detach=False, sequential=True)
"""


def available() -> bool:
    try:
        import nemo_run  # noqa: F401
    except Exception:
        return False
    return True


class NemoRunLauncher:
    name = "nemo_run"

    def command(self, spec: RunSpec) -> list[str]:
        import shlex

        payload = {"inline": shlex.join(spec.argv), "nproc": spec.nproc_per_node,
                   "env": dict(run_env(spec, base={})), "name": f"moetune-{spec.name}"}
        return [sys.executable, "-c", _DRIVER, json.dumps(payload)]

    def launch(self, spec: RunSpec) -> ProcessHandle:
        if not available():
            raise UserError("launcher nemo_run needs the nemo_run package (pip install nemo_run)")
        return ProcessHandle(self.command(spec), spec, run_env(spec))
