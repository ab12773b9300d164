"""Copy kinds: the memory a copy moves through (pageable / pinned / managed / device) from both
readers, in evidence and terminal; a naive activation offload through pageable host memory is
offload (a memory-wall cost) and gets a rule."""

from __future__ import annotations

from pathlib import Path

import polars as pl
import pytest
from moetune.analyzer.diagnose import diagnose
from moetune.analyzer.frames import copy_mem
from moetune.analyzer.readers import load_trace

from tests.golden import run_cli
from tests.kineto_gpu import GEMM, KinetoTrace

ROOT = Path(__file__).resolve().parents[1]
NSYS = Path("/work/shared/corpus/public/nsys")
MIB = 1 << 20


def test_copy_mem_from_endpoint_labels() -> None:
    src = ["Device", "Pageable", "Device", "Pinned", "Device Static", "Managed", "Pageable", "Unknown", None]
    dst = ["Pageable", "Device", "Pinned", "Device", "Array", "Device", "Pinned", "Device", "Device"]
    got = pl.select(copy_mem(pl.Series(src), pl.Series(dst)).cast(pl.String)).to_series().to_list()
    assert got == ["pageable", "pageable", "pinned", "pinned", "device", "managed", "pageable", None, None]


def test_kineto_reader_keeps_the_copy_memory() -> None:
    """A real H200 trace: pinned DtoH, pageable and pinned HtoD, device DtoD."""
    ev = load_trace([ROOT / "fixtures/traces/gpu_workload_computebound/trace.json.gz"]).events
    got = dict(ev.filter(pl.col("kind") == "memcpy").group_by("name").agg(
        pl.col("copy_mem").cast(pl.String).unique()).iter_rows())
    assert got == {"Memcpy DtoH (Device -> Pinned)": ["pinned"], "Memcpy HtoD (Pageable -> Device)": ["pageable"],
                   "Memcpy HtoD (Pinned -> Device)": ["pinned"], "Memcpy DtoD (Device -> Device)": ["device"]}
    assert ev.filter(pl.col("kind") != "memcpy").get_column("copy_mem").null_count() == ev.height - \
        ev.filter(pl.col("kind") == "memcpy").height


def test_nsys_reader_keeps_the_copy_memory() -> None:
    """nsys CUPTI_ACTIVITY_KIND_MEMCPY srcKind/dstKind (ENUM_CUDA_MEM_KIND) of a real export."""
    db = NSYS / "nsysai_h100_2gpu_inference.sqlite"
    if not db.exists():
        pytest.skip("public corpus absent")
    cp = load_trace([db]).events.filter(pl.col("kind") == "memcpy")
    got = {(k, m): n for k, m, n in cp.group_by(pl.col("copy_kind").cast(pl.String),
                                                  pl.col("copy_mem").cast(pl.String)).len().iter_rows()}
    # the export's own counts: copyKind 1 srcKind 0/1 (4 pageable, 446 pinned), 2 → 1, 8 (2 → 2)
    assert got == {("HtoD", "pageable"): 4, ("HtoD", "pinned"): 446, ("DtoH", "pinned"): 4,
                   ("DtoD", "device"): 450}


# every window is 2.2 s: the last one, with no next step, ends at its host end (2.2 s after its
# start) plus the 130 µs every other step's host end leaves before the next step's first kernel
# 1.6 s of offload copies in flight per step
OFFLOAD_FRACTION = 1.6 / 2.2  # 0.72727


