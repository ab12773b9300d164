"""Kernel/runtime classification from kernel_classes.yaml, on signatures and real traces."""

from __future__ import annotations

import polars as pl
import pytest
from moetune.analyzer.classify import CLASSES_PATH, claim, class_table, classify, load_classes

from moetune.errors import UserError
from tests.diagnose_synthetic import ev, frame

# Kernel names from the libraries that define them (DeepEP, HybridEP, TransformerEngine, NCCL,
# cuBLAS, Megatron-LM's Triton kernels) and from real traces → expected class.
SIGNATURES = [
    ("void deep_ep::intranode::dispatch<8, 768, 8192>(int4*, float*)", "comm.deepep.dispatch"),
    ("void deep_ep::legacy::internode::combine<true, 8>(int4*)", "comm.deepep.combine"),
    ("void deep_ep::layout::get_dispatch_layout<256, 32, 8>(long const*)", "comm.deepep.notify"),
    ("void deep_ep::intranode::notify_dispatch<8>(int const*)", "comm.deepep.notify"),
    ("void deep_ep::legacy::internode::cached_notify<8>(int*)", "comm.deepep.notify"),
    ("nvjet_sm90_tst_256x128_64x4_1x2_h_bz_coopA_TNT", "compute.gemm.bf16"),
    ("nvjet_sm90_qqtst_128x128_128x6_2x1_v_bz_coopA_algo2_TNT", "compute.gemm.fp8"),
    ("void hybrid_ep::dispatch_kernel<128, true>(hybrid_ep::Params)", "comm.hybridep.dispatch"),
    ("void hybrid_ep::combine_kernel<128>(hybrid_ep::Params)", "comm.hybridep.combine"),
    ("hybrid_ep::device_sync_kernel", "comm.hybridep.other"),
    ("nvshmemi_transfer_rma_kernel", "comm.nvshmem"),
    ("userbuffers_fp16_sum_inplace_gpu_rr_rs_oop", "comm.userbuffers"),
    ("ncclDevKernel_SendRecv(ncclDevComm*, unsigned long, ncclWork*)", "comm.nccl.sendrecv"),
    ("ncclKernel_SendRecv_RING_SIMPLE_Sum_int8_t(ncclDevComm*, unsigned long, ncclWork*)", "comm.nccl.sendrecv"),
    ("ncclKernel_AllReduce_RING_LL_Sum_float(ncclDevComm*, unsigned long, ncclWork*)", "comm.nccl.allreduce"),
    ("ncclDevKernel_AllGather_RING_LL(ncclDevComm*)", "comm.nccl.allgather"),
    ("ncclDevKernel_ReduceScatter_Sum_f32_RING_LL(ncclDevComm*)", "comm.nccl.reducescatter"),
    ("ncclKernel_Broadcast_RING_LL_Sum_int8_t(ncclDevComm*)", "comm.nccl.broadcast"),
    ("ncclDevKernel_Generic(ncclDevComm*)", "comm.nccl.other"),
    ("sm90_xmma_gemm_e4m3bf16_e4m3f32_f32_tn_n_tilesize128x128x128", "compute.gemm.fp8"),
    ("nvjet_qqtst_128x256_64x4_2x1_v_bz_Avec32UE8M0_Bvec32UE8M0_TNT", "compute.gemm.fp8"),
    ("nvjet_tst_128x256_64x4_2x1_v_bz_coopA_TNT", "compute.gemm.bf16"),
    ("sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x128x64", "compute.gemm.bf16"),
    ("void cutlass::device_kernel<cutlass::gemm::kernel::GemmUniversal<cutlass::gemm::GroupProblemShape<int>>>", "compute.gemm.grouped_cutlass"),
    ("volta_sgemm_128x32_nt", "compute.gemm.other"),
    ("Cijk_Ailk_Bljk_SB_MT64x64x16", "compute.gemm.other"),
    ("void pytorch_flash::flash_fwd_kernel<Flash_fwd_kernel_traits<64>>", "compute.attention"),
    ("void transformer_engine::fused_router::fused_topk_with_score_function_forward_kernel<float>", "compute.router"),
    ("_row_id_map_pass_1_kernel", "compute.permute"),
    ("void at::native::vectorized_elementwise_kernel<4, at::native::FillFunctor<float>>", "compute.elementwise"),
    ("void deep_ep::intranode::barrier<8>(int**, int)", "comm.deepep.other"),
    ("nccl_ep_jit_dispatch_kernel", "comm.ncclep"),
    # TE casts name their FP8 output type: the FP8-GEMM entry's 'e4m3' must not claim them
    ("void transformer_engine::cast_transpose_general_kernel<8ul, 8ul, __nv_bfloat16, __nv_fp8_e4m3>"
     "(__nv_bfloat16 const*, float const*, __nv_fp8_e4m3*, __nv_fp8_e4m3*)", "compute.fp8_cast"),
    ("void transformer_engine::mxfp8_kernel::cast_mxfp8_2D_kernel<false, false, false, float, "
     "__nv_bfloat16, __nv_fp8_e4m3, true, true, 64ul, 64ul, 64ul>(CUtensorMap)", "compute.fp8_cast"),
    ("void at::native::(anonymous namespace)::multi_tensor_apply_kernel<at::native::(anonymous namespace)::"
     "FusedOptimizerTensorListMetadata<4>, at::native::(anonymous namespace)::FusedAdamMathFunctor<c10::"
     "BFloat16, 4, (at::native::ADAM_MODE)1, false>>", "compute.optimizer"),
    ("void at::native::(anonymous namespace)::vectorized_layer_norm_kernel<c10::BFloat16, float, false>"
     "(int, float, c10::BFloat16 const*)", "compute.norm"),
    ("some_unknown_kernel", "compute.other"),
]
# Events other than kernels (kind, name, bytes) → class: copies by direction, memory kind and size
# (CUPTI's names, as fixtures/traces/ hold them), memsets, nsys graph rows, runtime calls.
EVENTS = [
    ("memcpy", "Memcpy DtoH (Device -> Pinned)", 8 << 20, "memory.offload"),
    ("memcpy", "Memcpy HtoD (Pageable -> Device)", 8 << 20, "memory.pageable"),
    ("memcpy", "Memcpy DtoH (Device -> Pinned)", 4, "memory.memcpy.dtoh"),
    ("memcpy", "Memcpy HtoD (Pinned -> Device)", 4, "memory.memcpy.htod"),
    ("memcpy", "Memcpy DtoD (Device -> Device)", 4, "memory.memcpy.dtod"),
    ("memcpy", "Memcpy PtoP (Device -> Device)", 4, "memory.memcpy.ptop"),
    ("memcpy", "Memcpy HtoH (Pinned -> Pinned)", 4, "memory.memcpy.other"),
    ("memset", "Memset (Device)", 4, "memory.memset"),
    ("graph", "CUDA graph 3", None, "compute.graph_replay"),
    ("runtime", "cudaGraphLaunch_v10000", None, "graph_launch"),
    ("runtime", "cudaLaunchKernel", None, "launch"),
    ("runtime", "cudaStreamSynchronize", None, "sync"),
    ("runtime", "cudaMemcpy", None, "memcpy_api"),
    ("runtime", "cudaMemcpyAsync", None, "memcpy_api"),
    ("runtime", "cudaEventRecord", None, "event_record"),
    ("runtime", "cudaStreamWaitEvent", None, "stream_wait_event"),
    ("runtime", "cudaFuncSetAttribute", None, "other"),
]
EXAMPLES = [("kernel", n, None, k) for n, k in SIGNATURES] + EVENTS


