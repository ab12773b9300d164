"""The one memory verdict (analyzer/planner/verdict.py) and what the engine does with it: a change
that does not fit is never ranked, rules use the prediction instead of shares of the GPU, a gate is
judged by what it unlocks, the offload ladder runs both ways; terminal, JSON and page print the
same words.

Inputs: the H200 grid (bench/grid/grid_h200.json: every point that ran and the one that ran out of
memory), the grid's real traces and logs, the issue's out-of-memory case rebuilt on a real trace
(its model and its log's memory line), and the constructed pageable-offload trace of
tests/test_copies.py."""

from __future__ import annotations

import copy
import json
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from moetune.analyzer.planner.verdict import describe, judge
from moetune.executor.logparse import parse_text
from moetune.rules.engine import recommend
from moetune.rules.load import load_rules

from moetune.analysis import Reference, analyze, apply_reference
from tests.test_copies import _offload_trace
from tests.test_memory_prediction import MEM

ROOT = Path(__file__).resolve().parents[1]
TRACES = ROOT / "fixtures" / "traces"
GRID = ROOT / "bench" / "grid" / "grid_h200.json"
RULES = load_rules()
H200 = 139.8


def log_line(alloc_mb: float, reserved_mb: float, it: int = 2) -> Reference:
    """A Megatron memory report line as the run's log prints it."""
    text = (f"[Rank 0] (after {it} iterations) memory (MB) | allocated: {alloc_mb * 0.6:.2f} | "
            f"max allocated: {alloc_mb:.2f} | reserved: {reserved_mb:.2f} | max reserved: "
            f"{reserved_mb:.2f}\n")
    return Reference(log_memory=parse_text(text).memory)


# ----------------------------------------------------------------------------- the issue's case


def issue_contract() -> dict[str, Any]:
    """The issue's model (8 layers, hidden 4096, 8 experts top-2, seq 4096, MBS 1, full recompute;
    Megatron-LM without Transformer Engine, local spec, bf16, Adam with fp32 main params, Megatron
    defaults elsewhere: 32 heads, tied embeddings, LayerNorm, dropout 0.1, vocab 32768). The expert
    FFN is not stated: 3200 puts the model's own MBS 1 peak at the 63.6 GiB the log measured."""
    return {
        "schema": "moetune.contract/1",
        "model": {"num_layers": 8, "hidden_size": 4096, "ffn_hidden_size": 3200,
                  "num_attention_heads": 32, "num_query_groups": 32, "num_experts": 8,
                  "moe_router_topk": 2, "moe_ffn_hidden_size": 3200, "moe_layer_freq": 1,
                  "vocab_size": 32768, "padded_vocab_size": 32768, "swiglu": True,
                  "untie_embeddings_and_output_weights": False, "normalization": "LayerNorm"},
        "hardware": {"gpu_model": "H200", "gpu_memory_gb": 141, "gpus_per_node": 1, "nodes": 1},
        "precision": {"params": "bf16"},
        "shape": {"seq_length": 4096, "micro_batch_size": 1, "global_batch_size": 8},
        "parallelism": {"tp": 1, "pp": 1, "cp": 1, "ep": 1, "dp": 1, "world_size": 1},
        "versions": {"transformer_engine": None},
        "megatron_args": {"transformer_impl": "local", "attention_dropout": 0.1,
                          "use_distributed_optimizer": False, "micro_batch_size": 1,
                          "global_batch_size": 8, "recompute_granularity": "full",
                          "recompute_method": "uniform", "recompute_num_layers": 1,
                          "moe_grouped_gemm": False},
    }


def test_the_issue_case_mbs8_does_not_fit_and_a_step_that_fits_is_taken() -> None:
    """`recommend --log` put MBS 8 first with `peak 130.0 GiB of 139.8, fits: true`; on the H200
    it ran out of memory (16 GiB asked, 11 GiB free). Its log: 63.6 GiB max allocated, 73.9 GiB max
    reserved. The same 130 GiB allocated, with this run's 10.3 GiB of allocator slack kept, is
    over the GPU even at the low end: MBS 8 does not fit and is never ranked; the micro-batch step
    taken is the largest that fits. Rebuilt on the grid's real MBS 1 full-recompute per-expert
    trace (its timeline gives the what-if steps)."""
    con = issue_contract()
    mbs8 = judge(con, {"micro_batch_size": 8},
                 {"source": "log", "peak_allocated_gib": 63.6, "peak_reserved_gib": 73.9,
                  "device_gib": H200})
    assert mbs8.verdict == "does not fit"
    assert 125 < mbs8.allocated_gib < 135  # what the old figure said: the verdict is new
    assert mbs8.reserved_gib[0] + mbs8.context_gib > H200
    folder = TRACES / "grid_host_mbs1_seq_rcfull_a2a_eager"
    diag = analyze(folder / "trace.json.gz").diagnosis
    diag["memory"] = {"source": "none", "device_gib": H200}
    apply_reference(diag, log_line(63.6 * 1024, 73.9 * 1024))
    assert diag["memory"]["source"] == "log"
    doc = recommend(RULES, diag, con, None)
    mbs = next(r for r in doc["recommendations"] if r["rule"] == "host.larger-micro-batch")
    assert mbs["change"]["to"] in (2, 4) and mbs["memory"]["verdict"] == "fits"
    assert all(r["memory"] is None or r["memory"]["verdict"] != "does not fit"
               for r in doc["recommendations"])
    off = next(r for r in doc["recommendations"] if r["rule"] == "memory.recompute-off")
    assert off["memory"]["verdict"] == "fits" and off["memory"]["evidence"] == "log"


