"""The phase table (analyzer/phases*.py, analyzer/phases.yaml) on real traces: it tiles the step,
agrees with the walls, finds each MoE phase of every Megatron-Core trace, and matches a hand check.

The hand check (tests/hand_phases.py says how it was made) labels the forward pass of two real
H200 Megatron-Core traces by a rule read from Megatron-Core's MoE code, with the standard library
alone; the phase table's forward GPU time per MoE phase must match it.
"""

from __future__ import annotations

import gzip
import json
import shutil
from pathlib import Path

import jsonschema
import polars as pl
import pytest
import yaml
from moetune.analyzer.classify import load_classes
from moetune.analyzer.phases_book import (
    PHASES_PATH,
    claim_kernel,
    claim_range,
    kernel_labels,
    load_phases,
    range_labels,
    validate_phases,
)
from moetune.analyzer.phases_sequence import _Run, resolve_stream

from moetune.analysis import analyze
from moetune.errors import UserError
from tests.hand_phases import forward_phase_ms

ROOT = Path(__file__).resolve().parents[1]
TRACES = ROOT / "fixtures" / "traces"
NSYS = ROOT / "fixtures" / "nsys"
SCHEMA = json.loads((ROOT / "schemas" / "diagnosis.schema.json").read_text())
MOE = ("router", "permute", "dispatch", "experts", "combine", "unpermute")
# Megatron-Core traces with MoE layers: every GPU trace the project made with Megatron-Core, and
# NVIDIA Megatron-LM's own pretrain_gpt.py runs (mlm_*)
MCORE = sorted([d.name for d in TRACES.iterdir() if d.name.startswith(("gpu_mcore_", "gpu_tune_",
                                                                        "gpu_workload_", "grid_",
                                                                        "gpu_ep2_", "mlm_"))])
# traces whose MoE layers run under CUDA graphs (local graphs of the router and preprocess
# scopes): the graphed work has no host ops, and at EP 1 the token all-to-all launches nothing
GRAPHED = {"grid_host_mbs8_grp_rcnone_a2a_local_droppad": ("dispatch", "combine")}


def _diagnose(path: Path | str, **kw: object) -> dict:
    doc = analyze([str(path)], audit=False, **kw).diagnosis
    jsonschema.validate(doc, SCHEMA)
    return doc


def _input(name: str) -> Path:
    d = TRACES / name
    return d / "trace.json.gz" if (d / "trace.json.gz").exists() else d


@pytest.fixture(scope="module")
def mcore_docs() -> dict[str, dict]:
    return {n: _diagnose(_input(n)) for n in MCORE}


# ----------------------------------------------------------------------------- the data


def test_shipped_phases_validate_and_name_real_kernel_classes() -> None:
    doc = yaml.safe_load(PHASES_PATH.read_text())
    validate_phases(doc, PHASES_PATH)  # as every load does (load_phases, below)
    known = set(load_classes().kclasses)
    named = {k for s in doc["signatures"] for k in (s.get("kernels") or {}).get("kclass", [])}
    assert named <= known, f"kernel classes not in kernel_classes.yaml: {sorted(named - known)}"
    book = load_phases()
    assert book.names[:2] == ("embedding", "attention") and "experts" in book.names
    # every regex is in the common subset of Python's re (the labels) and Rust's regex (the
    # kernel classes' syntax, which a reader of both files expects): both compile it
    import re
    pats = [r for s in doc["signatures"] for part in (s.get("ranges") or {}, (s.get("kernels") or {})
            .get("match") or {}) for r in part.get("regex", [])] + doc["layers"]["regex"]
    for r in pats:
        re.compile(r)
    pl.DataFrame({"name": ["x"]}).select([pl.col("name").str.contains(r) for r in pats[:1]]
                                         + [pl.col("name").str.contains(r).alias(str(i))
                                            for i, r in enumerate(pats)])


