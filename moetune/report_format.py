"""How the report page writes values: the walls' colours, trace- and ledger-derived text escaped and redacted,
times, shares, sizes, step ids (shared by moetune/report_page.py and report_decisions.py)."""

from __future__ import annotations

import html
import json
from collections.abc import Mapping, Sequence
from typing import Any

from moetune.redact import redact_text
from moetune.vocabulary import step_ids

WALL_COLORS: dict[str, str] = {"compute": "#4c78a8", "communication": "#f58518",
                               "memory": "#54a24b", "host": "#e45756", "other": "#9d9d9d"}
# memory kinds of copies: apart from the walls' colours (a red copy is not host time)
MEMORY_KIND_COLORS: dict[str, str] = {"device": "#72b7b2", "pinned": "#b279a2",
                                      "pageable": "#ff9da6", "managed": "#9d755d"}


def count(x: float) -> str:
    """A count (per step and rank, so maybe a mean): an integer when it is one (`480`, not
    `480.0`), else one decimal; the terminal's and the page's."""
    return f"{round(x):,}" if abs(x - round(x)) < 1e-9 else f"{x:,.1f}"


def short(s: str, n: int = 90) -> str:
    return s if len(s) <= n else s[: n - 1] + "…"


def esc(x: Any) -> str:
    """Trace- or ledger-derived text for the page: credentials redacted, HTML escaped."""
    return html.escape(redact_text("" if x is None else str(x)))


def chart_text(x: Any) -> str:
    """Text for a chart label (plotly escapes it itself)."""
    return redact_text("" if x is None else str(x))


def ms(s: float | None) -> str:
    return "—" if s is None else f"{s * 1e3:,.2f} ms"


def pct(x: float | None, signed: bool = False) -> str:
    if x is None:
        return "—"
    return f"{x * 100:+.1f} %" if signed else f"{x * 100:.1f} %"


def gib(x: float | None) -> str:
    return "unknown" if x is None else f"{x:.2f} GiB"


def collective(key: str) -> str:
    """`28:_allgather_base` (process group : collective) → `_allgather_base (group 28)`."""
    pg, _, coll = key.partition(":")
    return f"{coll} (group {pg})" if coll else key


def pairs(m: Mapping[str, Any] | None) -> str:
    """`key=value, …`: keys are moetune's own vocabulary (a name like moe_token_dispatcher_type
    must not read as a credential assignment), values are checked for credentials."""
    return ", ".join(f"{html.escape(k)}={esc(json.dumps(x))}" for k, x in (m or {}).items())


def steps_text(ids: Sequence[int]) -> str:
    return step_ids(list(ids))