# ----------------------------------------------------------------------------- the H200 grid


def grid_pairs() -> list[tuple[str, dict, dict, Any]]:
    """Every ordered pair of grid points (eager) one micro-batch or recompute step apart, with the
    verdict of going from the first to the second on the first one's measured peak."""
    grid = json.loads(GRID.read_text())
    out = []
    for shape, spec in grid["shapes"].items():
        flags = spec["flags"]
        given = {flags[i].lstrip("-").replace("-", "_"): int(flags[i + 1])
                 for i in range(0, len(flags), 2)}
        doc = copy.deepcopy(MEM)
        for k in ("num_layers", "hidden_size", "ffn_hidden_size", "num_attention_heads",
                  "num_experts", "moe_router_topk", "moe_ffn_hidden_size", "vocab_size"):
            doc["model"][k] = given[k]
        doc["model"]["num_query_groups"] = given["num_attention_heads"]
        doc["model"]["padded_vocab_size"] = given["vocab_size"]
        doc["shape"]["seq_length"] = given["seq_length"]

        def conf(k: dict, given: dict = given) -> dict:
            return {"micro_batch_size": k["mbs"], "global_batch_size": given["global_batch_size"],
                    "recompute_granularity": None if k["recompute"] == "none" else k["recompute"],
                    "moe_grouped_gemm": k["grouped"],
                    "moe_token_dispatcher_type": k["dispatcher"]}

        pts = [p for p in spec["points"] if p["status"] in ("ok", "oom")
               and p["knobs"]["graphs"] == "eager"]
        for a in (p for p in pts if p["status"] == "ok"):
            for b in pts:
                diff = [k for k in a["knobs"] if a["knobs"][k] != b["knobs"][k]]
                if a is b or len(diff) != 1 or diff[0] not in ("mbs", "recompute"):
                    continue
                ca = copy.deepcopy(doc)
                for k, v in conf(a["knobs"]).items():
                    ca["megatron_args"][k] = v
                    if k in ca["shape"]:
                        ca["shape"][k] = v
                changes = {k: v for k, v in conf(b["knobs"]).items() if conf(a["knobs"])[k] != v}
                mem = {"source": "log", "peak_allocated_gib": a["max_alloc_gib"],
                       "peak_reserved_gib": a["max_reserved_gib"], "device_gib": H200}
                out.append((shape, a, b, judge(ca, changes, mem)))
    return out


def test_grid_every_point_that_ran_is_not_ruled_out_and_the_oom_point_is() -> None:
    """54 one-step moves between grid points that ran: none `does not fit` (53 fit, recompute off
    at mem MBS 4 is `tight`: 124.8 GiB reserved measured); the two moves into mem MBS 8 without
    recompute, which ran out of memory, `does not fit`."""
    pairs = grid_pairs()
    ran = [(a, b, v) for _, a, b, v in pairs if b["status"] == "ok"]
    oom = [(a, b, v) for _, a, b, v in pairs if b["status"] == "oom"]
    assert len(ran) == 54 and len(oom) == 2
    assert all(v.verdict in ("fits", "tight") for _, _, v in ran)
    assert [b["id"] for _, b, v in ran if v.verdict == "tight"] == ["mbs4_seq_rcnone_a2a_eager"]
    assert all(v.verdict == "does not fit" for _, _, v in oom)
    # on the memory-bound shape, for every move that grows memory, the measured reserved peak
    # is at most the range's high end plus the margin (one is above the high end by 3.8 GiB)
    grow = [(b, v) for s, a, b, v in pairs if s == "mem" and b["status"] == "ok"
            and b["max_alloc_gib"] > a["max_alloc_gib"]]
    assert len(grow) == 7
    assert all(b["max_reserved_gib"] <= v.reserved_gib[1] + v.margin * H200 for b, v in grow)
    assert sum(b["max_reserved_gib"] <= v.reserved_gib[1] for b, v in grow) == 6