def test_targets_name_knobs_and_recommend_says_the_phase() -> None:
    """Every knob a phase target names is in the knob catalog; a recommendation of one gives the
    targeted phase's time now and after (tests/test_rules_catalog.py runs the fixtures)."""
    from moetune.rules.engine import recommend
    from moetune.rules.load import load_rules

    from fixtures.diagnoses import load
    from moetune.knobs import load as load_knobs

    assert set(load_phases().targets) <= set(load_knobs().knobs)
    s = load("slow_expert_gemms")
    doc = recommend(load_rules(), s["diagnosis"], s["contract"], s.get("audit"))
    rec = next(r for r in doc["recommendations"] if r["rule"] == "compute.grouped-gemm")
    (row,) = rec["targets"]["phases"]
    assert row["phase"] == "experts" and row["now_s"] == 0.18
    saving = rec["gain"]["step_time_s"]["before"] * (1 - 1 / (1 + rec["gain"]["speedup"]["mid"]))
    assert row["predicted_s"] == pytest.approx(0.18 - saving, abs=1e-6)


def test_a_bad_user_phase_file_is_one_line(tmp_path: Path) -> None:
    bad = tmp_path / "phases.yaml"
    doc = yaml.safe_load(PHASES_PATH.read_text())
    doc["signatures"][0]["phases"] = ["no_such_phase"]
    bad.write_text(yaml.safe_dump(doc))
    with pytest.raises(UserError, match="not in the vocabulary"):
        load_phases(bad)
    doc["phases"][0]["part"] = "nowhere"
    bad.write_text(yaml.safe_dump(doc))
    with pytest.raises(UserError, match="invalid phases at phases/0/part"):
        load_phases(bad)


# One example per signature of analyzer/phases.yaml that it must be the one to label (first fit
# wins; `moetune classify NAME [--kind range]` says which signature does): host ranges as
# Megatron-Core (d98e8a6), Transformer Engine and PyTorch name them, kernels as the H200 traces
# under fixtures/traces/ name them. (kind, name, the phases of the signature that labels it)
SIGNATURE_EXAMPLES: list[tuple[str, str, tuple[str, ...]]] = [
    ("range", "megatron.core.transformer.transformer_layer._forward_attention.self_attention",
     ("attention",)),
    ("range", "delayed_expert_wgrad", ("experts",)),
    ("range", "megatron.core.transformer.transformer_layer._forward_mlp.mlp",
     ("dense_mlp", "shared_experts", "router", "permute", "dispatch", "experts", "combine",
      "unpermute")),
    ("range", "megatron.core.transformer.mlp.forward.linear_fc1",
     ("dense_mlp", "shared_experts", "experts")),
    ("range", "Optimizer.step#FusedAdam.step", ("optimizer",)),
    ("range", "/opt/megatron-lm/megatron/core/distributed/distributed_data_parallel.py(388): "
     "finish_grad_sync", ("grad_reduce",)),
    ("kernel", "void at::native::(anonymous namespace)::multi_tensor_apply_kernel<at::native::"
     "(anonymous namespace)::TensorListMetadata<1>, at::native::(anonymous namespace)::ZeroFunctor"
     "<c10::BFloat16, 1, 1, 0>>(at::native::(anonymous namespace)::TensorListMetadata<1>, "
     "at::native::(anonymous namespace)::ZeroFunctor<c10::BFloat16, 1, 1, 0>)", ("optimizer",)),
    ("range", "MoEAuxLossAutoScaler", ("router",)),
    ("range", "RouterGatingLinearFunction", ("router",)),
    ("range", "_moe_permute_mask_map", ("permute",)),
    ("range", "ScatterAddBackward0", ("unpermute",)),
    ("range", "FusedDispatch", ("dispatch",)),
    ("range", "FusedCombine", ("combine",)),
    ("range", "aten::_grouped_mm", ("experts",)),
    ("range", "nn.Module: SharedExpertMLP_0", ("shared_experts",)),
    ("range", "_AllToAll", ("dispatch", "combine")),
    ("range", "aten::split_with_sizes", ("dispatch", "combine")),
    ("range", "aten::scaled_dot_product_attention", ("attention",)),
    ("range", "aten::embedding", ("embedding",)),
    ("range", "_VocabParallelCrossEntropy", ("loss",)),
    ("range", "aten::bmm", ("attention",)),
    ("range", "aten::_softmax", ("attention", "router")),
    ("range", "aten::argsort", ("permute", "embedding")),
    ("kernel", "void at::native::bitonicSortKVInPlace<2, -1, 16, 16, c10::BFloat16, long, "
     "at::native::GTOp<c10::BFloat16, true>, unsigned int>(at::cuda::detail::TensorInfo<c10::"
     "BFloat16, unsigned int>, unsigned int, unsigned int, unsigned int, at::cuda::detail::"
     "TensorInfo<long, unsigned int>, unsigned int, at::native::GTOp<c10::BFloat16, true>)",
     ("router", "permute", "embedding")),
    ("range", "aten::scatter_add_", ("permute", "unpermute")),
    ("kernel", "_row_id_map_pass_1_kernel", ("permute", "unpermute")),
    ("range", "aten::silu", ("dense_mlp", "shared_experts", "experts")),
    ("range", "LinearWithGradAccumulationAndAsyncCommunication",
     ("attention", "dense_mlp", "shared_experts", "experts", "loss")),
    ("range", "_LayerNormLinear", ("attention", "dense_mlp", "shared_experts", "experts", "loss")),
    ("range", "_LayerNormMLP", ("dense_mlp", "shared_experts")),
    ("range", "aten::layer_norm", ()),
]


