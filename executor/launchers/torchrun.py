"""Single-node `torchrun --standalone --nproc-per-node N`, one log for all local ranks.

`spec.argv` is the training script and its args, or `python -m module …` (run as `-m module`).
torchrun's `--tee 3 --local-ranks-filter` are not used: workers inherit the log file, and
Megatron prints iteration lines from the last rank only anyway.
"""

from __future__ import annotations

import os
import sys

from moetune.executor.launchers.base import ProcessHandle, RunSpec, run_env


def _script_args(argv: tuple[str, ...]) -> list[str]:
    a = list(argv)
    if a and os.path.basename(a[0]).startswith("python"):
        a = a[1:]
    return a  # either `-m module …` or `script.py …`: torchrun accepts both


class TorchrunLauncher:
    name = "torchrun"

    def command(self, spec: RunSpec) -> list[str]:
        return [sys.executable, "-m", "torch.distributed.run", "--standalone",
                "--nproc-per-node", str(spec.nproc_per_node), *_script_args(spec.argv)]

    def launch(self, spec: RunSpec) -> ProcessHandle:
        return ProcessHandle(self.command(spec), spec, run_env(spec))