@pytest.mark.parametrize(("name", "kclass"), SIGNATURES)
def test_signatures(name: str, kclass: str) -> None:
    out = classify(frame([ev("kernel", name, 0, 10)]))
    assert out["kclass"].to_list() == [kclass]
    assert out["wall"].cast(pl.String).to_list() == [kclass.split(".")[0].replace("comm", "communication")]


@pytest.mark.parametrize(("kind", "name", "nbytes", "label"), EXAMPLES,
                         ids=[f"{k}-{lab}-{i}" for i, (k, _, _, lab) in enumerate(EXAMPLES)])
def test_claim_agrees_with_classify(kind: str, name: str, nbytes: int | None, label: str) -> None:
    c = claim(name, kind=kind, nbytes=nbytes)
    copy = {"copy_kind": name[7:11]} if kind == "memcpy" else {}  # as the readers read it
    row = classify(frame([ev(kind, name, 0, 10, bytes=nbytes, **copy)])).row(0, named=True)
    assert c.label == label == (row["rclass"] if kind == "runtime" else row["kclass"])
    assert c.blocking == row["blocking"]


def test_every_entry_claims_an_example() -> None:
    """Each gpu and runtime entry of kernel_classes.yaml is the FIRST fit of some example above: an
    entry whose examples an earlier entry already claims is dead, and a new entry's example line
    fails here until the entry really is the one that classifies it (`moetune classify NAME` says
    which entry does)."""
    cl = load_classes()
    claimed: dict[tuple[str, int], list[str]] = {}
    for kind, name, nbytes, _ in EXAMPLES:
        c = claim(name, kind=kind, nbytes=nbytes)
        claimed.setdefault((c.section, c.entry), []).append(f"{name[:60]!r}")
    dead = []
    for section, entries in (("gpu", cl.gpu), ("runtime", cl.runtime)):
        for i, entry in enumerate(entries, 1):
            if (section, i) not in claimed:
                label = entry.get("kclass") or entry.get("rclass")
                dead.append(f"entry {i} of {section} ({label}) classifies none of the examples: add "
                            "a name only it claims, or find the earlier entry that claims yours")
    assert not dead, "\n".join(dead)