def _kclass(name: str) -> str | None:
    from moetune.analyzer.classify import claim

    return claim(name).label


def test_every_signature_labels_an_example_of_its_own() -> None:
    """First fit wins: a signature an earlier one shadows labels nothing. Each must be the one
    that labels an example, and the labelling the diagnosis does must take the same one."""
    book = load_phases()
    claimed = set()
    for kind, name, phases in SIGNATURE_EXAMPLES:
        if kind == "range":
            got = claim_range(name, book)
            d, a = range_labels([name], book)[name][:2]
        else:
            got = claim_kernel(_kclass(name), name, None, book)
            ((d, a, _),) = kernel_labels([(_kclass(name), name, None)], book).values()
        i = got.claimant
        assert i is not None and book.signatures[i].phases == phases, (
            f"{name!r}: labelled by signature {None if i is None else i + 1} "
            f"{None if i is None else book.signatures[i].phases}, not one of {phases}")
        assert (d, a) == tuple(-1 if x is None else x for x in (got.definite, got.ambiguous)), name
        claimed.add(i)
    missing = [i + 1 for i in range(len(book.signatures)) if i not in claimed]
    assert not missing, (f"signature(s) {missing} of analyzer/phases.yaml label no example of "
                         "SIGNATURE_EXAMPLES: add one (or an earlier signature claims its names)")


# ----------------------------------------------------------------------------- the table


def _check_tiles(doc: dict) -> None:
    ph = doc["phases"]
    total = sum(r["step_s"] for r in ph["rows"])
    assert total == pytest.approx(doc["step_time_s"], rel=0.02)
    assert sum(r["share"] for r in ph["rows"]) == pytest.approx(1.0, abs=0.02)
    # the exposed times are the walls' exposed times, the waits the walls' host idle
    wd = doc["wall_detail"]
    busy = wd["compute"]["exposed_s"] + wd["communication"]["exposed_s"] + wd["memory"]["exposed_s"]
    assert sum(r["exposed_s"] for r in ph["rows"]) == pytest.approx(busy, rel=0.01, abs=2e-6)
    assert sum(r["idle_s"] for r in ph["rows"]) == pytest.approx(wd["host"]["exposed_s"], rel=0.01,
                                                                 abs=2e-6)
    for r in ph["rows"]:
        assert r["hidden_s"] <= r["busy_s"] + 1e-9
        split = r["forward_s"] + r["backward_s"] + r["recompute_s"]
        assert split <= r["step_s"] + 2e-6


def test_every_megatron_core_trace_tiles_and_finds_each_moe_phase(mcore_docs: dict[str, dict]) -> None:
    for name, doc in mcore_docs.items():
        _check_tiles(doc)
        found = {r["phase"] for r in doc["phases"]["rows"]}
        missing = set(MOE) - found
        assert missing == set(GRAPHED.get(name, ())), (name, sorted(missing))
        assert set(doc["phases"]["not_found"]) >= missing
        assert doc["phases"]["layers"]["distinguishable"], (name, doc["phases"]["layers"])


