"""The real H200 traces in fixtures/traces/gpu_*: `observed` must match what is true by construction
(truth.json, written by fixtures/gpu/make_traces.py or bench/gpu/run_ep2.sh next to the traces; a
folder with several trace files is one multi-rank run)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from moetune.analyzer.diagnose import diagnose

GPU = sorted((Path(__file__).resolve().parents[1] / "fixtures" / "traces").glob("gpu_*/truth.json"))
OBSERVED_KEYS = ("cuda_graph_replay", "fp8_gemm", "grouped_gemm", "dispatcher_backend")


@pytest.fixture(scope="module")
def docs() -> dict[str, dict]:
    return {p.parent.name: diagnose(sorted(p.parent.glob("*.json.gz"))) for p in GPU}


@pytest.mark.parametrize("truth_path", GPU, ids=[p.parent.name for p in GPU])
def test_observed_matches_construction(truth_path: Path, docs: dict[str, dict]) -> None:
    truth = json.loads(truth_path.read_text())
    doc = docs[truth_path.parent.name]
    checked = [k for k in OBSERVED_KEYS if k in truth]
    assert checked or "recompute" in truth, "every GPU fixture states an observable truth"
    for key in checked:
        assert doc["observed"][key] == truth[key], key
    if truth.get("recompute"):
        # Full recompute re-runs each layer's forward once: about 1/4 of fwd+recompute+bwd(≈2 fwd)
        assert 0.15 <= doc["observed"]["recompute_fraction"] <= 0.35
    else:
        assert doc["observed"]["recompute_fraction"] == 0.0


def test_hostbound_megatron_is_host_dominant(docs: dict[str, dict]) -> None:
    doc = docs["gpu_mcore_hostbound"]
    assert doc["dominant_wall"] == "host"
    # ~185 ms steps with ~6 ms of kernels: the GPU idles > 90 % of the step, waiting for launches
    assert doc["walls"]["host"] > 0.9
    assert doc["host"]["launch_starved_s"] > 0.9 * doc["host"]["idle_s"]


def test_computebound_megatron_is_compute_dominant(docs: dict[str, dict]) -> None:
    doc = docs["gpu_mcore_computebound"]
    assert doc["dominant_wall"] == "compute"
    assert doc["walls"]["compute"] > 0.5
    assert abs(sum(doc["walls"].values()) - 1) <= 0.01


@pytest.mark.slow
def test_ep2_alltoall_shows_the_communication_wall_on_both_ranks(docs: dict[str, dict]) -> None:
    """2 x H200, EP 2 x DP 2 (bench/gpu/run_ep2.sh): NCCL all-to-all is a real wall, on the
    critical path, and the two ranks are aligned on their collectives."""
    for case in ("gpu_ep2_alltoall_nooverlap", "gpu_ep2_alltoall_overlap", "gpu_ep2_allgather"):
        doc = docs[case]
        assert doc["ranks_analyzed"] == [0, 1]
        assert doc["walls"]["communication"] > 0.15, case
        assert doc["critical_path"]["recoverable_s"]["communication"] > 0.005, case
        assert doc["ranks"]["alignment"]["method"] == "collective_end"
    # the dispatcher is told apart by Megatron's process-group names, with no contract hint
    ev = docs["gpu_ep2_allgather"]["evidence"]["dispatcher"]
    assert ev["ep_group_allgather_kernels"] > 0 and ev["ep_group_sendrecv_kernels"] == 0
    ev = docs["gpu_ep2_alltoall_nooverlap"]["evidence"]["dispatcher"]
    assert ev["ep_group_sendrecv_kernels"] > 0


def test_trimmed_ep2_fixtures_keep_whole_steps() -> None:
    """fixtures/gpu/trim_steps.py dropped rows only: one ProfilerStep left, and every kept kernel
    still has its launch (and every kept launch in the step its kernel)."""
    import gzip

    for f in sorted((GPU[0].parents[1]).glob("gpu_ep2_*/rank*.pt.trace.json.gz")):
        doc = json.loads(gzip.decompress(f.read_bytes()))
        ev = doc["traceEvents"]
        assert doc["moetune_trimmed"] == {"kept_profiler_steps": [5]}
        assert [e["name"] for e in ev if e.get("name", "").startswith("ProfilerStep#")] == ["ProfilerStep#5"]
        launches = {e["args"]["correlation"] for e in ev if e.get("cat") in ("cuda_runtime", "cuda_driver")
                    and "correlation" in e.get("args", {})}
        kernels = {e["args"]["correlation"] for e in ev if e.get("cat") == "kernel"}
        assert kernels and kernels <= launches, f.name
        assert doc["distributedInfo"]["world_size"] == 2


def test_trim_steps_keeps_late_kernels_of_kept_launches() -> None:
    from fixtures.gpu.trim_steps import trim

    ev = [
        {"ph": "X", "cat": "user_annotation", "name": "ProfilerStep#1", "ts": 0, "dur": 10},
        {"ph": "X", "cat": "user_annotation", "name": "ProfilerStep#2", "ts": 10, "dur": 10},
        {"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "ts": 9, "dur": 1, "args": {"correlation": 1}},
        {"ph": "X", "cat": "kernel", "name": "k1", "ts": 12, "dur": 3, "args": {"correlation": 1}},  # runs late
        {"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "ts": 11, "dur": 1, "args": {"correlation": 2}},
        {"ph": "X", "cat": "kernel", "name": "k2", "ts": 16, "dur": 1, "args": {"correlation": 2}},
        {"ph": "s", "cat": "ac2g", "id": 1, "ts": 9}, {"ph": "s", "cat": "ac2g", "id": 2, "ts": 11},
        {"ph": "M", "name": "process_name", "args": {"name": "x"}},
    ]
    out = trim({"traceEvents": ev, "distributedInfo": {"rank": 0}}, {1})
    names = [e.get("name") for e in out["traceEvents"]]
    assert names == ["ProfilerStep#1", "cudaLaunchKernel", "k1", None, "process_name"]
    assert out["distributedInfo"] == {"rank": 0}
