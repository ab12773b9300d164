"""The real H200 traces in fixtures/traces/gpu_*: `observed` must match what is true by construction
(truth.json, written by fixtures/gpu/make_traces.py next to each trace)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from analyzer.diagnose import diagnose

GPU = sorted((Path(__file__).resolve().parents[1] / "fixtures" / "traces").glob("gpu_*/truth.json"))
OBSERVED_KEYS = ("cuda_graph_replay", "fp8_gemm", "grouped_gemm", "dispatcher_backend")


@pytest.fixture(scope="module")
def docs() -> dict[str, dict]:
    return {p.parent.name: diagnose([p.parent / "trace.json.gz"]) for p in GPU}


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
