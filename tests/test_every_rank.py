"""Every rank of an input is analysed, or named with why it was not (issue #17, item 2).

The public 2-GPU training export (nsys-ai `mfu_2gpu_before`: `torchrun --nproc_per_node=2`, pids
144 and 145 on devices 0 and 1) and faithful edits of a copy of it: step ranges on one process
only, one process's GPU rows lost."""

from __future__ import annotations

import json
import shutil
import sqlite3
import subprocess
import sys
from pathlib import Path

import jsonschema
import polars as pl
import pytest
from moetune.analyzer.frames import EVENTS_SCHEMA, conform
from moetune.analyzer.readers import load_trace
from moetune.analyzer.steps import find_steps

ROOT = Path(__file__).resolve().parents[1]
SCHEMA = json.loads((ROOT / "schemas/diagnosis.schema.json").read_text())
EXPORT = "public/nsys/nsysai_2gpu_training_before.sqlite"
PID = "((globalPid >> 24) & 16777215)"
TID_PID = "((globalTid >> 24) & 16777215)"


def moetune(*args: str | Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "moetune", "diagnose", *map(str, args)], cwd=ROOT,
                          capture_output=True, text=True, timeout=300)


def edited(corpus: Path, tmp_path: Path, *sql: str) -> Path:
    """A copy of the public export with `sql` applied (the corpus file is never written)."""
    dst = tmp_path / "mfu_2gpu_edited.sqlite"
    shutil.copyfile(corpus / EXPORT, dst)
    with sqlite3.connect(dst) as conn:
        for q in sql:
            conn.execute(q)
    return dst


@pytest.mark.corpus
def test_both_devices_of_the_public_export_are_ranks(corpus: Path) -> None:
    tr = load_trace([corpus / EXPORT])
    k = tr.events.filter(pl.col("kind") == "kernel").group_by("rank").len().sort("rank")
    assert k.rows() == [(0, 1993), (1, 2017)]  # every kernel of both devices (4,010)
    host = tr.events.filter(pl.col("kind") == "runtime").group_by("rank").agg(pl.col("pid").unique())
    assert sorted((r, p) for r, ps in host.rows() for p in ps) == [(0, 144), (1, 145)]
    assert tr.ranks.select("rank", "world_size", "rank_from").rows() == [
        (0, 2, "file_order"), (1, 2, "file_order")]

    r = moetune(corpus / EXPORT, "--json")
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    jsonschema.validate(doc, SCHEMA)
    assert doc["ranks_analyzed"] == [0, 1] and doc["inputs"][0]["ranks"] == [0, 1]
    assert doc["ranks"]["count"] == 2 and "skipped" not in doc["ranks"]
    assert doc["median_step_by_rank"] == {"0": 0, "1": 0}
    # no step structure in the 0.3 s window: one whole-trace step on each rank, ids not mixed
    assert doc["steps"] == [0] and doc["window"]["step_source"] == "whole_trace"
    assert sorted(p["rank"] for p in doc["per_step"]) == [0, 1]
    head = moetune(corpus / EXPORT).stdout.splitlines()[0]
    assert "· 2 ranks · the whole trace as one step ·" in head


@pytest.mark.corpus
def test_steps_on_one_process_only_name_the_skipped_rank(corpus: Path, tmp_path: Path) -> None:
    """Step ranges pushed by rank 0 only (pid 144): rank 1 has no step to analyse; the JSON,
    the warnings and the terminal say so instead of dropping it silently."""
    rows = ", ".join(f"({a}, {b}, 59, 'train_step', {{tid}})" for a, b in (
        (60_120_900_000, 60_220_900_000), (60_220_900_000, 60_320_900_000),
        (60_320_900_000, 60_411_500_000)))
    tid = f"(SELECT min(globalTid) FROM NVTX_EVENTS WHERE {TID_PID} = 144)"
    f = edited(corpus, tmp_path, 'INSERT INTO NVTX_EVENTS (start, "end", eventType, text, '
               f"globalTid) VALUES {rows.format(tid=tid)}")
    r = moetune(f, "--step-range", "train_step", "--json")
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    jsonschema.validate(doc, SCHEMA)
    assert doc["ranks_analyzed"] == [0] and doc["steps"] == [0, 1, 2]
    assert doc["ranks"]["count"] == 2
    assert doc["ranks"]["skipped"] == [{
        "rank": 1, "file": f.name,
        "reason": "its GPU work lies in no complete 'train_step' range (steps come from other "
                  "ranks' 'train_step' ranges)"}]
    assert any(w.startswith("rank(s) 1 not analysed: its GPU work lies in no complete")
               for w in doc["warnings"])
    t = moetune(f, "--step-range", "train_step")
    assert t.returncode == 0, t.stderr
    assert "ranks: 2 (1 analysed) · " in t.stdout
    assert f"  rank 1 ({f.name}) not analysed: its GPU work" in t.stdout
    assert "warning: rank(s) 1 not analysed" in t.stderr