def test_verdict_edges() -> None:
    con = copy.deepcopy(MEM)
    # the model alone: ± its error; a model that prices the run as given over the GPU it ran
    # on is not believed
    alone = judge(con, {"micro_batch_size": 2}, {"device_gib": H200})
    assert alone.evidence == "model" and alone.verdict == "fits"
    assert alone.reserved_gib[0] == pytest.approx(alone.allocated_gib * 0.85, abs=0.02)
    small = judge(con, {"micro_batch_size": 2}, {"device_gib": 40.0})
    assert small.verdict == "unknown" and "over the 40.0 GiB GPU it ran on" in small.why
    # no GPU size anywhere: unknown, with the prediction still shown
    nohw = copy.deepcopy(con)
    del nohw["hardware"]
    v = judge(nohw, {"micro_batch_size": 2}, {"source": "log", "peak_allocated_gib": 48.0,
                                               "peak_reserved_gib": 50.0})
    assert v.verdict == "unknown" and v.allocated_gib is not None
    # the driver's reserved only (nsys): the reserved peak is the anchor
    r = judge(con, {"micro_batch_size": 2}, {"source": "cuda_memory_usage",
                                              "peak_reserved_gib": 50.0, "device_gib": H200})
    assert r.allocated_gib is None and r.reserved_gib[0] > 50.0 and "reserved" in r.basis
    # turning expandable segments on keeps little slack
    meas = {"source": "log", "peak_allocated_gib": 48.0, "peak_reserved_gib": 58.0,
            "device_gib": H200}
    plain = judge(con, {"micro_batch_size": 2}, meas)
    exp = judge(con, {"micro_batch_size": 2,
                      "PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True"}, meas)
    assert exp.reserved_gib[0] < plain.reserved_gib[0] and "expandable" in exp.why
    # an unreadable model: unknown, saying why
    bad = copy.deepcopy(con)
    del bad["model"]["hidden_size"]
    assert "model.hidden_size" in judge(bad, {"micro_batch_size": 2}, meas).why


def test_the_loop_orders_by_the_verdict() -> None:
    from moetune.executor.loop import candidate_changes

    from moetune.analysis import Recommendation

    def rec(rule: str, knob: str, to: Any, mid: float, verdict: str | None) -> Recommendation:
        mem = None if verdict is None else {"verdict": verdict,
                                            "fits": verdict != "does not fit"}
        return Recommendation.from_entry({"rule": rule, "wall": "host", "change": {
            "knob": knob, "to": to}, "gain": {"speedup": {"mid": mid}}, "memory": mem})

    out = candidate_changes([rec("a", "micro_batch_size", 8, 3.0, "does not fit"),
                             rec("b", "recompute_granularity", None, 0.4, "tight"),
                             rec("c", "manual_gc", True, 0.1, None)], [])
    assert [c["source"] for c in out] == ["b", "c", "a"]


# ----------------------------------------------------------------------------- gates


def _mem_cli(*extra: str, json_out: bool = True) -> Any:
    folder = TRACES / "grid_mem_mbs4_seq_rcfull_a2a_eager"
    contract = Path(__file__).parent / "_mem_contract.yaml"
    out = subprocess.run([sys.executable, "-m", "moetune", "contract", "from-log",
                          str(folder / "train.log")], capture_output=True, text=True,
                         timeout=300, check=True).stdout
    contract.write_text(out)
    try:
        args = [sys.executable, "-m", "moetune", *extra, str(folder / "trace.json.gz"),
                "--contract", str(contract), "--log", str(folder / "train.log")]
        p = subprocess.run(args + (["--json"] if json_out else []), capture_output=True,
                           text=True, timeout=600, check=True)
        return json.loads(p.stdout) if json_out else p.stdout
    finally:
        contract.unlink()


