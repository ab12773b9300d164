"""Memory evidence beside the trace (analyzer/memory_evidence.py, moetune/analysis.py
apply_reference): Megatron's memory report lines and PyTorch memory snapshots fill the diagnosis'
`memory` section where the trace has no allocator events, each figure saying its source.

Inputs: real H200 runs (the grid traces and their logs; Megatron-LM's own profiler records no
allocator events, so its traces are those traces with the `[memory]` events taken out), a snapshot
torch made on the CPU (fixtures/memory/make_snapshot.py) and one rebuilt from the H200 trace's
allocator events in the CUDA snapshot format (fixtures/memory/make_cuda_snapshot.py)."""

from __future__ import annotations

import gzip
import json
import pickle
import subprocess
import sys
from pathlib import Path

import pytest
from moetune.analyzer.memory_evidence import (
    log_section,
    read_snapshot,
    snapshot_rank,
    snapshot_summary,
)
from moetune.executor.logparse import parse_file, parse_text

from moetune.analysis import analyze, read_reference
from moetune.errors import UserError

ROOT = Path(__file__).resolve().parents[1]
TRACES = ROOT / "fixtures" / "traces"
LOGS = ROOT / "fixtures" / "logs"
MEMORY = ROOT / "fixtures" / "memory"
MEM = TRACES / "grid_mem_mbs4_seq_rcfull_a2a_eager"
CPU_SNAPSHOT = MEMORY / "cpu_moe_snapshot.pickle"
CUDA_SNAPSHOT = MEMORY / "h200_mem_mbs4_rcfull_snapshot.pickle"


def without_allocator_events(src: Path, dst: Path) -> Path:
    """The trace as Megatron-LM's profiler call writes it: no `[memory]` events."""
    with gzip.open(src) as f:
        doc = json.load(f)
    doc["traceEvents"] = [e for e in doc["traceEvents"] if e.get("name") != "[memory]"]
    with gzip.open(dst, "wt") as f:
        json.dump(doc, f)
    return dst


