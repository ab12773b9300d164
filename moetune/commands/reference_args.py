"""The reference inputs every analysing command takes (`--log`, `--memory-snapshot`), spelled once:
`diagnose`, `recommend`, `report` and `diff` (per side) add them here and read them through
`moetune.analysis.read_reference`, so the same files give the same numbers everywhere."""

from __future__ import annotations

import argparse
from typing import Any

LOG_HELP = ("the profiled run's Megatron log: its steady unprofiled step time (median of the "
            "iterations outside warm-up and the profiled span, which it names) is what the what-if "
            "estimates start from, and its memory report lines are the run's device memory where "
            "the trace has no allocator events; its TFLOP/s per GPU cross-check the throughput "
            "section")
SNAPSHOT_HELP = ("a PyTorch memory snapshot of the run (Megatron's --record-memory-history "
                 "--memory-snapshot-path, one file per rank: <base>_<rank>.pickle; repeatable): "
                 "peak, fragmentation and the largest live allocations by stack")


def add_arguments(p: argparse.ArgumentParser, suffix: str = "", who: str = "") -> None:
    """`--log FILE` and `--memory-snapshot FILE…` (with `suffix` `-a`: `--log-a`, for one side of
    a comparison; `who` names that side in the help)."""
    p.add_argument(f"--log{suffix}", metavar="FILE", help=who + LOG_HELP)
    p.add_argument(f"--memory-snapshot{suffix}", metavar="FILE", action="append", default=[],
                   help=who + SNAPSHOT_HELP)


def from_args(args: argparse.Namespace, suffix: str = "", *, require_step: bool = True) -> Any:
    """The `moetune.analysis.Reference` of the parsed arguments, or None when none was given.
    `require_step=False`: a log with no unprofiled iteration still gives its arguments and
    memory (a comparison measures the traces' own steps)."""
    from moetune.analysis import read_reference

    key = suffix.replace("-", "_")
    return read_reference(getattr(args, f"log{key}"), getattr(args, f"memory_snapshot{key}"),
                          require_step=require_step)


def given(args: argparse.Namespace, suffix: str = "") -> bool:
    key = suffix.replace("-", "_")
    return bool(getattr(args, f"log{key}") or getattr(args, f"memory_snapshot{key}"))
