"""How many CPU cores this process may use: the readers size their thread pools by it."""

from __future__ import annotations

import os


def cpu_count() -> int:
    """Cores this process may run on (its affinity mask where the OS has one)."""
    if hasattr(os, "sched_getaffinity"):
        return len(os.sched_getaffinity(0)) or 1
    return os.cpu_count() or 1