def test_a_gate_shows_what_it_unlocks_everywhere(tmp_path: Path) -> None:
    """Expandable segments on the grid's memory-bound MBS 4 full-recompute run (no Transformer
    Engine): alone +0 %, it is shown with the change it unlocks in the same call (selective
    recompute of the unfused attention scores, which needs it), that change's gain and memory
    verdict; terminal, JSON and page say the same."""
    doc = _mem_cli("recommend")
    gate = next(r for r in doc["recommendations"] if r["rule"] == "memory.expandable-segments")
    assert gate["gate"] is True and gate["gain"]["speedup"]["high"] == 0
    (u,) = gate["unlocks"]
    assert u["rule"] == "memory.selective-recompute-core-attn"
    assert u["megatron_flags"] == ["--recompute-granularity selective",
                                   "--recompute-modules core_attn"]
    assert u["memory"]["verdict"] == "fits" and u["gain"]["speedup"]["low"] > 0
    # replayed (analyzer/whatif.yaml recompute_core_attn): ranked by its own midpoint
    assert u["gain"]["recoverable_from"] == "whatif.recompute_core_attn"
    assert gate["score"] == pytest.approx(u["gain"]["speedup"]["mid"], rel=1e-3)
    off = next(r for r in doc["recommendations"] if r["rule"] == "memory.recompute-off")
    assert off["memory"]["verdict"] == "tight"  # 124.8 GiB reserved measured at the point
    text = _mem_cli("recommend", json_out=False)
    head, _basis = describe(u["memory"])
    assert f"  memory: {head}" in text
    assert "unlocks: memory.selective-recompute-core-attn (recompute_granularity → selective)" \
        in text
    oh, ob = describe(off["memory"])
    assert f"memory: {oh}" in text and f"  basis: {ob}" in text
    folder = TRACES / "grid_mem_mbs4_seq_rcfull_a2a_eager"
    contract = tmp_path / "c.yaml"
    contract.write_text(subprocess.run([sys.executable, "-m", "moetune", "contract", "from-log",
                                        str(folder / "train.log")], capture_output=True,
                                       text=True, timeout=300, check=True).stdout)
    page = tmp_path / "r.html"
    subprocess.run([sys.executable, "-m", "moetune", "report", str(folder / "trace.json.gz"),
                    "--contract", str(contract), "--log", str(folder / "train.log"), "-o",
                    str(page)], capture_output=True, text=True, timeout=900, check=True)
    html = re.sub(r"<[^>]+>", "", page.read_text()).replace("&#x27;", "'")
    for words in (head, oh, ob, "median of iterations 3–8"):
        assert words.replace("'", "'") in html, words


# ----------------------------------------------------------------------------- offload


OFFLOAD_CONTRACT = {**copy.deepcopy(MEM), "versions": {"transformer_engine": "2.8.0"},
                    "env": {"NVTE_CPU_OFFLOAD_V1": "1"}}
OFFLOAD_CONTRACT["megatron_args"] = {**MEM["megatron_args"], "transformer_impl":
                                     "transformer_engine",
                                     "fine_grained_activation_offloading": True,
                                     "offload_modules": ["expert_fc1", "moe_act"]}


@pytest.fixture(scope="module")
def pageable(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return _offload_trace(tmp_path_factory.mktemp("offload") / "pageable.json.gz",
                          ("Device -> Pageable", "Pageable -> Device"))


def test_offload_claim_audited_by_the_copies_memory_kind(pageable: Path) -> None:
    an = analyze(pageable, OFFLOAD_CONTRACT)
    v = an.audit["verdicts"]["fine_grained_activation_offloading"]
    assert v["verdict"] == "contradicted" and "pageable" in v["reason"]
    assert v["evidence"]["probe.pageable.count"] > 0 and v["evidence"]["probe.copies.count"] == 0


@pytest.mark.parametrize(("alloc_gib", "verdict"), [(40.0, "fits"), (136.0, "does not fit")])
def test_offload_off_when_the_memory_leaves_room(pageable: Path, alloc_gib: float,
                                                 verdict: str) -> None:
    """The offload ladder's way down: the round trips (1.6 s of a 2.2 s step) go when keeping
    the activations fits; with the GPU nearly full it is considered and not recommended."""
    ref = log_line(alloc_gib * 1024, (alloc_gib + 4) * 1024)
    an = analyze(pageable, OFFLOAD_CONTRACT, reference_step_s=ref)
    doc = an.advise().document
    recs = {r["rule"]: r for r in doc["recommendations"]}
    blocked = {b["rule"]: b for b in doc["blocked"]}
    if verdict == "fits":
        off = recs["memory.offload-off"]
        assert off["memory"]["verdict"] == "fits" and off["memory"]["evidence"] == "log"
        assert off["gain"]["speedup"]["low"] > 1.0  # 0.7 × 1.6 s of 2.2 s: +104 %
        assert off["verify"]["verdict_now"] == "contradicted"
        assert off["remove_flags"] == ["--fine-grained-activation-offloading",
                                       "--offload-modules"]
        assert doc["recommendations"][0]["rule"] == "memory.offload-off"
    else:
        assert "memory.offload-off" not in recs
        assert blocked["memory.offload-off"]["memory"]["verdict"] == "does not fit"
