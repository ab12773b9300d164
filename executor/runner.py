"""One keyed run of a `tune`/`run` session: launched, measured and recorded, or read back.

Every run is keyed by its position in a deterministic plan (`r<round>:<role>:<label>:<k>`) inside
a session whose id hashes the starting command, contract and options. Re-running the same command
after an interruption replays the plan: a run finished in the ledger is read back, never redone; a
run left `running` was interrupted and is redone (its old row is kept, marked `interrupted`).

Every run of a session has the same shape (`RunShape`): `warmup` iterations never measured (the
first ones compile Megatron's `torch.compile` fusions and warm the allocator), `measured`
iterations whose per-iteration times are the run's evidence, then three more: the profiler's
warm-up iteration, one profiled iteration and the one whose start writes the trace (Megatron's
schedule). A run asked for a trace has the profiler on those; the others run them unprofiled, so
every run has the same iteration count and so the same learning-rate schedule, and the same
losses at the same iterations.

The budget is machine seconds (`max_run_time_s`): a run that would end past it is not started
(`BudgetSpent`), its length estimated from the session's finished runs of the same command, else
the latest ones.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from moetune.executor.candidate import Launch, diff
from moetune.executor.launchers import RunSpec, get_launcher
from moetune.executor.ledger import Ledger
from moetune.executor.logparse import parse_file, parse_text
from moetune.executor.trainer import Dialect
from moetune.executor.validate import Window, run_metrics

TAIL_CHARS = 4000


@dataclass(frozen=True, slots=True)
class RunShape:
    """Iterations of every run of a session: warm-up, measured window, profile tail."""

    warmup: int = 2
    measured: int = 12

    @property
    def window(self) -> Window:
        return Window(self.warmup + 1, self.warmup + self.measured)

    @property
    def profile_start(self) -> int:
        return self.warmup + self.measured + 2

    @property
    def profile_end(self) -> int:
        return self.profile_start + 1

    @property
    def iters(self) -> int:
        return self.profile_end


class BudgetSpent(Exception):
    """The next run would take the session past `max_run_time_s`."""


_COMMAND: ContextVar[str] = ContextVar("command", default="tune")


@contextmanager
def speaking_as(command: str) -> Iterator[None]:
    """Progress lines name the command the user ran (`moetune run:`, `moetune tune:`)."""
    token = _COMMAND.set(command)
    try:
        yield
    finally:
        _COMMAND.reset(token)


def log(msg: str) -> None:
    print(f"moetune {_COMMAND.get()}: {msg}", file=sys.stderr, flush=True)


class Runner:
    """Runs (or reads back from the ledger) one keyed run of the session."""

    def __init__(self, ledger: Ledger, session: str, *, workdir: Path, dialect: Dialect,
                 shape: RunShape, base0: Launch, launcher: str = "local",
                 timeout_s: float | None = None, nproc_per_node: int = 1, nodes: int = 1,
                 slurm_options: Mapping[str, str] | None = None, env_profile: str | None = None,
                 max_run_time_s: float | None = None) -> None:
        # absolute: the trainer writes its traces from its own working directory (a Slurm job's)
        self.ledger, self.session, self.workdir = ledger, session, workdir.resolve()
        self.dialect, self.shape, self.base0 = dialect, shape, base0
        self.launcher = get_launcher(launcher)
        self.timeout_s, self.nproc_per_node, self.nodes = timeout_s, nproc_per_node, nodes
        self.slurm_options = dict(slurm_options or {})
        self.env_profile, self.max_run_time_s = env_profile, max_run_time_s
        self.reused = 0
        self.executed = 0

    def run_dir(self, key: str) -> Path:
        safe = key.replace(":", "_").replace("/", "_").replace("=", "-")
        return self.workdir / self.session / safe

    def run(self, key: str, *, role: str, label: str, launch: Launch,
            profile: bool = False) -> dict[str, Any]:
        """The finished run `key`: `launch` harnessed to the session's shape (and profiled at its
        end when `profile`), run now unless the ledger has it. Its record carries `traces`."""
        done = self.ledger.finished_run(self.session, key)
        if done is not None:
            self.reused += 1
            return self._with_traces(done)
        shaped = self.dialect.harness(launch, self.shape.iters)
        rdir = self.run_dir(key)
        if profile:
            shaped = self.dialect.profile(shaped, rdir, self.shape.profile_start,
                                          self.shape.profile_end)
        self.check_budget(label)
        log_path = rdir / "train.log"
        if log_path.exists():
            log_path.unlink()  # a redone run starts a fresh log
        run_id = self.ledger.begin_run(
            self.session, key, role=role, label=label, command=list(shaped.argv),
            env=dict(shaped.env), diff=diff(self.base0, shaped), log_path=str(log_path))
        spec = RunSpec(argv=shaped.argv, env=shaped.env, log_path=log_path,
                       timeout_s=self.timeout_s, nproc_per_node=self.nproc_per_node,
                       nodes=self.nodes, name=rdir.name, slurm_options=self.slurm_options,
                       env_profile=self.env_profile)
        log(f"{key}: running ({self.launcher.name})")
        result = self.launcher.launch(spec).wait()
        self.executed += 1
        parsed = parse_file(log_path) if log_path.exists() else parse_text("")
        metrics = run_metrics(parsed, result, self.shape.window, expected_iters=self.shape.iters)
        metrics["traces"] = self.dialect.traces(rdir) if profile else []
        cause = metrics["cause"]
        tail = log_path.read_text(errors="replace")[-TAIL_CHARS:] if log_path.exists() else ""
        self.ledger.end_run(run_id, status="failed" if cause else "done",
                            returncode=result.returncode, timed_out=result.timed_out,
                            metrics=metrics, cause=cause, log_tail=tail)
        step = metrics.get("step_ms")
        log(f"{key}: {cause or 'ok'}, step {f'{step:.1f} ms' if step else 'n/a'}"
            + (f", drift {metrics['drift']:+.0%}" if metrics.get("drifting") else ""))
        rec = self.ledger.finished_run(self.session, key)
        assert rec is not None
        return self._with_traces(rec)

    @staticmethod
    def _with_traces(rec: dict[str, Any]) -> dict[str, Any]:
        traces = [t for t in (rec.get("metrics") or {}).get("traces") or [] if Path(t).is_file()]
        return {**rec, "traces": traces}

    def estimate_s(self, label: str | None = None) -> float:
        """Seconds the next run is likely to take: the latest finished run of the same
        configuration (`label`), else the latest run: a new candidate is one change from the
        current baseline, whose latest run (or its accepted candidate's) is the closest in size;
        an older run can be the start's, many times longer (Megatron-LM's MBS 1 profile run took
        141 s where the MBS 8 runs after it took 71 s)."""
        runs = self.finished()
        if not runs:
            return 0.0
        same = [r for r in runs if label is not None and r.get("label") == label]
        if same:
            return same[-1]["finished_at"] - same[-1]["started_at"]
        return runs[-1]["finished_at"] - runs[-1]["started_at"]

    def finished(self) -> list[dict[str, Any]]:
        return [r for r in self.ledger.runs(self.session)
                if r.get("finished_at") and r.get("started_at")]

    def spent_s(self) -> float:
        return run_time_s(self.finished())

    def check_budget(self, label: str | None = None) -> None:
        """Refuse a run (of configuration `label`) that would end past the time budget. The
        session's first run always starts."""
        cap = self.max_run_time_s
        if cap is None:
            return
        spent, est = self.spent_s(), self.estimate_s(label)
        if spent + est > cap:
            raise BudgetSpent(f"runs took {spent:.0f} s of the {cap:.0f} s budget and the next "
                              f"would take about {est:.0f} s")


def run_time_s(runs: Sequence[Mapping[str, Any]]) -> float:
    """Wall time of a session's finished runs (start to exit, each): what the loop cost in
    machine time, the figure to set against a grid of the same knobs."""
    return round(sum(r["finished_at"] - r["started_at"] for r in runs
                     if r.get("finished_at") and r.get("started_at")), 1)
