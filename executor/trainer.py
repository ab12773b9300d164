"""How moetune speaks to the training command it drives: the trainer's dialect.

Three dialects, told apart by the command (`dialect_of`):
- `megatron-lm`: NVIDIA Megatron-LM's entry scripts (`pretrain_gpt.py`, `pretrain_mamba.py`, …):
  changes are Megatron flags (rules/knobs.yaml); a profile run gets Megatron's own profiler flags,
  `--profile --use-pytorch-profiler --profile-step-start S --profile-step-end E --tensorboard-dir
  RUN/tb`, and Megatron writes each rank's trace to `RUN/tb/../torch_profile/rank-N.json.gz`
  (megatron/training/training.py, `trace_handler`).
- `megatron-bridge`: a Megatron-Bridge recipe (`scripts/training/run_recipe.py`, a recipe script,
  or any command whose overrides look like `train.micro_batch_size=2`): changes are the knobs'
  Bridge overrides (`model.moe_grouped_gemm=true`); a profile run gets `profiling.*` overrides and
  `logger.tensorboard_dir=RUN/tb`, and Bridge writes to the same `RUN/torch_profile/`
  (megatron/bridge/training/profiling.py, `initialize_pytorch_profiler`).
- `workload`: the bundled CPU/GPU workload (`moetune.executor.workloads.moe_gpt`), which takes
  Megatron flags and writes `RUN/trace/rankN.pt.trace.json.gz` (`--profile-dir`).

A launcher (torchrun, Slurm, NeMo-Run) wraps the command; the dialect works on the command's own
arguments, so it is the same under every launcher and for any rank layout: every rank's trace is
collected (`profile_ranks` is left at Megatron's default, all ranks; Bridge's default is rank 0
only, so the profile run asks for all).

Harness settings are set identically on every run of a comparison (they are not the change): the
iteration count and `log_interval` 1. A run that is not a profile run carries no profiler
settings, even where the user's command had some: a profiled iteration is several times slower.
"""

from __future__ import annotations

import re
import shlex
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from moetune.executor.candidate import Change, Launch, apply

from moetune.errors import UserError
from moetune.knob_flags import value_text
from moetune.knobs import Knob

# the Megatron-LM entry scripts; Megatron-Bridge's recipe runner and recipe scripts
_MEGATRON_SCRIPT = re.compile(r"(?:^|/)pretrain_\w+\.py$")
_BRIDGE_SCRIPT = re.compile(r"(?:^|/)(?:run_recipe\.py|megatron[/.]bridge|recipes/)")
_OVERRIDE = re.compile(r"^(?:train|model|logger|profiling|optimizer|ddp|dataset|checkpoint|"
                       r"scheduler|mixed_precision|comm_overlap|rng|rerun_state_machine)\.[\w.]+=")
_WORKLOAD = re.compile(r"moetune\.executor\.workloads\.moe_gpt|(?:^|/)moe_gpt\.py$")


def _flag(name: str, flag: str, type_: str) -> Knob:
    return Knob(name, type=type_, flag=flag)


TRAIN_ITERS = _flag("train_iters", "--train-iters", "int")
LOG_INTERVAL = _flag("log_interval", "--log-interval", "int")
# Megatron-LM's profiler arguments (megatron/training/config/common_config.py ProfilingConfig)
PROFILE_FLAGS = (
    _flag("profile", "--profile", "bool"),
    _flag("use_pytorch_profiler", "--use-pytorch-profiler", "bool"),
    _flag("profile_step_start", "--profile-step-start", "int"),
    _flag("profile_step_end", "--profile-step-end", "int"),
    _flag("profile_ranks", "--profile-ranks", "list"),
)
TENSORBOARD_DIR = _flag("tensorboard_dir", "--tensorboard-dir", "str")
# the bundled workload's own profiler arguments
WORKLOAD_PROFILE_FLAGS = (
    _flag("profile", "--profile", "bool"),
    _flag("profile_step_start", "--profile-step-start", "int"),
    _flag("profile_step_end", "--profile-step-end", "int"),
    _flag("profile_dir", "--profile-dir", "str"),
    _flag("nvtx_ranges", "--nvtx-ranges", "bool"),
)