def test_claim_names_the_entry_and_what_it_shadows() -> None:
    c = claim("ncclDevKernel_AllReduce_Sum_f32_RING_LL(ncclDevComm*)")
    cl = load_classes()
    assert cl.gpu[c.entry - 1]["kclass"] == "comm.nccl.allreduce" == c.label
    assert c.sentence() == f"classified by entry {c.entry} of gpu in kernel_classes.yaml (line {c.line})"
    shadowed = [label for _, _, label in c.shadowed]
    assert shadowed == ["comm.nccl.other", "compute.other"]  # later fits, never reached
    lines = CLASSES_PATH.read_text().splitlines()
    assert lines[c.line - 1].strip() == "- kclass: comm.nccl.allreduce"


def test_copies_offload_and_runtime_classes() -> None:
    rows = [
        ev("memcpy", "Memcpy DtoH (Device -> Pinned)", 0, 5, copy_kind="DtoH", bytes=4),
        ev("memcpy", "Memcpy DtoH (Device -> Pinned)", 0, 5, copy_kind="DtoH", bytes=8 << 20),
        ev("memcpy", "Memcpy HtoD (Pageable -> Device)", 0, 5, copy_kind="HtoD", bytes=8 << 20),
        ev("memset", "Memset (Device)", 0, 5),
        ev("runtime", "cudaLaunchKernel", 0, 5),
        ev("runtime", "cuLaunchKernelEx", 0, 5),
        ev("runtime", "hipExtModuleLaunchKernel", 0, 5),
        ev("runtime", "cudaGraphLaunch_v10000", 0, 5),
        ev("runtime", "cudaStreamSynchronize", 0, 5),
        ev("runtime", "cudaMemcpy", 0, 5),
        ev("runtime", "cudaMemcpyAsync", 0, 5),
        ev("runtime", "cudaEventRecord", 0, 5),
        ev("runtime", "cudaStreamWaitEvent", 0, 5),
        ev("runtime", "cudaFuncSetAttribute", 0, 5),
        ev("sync", "Stream Sync", 0, 5, sync_kind="stream_sync"),
        ev("sync", "Stream Wait Event", 0, 5, sync_kind="stream_wait_event"),
        ev("cpu_op", "aten::mm", 0, 5),
    ]
    out = classify(frame(rows))
    # ≥ 1 MiB through pinned memory is offload-sized; through pageable memory, its own class
    assert out["kclass"].to_list()[:4] == ["memory.memcpy.dtoh", "memory.offload", "memory.pageable", "memory.memset"]
    assert out["rclass"].cast(pl.String).to_list()[4:] == [
        "launch", "launch", "launch", "graph_launch", "sync", "memcpy_api", "memcpy_api",
        "event_record", "stream_wait_event", "other", "sync", "sync", None,
    ]
    assert out["blocking"].to_list()[4:] == [False] * 4 + [True, True] + [False] * 4 + [True, False, False]
    assert out.height == len(rows)


def test_real_trace_nccl_counts(corpus) -> None:
    from moetune.analyzer.readers import load_trace

    ev_ = classify(load_trace([corpus / "public/kineto/hta_a100_2rank_nccl.json.gz"]).events)
    t = {r["kclass"]: r["count"] for r in class_table(ev_).to_dicts()}
    # 21 NCCL kernels (HTA's tests/test_trace_parse.py) = 15 AllReduce + 6 Broadcast; 2,700 in all
    assert (t["comm.nccl.allreduce"], t["comm.nccl.broadcast"]) == (15, 6)
    assert ev_.filter(pl.col("kind") == "kernel").height == 2700
    assert ev_.filter((pl.col("kind") == "kernel") & pl.col("kclass").is_null()).height == 0

    ev2 = classify(load_trace([corpus / "public/kineto/hta_a100_alltoall_rank3of8.json.gz"]).events)
    t2 = {r["kclass"]: r["count"] for r in class_table(ev2).to_dicts()}
    assert (t2["comm.nccl.sendrecv"], t2["comm.nccl.allreduce"]) == (42, 18)


