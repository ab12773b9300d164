"""The diagnosis document: schema-valid, deterministic, sums to 1, on every corpus trace."""

from __future__ import annotations

import json
from pathlib import Path

import jsonschema
import pytest
from moetune.analyzer.diagnose import diagnose, diagnose_trace

from moetune.errors import UserError
from tests.diagnose_synthetic import three_steps, trace

SCHEMA = json.loads((Path(__file__).resolve().parents[1] / "schemas" / "diagnosis.schema.json").read_text())
KINETO = [
    "hta_a100_2rank_nccl", "hta_a100_alltoall_rank3of8", "hta_alexnet", "hta_cuda_event_sync",
    "hta_mi250_minitoy", "hta_sampled_rank0", "hta_simple_add", "hta_v100_ddp_allreduce_rank1",
    "tracelens_h100_qwen05b_inference",
]


def check(doc: dict) -> None:
    jsonschema.validate(doc, SCHEMA)
    assert sum(doc["walls"].values()) == pytest.approx(1.0, abs=0.01)
    for row in doc["per_step"]:
        assert sum(row["walls"].values()) == pytest.approx(1.0, abs=0.01)
    for w, d in doc["wall_detail"].items():
        assert d["exposed_s"] + d["hidden_s"] == pytest.approx(d["busy_s"], abs=2e-6), w
    assert doc["dominant_wall"] == max(doc["walls"], key=doc["walls"].get)
    h = doc["host"]
    assert h["launch_starved_s"] + h["sync_blocked_s"] + h["other_s"] == pytest.approx(h["idle_s"], abs=3e-6)


@pytest.mark.parametrize("name", KINETO)
def test_every_kineto_trace(corpus, name) -> None:
    doc = diagnose([corpus / f"public/kineto/{name}.json.gz"])
    check(doc)
    assert [i["file"] for i in doc["inputs"]] == [f"{name}.json.gz"]
    assert "/" not in json.dumps(doc["inputs"])  # file names only, never host paths


def test_cpu_only_trace_is_a_user_error(corpus) -> None:
    with pytest.raises(UserError, match=r"has no GPU events \(CPU-only profile\?\)"):
        diagnose([corpus / "public/kineto/hta_cpu_only.json.gz"])


def test_known_numbers(corpus) -> None:
    a100 = diagnose([corpus / "public/kineto/hta_a100_2rank_nccl.json.gz"])
    assert (a100["steps"], a100["window"]["dropped_incomplete"]) == ([4, 5, 6], [])
    # median of steps 4 (222.055 ms), 5 (219.732 ms) and 6 (225.024 ms; its host ProfilerStep
    # ran 224.9 ms: the last window ends at its host end plus the others' gap) is step 4
    assert a100["median_step_by_rank"] == {"0": 4} and a100["step_time_s"] == 0.222055
    assert a100["dominant_wall"] == "host" and a100["observed"]["dispatcher_backend"] == "none"
    a2a = diagnose([corpus / "public/kineto/hta_a100_alltoall_rank3of8.json.gz"])
    assert a2a["observed"]["dispatcher_backend"] == "nccl_alltoall"
    assert a2a["evidence"]["dispatcher"]["nccl_sendrecv_kernels"] > 0
    qwen = diagnose([corpus / "public/kineto/tracelens_h100_qwen05b_inference.json.gz"])
    assert qwen["step_time_s"] == 0.034892 and qwen["host"]["idle_s"] == 0.002987
    assert qwen["evidence"]["classes"]["compute.gemm.bf16"]["count"] == 168


def test_deterministic(corpus) -> None:
    p = corpus / "public/kineto/hta_sampled_rank0.json.gz"
    assert json.dumps(diagnose([p])) == json.dumps(diagnose([p]))


def test_multi_rank_nsys(corpus) -> None:
    doc = diagnose([corpus / "public/nsys/nsysai_2gpu_training_before.sqlite"])
    check(doc)
    assert doc["ranks_analyzed"] == [0, 1]
    assert sorted({r["rank"] for r in doc["per_step"]}) == [0, 1]
    # walls are the mean of the per-rank median-step fractions
    per_rank = {r["rank"]: r["walls"] for r in doc["per_step"]}
    for w in doc["walls"]:
        assert doc["walls"][w] == pytest.approx((per_rank[0][w] + per_rank[1][w]) / 2, abs=2e-4)


def test_synthetic_healthy_is_compute_bound(corpus) -> None:
    # nsys-ai label: 400 ms busy in a 403.99 ms span → idle 0.99 %, no communication
    doc = diagnose([corpus / "public/nsys/nsysai_synthetic_healthy.sqlite"])
    assert doc["dominant_wall"] == "compute" and doc["walls"]["communication"] == 0
    assert doc["walls"]["host"] == pytest.approx(0.0099, abs=2e-4)