def _offload_trace(path: Path, ends: tuple[str, str]) -> Path:
    """4 profiler steps of 2.2 s: per layer (8) a forward GEMM and its 64 MiB activation copied
    to the host (170 ms); in backward each comes back (30 ms) before two GEMMs. Through pageable
    memory cudaMemcpyAsync blocks the host for the copy, as CUDA documents; on the compute
    stream, as a hand-made `.cpu()` / `.to("cuda")` offload runs. Every step is whole, so all 4
    are analysed; each window runs from its first kernel to the next step's first kernel, the
    last one's to its host end plus the same 130 µs."""
    down, up = ends
    t = KinetoTrace()
    for n in range(4):
        s = n * 2_200_000.0
        t.step(n + 3, s, 2_200_000.0)
        at = s + 100
        for _ in range(8):
            t.op("aten::linear", at, 20)
            t.kernel(GEMM, at + 5, at + 30, 20_000)
            t.op("aten::to", at + 20_040, 170_010)
            t.copy("DtoH", down, 64 * MIB, at + 20_050, at + 20_060, 170_000)
            at += 190_100
        for _ in range(8):
            t.op("aten::to", at, 30_010)
            t.copy("HtoD", up, 64 * MIB, at + 5, at + 10, 30_000)
            t.op("aten::mm", at + 30_020, 20)
            t.kernel(GEMM, at + 30_025, at + 30_030, 20_000)
            t.op("aten::mm", at + 30_050, 20)
            t.kernel(GEMM, at + 30_055, at + 50_030, 20_000)
            at += 70_050
    return t.write(path)


@pytest.fixture(scope="module")
def pageable(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return _offload_trace(tmp_path_factory.mktemp("copies") / "pageable.json.gz",
                          ("Device -> Pageable", "Pageable -> Device"))


def test_pageable_offload_is_offload_and_a_memory_cost(pageable: Path) -> None:
    doc = diagnose(pageable)
    step = doc["step_time_s"]
    assert step == pytest.approx(2.2)
    assert [r["wall_s"] for r in doc["per_step"]] == pytest.approx([2.2, 2.2, 2.2, 2.2])
    # 8 × 170 ms DtoH + 8 × 30 ms HtoD per step, all on the compute stream: exposed
    assert doc["observed"]["offload_copy_fraction"] == pytest.approx(OFFLOAD_FRACTION, abs=1e-5)
    assert doc["observed"]["pageable_copy_fraction"] == pytest.approx(OFFLOAD_FRACTION, abs=1e-5)
    mem = doc["wall_detail"]["memory"]
    assert mem["offload_s"] == pytest.approx(1.6, abs=1e-3) == pytest.approx(mem["offload_pageable_s"])
    assert doc["dominant_wall"] == "memory"
    copies = doc["evidence"]["copies"]
    steps = len(doc["steps"])
    assert copies["DtoH"]["pageable"] == {"count": 8 * steps, "bytes": 8 * steps * 64 * MIB,
                                          "time_s": pytest.approx(1.36 * steps)}
    assert copies["HtoD"]["pageable"]["time_s"] == pytest.approx(0.24 * steps)
    assert doc["evidence"]["classes"]["memory.pageable"]["count"] == 16 * steps


def test_pinned_offload_is_offload_but_not_pageable(tmp_path: Path) -> None:
    doc = diagnose(_offload_trace(tmp_path / "pinned.json.gz", ("Device -> Pinned", "Pinned -> Device")))
    assert doc["observed"]["offload_copy_fraction"] == pytest.approx(OFFLOAD_FRACTION, abs=1e-5)
    assert doc["observed"]["pageable_copy_fraction"] == 0
    assert doc["wall_detail"]["memory"]["offload_pageable_s"] == 0
    assert "pageable" not in doc["evidence"]["copies"]["DtoH"]


def test_terminal_and_recommendation_name_the_pageable_copies(pageable: Path) -> None:
    code, out, err = run_cli(["diagnose", str(pageable)])
    assert code == 0, err
    assert "offload copies 72.7 % of step · pageable copies 72.7 % of step" in out
    assert "memory includes offload round trips 1,600.0 ms exposed, 1,600.0 ms through pageable memory" in out
    assert "DtoH pageable 1,360.0 ms · HtoD pageable 240.0 ms" in out
    code, out, err = run_cli(["recommend", "--json", str(pageable)])
    assert code == 0, err
    import json

    doc = json.loads(out)
    rules = [r["rule"] for r in doc["recommendations"]] + [r["rule"] for r in doc.get("blocked", [])]
    assert "memory.pageable-copies" in rules, doc