def test_rocm_hip_kernels_are_not_communication(corpus) -> None:
    # HTA's kernel-type regexes make every ^hip kernel COMM; ours must not.
    from moetune.analyzer.readers import load_trace

    ev_ = classify(load_trace([corpus / "public/kineto/hta_mi250_minitoy.json.gz"]).events)
    k = ev_.filter(pl.col("kind") == "kernel")
    assert k.height == 14
    assert set(k["wall"].cast(pl.String)) == {"compute"}
    assert ev_.filter(pl.col("name") == "hipLaunchKernel")["rclass"].cast(pl.String).unique().to_list() == ["launch"]


def test_invalid_yaml_is_a_user_error(tmp_path) -> None:
    bad = tmp_path / "classes.yaml"
    bad.write_text("schema: moetune.kernel_classes/1\ngpu:\n  - kclass: Compute.X\n    wall: gpu\n    match: {}\nruntime: []\n")
    with pytest.raises(UserError, match="invalid kernel classes"):
        load_classes(bad)


def test_shipped_yaml_validates() -> None:
    """The shipped file passes the schema check every load_classes() runs."""
    import yaml
    from moetune.analyzer.classify import CLASSES_PATH, validate_classes

    validate_classes(yaml.safe_load(CLASSES_PATH.read_text()), CLASSES_PATH)
    cl = load_classes()
    assert "comm.deepep.dispatch" in cl.kclasses and cl.size_thresholds == [1 << 20]


def test_classify_command_names_the_entry(tmp_path) -> None:
    import json

    import jsonschema

    from tests.golden import ROOT, run_cli

    name = "ncclDevKernel_AllReduce_Sum_f32_RING_LL(ncclDevComm*)"
    code, out, _ = run_cli(["classify", name])
    c = claim(name)
    assert code == 0 and out.splitlines()[:2] == [
        name, f"  comm.nccl.allreduce (communication): classified by entry {c.entry} of gpu in "
        f"kernel_classes.yaml (line {c.line})"]
    assert "also fits, never reached: entry" in out
    code, out, _ = run_cli(["classify", "--json", "--kind", "runtime", "cudaStreamSynchronize"])
    doc = json.loads(out)
    jsonschema.validate(doc, json.loads((ROOT / "schemas/classify.schema.json").read_text()))
    assert (doc["names"][0]["class"], doc["names"][0]["blocking"]) == ("sync", True)
    bad = tmp_path / "classes.yaml"
    bad.write_text("schema: moetune.kernel_classes/1\ngpu:\n  - kclass: compute.x\n    wall: compute\n"
                   "    match: {regex: ['(']}\nruntime:\n  - rclass: other\n    match: {regex: ['.*']}\n")
    code, out, err = run_cli(["classify", "--classes", str(bad), "x"])
    assert code == 2 and out == "" and err.startswith(f"moetune: {bad}: cannot match") and err.count("\n") == 1


def test_classify_names_the_phase_signature_that_labels_a_range_or_a_kernel() -> None:
    """First fit wins in phases.yaml too: `classify` names the signature (and its line) whose
    label the work takes, and the later ones that also fit but never label it."""
    import json

    import jsonschema
    from moetune.analyzer.phases_book import load_phases, signature_lines

    from tests.golden import ROOT, run_cli

    book, lines = load_phases(), signature_lines()
    code, out, _ = run_cli(["classify", "--kind", "range", "--json", "aten::_softmax",
                            "RouterGatingLinearFunction", "no_such_range"])
    assert code == 0
    doc = json.loads(out)
    jsonschema.validate(doc, json.loads((ROOT / "schemas/classify.schema.json").read_text()))
    soft, gate, none = (n["phase"] for n in doc["names"])
    assert soft["label"] == "ambiguous" and soft["phases"] == ["attention", "router"]
    assert book.signatures[soft["signature"] - 1].phases == ("attention", "router")
    assert soft["line"] == lines[soft["signature"] - 1]
    assert gate["label"] == "definite" and gate["phases"] == ["router"]
    assert none == {"label": None, "signature": None, "line": None, "phases": [], "hidden": []}
    assert all(n["class"] is None and n["section"] is None for n in doc["names"])
    # a kernel: its class, then the phase its own kernel signature gives it
    name = "void at::native::sbtopk::gatherTopK<float, unsigned int, 2, false>"
    code, out, _ = run_cli(["classify", name])
    assert code == 0
    sig = next(i for i, s in enumerate(book.signatures) if s.kernels and
               "gatherTopK" in (s.kernels.get("match") or {}).get("contains", []))
    assert f"  phase: router, by signature {sig + 1} of phases.yaml (line {lines[sig]})" in out
    code, out, _ = run_cli(["classify", "--kind", "range", "aten::layer_norm"])
    assert out.splitlines()[1].startswith("  phase: none; starts a block of the layer pass")
