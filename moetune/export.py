"""`diagnose --csv DIR` / `--parquet DIR`: the diagnosis' tables as files a spreadsheet (or pandas,
or polars) reads: the phase table (per phase, and per phase and layer where the layers are told
apart), the kernels by GPU time and the per-rank breakdown. Built from the diagnosis document only,
so the files say what the terminal and `--json` say."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import polars as pl

from moetune.errors import UserError

PHASE_COLUMNS = ("layer", "phase", "title", "source", "step_s", "share", "busy_s", "exposed_s",
                 "hidden_s", "idle_s", "forward_s", "backward_s", "recompute_s", "kernels",
                 "launches", "host_s", "tflops")
KERNEL_COLUMNS = ("name", "kclass", "count", "time_s", "share")
RANK_COLUMNS = ("rank", "step", "step_s", "compute_s", "communication_s", "memory_s", "host_s",
                "idle_s")


def tables(doc: Mapping[str, Any]) -> dict[str, pl.DataFrame]:
    """name → frame: `phases`, `kernels`, `ranks` (each present when the document has it)."""
    out: dict[str, pl.DataFrame] = {}
    ph = doc.get("phases") or {}
    rates = {p["phase"]: p.get("tflops") for p in (doc.get("throughput") or {}).get("phases") or []}
    rows = [{**r, "layer": None, "tflops": rates.get(r["phase"])} for r in ph.get("rows") or []]
    rows += [{**r, "tflops": None} for r in ph.get("by_layer") or []]
    if rows:
        out["phases"] = pl.DataFrame([{c: r.get(c) for c in PHASE_COLUMNS} for r in rows],
                                     schema_overrides={"layer": pl.Int32, "tflops": pl.Float64},
                                     infer_schema_length=None)
    top = (doc.get("top") or {}).get("kernels")
    kernels = top if top is not None else (doc.get("evidence") or {}).get("top_kernels") or []
    if kernels:
        out["kernels"] = pl.DataFrame([{c: k.get(c) for c in KERNEL_COLUMNS} for k in kernels],
                                      schema_overrides={"share": pl.Float64}, infer_schema_length=None)
    ranks = (doc.get("rank_breakdown") or {}).get("ranks") or []
    if ranks:
        names = sorted({p for r in ranks for p in r.get("phases") or {}})
        out["ranks"] = pl.DataFrame(
            [{**{c: r.get(c) for c in RANK_COLUMNS},
              **{f"phase_{p}_s": (r.get("phases") or {}).get(p, 0.0) for p in names}} for r in ranks],
            infer_schema_length=None)
    return out


def write_tables(doc: Mapping[str, Any], out_dir: str | Path, *, fmt: str) -> list[Path]:
    """Write `tables(doc)` to `out_dir` as `<name>.csv` or `<name>.parquet`; the paths written."""
    d = Path(out_dir)
    try:
        d.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise UserError(f"cannot create the export folder: {exc.strerror or exc}", path=d) from None
    written = []
    for name, df in tables(doc).items():
        p = d / f"{name}.{fmt}"
        try:
            if fmt == "csv":
                df.write_csv(p)
            else:
                df.write_parquet(p)
        except OSError as exc:
            raise UserError(f"cannot write: {exc.strerror or exc}", path=p) from None
        written.append(p)
    return written
