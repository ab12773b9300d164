"""The GPU a training log states, for a contract's `hardware` section, and what to add by hand
where it states none.

Megatron-LM prints neither the device's name nor its memory in a training run; a log names them
only where something else printed them: PyTorch's out-of-memory error (`GPU 1 has a total
capacity of 139.80 GiB`, c10/cuda/CUDACachingAllocator.cpp), or `nvidia-smi` run by the launch
script (its table, `-L`, or `--query-gpu=name,memory.total --format=csv`). Memory is in GiB, as
`fit` and the memory verdicts read `hardware.gpu_memory_gb` (torch's total_memory / 2**30).
"""

from __future__ import annotations

import re
from typing import Any

from moetune.analyzer.megatron_text import strip_prefix

_OOM = re.compile(r"GPU \d+ has a total capacity of ([\d.]+) GiB")
# nvidia-smi's table: `|   0  NVIDIA H200   On  |   00000000:19:00.0 Off |   0 |` then the
# memory row `| N/A   33C    P0   77W / 700W |   4MiB / 143771MiB |   0%   Default |`
_SMI_NAME = re.compile(r"^\|\s+\d+\s+(NVIDIA [^|]*?|Tesla [^|]*?|AMD [^|]*?)\s+(?:On|Off)\s+\|")
_SMI_MEM = re.compile(r"\|\s*\d+MiB\s*/\s*(\d+)MiB\s*\|")
_SMI_LIST = re.compile(r"^GPU \d+: (.+?) \(UUID: ")                 # nvidia-smi -L
_SMI_CSV = re.compile(r"^((?:NVIDIA|Tesla) [^,]+), (\d+) MiB$")   # --query-gpu=name,memory.total

# What a contract needs that a log may not state: the key, the commands that need it, and a
# line to add (one definition: `contract from-log` names them, `fit` asks for them).
FILL: dict[str, tuple[str, str]] = {
    "hardware.gpu_memory_gb": (
        "fit, and the memory verdicts of recommend",
        "hardware: {gpu_memory_gb: 139.8}  # GiB per GPU: torch.cuda.get_device_properties(0)"
        ".total_memory / 2**30 (an H200: 139.8, an H100 80GB: 79.6)"),
    "hardware.gpu_model": (
        "the MFU of diagnose's throughput when the trace names no device",
        "hardware: {gpu_model: NVIDIA H200}  # as nvidia-smi names it"),
    "hardware.gpus_per_node": (
        "fit without --gpus",
        "hardware: {nodes: 8, gpus_per_node: 8}"),
    "shape.seq_length": ("fit", "shape: {seq_length: 4096}"),
}


def fill_hint(key: str) -> str:
    """`KEY (needed by …): add `LINE`` for a key of `FILL`."""
    needed, line = FILL[key]
    return f"{key} (needed by {needed}): add `{line}`"


def hardware_from_log(text: str) -> dict[str, Any]:
    """`hardware.gpu_model` / `gpu_memory_gb` where the log states them ({} when it does not);
    the first statement of each wins (all ranks of a run share a GPU model)."""
    model: str | None = None
    mem_gib: float | None = None
    for raw in text.splitlines():
        line = strip_prefix(raw)[1].strip()
        if model is None:
            m = _SMI_NAME.match(line) or _SMI_LIST.match(line)
            if m:
                model = m.group(1).strip()
        if mem_gib is None:
            if m := _OOM.search(line):
                mem_gib = float(m.group(1))
            elif m := _SMI_MEM.search(line):
                mem_gib = round(int(m.group(1)) / 1024, 1)
        if (m := _SMI_CSV.match(line)) is not None:
            model = model or m.group(1).strip()
            mem_gib = mem_gib if mem_gib is not None else round(int(m.group(2)) / 1024, 1)
        if model is not None and mem_gib is not None:
            break
    out: dict[str, Any] = {}
    if model is not None:
        out["gpu_model"] = model
    if mem_gib is not None:
        out["gpu_memory_gb"] = mem_gib
    return out
