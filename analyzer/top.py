"""Top tables: GPU work by kernel name and host ops by self time, over the analysed steps.

The diagnosis' `evidence.top_kernels` keeps ten names; `moetune diagnose --top N` and `moetune
diff` need more (a diff must tell a kernel that disappeared from one that fell out of a top ten),
so this section runs on request (`top_section(n)`, an extra `diagnose.Section`) and adds `top`.
Totals are over the analysed window, all ranks; `rank_steps` divides them into a per-step figure.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import polars as pl
from moetune.analyzer.intervals import locate

NS = 1e-9
HOST_OP_KINDS = ("cpu_op",)  # PyTorch ops; python frames and runtime calls are not ops


def kernel_table(gpu: pl.DataFrame) -> pl.DataFrame:
    """GPU rows (kernels, copies, memsets, graph replays) → name, kclass, count, time_ns,
    sorted by time (desc), then name."""
    if gpu.height == 0:
        return pl.DataFrame(schema={"name": pl.String, "kclass": pl.String, "count": pl.UInt32,
                                    "time_ns": pl.Int64})
    kc = pl.col("kclass").cast(pl.String) if "kclass" in gpu.columns else pl.lit(None, pl.String)
    return (gpu.with_columns(kclass=kc)
            .group_by("name", "kclass")
            .agg(count=pl.len(), time_ns=pl.col("dur_ns").sum())
            .sort(["time_ns", "name"], descending=[True, False]))


def self_times(ops: pl.DataFrame) -> pl.DataFrame:
    """Host ops → the same rows with `self_ns`: duration less the time of ops nested in them on the
    same thread (a child is clipped to its parent, as profilers nest ranges)."""
    ops = ops.sort(["rank", "pid", "tid", "ts_ns", "dur_ns"], descending=[False] * 4 + [True])
    thread = ops.select(pl.struct("rank", "pid", "tid").rank("dense")).to_series().to_list()
    ts, dur = ops.get_column("ts_ns").to_list(), ops.get_column("dur_ns").to_list()
    child = [0] * len(ts)
    stack: list[tuple[int, int]] = []  # (end_ns, row) of the open ancestors
    prev = None
    for i, (t, d, th) in enumerate(zip(ts, dur, thread, strict=True)):
        if th != prev:
            stack.clear()
            prev = th
        while stack and stack[-1][0] <= t:
            stack.pop()
        end = t + d
        if stack:
            p_end, p = stack[-1]
            child[p] += min(end, p_end) - t
        stack.append((end, i))
    return ops.with_columns(self_ns=pl.Series(dur, dtype=pl.Int64) - pl.Series(child, dtype=pl.Int64))


def op_table(events: pl.DataFrame, steps: pl.DataFrame) -> pl.DataFrame:
    """Host ops starting inside a step's host range → name, count, self_ns, total_ns, sorted by
    self time (desc), then name. Empty when the trace has no ops (nsys exports)."""
    ops = events.filter(pl.col("kind").is_in(HOST_OP_KINDS) & pl.col("dur_ns").is_not_null())
    empty = pl.DataFrame(schema={"name": pl.String, "count": pl.UInt32, "self_ns": pl.Int64,
                                 "total_ns": pl.Int64})
    if ops.height == 0 or steps.height == 0:
        return empty
    inside = locate(ops, steps, on=["rank"], at="ts_ns", start="start_ns", end="end_ns")
    if inside.height == 0:
        return empty
    return (self_times(inside).group_by("name")
            .agg(count=pl.len(), self_ns=pl.col("self_ns").sum(), total_ns=pl.col("dur_ns").sum())
            .sort(["self_ns", "name"], descending=[True, False]))


def top_document(kernels: pl.DataFrame, ops: pl.DataFrame, *, rank_steps: int,
                 n: int | None) -> dict[str, Any]:
    """The `top` section: `n` rows of each table (all with n=None), shares of the table's total."""
    k_total = int(kernels.get_column("time_ns").sum() or 0)
    o_total = int(ops.get_column("self_ns").sum() or 0)
    kr = kernels if n is None else kernels.head(n)
    orows = ops if n is None else ops.head(n)
    return {
        "rank_steps": rank_steps,
        "gpu_time_s": round(k_total * NS, 9),
        "host_op_self_s": round(o_total * NS, 9),
        "kernels": [
            {"name": nm, "kclass": kc, "count": int(c), "time_s": round(t * NS, 9),
             "share": round(t / k_total, 4) if k_total else 0.0}
            for nm, kc, c, t in kr.iter_rows()
        ],
        "ops": [
            {"name": nm, "count": int(c), "self_s": round(s * NS, 9), "total_s": round(t * NS, 9),
             "share": round(s / o_total, 4) if o_total else 0.0}
            for nm, c, s, t in orows.iter_rows()
        ],
    }


def top_section(n: int | None) -> tuple[str, Callable[[Any, Any, Any], dict[str, Any]]]:
    """A `diagnose.Section` adding `top` with `n` rows per table (None: every name)."""

    def section(trace: Any, steps: Any, ctx: Any) -> dict[str, Any]:
        table = steps.table if hasattr(steps, "table") else steps
        return {"top": top_document(kernel_table(ctx.gpu), op_table(ctx.events, table),
                                    rank_steps=table.height, n=n)}

    return ("top", section)
