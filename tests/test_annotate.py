"""`moetune annotate`: the input trace plus moetune's tracks, as Chrome trace JSON."""

from __future__ import annotations

import gzip
import hashlib
import json
from collections import Counter, defaultdict
from pathlib import Path
from typing import Any

import pytest
from moetune.analyzer.annotate import PID, tid

from moetune.cli import main

ROOT = Path(__file__).resolve().parent.parent
HOSTBOUND = ROOT / "fixtures" / "traces" / "gpu_mcore_hostbound" / "trace.json.gz"
EP2 = ROOT / "fixtures" / "traces" / "gpu_ep2_alltoall_overlap"
NSYS = ROOT / "fixtures" / "nsys" / "h200_eager_2steps.sqlite.gz"
KEYS = ("ph", "ts", "pid", "tid", "name")


def _load(p: Path) -> dict[str, Any]:
    with (gzip.open(p, "rt") if p.name.endswith(".gz") else p.open()) as f:
        return json.load(f)


def _annotate(tmp_path: Path, *inputs: Path, name: str = "out.json.gz") -> dict[str, Any]:
    out = tmp_path / name
    assert main(["annotate", *map(str, inputs), "-o", str(out)]) == 0
    assert not (tmp_path / (name + ".part")).exists()
    return _load(out)


def _chrome_shape(doc: dict[str, Any]) -> list[dict[str, Any]]:
    ev = doc["traceEvents"]
    assert isinstance(ev, list) and ev
    missing = [e for e in ev if not all(k in e for k in KEYS)]
    assert not missing, missing[:3]
    return ev