def test_layers_are_counted_and_sum_to_their_phases(mcore_docs: dict[str, dict]) -> None:
    doc = mcore_docs["gpu_mcore_recompute_full"]  # 4 layers, full recompute of each
    ph = doc["phases"]
    assert ph["layers"] == {"distinguishable": True, "source": "sequence", "count": 4, "why": None}
    assert sorted({r["layer"] for r in ph["by_layer"]}) == [1, 2, 3, 4]
    for row in ph["rows"]:
        layered = [r["step_s"] for r in ph["by_layer"] if r["phase"] == row["phase"]]
        if row["phase"] in MOE:  # MoE work is all inside the layers
            assert sum(layered) == pytest.approx(row["step_s"], rel=1e-3, abs=2e-6)
    # recompute is found and charged to the layers it re-runs
    rc = [r for r in ph["by_layer"] if r["recompute_s"] > 0]
    assert {r["layer"] for r in rc} == {1, 2, 3, 4}


def test_dispatch_at_ep1_is_a_host_only_phase(mcore_docs: dict[str, dict]) -> None:
    """At EP 1 the all-to-all launches nothing: the phase is there by its host scope, with no
    kernels of its own but the chunk sort after it."""
    rows = {r["phase"]: r for r in mcore_docs["gpu_mcore_hostbound"]["phases"]["rows"]}
    assert rows["dispatch"]["host_s"] > 0 and rows["combine"]["host_s"] > 0


@pytest.mark.parametrize(("name", "step"), [("grid_host_mbs8_grp_rcnone_a2a_eager", 11),
                                            ("gpu_mcore_computebound", 4)])
def test_moe_phases_match_the_hand_check(name: str, step: int, mcore_docs: dict[str, dict]) -> None:
    hand = forward_phase_ms(str(TRACES / name / "trace.json.gz"), step)
    doc = mcore_docs[name]
    assert doc["median_step_by_rank"] == {"0": step}
    rows = {r["phase"]: r for r in doc["phases"]["rows"]}
    st = doc["step_time_s"] * 1e3
    for phase in MOE:
        ours = rows[phase]["busy_by_direction_s"]["forward"] * 1e3
        assert abs(ours - hand[phase]) <= max(0.001 * st, 0.10 * hand[phase]), (phase, ours, hand)


def test_ep2_ranks_break_down_and_name_the_slowest_phase(mcore_docs: dict[str, dict]) -> None:
    doc = mcore_docs["gpu_ep2_alltoall_overlap"]
    rb = doc["rank_breakdown"]
    assert [r["rank"] for r in rb["ranks"]] == [0, 1]
    for r in rb["ranks"]:
        parts = r["compute_s"] + r["communication_s"] + r["memory_s"] + r["host_s"] + r["idle_s"]
        assert parts == pytest.approx(r["step_s"], rel=0.01)
        assert sum(r["phases"].values()) == pytest.approx(r["step_s"], rel=0.01)
    slow = rb["slowest"]
    assert slow["rank"] == max(rb["ranks"], key=lambda r: r["step_s"])["rank"]
    assert slow["phase"] in {p for r in rb["ranks"] for p in r["phases"]}
    # the token all-to-all is NCCL on the EP group: its kernels label dispatch and combine
    rows = {r["phase"]: r for r in doc["phases"]["rows"]}
    assert rows["dispatch"]["busy_s"] > 0 and rows["combine"]["busy_s"] > 0
    assert rows["grad_reduce"]["busy_s"] > 0


