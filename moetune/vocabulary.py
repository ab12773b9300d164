"""Words every layer shares, defined once."""

from __future__ import annotations

# The four walls a step's time is attributed to, in display order.
WALLS: tuple[str, ...] = ("compute", "communication", "memory", "host")

# "Paced by": which side set the step's length. The host paced it when, for more than half of
# the step, the critical path ran through host calls while the GPU had no work queued (the GPU
# waited for the host: launches, syncs, Python); the GPU (`device`) paced it otherwise (its own
# work and dependencies, or host calls that ran beside queued GPU work, which a faster host
# cannot recover). A 99 %-busy GPU whose every launch sits on the path is GPU-paced; a step of
# thousands of µs-long kernels the host cannot issue fast enough is host-paced.
PACED_BY = {
    "host": "host-paced: for over half the step the GPU sat idle waiting for the host's calls",
    "device": "GPU-paced: the GPU's own work and dependencies set the step's length",
}


def paced_by(length_s: float, host_on_path_s: float, host_gpu_busy_s: float) -> str:
    """`host` or `device` (PACED_BY): the host paced the step when its path time with the GPU
    idle (`host_on_path_s` − `host_gpu_busy_s`) is over half the step's length."""
    return "host" if (host_on_path_s - host_gpu_busy_s) * 2 > length_s else "device"

# Memory-saving recompute: forward work re-run inside backward (activation checkpointing) so that
# its activations need not be kept. It exists to save memory, so its GPU time is a memory cost:
# the memory wall (analyzer/walls.py), the critical path's memory part (analyzer/path_summary.py)
# and the evidence all count the same kernels, each showing it as its own line. Its share of
# compute (`observed.recompute_fraction`) divides by all compute-kernel time, re-runs included.
RECOMPUTE = "memory-saving recompute"
RECOMPUTE_MEANING = "forward work re-run in backward to save activation memory; a memory cost"
RECOMPUTE_SHARE = "of all compute-kernel time (first runs and re-runs)"