def _ours(ev: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [e for e in ev if e["pid"] == PID]


def _encloses(slices: list[dict[str, Any]], e: dict[str, Any]) -> bool:
    return any(s["ts"] <= e["ts"] <= s["ts"] + s["dur"] for s in slices)


def _flow_phases(ev: list[dict[str, Any]]) -> dict[tuple, Counter]:
    phases: dict[tuple, Counter] = defaultdict(Counter)
    for e in ev:
        if e["ph"] in ("s", "f"):
            phases[(e.get("cat"), e.get("name"), e["id"])][e["ph"]] += 1
    return phases


def test_hostbound_tracks(tmp_path: Path) -> None:
    before = hashlib.sha256(HOSTBOUND.read_bytes()).hexdigest()
    src = _load(HOSTBOUND)
    doc = _annotate(tmp_path, HOSTBOUND)
    assert hashlib.sha256(HOSTBOUND.read_bytes()).hexdigest() == before  # input untouched
    ev = _chrome_shape(doc)
    ours = _ours(ev)
    # every input event is copied (metadata events rewritten, never dropped)
    assert len(ev) - len(ours) == len(src["traceEvents"])
    names = {e["args"]["name"] for e in ours if e["ph"] == "M" and e["name"] == "thread_name"}
    assert names == {"rank 0 · walls", "rank 0 · critical path", "rank 0 · blocking", "rank 0 · audit"}
    walls = [e for e in ours if e["ph"] == "X" and e["tid"] == tid(0, "walls")]
    steps = [e for e in walls if e["name"].startswith("step ")]
    # ProfilerSteps 3-6, each whole (2,521 GPU ops): all four are analysed
    assert sorted(e["args"]["step"] for e in steps) == [3, 4, 5, 6]
    for st in steps:  # the wall slices tile their step, host the largest here (host-bound run)
        kids = [e for e in walls if not e["name"].startswith("step ")
                and st["ts"] <= e["ts"] < st["ts"] + st["dur"]]
        assert abs(sum(k["dur"] for k in kids) - st["dur"]) < 0.01 * st["dur"]
        assert max(kids, key=lambda k: k["dur"])["name"] == "host"
    # the step slices (GPU windows) overlap the trace's own ProfilerStep ranges: same clock
    prof = {int(e["name"].split("#")[1]): e for e in src["traceEvents"]
            if str(e.get("name", "")).startswith("ProfilerStep#")}
    for st in steps:
        p = prof[st["args"]["step"]]
        overlap = min(p["ts"] + p["dur"], st["ts"] + st["dur"]) - max(p["ts"], st["ts"])
        assert overlap > 0.5 * p["dur"]
    path = [e for e in ours if e["ph"] == "X" and e["tid"] == tid(0, "critical path")]
    assert path and all(e["args"]["wall"] in ("compute", "communication", "memory", "host", "other")
                        for e in path)
    marks = [e["name"] for e in ours if e["ph"] == "i"]
    assert "observed cuda graph replay: no" in marks
    # metadata: whitelisted only (the input's traceName is a host path)
    assert "traceName" not in doc and doc["deviceProperties"][0]["name"] == "NVIDIA H200"
    assert doc["moetune"]["steps"] == [3, 4, 5, 6]


def test_two_ranks_flows(tmp_path: Path) -> None:
    doc = _annotate(tmp_path, EP2, name="ep2.json")  # uncompressed output too
    ev = _chrome_shape(doc)
    ours = _ours(ev)
    # the inputs' own flows keep their arrows apart: both files number them from 1, so the
    # second file's ids are moved (as many distinct arrows out as the files have between them)
    theirs = _flow_phases([e for e in ev if e["pid"] != PID])
    per_file = [_flow_phases(_load(f)["traceEvents"]) for f in sorted(EP2.glob("rank*.json.gz"))]
    assert len(set(per_file[0]) & set(per_file[1])) > 100  # the collision there is to avoid
    assert len(theirs) == sum(len(p) for p in per_file)
    mine = _flow_phases(ours)  # ours pair up exactly
    assert mine and all(c == Counter({"s": 1, "f": 1}) for c in mine.values())
    flows = [e for e in ours if e["ph"] in ("s", "f")]
    assert flows, "blocking communication drawn as flow arrows"
    by_thread: dict[int, list[dict[str, Any]]] = defaultdict(list)
    for e in ours:
        if e["ph"] == "X":
            by_thread[e["tid"]].append(e)
    for f in flows:  # each end binds to a slice of its thread
        assert _encloses(by_thread[f["tid"]], f), f
        assert f["ph"] == "s" or f.get("bp") == "e"
    for r in (0, 1):
        assert [e for e in ours if e["ph"] == "X" and e["tid"] == tid(r, "walls")]
    marks = {e["name"] for e in ours if e["ph"] == "i"}
    assert "observed grouped gemm: yes" in marks
    # the ranks' CPU processes keep their own pids (no collision here); GPU 0 and GPU 1 too
    pids = {e["pid"] for e in ev if e["ph"] == "X" and e.get("cat") == "kernel"}
    assert pids == {0, 1}


def test_nsys_window(tmp_path: Path) -> None:
    doc = _annotate(tmp_path, NSYS)
    ev = _chrome_shape(doc)
    ours = _ours(ev)
    kernels = [e for e in ev if e["ph"] == "X" and e.get("cat") == "kernel"]
    steps = [e for e in ours if e["ph"] == "X" and e["name"].startswith("step ")]
    assert kernels and steps
    lo = min(s["ts"] for s in steps)
    hi = max(s["ts"] + s["dur"] for s in steps)
    # the analysed window only (kernels overlapping it)
    assert all(k["ts"] <= hi and k["ts"] + k["dur"] >= lo - 1 for k in kernels)
    assert {e["args"]["name"] for e in ev if e["ph"] == "M" and e["name"] == "process_name"} >= {
        "moetune", "rank 0 · GPU 0", "rank 0 · host"}


def test_refuses_to_overwrite_input(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    copy = tmp_path / "t.json.gz"
    copy.write_bytes(HOSTBOUND.read_bytes())
    assert main(["annotate", str(copy), "-o", str(copy)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "never overwrites its input" in err[0]
    assert copy.read_bytes() == HOSTBOUND.read_bytes()


def test_opens_in_perfetto(tmp_path: Path) -> None:
    """The real check of "opens as is in Perfetto": its trace processor imports the file."""
    tp_mod = pytest.importorskip("perfetto.trace_processor",
                                 reason="the `perfetto` package is not installed")
    out = tmp_path / "ep2.json"
    assert main(["annotate", str(EP2), "-o", str(out)]) == 0
    try:
        tp = tp_mod.TraceProcessor(trace=str(out))
    except Exception as exc:  # it downloads trace_processor_shell on first use
        pytest.skip(f"Perfetto's trace processor binary is unavailable offline ({exc})")
    rows = list(tp.query("select count(*) as n from slice join thread_track on slice.track_id = "
                         "thread_track.id join thread using (utid) where thread.name like 'rank 0 · walls'"))
    assert rows[0].n > 0
    tp.close()


CORPUS = Path("/work/shared/corpus/public")
SHOWN = {"traceEvents", "moetune", "schemaVersion", "displayTimeUnit", "baseTimeNanoseconds",
         "deviceProperties", "distributedInfo", "cuda_driver_version", "cuda_runtime_version",
         "cupti_version", "hip_version", "roctracer_version", "torch_version", "pytorch_version",
         "cuda_version", "nccl_version", "trace_start_time", "traceStartTime", "deviceType"}


@pytest.mark.parametrize("name", ["kineto/hta_a100_2rank_nccl.json.gz",
                                  "kineto/tracelens_h100_qwen05b_inference.json.gz",
                                  "nsys/nsysai_h100_2gpu_inference.sqlite"])
def test_public_corpus(tmp_path: Path, name: str) -> None:
    src = CORPUS / name
    if not src.exists():
        pytest.skip(f"public corpus not here ({src})")
    doc = _annotate(tmp_path, src)
    ev = _chrome_shape(doc)
    assert set(doc) <= SHOWN  # nothing but whitelisted metadata at the top level
    mine = _flow_phases(_ours(ev))
    assert all(c == Counter({"s": 1, "f": 1}) for c in mine.values())
    assert [e for e in _ours(ev) if e["ph"] == "X" and e["name"].startswith("step ")]
