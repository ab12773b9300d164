"""A Megatron run's log, as the diagnosis' throughput section reads it (the analyzer reads no logs:
the executor's log parser does, here, at the command layer)."""

from __future__ import annotations

from collections.abc import Collection
from pathlib import Path
from typing import Any

from moetune.errors import UserError


def read_run_log(path: str | Path, keep: Collection[int] | None = None) -> dict[str, Any]:
    """`file` (the name), `iterations` (one per iteration: iteration, elapsed_s, tflops_per_gpu,
    the line Megatron prints last for it) and `args` (the model arguments the log states, as
    `contract from-log` reads them, in Megatron's names). `keep`: the iterations to keep (the
    reference step's, warm-up and profiled ones left out), marked `steady: True`."""
    from moetune.analyzer.contract import effective_args
    from moetune.analyzer.megatron_args import read_log
    from moetune.executor.logparse import iteration_args, parse_text, steady

    p = Path(path)
    try:
        text = p.read_text(errors="replace")
    except OSError as exc:
        raise UserError(f"cannot read log: {exc.strerror or exc}", path=p) from None
    its = parse_text(text).iterations
    rows = steady(its, first=0) if its.height else its
    iterations = [{"iteration": int(r["iteration"]), "elapsed_s": r["elapsed_ms"] / 1e3,
                   "tflops_per_gpu": r["tflops_per_gpu"]}
                  for r in rows.iter_rows(named=True)
                  if r["iteration"] is not None and r["elapsed_ms"] is not None]
    if not iterations:
        raise UserError("no iteration lines in the log", path=p)
    kept = [i for i in iterations if keep is not None and i["iteration"] in keep]
    contract = read_log(text, observed=iteration_args(its)).contract
    return {"file": p.name, "iterations": kept or iterations, "steady": bool(kept),
            "args": effective_args(contract) if contract else {}}