@dataclass(frozen=True)
class Dialect:
    """One trainer's way of taking changes, harness settings and a profile request."""

    name: str
    template: str | None = None  # the user's `--profile-args` ({dir}, {start}, {end}), if any

    def apply(self, launch: Launch, change: Change) -> Launch:
        """The launch with one knob changed, in this trainer's spelling."""
        if self.name != "megatron-bridge" or change.knob.kind == "env":
            return apply(launch, change)
        k = change.knob
        if not k.bridge:
            raise UserError(f"{k.name} has no Megatron-Bridge override (rules/knobs.yaml: "
                            "bridge): this change cannot be applied to a Bridge recipe")
        return Launch(_set_override(launch.argv, k.bridge, change.value), dict(launch.env))

    def current(self, launch: Launch, k: Knob) -> Any:
        """What the launch sets knob `k` to (None when it does not say)."""
        if self.name == "megatron-bridge" and k.kind != "env":
            return _read_override(launch.argv, k.bridge) if k.bridge else None
        from moetune.executor.candidate import current_value

        return current_value(launch, k)

    def harness(self, launch: Launch, iters: int) -> Launch:
        """`iters` iterations, every one logged, no profiler: a measured run."""
        if self.name == "megatron-bridge":
            argv = _set_override(launch.argv, "train.train_iters", iters)
            argv = _set_override(argv, "logger.log_interval", 1)
            # the user's profiling overrides go (a recipe without a profiling section has none)
            return Launch(tuple(w for w in argv if not w.startswith("profiling.")),
                          dict(launch.env))
        launch = apply(apply(launch, Change(TRAIN_ITERS, iters)), Change(LOG_INTERVAL, 1))
        flags = WORKLOAD_PROFILE_FLAGS if self.name == "workload" else PROFILE_FLAGS
        for k in flags:
            launch = apply(launch, Change(k, None))
        return launch

    def profile(self, launch: Launch, run_dir: Path, start: int, end: int) -> Launch:
        """The harnessed launch with the profiler on iterations start … end-1, its traces under
        `run_dir` (`traces` finds them)."""
        if self.template is not None:
            extra = self.template.format(dir=run_dir / "tb", start=start, end=end)
            return Launch(tuple(launch.argv) + tuple(shlex.split(extra)), dict(launch.env))
        if self.name == "megatron-bridge":
            argv = launch.argv
            for key, value in (("profiling.use_pytorch_profiler", True),
                               ("profiling.profile_step_start", start),
                               ("profiling.profile_step_end", end),
                               ("profiling.profile_ranks", []),
                               ("logger.tensorboard_dir", str(run_dir / "tb"))):
                argv = _set_override(argv, key, value)
            return Launch(argv, dict(launch.env))
        if self.name == "workload":
            sets = [("--profile", True), ("--profile-step-start", start),
                    ("--profile-step-end", end), ("--profile-dir", str(run_dir / "trace")),
                    ("--nvtx-ranges", True)]
            ks = {k.flag: k for k in WORKLOAD_PROFILE_FLAGS}
        else:
            sets = [("--profile", True), ("--use-pytorch-profiler", True),
                    ("--profile-step-start", start), ("--profile-step-end", end)]
            ks = {k.flag: k for k in PROFILE_FLAGS}
        for flag, value in sets:
            launch = apply(launch, Change(ks[flag], value))
        if self.name != "workload":
            launch = apply(launch, Change(TENSORBOARD_DIR, str(run_dir / "tb")))
        return launch

    def traces(self, run_dir: Path) -> list[str]:
        """The trace files a profile run under `run_dir` wrote, every rank's (a user's template:
        any `*.json[.gz]` under `{dir}` or beside it in `torch_profile/`)."""
        if self.template is not None:
            wheres = [run_dir / "tb", run_dir / "torch_profile"]
        else:
            wheres = [run_dir / ("trace" if self.name == "workload" else "torch_profile")]
        return sorted(str(p) for d in wheres if d.is_dir() for p in d.rglob("*.json*")
                      if p.is_file() and (p.name.endswith(".json.gz") or p.name.endswith(".json")))


def dialect_of(argv: Sequence[str], template: str | None = None) -> Dialect:
    """The dialect of a training command (see the module doc); `template`: the user's profiler
    flags, which replace the dialect's own."""
    words = list(argv)
    if any(_WORKLOAD.search(w) for w in words):
        return Dialect("workload", template)
    if any(_BRIDGE_SCRIPT.search(w) for w in words) or any(_OVERRIDE.match(w) for w in words):
        return Dialect("megatron-bridge", template)
    return Dialect("megatron-lm", template)


def can_profile(argv: Sequence[str], template: str | None = None) -> bool:
    """Whether moetune knows how to ask this command for a trace: a Megatron-LM entry script, a
    Bridge recipe, the workload, or a user's template."""
    words = list(argv)
    return (template is not None or any(_MEGATRON_SCRIPT.search(w) for w in words)
            or dialect_of(words).name != "megatron-lm")


def _override_value(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, list | tuple):
        return "[" + ",".join(value_text(v) for v in value) + "]"
    return value_text(value)


def _set_override(argv: Sequence[str], key: str, value: Any) -> tuple[str, ...]:
    """`argv` with the Bridge override `key=…` replaced (every mention) or appended."""
    out = [w for w in argv if not w.startswith(f"{key}=")]
    return (*out, f"{key}={_override_value(value)}")


def _read_override(argv: Sequence[str], key: str) -> Any:
    for w in reversed(list(argv)):
        if w.startswith(f"{key}="):
            text = w.split("=", 1)[1]
            if text in ("true", "false"):
                return text == "true"
            if text == "null":
                return None
            try:
                return int(text)
            except ValueError:
                try:
                    return float(text)
                except ValueError:
                    return text
    return None
