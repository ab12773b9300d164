"""Recompute that is not Megatron's CheckpointFunction: non-reentrant torch.utils.checkpoint re-runs
the forward as plain aten ops inside autograd backward nodes. Read from real CPU profiles
(fixtures/checkpoint/) and from GPU traces written in the same shape; the audit says
"contradicted" only where the trace shows no recompute could have hidden."""

from __future__ import annotations

import json
from pathlib import Path

import polars as pl
import pytest
import yaml
from moetune.analyzer.audit import audit_validator
from moetune.analyzer.contract import contract_from_doc
from moetune.analyzer.diagnose import diagnose
from moetune.analyzer.readers import load_trace
from moetune.analyzer.walls import recompute_launches, recompute_ops

from moetune.analysis import analyze_trace
from tests.golden import run_cli
from tests.kineto_gpu import AUTOGRAD, GELU, GEMM, KinetoTrace

ROOT = Path(__file__).resolve().parents[1]
CPU = ROOT / "fixtures" / "checkpoint"
MCORE = ROOT / "fixtures" / "traces" / "gpu_mcore_recompute_full" / "trace.json.gz"


def _flags(path: Path) -> dict[str, int]:
    ops = recompute_ops(load_trace([path]).events)
    return {k: int(ops.get_column(k).sum()) for k in ("scope", "backward", "forward", "in_backward")}


def test_real_cpu_profiles_show_the_forward_re_run_inside_backward() -> None:
    """torch 2.13 CPU: the non-reentrant checkpoint has no scope, and its re-run forward ops sit
    inside backward nodes; without checkpointing none does; the reentrant one has scopes."""
    none, nonre, re_ = (_flags(CPU / f"cpu_{m}.json.gz") for m in ("none", "nonreentrant", "reentrant"))
    assert none["scope"] == nonre["scope"] == 0 and re_["scope"] > 0
    assert none["in_backward"] == 0
    # 2 steps × 2 blocks, each re-running ln, 4 linears, sdpa (+ its softmax), gelu
    assert nonre["in_backward"] == 48 and nonre["backward"] == none["backward"]
    assert nonre["forward"] == 2 * none["forward"]


def _step_trace(path: Path, forward: str) -> Path:
    """4 profiler steps of 1 ms: forward linear → gelu → linear on the main thread; backward on
    the autograd thread: one AddmmBackward0 node (two mm GEMMs) and one GeluBackward0 node.
    `forward`: "recompute" re-runs linear + gelu inside the AddmmBackward0 node as the
    non-reentrant checkpoint does (fixtures/checkpoint/cpu_nonreentrant.json.gz); "plain" does
    not; "opaque" names the forward and backward by an extension's ops only, no aten op."""
    t = KinetoTrace()
    fwd_names = ("myext::fused_linear", "myext::fused_gelu") if forward == "opaque" else ("aten::linear", "aten::gelu")
    for n in range(4):
        s = n * 1000.0
        t.step(n + 3, s, 1000.0)
        t.op(fwd_names[0], s + 10, 40)
        t.kernel(GEMM, s + 20, s + 30, 100)
        t.op(fwd_names[1], s + 60, 20)
        t.kernel(GELU, s + 65, s + 130, 20)
        t.op(fwd_names[0], s + 90, 30)
        t.kernel(GEMM, s + 100, s + 150, 100)
        t.op("autograd::engine::evaluate_function: AddmmBackward0", s + 300, 200, tid=AUTOGRAD)
        t.op("AddmmBackward0", s + 302, 196, tid=AUTOGRAD)
        if forward == "recompute":
            t.op("aten::linear", s + 305, 30, tid=AUTOGRAD)
            t.op("aten::addmm", s + 308, 20, tid=AUTOGRAD)
            t.kernel(GEMM, s + 310, s + 320, 100, tid=AUTOGRAD)
            t.op("aten::gelu", s + 340, 15, tid=AUTOGRAD)
            t.kernel(GELU, s + 345, s + 420, 20, tid=AUTOGRAD)
        mm = "myext::fused_linear_backward" if forward == "opaque" else "aten::mm"
        for k, at in enumerate((s + 360, s + 400)):
            t.op(mm, at, 30, tid=AUTOGRAD)
            t.kernel(GEMM, at + 5, s + 440 + 100 * k, 100, tid=AUTOGRAD)
        t.op("autograd::engine::evaluate_function: GeluBackward0", s + 520, 40, tid=AUTOGRAD)
        t.op("GeluBackward0", s + 522, 36, tid=AUTOGRAD)
        t.op("aten::gelu_backward", s + 525, 30, tid=AUTOGRAD)
        t.kernel(GELU, s + 530, s + 640, 20, tid=AUTOGRAD)
    return t.write(path)


