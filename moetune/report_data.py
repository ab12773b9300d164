"""What the report page shows, as data: `ReportData` (everything `render` reads) and the median
step's `Timeline`. `collect` (moetune/report.py) fills them; moetune/report_page.py draws them."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import polars as pl

if TYPE_CHECKING:
    from moetune.analysis import Analysis


@dataclass(frozen=True)
class Timeline:
    """The median step of one rank, ready to draw (times in ns from the step's start)."""

    rank: int
    step: int
    length_ns: int
    boxes: pl.DataFrame      # lane, start, end, wall, label, n (events merged into the box),
    #                          occupancy (share of the box some event covers; 1 for one event)
    path: pl.DataFrame       # the critical path's boxes (runs of one wall merged), as `boxes`
    edges: list[dict[str, Any]]  # blocking edges: src_lane, src_start, src_end (the awaited
    #                              communication on the path), dst_lane, dst_start, label, on_path
    lanes: list[str]         # lane names, top to bottom
    merged: dict[str, int]   # lane -> events shown as bins (lanes over LANE_MAX_BOXES only)
    lanes_dropped: int = 0   # quietest lanes left out above MAX_LANES


@dataclass(frozen=True)
class ReportData:
    """Everything the page shows; `render` reads nothing else."""

    files: list[str]
    analysis: Analysis | None
    problem: str | None = None          # why there is no diagnosis (no GPU work, no step, …)
    advice: dict[str, Any] | None = None
    advice_problem: str | None = None
    timeline: Timeline | None = None
    cpu_ops: pl.DataFrame | None = None  # name, per_step, per_step_s (self), per_step_total_s
    memory: pl.DataFrame | None = None   # t_ms, allocated_gib, reserved_gib (median step, rank)
    memory_binned: bool = False
    metadata: list[dict[str, Any]] = field(default_factory=list)
    ledger: dict[str, Any] | None = None
    ledger_problem: str | None = None
    ledger_name: str | None = None
    baseline: ReportData | None = None
    diff: dict[str, Any] | None = None
    contract_given: bool = False