def test_sections_hook_and_contract_window(tmp_path) -> None:
    seen = {}

    def section(tr, steps, ctx):
        seen["ids"] = steps.ids
        return {"extra_section": {"summary": "x"}}

    doc = diagnose_trace(trace(three_steps()), sections=[("cp", section)])
    check(doc)
    assert doc["extra_section"] == {"summary": "x"} and seen["ids"] == [1, 2]
    c = tmp_path / "contract.yaml"
    c.write_text("schema: moetune.contract/1\nwindow: {steady: '2:2'}\n")
    assert diagnose_trace(trace(three_steps()), contract=str(c))["steps"] == [2]
    with pytest.raises(AssertionError):
        diagnose_trace(trace(three_steps()), sections=[("bad", lambda *a: {"walls": {}})])


def test_observed_facts_synthetic() -> None:
    from tests.diagnose_synthetic import GEMM, ev, launch

    rows = three_steps()
    rows += [
        # one graph launch replaying two kernels (shared correlation)
        ev("runtime", "cudaGraphLaunch", 1150, 20, correlation=70),
        ev("kernel", "void deep_ep::intranode::dispatch<8>(int4*)", 1300, 50, correlation=70, stream=30),
        ev("kernel", "void deep_ep::intranode::combine<8>(int4*)", 1400, 50, correlation=70, stream=30),
        # FP8 GEMM, and two expert GEMMs overlapping on side streams 21 and 22 for 30 ns
        launch(71, 1160), ev("kernel", "nvjet_qqtst_128x128_Avec32UE8M0", 1500, 40, correlation=71),
        launch(72, 1170), ev("kernel", GEMM, 1600, 50, correlation=72, stream=21),
        launch(73, 1180), ev("kernel", GEMM, 1620, 50, correlation=73, stream=22),
        # activation offload: 2 MiB pinned DtoH then HtoD, 100 ns each
        launch(74, 1190, name="cudaMemcpyAsync"),
        ev("memcpy", "Memcpy DtoH (Device -> Pinned)", 1700, 100, correlation=74, copy_kind="DtoH", bytes=2 << 20),
        launch(75, 1195, name="cudaMemcpyAsync"),
        ev("memcpy", "Memcpy HtoD (Pinned -> Device)", 1850, 100, correlation=75, copy_kind="HtoD", bytes=2 << 20),
    ]
    doc = diagnose_trace(trace(rows))
    check(doc)
    o, e = doc["observed"], doc["evidence"]
    assert o["cuda_graph_replay"] and (e["graph_launches"], e["graph_kernels"]) == (1, 2)
    assert o["fp8_gemm"] and e["fp8_gemm"]["count"] == 1
    assert o["grouped_gemm"] and e["grouped_gemm"]["max_concurrent_side_streams"] == 2
    assert o["dispatcher_backend"] == "deepep" and e["dispatcher"]["deepep_kernels"] == 2
    # 200 ns of offload copies over two 1000 ns steps
    assert o["offload_copy_fraction"] == 0.1
    assert o["recompute_fraction"] == 0.0


def test_recompute_in_document() -> None:
    from tests.test_walls import recompute_rows

    doc = diagnose_trace(trace(recompute_rows()))
    check(doc)
    # recompute busy 50 ns of 500 ns compute busy (step 1: 300; step 2: 100 + 50 backward + 50)
    assert doc["observed"]["recompute_fraction"] == 0.1
    assert doc["median_step_by_rank"] == {"0": 1}  # equal walls: lower median; no recompute there


def test_no_paths_is_a_user_error_not_a_traceback() -> None:
    with pytest.raises(UserError, match="no trace file given"):
        diagnose([])


FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "traces"


@pytest.mark.parametrize("rel", ["gpu_mcore_recompute_full/trace.json.gz", "gpu_ep2_alltoall_overlap"])
def test_side_by_side_orchestration_equals_the_functions_in_order(rel) -> None:
    """diagnose_trace runs the walls on a helper thread beside the steps and backend facts; the
    same public functions called one after another must give the same document parts."""
    from moetune.analyzer.classify import classify
    from moetune.analyzer.diagnose import _per_step_rows, normalize
    from moetune.analyzer.observed import gpu_facts, observe
    from moetune.analyzer.readers import load_trace
    from moetune.analyzer.steps import find_steps
    from moetune.analyzer.walls import (
        attribute_walls,
        recompute_evidence,
        recompute_launches,
        recompute_ops,
    )

    path = FIXTURES / rel
    tr = load_trace([path])
    doc = diagnose_trace(tr, files=[path], sections=[])
    events = classify(tr.events)
    steps = find_steps(events)
    per_step = attribute_walls(events, steps.table, recompute=recompute_launches(events))
    observed, evidence = observe(gpu_facts(events, steps.table, comms=tr.comms), per_step,
                                 recompute=recompute_evidence(recompute_ops(events), steps.table))
    assert doc["per_step"] == normalize(_per_step_rows(per_step))
    assert doc["observed"] == normalize(observed)
    assert {k: doc["evidence"][k] for k in evidence} == normalize(evidence)
    assert len(doc["ranks_analyzed"]) == (2 if "ep2" in rel else 1)