@pytest.fixture(scope="module")
def bare_trace(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return without_allocator_events(MEM / "trace.json.gz",
                                    tmp_path_factory.mktemp("bare") / "trace.json.gz")


# ----------------------------------------------------------------------------- the log


def test_the_log_fills_memory_where_the_trace_has_no_allocator_events(bare_trace: Path) -> None:
    plain = analyze(bare_trace).diagnosis["memory"]
    assert plain["source"] == "none" and plain["peak_allocated_gib"] is None
    assert plain["device_gib"] == pytest.approx(139.8, abs=0.01)  # the trace's device properties
    mem = analyze(bare_trace, reference_step_s=read_reference(MEM / "train.log")).diagnosis["memory"]
    # `[Rank 0] (after 12 iterations) memory (MB) | … max allocated: 52479.92 | … max reserved:
    # 63232.00`: the same peaks as the allocator events of the trace it came with
    assert mem["source"] == "log" and mem["scope"] == "run" and mem["iteration"] == 12
    assert mem["peak_allocated_gib"] == pytest.approx(52479.92 / 1024, abs=1e-3)
    assert mem["peak_reserved_gib"] == pytest.approx(63232.00 / 1024, abs=1e-3)
    assert mem["fragmentation"] == pytest.approx(63232.00 / 52479.92, abs=1e-4)
    assert mem["reserved_share"] == pytest.approx(61.75 / 139.8, abs=1e-3)
    assert mem["files"] == ["train.log"] and mem["notes"] == []
    assert set(mem["by_rank"]) == {"0"} and mem["by_rank"]["0"]["events"] == 2
    with_events = analyze(MEM / "trace.json.gz").diagnosis["memory"]
    assert with_events["peak_allocated_gib"] == pytest.approx(mem["peak_allocated_gib"], abs=1e-3)
    assert with_events["fragmentation"] == pytest.approx(mem["fragmentation"], abs=1e-3)


def test_allocator_events_stay_first_and_the_log_is_kept_beside_them() -> None:
    mem = analyze(MEM / "trace.json.gz",
                  reference_step_s=read_reference(MEM / "train.log")).diagnosis["memory"]
    assert mem["source"] == "allocator_events"
    assert [o["source"] for o in mem["other_sources"]] == ["log"]
    assert mem["other_sources"][0]["iteration"] == 12


def test_log_lines_per_rank_and_the_worst_rank_leads() -> None:
    parsed = parse_file(LOGS / "real_gnosia93_slurm_gpt70b.log")
    assert parsed.memory.height > 1
    sec = log_section(parsed.memory, device_bytes=80 * 2**30)["memory"]
    ranks = {int(r) for r in parsed.memory.get_column("rank").unique()}
    assert {int(r) for r in sec["by_rank"]} == ranks
    worst = max(sec["by_rank"].values(), key=lambda r: r["reserved_share"])
    assert sec["peak_reserved_gib"] == worst["peak_reserved_gib"]


def test_a_log_with_only_the_first_iteration_line_says_so() -> None:
    text = ("[Rank 0] (after 1 iterations) memory (MB) | allocated: 100.0 | max allocated: 200.0 | "
            "reserved: 300.0 | max reserved: 300.0\n")
    sec = log_section(parse_text(text).memory)["memory"]
    assert sec["iteration"] == 1 and sec["device_gib"] is None and sec["reserved_share"] is None
    assert "second" in sec["notes"][0]


# ----------------------------------------------------------------------------- snapshots


def test_cpu_snapshot_made_by_torch_peak_history_and_sites() -> None:
    doc = read_snapshot(CPU_SNAPSHOT)
    s = snapshot_summary(doc, file=CPU_SNAPSHOT.name)
    # forward replay of the recorded actions, from the level before them
    trace = next(t for t in doc["device_traces"] if t)
    level = peak = 0
    for e in trace:
        level += e["size"] if e["action"] == "alloc" else \
            -e["size"] if e["action"] == "free_completed" else 0
        peak = max(peak, level)
    before = s["allocated_at_dump_gib"] * 2**30 - level
    assert s["peak_allocated_gib"] == pytest.approx((peak + before) / 2**30, abs=1e-4)
    assert s["peak_reserved_gib"] is None and s["fragmentation"] is None  # no allocator on a CPU
    assert any("reserved memory unknown" in n for n in s["notes"])
    sites = [x["site"] for x in s["largest"]]
    assert any(site.startswith("torch_moe.py(") for site in sites)  # the model's own lines
    assert not any(site.startswith(("torch/", "<built-in")) for site in sites)
    assert sum(x["share"] for x in s["largest"]) <= 1.0 + 1e-6


def test_cuda_format_snapshot_agrees_with_the_allocator_events_it_was_built_from() -> None:
    s = snapshot_summary(read_snapshot(CUDA_SNAPSHOT), file=CUDA_SNAPSHOT.name)
    mem = analyze(MEM / "trace.json.gz").diagnosis["memory"]
    assert s["peak_allocated_gib"] == pytest.approx(mem["peak_allocated_gib"], abs=1e-3)
    assert s["peak_reserved_gib"] == pytest.approx(mem["peak_reserved_gib"], abs=1e-3)
    assert s["fragmentation"] == pytest.approx(1.2049, abs=1e-3)
    # at the peak (the softmax backward of one layer at MBS 4): four 6 GiB score tensors
    big = [x for x in s["largest"] if x["gib"] == pytest.approx(6.0, abs=0.01)]
    assert {x["site"] for x in big} >= {"aten::_softmax", "aten::_softmax_backward_data"}


def test_snapshot_through_the_pipeline_says_its_source(bare_trace: Path) -> None:
    ref = read_reference(None, [CUDA_SNAPSHOT])
    mem = analyze(bare_trace, reference_step_s=ref).diagnosis["memory"]
    assert mem["source"] == "snapshot" and mem["scope"] == "history"
    assert mem["files"] == [CUDA_SNAPSHOT.name]
    assert mem["peak_reserved_gib"] == pytest.approx(61.75, abs=1e-3)
    assert mem["largest"] and mem["largest"][0]["gib"] > 1
    both = analyze(bare_trace, reference_step_s=read_reference(MEM / "train.log", [CUDA_SNAPSHOT]))
    m2 = both.diagnosis["memory"]
    assert m2["source"] == "log" and [o["source"] for o in m2["other_sources"]] == ["snapshot"]
    assert m2["largest"] == mem["largest"]  # the stacks come from the snapshot, and say so


def test_megatron_snapshot_names_give_ranks() -> None:
    assert snapshot_rank("snapshot_3.pickle") == 3
    assert snapshot_rank("/x/mem_snap_12.pickle") == 12
    assert snapshot_rank("snapshot.pickle") is None


class _Evil:
    def __reduce__(self):  # what a crafted pickle does to run code on load
        return (print, ("pwned",))


@pytest.mark.parametrize("payload", [
    pickle.dumps(_Evil()),
    pickle.dumps({"segments": [], "x": Path}),  # a class: not plain data
])
def test_a_pickle_that_names_code_is_refused_in_one_line(tmp_path: Path, payload: bytes) -> None:
    f = tmp_path / "snap_0.pickle"
    f.write_bytes(payload)
    with pytest.raises(UserError, match="not a plain-data memory snapshot"):
        read_snapshot(f)


@pytest.mark.parametrize(("payload", "message"), [
    (b"\x80\x04\x95", "not a readable pickle"),
    (pickle.dumps([1, 2, 3]), "not a memory snapshot"),
    (pickle.dumps({"segments": [], "device_traces": {"a": 1}}), "is not a list of lists"),
])
def test_bad_snapshots_are_one_line(tmp_path: Path, payload: bytes, message: str) -> None:
    f = tmp_path / "s.pickle"
    f.write_bytes(payload)
    with pytest.raises(UserError, match=message):
        read_snapshot(f)


def test_cli_refuses_a_crafted_snapshot_with_exit_2(tmp_path: Path) -> None:
    f = tmp_path / "snap_0.pickle"
    f.write_bytes(pickle.dumps(_Evil()))
    p = subprocess.run([sys.executable, "-m", "moetune", "diagnose", str(MEM / "trace.json.gz"),
                        "--memory-snapshot", str(f)],
                       capture_output=True, text=True, timeout=300, check=False)
    assert p.returncode == 2 and "pwned" not in p.stdout + p.stderr
    assert p.stderr.strip().startswith(f"moetune: {f}: not a plain-data memory snapshot (it names")
    assert len(p.stderr.strip().splitlines()) == 1


def test_cli_diagnose_log_terminal_and_json_agree(bare_trace: Path) -> None:
    args = [sys.executable, "-m", "moetune", "diagnose", str(bare_trace), "--log",
            str(MEM / "train.log")]
    doc = json.loads(subprocess.run([*args, "--json"], capture_output=True, text=True,
                                    timeout=300, check=True).stdout)
    text = subprocess.run(args, capture_output=True, text=True, timeout=300, check=True).stdout
    mem = doc["memory"]
    assert mem["source"] == "log"
    assert (f"peak reserved {mem['peak_reserved_gib']:.2f} GiB, allocated "
            f"{mem['peak_allocated_gib']:.2f} GiB") in text
    assert "source: the run's log train.log (max since start, after iteration 12)" in text


def test_diff_takes_each_sides_reference(bare_trace: Path) -> None:
    """`diff A B --log-a FILE`: A's memory from its log (its trace has no allocator events), B's
    from its allocator events; each side says its source in the JSON and on the terminal."""
    args = [sys.executable, "-m", "moetune", "diff", str(bare_trace), str(MEM / "trace.json.gz"),
            "--log-a", str(MEM / "train.log")]
    doc = json.loads(subprocess.run([*args, "--json"], capture_output=True, text=True,
                                    timeout=600, check=True).stdout)
    mem = doc["memory"]
    assert mem["source"] == {"a": "log", "b": "allocator_events"}
    assert mem["peak_allocated_gib"]["a"] == pytest.approx(mem["peak_allocated_gib"]["b"],
                                                           abs=1e-3)
    text = subprocess.run(args, capture_output=True, text=True, timeout=600, check=True).stdout
    assert "(source: log → allocator_events)" in text


def test_megatron_lms_own_trace_takes_its_memory_from_its_log(tmp_path: Path) -> None:
    """NVIDIA Megatron-LM's pretrain_gpt.py on the H200 (fixtures/traces/mlm_mem_mbs1_rcfull): its
    profiler call records no allocator events, so the memory verdicts stand on the log's memory
    lines; recompute off is recommended with its verdict from them, and the estimates start from
    the steady unprofiled median (iterations 3–8; 9–12 profiled, 12 the 18.4 s export)."""
    from moetune.analyzer.megatron_args import contract_from_log

    folder = TRACES / "mlm_mem_mbs1_rcfull"
    plain = analyze(folder / "trace.json.gz").diagnosis
    assert plain["memory"]["source"] == "none"
    an = analyze(folder / "trace.json.gz", contract_from_log((folder / "train.log").read_text()),
                 reference_step_s=read_reference(folder / "train.log"))
    d = an.diagnosis
    assert d["memory"]["source"] == "log" and d["memory"]["iteration"] == 2
    assert d["memory"]["peak_allocated_gib"] == pytest.approx(55158.55 / 1024, abs=1e-3)
    assert d["reference"]["iterations"] == [3, 4, 5, 6, 7, 8]
    assert d["reference"]["step_s"] == pytest.approx(2.2259)
    doc = an.advise().document
    off = next(r for r in doc["recommendations"] if r["rule"] == "memory.recompute-off")
    assert off["memory"]["verdict"] == "fits" and off["memory"]["evidence"] == "log"
    # its peak is torch Adam's step, not the activations recompute saves: recompute off adds
    # little (the "memory unchanged")
    assert off["memory"]["peak_gib"] - d["memory"]["peak_allocated_gib"] < 2.0
