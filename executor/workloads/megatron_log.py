"""Megatron-LM's exact log line formats (`training_log()` in `megatron/training/training.py`,
`_print_args()` in `megatron/training/arguments.py`, `report_memory()`), so every parser built for
real Megatron output reads the workload's output too. Pure string functions; the trainer prints them."""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime
from typing import Any


def world_line(world: int, dp: int, cp: int, tp: int, pp: int) -> str:
    """The line Megatron prints just before the arguments block."""
    return (
        f"using world size: {world}, data-parallel size: {dp}, context-parallel size: {cp}, "
        f"hierarchical context-parallel sizes: None, tensor-model-parallel size: {tp}, "
        f"pipeline-model-parallel size: {pp}"
    )


def args_dump(args: Mapping[str, Any]) -> list[str]:
    """`_print_args("arguments", args)`: dotted lines sorted case-insensitively on the whole line."""
    lines = []
    for name, value in args.items():
        dots = "." * (48 - len(name))
        lines.append(f"  {name} {dots} {value}")
    lines.sort(key=lambda x: x.lower())
    return [
        "------------------------ arguments ------------------------",
        *lines,
        "-------------------- end of arguments ---------------------",
    ]


def iteration_line(
    *,
    iteration: int,
    train_iters: int,
    consumed_samples: int,
    elapsed_ms: float,
    tflops: float | None,
    lr: float,
    global_batch_size: int,
    losses: Mapping[str, float],
    loss_scale: float,
    grad_norm: float | None,
    skipped: int,
    nan: int,
    now: datetime | None = None,
) -> str:
    """`training_log()` iteration line, fields in Megatron's order, each ending with ` |`."""
    ts = (now or datetime.now()).strftime("%Y-%m-%d %H:%M:%S.%f")
    parts = [
        f" [{ts}]",
        f" iteration {iteration:8d}/{train_iters:8d} |",
        f" consumed samples: {consumed_samples:12d} |",
        f" elapsed time per iteration (ms): {elapsed_ms:.1f} |",
    ]
    if tflops is not None:
        parts.append(f" throughput per GPU (TFLOP/s/GPU): {tflops:.1f} |")
    parts.append(f" learning rate: {lr:.6E} |")
    parts.append(f" global batch size: {global_batch_size:5d} |")
    for key, avg in losses.items():
        if avg >= 0 or avg != avg:  # Megatron drops negative averages; keep NaN visible
            parts.append(f" {key}: {avg:.6E} |")
    parts.append(f" loss scale: {loss_scale:.1f} |")
    if grad_norm is not None:
        parts.append(f" grad norm: {grad_norm:.3f} |")
    parts.append(f" number of skipped iterations: {skipped:3d} |")
    parts.append(f" number of nan iterations: {nan:3d} |")
    return "".join(parts)


def memory_line(rank: int, iteration: int, allocated: float, max_allocated: float,
                reserved: float, max_reserved: float) -> str:
    """`report_memory()` (post-82ea0223 form, two decimals), values in MB."""
    return (
        f"[Rank {rank}] (after {iteration} iterations) memory (MB) | allocated: {allocated:.2f} | "
        f"max allocated: {max_allocated:.2f} | reserved: {reserved:.2f} | "
        f"max reserved: {max_reserved:.2f}"
    )