@pytest.fixture(scope="module")
def traces(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    d = tmp_path_factory.mktemp("recompute")
    return {f: _step_trace(d / f"{f}.json.gz", f) for f in ("recompute", "plain", "opaque")}


def test_gpu_non_reentrant_recompute_is_seen_and_charged_to_memory(traces: dict[str, Path]) -> None:
    doc = diagnose(traces["recompute"])
    # per step: the re-run GEMM (100 µs) + GELU (20 µs) of 560 µs of compute kernels
    assert doc["observed"]["recompute_fraction"] == pytest.approx(120 / 560, abs=1e-4)
    assert doc["wall_detail"]["memory"]["recompute_s"] == pytest.approx(120e-6, abs=1e-6)
    rc = doc["evidence"]["recompute"]
    assert (rc["checkpoint_regions"], rc["forward_ops_in_backward"]) == (0, 2 * len(doc["steps"]))
    # only the re-run launches, not the mm GEMMs of the same backward node
    events = load_trace([traces["recompute"]]).events
    assert recompute_launches(events).height == 2 * 4
    plain = diagnose(traces["plain"])
    assert plain["observed"]["recompute_fraction"] == 0
    assert plain["evidence"]["recompute"]["forward_ops_in_backward"] == 0


def _audit(path: Path, granularity: str | None) -> dict:
    out = analyze_trace(load_trace([path]), contract_from_doc(
        {"megatron_args": {"recompute_granularity": granularity}}), files=[path], full=False).audit
    assert list(audit_validator().iter_errors(out)) == []
    return out["verdicts"]["recompute_granularity"]


@pytest.mark.parametrize(("trace", "claim", "verdict"), [
    ("recompute", "full", "confirmed"),       # was "contradicted": no CheckpointFunction scope
    ("recompute", None, "contradicted"),      # claimed off, yet the forward re-runs in backward
    ("plain", "full", "contradicted"),        # forward ops visible, none re-run: positive absence
    ("plain", None, "confirmed"),
    ("opaque", "full", "unobservable"),       # no op by which a re-run would show: no verdict
    ("opaque", None, "unobservable"),
])
def test_recompute_verdict_needs_positive_evidence(traces: dict[str, Path], trace: str,
                                                    claim: str | None, verdict: str) -> None:
    v = _audit(traces[trace], claim)
    assert v["verdict"] == verdict, v


def test_audit_cli_exit_codes(traces: dict[str, Path], tmp_path: Path) -> None:
    """The false CI failure of the issue: `audit` of recompute_granularity=full on a
    non-reentrant-checkpoint trace exits 0 now; on a trace that cannot show it, 3 (undecided:
    nothing checked, neither a pass nor a failure)."""
    contract = tmp_path / "contract.yaml"
    contract.write_text(yaml.safe_dump({"schema": "moetune.contract/1",
                                        "megatron_args": {"recompute_granularity": "full"}}))
    for name, code in (("recompute", 0), ("opaque", 3), ("plain", 1)):
        got, out, err = run_cli(["audit", "--json", "--contract", str(contract), str(traces[name])])
        assert got == code, (name, err)
        v = json.loads(out)["verdicts"]["recompute_granularity"]
        assert v["verdict"] == {0: "confirmed", 1: "contradicted"}.get(code) or v["verdict"] == "unobservable"


def test_megatron_checkpoint_function_path_unchanged() -> None:
    """Megatron's reentrant CheckpointFunction: its forward ops inside CheckpointFunctionBackward
    are also forward-in-backward, but the launches counted are exactly the scope's."""
    if not MCORE.exists():
        pytest.skip("fixture trace absent")
    events = load_trace([MCORE]).events
    ops = recompute_ops(events)
    scoped = recompute_launches(events, ops=ops.with_columns(pl.lit(False).alias("in_backward")))
    assert recompute_launches(events, ops=ops).sort("correlation").equals(scoped.sort("correlation"))
    assert scoped.height > 0


def _truth(path: Path) -> tuple[list[tuple[float, float]], list[tuple[float, float]]]:
    """From the profile's own args: the ops directly under a backward node (`…Backward0`, on its
    thread) that torch recorded with a `Sequence number`, i.e. under grad mode — the re-run
    forward — and those without one, the node's own gradient ops. (µs, as written.)"""
    import gzip

    rows = sorted((e for e in json.loads(gzip.decompress(path.read_bytes()))["traceEvents"]
                   if e.get("ph") == "X" and e.get("cat") == "cpu_op"),
                  key=lambda e: (e["tid"], e["ts"], -e["dur"]))
    rerun, grad, stack = [], [], []  # stack: (end, name) of the enclosing ops
    for e in rows:
        while stack and e["ts"] >= stack[-1][0]:
            stack.pop()
        parent = stack[-1][1] if stack else ""
        if "Backward" in parent and not parent.startswith("autograd::engine"):
            (rerun if "Sequence number" in e["args"] else grad).append((e["ts"], e["ts"] + e["dur"]))
        stack.append((e["ts"] + e["dur"], e["name"]))
    return rerun, grad


@pytest.mark.parametrize("name", ["cpu_nonreentrant", "cpu_moe_nonreentrant", "gpu_nonreentrant"])
def test_rerun_regions_cover_the_whole_rerun_and_no_gradient_op(name: str) -> None:
    """Real torch 2.13 profiles: the span found inside each re-running node holds every op torch
    itself marks as forward work (a `Sequence number` under a backward node) and none of the
    node's gradient ops. The MoE blocks end their forward with a batched down-projection GEMM and
    the weighted combine (`aten::bmm`, `aten::mul`: names backward uses too), which the
    forward-only ops alone never reached."""
    from moetune.analyzer.classify import load_classes
    from moetune.analyzer.recompute import rerun_regions

    path = CPU / f"{name}.json.gz"
    events = load_trace([path]).events
    rerun, grad = _truth(path)
    assert rerun and grad
    # the reader's ns against the file's µs: one offset for the whole trace
    first = min(e["ts"] for e in json.loads(__import__("gzip").decompress(path.read_bytes()))
                ["traceEvents"] if e.get("ph") == "X")
    off = int(events["ts_ns"].min()) - round(first * 1000)
    ops = recompute_ops(events)
    spans = rerun_regions(events, ops, load_classes()).select("start_ns", "end_ns").rows()
    assert spans

    def inside(a: float, b: float, regions: list[tuple[int, int]]) -> bool:
        lo, hi = round(a * 1000) + off, round(b * 1000) + off
        return any(s <= lo and hi <= e for s, e in regions)

    def overlaps(a: float, b: float, regions: list[tuple[int, int]]) -> bool:
        lo, hi = round(a * 1000) + off, round(b * 1000) + off
        return any(lo < e and s < hi for s, e in regions)

    assert all(inside(a, b, spans) for a, b in rerun)
    assert not any(overlaps(a, b, spans) for a, b in grad)
    # the forward-only ops' own intervals (the former regions) miss part of the re-run
    fwd = ops.filter(pl.col("in_backward")).select(
        "ts_ns", end=pl.col("ts_ns") + pl.col("dur_ns")).rows()
    missed = sum(not inside(a, b, fwd) for a, b in rerun)
    # of 36, 76 and 36 re-run ops: 11, 66 and 10 were outside every forward-only op
    assert missed == {"cpu_nonreentrant": 11, "cpu_moe_nonreentrant": 66,
                      "gpu_nonreentrant": 10}[name]


def test_real_h200_rerun_is_the_compute_checkpointing_adds() -> None:
    """The H200 profiles of the same 2-block transformer (torch 2.11, width 1024, sequence 512):
    the recompute read on the non-reentrant one is the GPU compute it runs beyond the run without
    checkpointing (2.054 of 2.075 ms per step, 19.4 % of its compute), and none on that run."""
    none = diagnose([CPU / "gpu_none.json.gz"])
    nonre = diagnose([CPU / "gpu_nonreentrant.json.gz"])
    assert none["observed"]["recompute_fraction"] == 0
    rc, rc0 = nonre["evidence"]["recompute"], none["evidence"]["recompute"]
    extra = rc["compute_busy_s"] - rc0["compute_busy_s"]
    assert extra == pytest.approx(0.002075, abs=1e-6)
    assert rc["busy_s"] == pytest.approx(extra, rel=0.02)
    assert nonre["observed"]["recompute_fraction"] == pytest.approx(0.194, abs=0.001)


def _moe_step_trace(path: Path) -> Path:
    """The MoE block's backward of cpu_moe_nonreentrant.json.gz carried to a GPU trace: on the
    autograd thread, `MulBackward0` (the combine) first re-runs the router (linear, softmax), the
    experts' up-projection GEMM, SiLU, the gating product, the down-projection GEMM and the
    combine, each op that saves a tensor holding an `aten::detach`, then its own two gradient
    products. 4 steps."""
    t = KinetoTrace()
    mul = ("void at::native::vectorized_elementwise_kernel<4, at::native::BinaryFunctor<float, "
           "float, float, at::native::binary_internal::MulFunctor<float> >, std::array<char*, "
           "3ul> >(int, at::native::BinaryFunctor<float, float, float, at::native::"
           "binary_internal::MulFunctor<float> >, std::array<char*, 3ul>)")
    for n in range(4):
        s = n * 2000.0
        t.step(n + 3, s, 2000.0)
        t.op("aten::linear", s + 10, 40)
        t.kernel(GEMM, s + 20, s + 30, 100)
        t.op("autograd::engine::evaluate_function: MulBackward0", s + 500, 900, tid=AUTOGRAD)
        t.op("MulBackward0", s + 502, 896, tid=AUTOGRAD)
        at, gpu = s + 510, s + 520  # host time, the stream's next free time
        for op, kernel, dur in (("aten::linear", GEMM, 60), ("aten::softmax", GELU, 10),
                                ("aten::bmm", GEMM, 120), ("aten::silu", GELU, 20),
                                ("aten::mul", mul, 15), ("aten::bmm", GEMM, 110),
                                ("aten::mul", mul, 15)):
            t.op(op, at, 40, tid=AUTOGRAD)
            t.op("aten::detach", at + 30, 5, tid=AUTOGRAD)
            gpu = max(gpu, at + 10)
            t.kernel(kernel, at + 5, gpu, dur, tid=AUTOGRAD)
            at, gpu = at + 50, gpu + dur
        for k in range(2):  # the node's gradient: grad * other, grad * self
            t.op("aten::mul", at + 10 + 40 * k, 30, tid=AUTOGRAD)
            gpu = max(gpu, at + 20 + 40 * k)
            t.kernel(mul, at + 15 + 40 * k, gpu, 15, tid=AUTOGRAD)
            gpu += 15
    return t.write(path)


def test_gpu_rerun_charged_to_its_end_not_to_the_nodes_gradient(tmp_path: Path) -> None:
    """The whole re-run's kernels are recompute (7 per step: 60 + 10 + 120 + 20 + 15 + 110 + 15
    µs), not only the forward-only ops' (linear, softmax, SiLU: 90 µs), and the node's own
    gradient products are not."""
    path = _moe_step_trace(tmp_path / "moe.json.gz")
    events = load_trace([path]).events
    assert recompute_launches(events).height == 7 * 4
    doc = diagnose(path)
    assert doc["wall_detail"]["memory"]["recompute_s"] == pytest.approx(350e-6, abs=1e-6)
    # compute per step: the forward GEMM 100 + the re-run 350 + the gradient products 30 µs
    assert doc["observed"]["recompute_fraction"] == pytest.approx(350 / 480, abs=1e-4)