@pytest.mark.corpus
def test_a_process_whose_gpu_rows_are_lost_is_named(corpus: Path, tmp_path: Path) -> None:
    """pid 145 launched kernels, but its kernels, copies and memsets are not in the export (as
    when CUPTI drops its buffers): one rank remains, and a warning names the process."""
    f = edited(corpus, tmp_path, *(f"DELETE FROM {t} WHERE {PID} = 145" for t in (
        "CUPTI_ACTIVITY_KIND_KERNEL", "CUPTI_ACTIVITY_KIND_MEMCPY", "CUPTI_ACTIVITY_KIND_MEMSET")))
    tr = load_trace([f])
    assert tr.ranks["rank"].to_list() == [0]
    lost = [w for w in tr.warnings if "process 145" in w]
    # its 1,819 cudaLaunchKernel + 204 cuLaunchKernelEx calls (sqlite3 on the export)
    assert lost == [f"{f.name}: process 145 launched 2,023 kernel(s) but the export holds none of "
                    "its GPU work (CUPTI records lost, or its kernels ran outside the capture): "
                    "not analysed as a rank"]


def _kernels(rank: int, starts: list[int], dur: int = 10_000) -> list[dict]:
    return [{"rank": rank, "kind": "kernel", "name": "gemm", "ts_ns": t, "dur_ns": dur,
             "pid": 0, "tid": 7, "device": rank, "stream": 7, "correlation": i}
            for i, t in enumerate(starts)]


def test_gpu_idle_structure_on_one_rank_only_is_not_mixed_with_whole_trace() -> None:
    """Rank 1 runs three bursts of 10 kernels 5 ms apart, rank 0 runs kernels back to back. Step
    numbers from GPU-idle gaps are per-rank ordinals: with structure on rank 1 only, rank 0
    used to vanish from the analysis (ranks_analyzed [1]); now both are one whole-trace step."""
    burst = [b * 5_200_000 + k * 12_000 for b in range(3) for k in range(10)]
    steady = [k * 12_000 for k in range(900)]
    ev = conform(pl.DataFrame(_kernels(0, steady) + _kernels(1, burst)), EVENTS_SCHEMA)
    st = find_steps(ev)
    assert st.source == "whole_trace"
    assert st.table.select("rank", "step").rows() == [(0, 0), (1, 0)]
    assert st.skipped == ()
    assert any("repetitive GPU-idle structure on rank(s) 1 only, not on 0" in w for w in st.warnings)


def test_gpu_idle_structure_on_every_rank_is_kept() -> None:
    burst = [b * 5_200_000 + k * 12_000 for b in range(3) for k in range(10)]
    ev = conform(pl.DataFrame(_kernels(0, burst) + _kernels(1, burst)), EVENTS_SCHEMA)
    st = find_steps(ev)
    assert st.source == "gpu_idle" and st.skipped == ()
    assert st.table.group_by("rank").len().sort("rank").rows() == [(0, 3), (1, 3)]


def test_window_without_a_rank_names_it() -> None:
    """`--window 1:1` where rank 1's steps start at 2: rank 1 is named, not silently dropped."""
    ev = conform(pl.DataFrame(
        [{"rank": r, "kind": "annotation", "name": f"ProfilerStep#{s}", "ts_ns": s * 10**7,
          "dur_ns": 10**7, "pid": 1, "tid": 1} for r, ids in ((0, (1, 2, 3)), (1, (2, 3, 4)))
         for s in ids]
        + [{"rank": r, "kind": "runtime", "name": "cudaLaunchKernel", "ts_ns": s * 10**7 + 10,
            "dur_ns": 5, "pid": 1, "tid": 1, "correlation": s} for r, ids in ((0, (1, 2, 3)),
                                                                            (1, (2, 3, 4)))
           for s in ids]
        + [k | {"correlation": s, "ts_ns": s * 10**7 + 100} for r, ids in ((0, (1, 2, 3)),
                                                                          (1, (2, 3, 4)))
           for s in ids for k in _kernels(r, [0])]), EVENTS_SCHEMA)
    st = find_steps(ev, window="1:1")
    assert st.table.select("rank", "step").rows() == [(0, 1)]
    assert st.skipped == ((1, "no complete step in the steady window 1:1"),)
    assert "rank(s) 1 not analysed: no complete step in the steady window 1:1" in st.warnings