def test_nsys_export_without_nvtx_reads_the_layer_by_its_kernels(tmp_path: Path) -> None:
    """The same Megatron-Core model in an nsys export with no NVTX and no PyTorch ops: the
    kernels alone give attention, router, permute, experts and unpermute and the 4 layers; the
    all-to-all at EP 1 left no trace at all, so dispatch and combine are said not to be seen."""
    db = tmp_path / "h.sqlite"
    with gzip.open(NSYS / "h200_mcore_hostbound_node.sqlite.gz") as src, db.open("wb") as dst:
        shutil.copyfileobj(src, dst)
    doc = _diagnose(db)
    _check_tiles(doc)
    found = {r["phase"] for r in doc["phases"]["rows"]}
    assert {"attention", "router", "permute", "experts", "unpermute"} <= found
    assert {"dispatch", "combine"} <= set(doc["phases"]["not_found"])
    assert doc["phases"]["layers"]["count"] == 4
    assert {r["source"] for r in doc["phases"]["rows"]} <= {"kernel", "sequence", "gap", None}
    # the optimizer's kernels (compute.optimizer) are the optimizer's, not the last expert GEMMs'
    opt = next(r for r in doc["phases"]["rows"] if r["phase"] == "optimizer")
    assert opt["source"] == "kernel" and opt["kernels"] > 0 and opt["step_s"] > 0.003
    # ...and it runs outside every layer: no layer's row holds it (layer 4 once did, 3.6 ms)
    in_layers = {"attention", "dense_mlp", "shared_experts", "router", "permute", "dispatch",
                 "experts", "combine", "unpermute"}
    assert {r["phase"] for r in doc["phases"]["by_layer"]} <= in_layers


@pytest.mark.corpus
def test_public_corpus_tiles_the_step(corpus: Path) -> None:
    public = corpus / "public"
    files = sorted(p for p in public.glob("*/*") if p.suffix in (".gz", ".sqlite")
                   and "cpu_only" not in p.name)
    if not files:
        pytest.skip("public corpus not present")
    for f in files:
        doc = _diagnose(f)
        _check_tiles(doc)
    # with_stack: the Python frames and modules label the phases and number the layers
    doc = _diagnose(public / "kineto" / "tracelens_h100_qwen05b_inference.json.gz")
    ph = doc["phases"]
    assert ph["layers"] == {"distinguishable": True, "source": "stack", "count": 24, "why": None}
    rows = {r["phase"]: r for r in ph["rows"]}
    assert rows["attention"]["sources"].get("stack", 0) > 0.5
    assert rows["attention"]["share"] + rows["dense_mlp"]["share"] > 0.9


# ----------------------------------------------------------------------------- the grammar


def _runs(spec: list[tuple[str | None, tuple[str, ...] | None, bool]]) -> list[_Run]:
    return [_Run(i, i + 1, d, c, False, False, i if b else None, "scope" if d else None)
            for i, (d, c, b) in enumerate(spec)]


LINEAR = ("attention", "dense_mlp", "shared_experts", "experts", "loss")
ACT = ("dense_mlp", "shared_experts", "experts")
A2A = ("dispatch", "combine")


def test_grammar_reads_a_moe_layer_with_shared_experts_and_a_dense_layer() -> None:
    book = load_phases()
    runs = _runs([
        ("embedding", None, True),
        (None, None, True), (None, LINEAR, False), ("attention", None, False), (None, LINEAR, False),
        # MoE block: norm, shared expert (GEMM, activation, GEMM), router, permute, a2a,
        # expert GEMMs, a2a, unpermute
        (None, None, True), (None, LINEAR, False), (None, ACT, False), (None, LINEAR, False),
        ("router", None, False), (None, ("permute", "embedding"), False), (None, A2A, False),
        (None, LINEAR, False), (None, ACT, False), (None, LINEAR, False), (None, A2A, False),
        (None, ("permute", "unpermute"), False),
        # layer 2: attention, then a dense MLP
        (None, None, True), (None, LINEAR, False), ("attention", None, False),
        (None, None, True), (None, LINEAR, False), (None, ACT, False), (None, LINEAR, False),
    ])
    assert resolve_stream(runs, book) == [2]
    got = [r.phase for r in runs]
    assert got == ["embedding",
                   "attention", "attention", "attention", "attention",
                   "attention", "shared_experts", "shared_experts", "shared_experts",
                   "router", "permute", "dispatch", "experts", "experts", "experts", "combine",
                   "unpermute",
                   "attention", "attention", "attention",
                   "attention", "dense_mlp", "dense_mlp", "dense_mlp"]
    assert [r.layer for r in runs[1:17]] == [1] * 16 and {r.layer for r in runs[17:]} == {2}


