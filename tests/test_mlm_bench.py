"""The real-trainer bench's bookkeeping (bench/mlm_spec.py, mlm_grid.py, mlm_advice.py): a tune
session's end point is read back as its grid point, and the advice is judged only by pairs that
one device call measured."""

from __future__ import annotations

import itertools
import json
import sqlite3
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))

import mlm_advice  # noqa: E402
import mlm_grid  # noqa: E402
import mlm_spec as ms  # noqa: E402


def test_every_grid_point_reads_back_from_its_command() -> None:
    for values in itertools.product(*ms.KNOBS.values()):
        p = dict(zip(ms.KNOBS, values, strict=True))
        for repeat in (False, True):
            cmd = ms.command("/tmp/mlm", "host", p, "/tmp/tb", repeat=repeat)
            got, beyond = ms.point_of(cmd)
            assert ms.point_id(got) == ms.point_id(p) and beyond == []
    # what the point ids cannot spell is named: a flag, other recompute modules, the environment
    cmd = ms.command("/tmp/mlm", "mem", {"mbs": 8, "recompute": "selective"}, "", repeat=True)
    got, beyond = ms.point_of([*cmd, "--manual-gc", "--recompute-modules", "moe_act"],
                              {"PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True"})
    assert ms.point_id(got) == "mbs8_seq_rcselective_a2a_eager"
    assert beyond == ["--manual-gc", "--recompute-modules moe_act",
                      "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True"]


def test_a_tune_ledgers_runs_are_their_grid_points() -> None:
    """Tune session 4 on the H200 (a real ledger): profile, MBS 8, recompute off, local graphs."""
    with sqlite3.connect(ROOT / "bench/grid_mlm/tune/tune4_host_ledger.sqlite") as db:
        rows = db.execute("select command, env from runs order by id").fetchall()
    points = [ms.point_id(ms.point_of(json.loads(c), json.loads(e or "{}"))[0]) for c, e in rows]
    assert points == ["mbs1_seq_rcfull_a2a_eager", "mbs8_seq_rcfull_a2a_eager",
                      "mbs8_seq_rcnone_a2a_eager", "mbs8_seq_rcnone_a2a_local"]


def test_end_job_needs_a_tune_document(tmp_path: Path) -> None:
    assert mlm_grid.job_error("end:host:" + str(tmp_path / "none.json"), {}) is not None
    doc = tmp_path / "tune.json"
    doc.write_text(json.dumps({"final_command": ["python3"], "final_env": {}}))
    assert mlm_grid.job_error(f"end:host:{doc}", {}) is None
    assert "no shape" in (mlm_grid.job_error(f"end:big:{doc}", {}) or "")


def test_the_advice_is_judged_by_same_call_pairs_only() -> None:
    runs = mlm_advice.runs_by_call()
    pairs = dict(mlm_advice.paired(runs, "host", "mbs1_seq_rcfull_a2a_eager",
                                   "mbs8_seq_rcfull_a2a_eager"))
    # call 1 ran the start but not MBS 8; a tune session's runs join the call it ran in (tune 7
    # started at MBS 8: its call 11 has no start to pair)
    assert set(pairs) == {"call4", "call6", "call10", "tune1_host"}
    assert pairs["call6"] == runs[("call6", "host", "mbs1_seq_rcfull_a2a_eager")][0] / \
        runs[("call6", "host", "mbs8_seq_rcfull_a2a_eager")][0] - 1
    assert ("call1", "host", "mbs1_seq_rcfull_a2a_eager") in runs
