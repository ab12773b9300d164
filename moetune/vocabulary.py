"""Words every layer shares, defined once."""

from __future__ import annotations

# The four walls a step's time is attributed to, in display order.
WALLS: tuple[str, ...] = ("compute", "communication", "memory", "host")