def test_grammar_without_shared_experts_gives_the_first_gemm_to_the_router() -> None:
    runs = _runs([(None, None, True), (None, LINEAR, False), ("router", None, False),
                  (None, A2A, False), (None, LINEAR, False), (None, A2A, False)])
    resolve_stream(runs, load_phases())
    assert [r.phase for r in runs] == ["router", "router", "router", "dispatch", "experts",
                                       "combine"]


def test_many_ranks_path_gives_the_same_rank_breakdown(tmp_path: Path,
                                                       mcore_docs: dict[str, dict]) -> None:
    """The Dask path's summaries (rank_summary's `phases` table) give each rank the breakdown
    the one-process diagnosis gives it."""
    from moetune import scale

    d = TRACES / "gpu_ep2_alltoall_overlap"
    an, _ = scale.diagnose_many([d], scale.ScaleOptions(cache=tmp_path, progress=False))
    many = an.diagnosis["rank_breakdown"]
    one = mcore_docs["gpu_ep2_alltoall_overlap"]["rank_breakdown"]
    assert [r["rank"] for r in many["ranks"]] == [r["rank"] for r in one["ranks"]]
    for x, y in zip(many["ranks"], one["ranks"], strict=True):
        assert x["step_s"] == pytest.approx(y["step_s"], abs=2e-6)
        assert x["phases"] == pytest.approx(y["phases"], abs=2e-6)
    assert many["slowest"]["rank"] == one["slowest"]["rank"]


def test_megatron_nvtx_ranges_label_their_work() -> None:
    """An nsys export of a run with Megatron's --nvtx-ranges (names as megatron/core/utils.py
    nvtx_range_push writes them) around the launches: the ranges name the phase, source nvtx."""
    from moetune.analyzer.frames import EVENTS_SCHEMA, conform
    from moetune.analyzer.phases_sequence import label_items

    ms = 1_000_000
    rows = []
    names = [("megatron.core.transformer.transformer_layer._forward_attention.self_attention",
              "ampere_bf16_s16816gemm_bf16_128x128_ldg8_f2f_stages_64x3_tn"),
             ("megatron.core.transformer.moe.moe_layer.forward", "void at::native::sbtopk::gatherTopK<float>"),
             ("megatron.core.transformer.transformer_layer._forward_mlp.mlp",
              "void at::native::vectorized_elementwise_kernel<4, at::native::FillFunctor<float>>")]
    for i, (rng, kern) in enumerate(names):
        t0 = i * 10 * ms
        rows += [
            {"rank": 0, "kind": "annotation", "name": rng, "ts_ns": t0, "dur_ns": 5 * ms, "pid": 1, "tid": 1},
            {"rank": 0, "kind": "runtime", "name": "cudaLaunchKernel", "ts_ns": t0 + ms, "dur_ns": 10_000,
             "pid": 1, "tid": 1, "correlation": i + 1},
            {"rank": 0, "kind": "kernel", "name": kern, "ts_ns": t0 + 2 * ms, "dur_ns": ms, "pid": 0,
             "tid": 7, "device": 0, "stream": 7, "correlation": i + 1},
        ]
    ev = conform(pl.DataFrame(rows), EVENTS_SCHEMA)
    from moetune.analyzer.classify import classify

    ev = classify(ev)
    win = pl.DataFrame({"rank": [0], "step": [1], "start_ns": [0], "end_ns": [30 * ms],
                        "win_start_ns": [0], "win_end_ns": [30 * ms]},
                       schema_overrides={"rank": pl.Int32})
    lab = label_items(ev, win, book=load_phases(), classes=load_classes(),
                      comms=pl.DataFrame(schema={"rank": pl.Int32, "correlation": pl.Int64,
                                                 "pg_desc": pl.String}),
                      recompute=None, formats={0: "nsys"})
    got = dict(lab.items.filter(pl.col("item") == "gpu").select("name", "phase").iter_rows())
    src = dict(lab.items.filter(pl.col("item") == "gpu").select("name", "source").iter_rows())
    gemm, topk, fill = (k for _, k in names)
    assert got[gemm] == "attention" and src[gemm] == "nvtx"
    assert got[topk] == "router" and src[topk] == "kernel"
    assert got[fill] == "router"  # unlabelled work after the router, inside the MLP range
