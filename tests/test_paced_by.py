""""Paced by" (moetune/vocabulary.py `paced_by`): the host paces a step only where the GPU sat
idle for it. A 99 %-busy GPU whose every launch lies on the critical path is GPU-paced; Megatron-LM
at 20 k kernels per step, the GPU busy 2 % of it, is host-paced."""

from __future__ import annotations

import contextlib
import io
import json
from pathlib import Path

import jsonschema

from moetune.cli import main
from moetune.vocabulary import PACED_BY, PACED_BY_LABEL, PACED_BY_WHO, paced_by
from tests.test_reader_nsys import GPID, _gtid, make_export

ROOT = Path(__file__).resolve().parents[1]
SCHEMA = json.loads((ROOT / "schemas" / "diagnosis.schema.json").read_text())
HOST_BOUND = ROOT / "fixtures" / "traces" / "mlm_host_mbs1_rcfull" / "trace.json.gz"


def _diagnose(path: Path) -> tuple[dict, str]:
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        assert main(["diagnose", str(path), "--json"]) == 0
    doc = json.loads(out.getvalue())
    jsonschema.validate(doc, SCHEMA)
    out = io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(io.StringIO()):
        assert main(["diagnose", str(path)]) == 0
    return doc, out.getvalue()


def healthy_export(path: Path, n: int = 400) -> Path:
    """The shape of nsys-ai's `synthetic_healthy` export, built with nsys' own table and column
    names: n × 1 ms kernels on one stream, 10 µs apart; each `cudaLaunchKernel` (2.5 µs) starts
    7 µs after the previous kernel ended, so every launch is on the path while the GPU is busy
    99 % of the time."""
    kernels, launches = [], []
    for i in range(n):
        start = i * 1_010_000
        kernels.append((start, start + 1_000_000, 0, 7, 100 + i, GPID, 1, 1, 0, 0))
        t = start - 3_000
        launches.append((t, t + 2_500, 0, _gtid(731, 1), 100 + i, 2))
    return make_export(path, {
        "StringIds": [(1, "void cutlass::gemm_nn_128x128<float>(float*, float*)"),
                      (2, "cudaLaunchKernel")],
        "CUPTI_ACTIVITY_KIND_KERNEL": kernels,
        "CUPTI_ACTIVITY_KIND_RUNTIME": launches,
    })


def test_definition_is_one_function() -> None:
    assert paced_by(1.0, 0.9, 0.85) == "device"  # the path's host time ran beside GPU work
    assert paced_by(1.0, 0.9, 0.1) == "host"  # the GPU idle 0.8 of the step for the host
    assert paced_by(1.0, 0.5, 0.0) == "device"  # exactly half: not more than half
    assert set(PACED_BY) == set(PACED_BY_LABEL) == set(PACED_BY_WHO) == set(SCHEMA["properties"]["critical_path"]["properties"]["paced_by"]
                                ["enum"])


def test_busy_gpu_nsys_export_is_gpu_paced(tmp_path: Path) -> None:
    doc, text = _diagnose(healthy_export(tmp_path / "healthy.sqlite"))
    cp = doc["critical_path"]
    assert doc["walls"]["compute"] > 0.98
    assert cp["path_s"]["host"] > 0.9 * cp["length_s"]  # the launches are the path...
    assert cp["host_gpu_busy_s"] > 0.98 * cp["path_s"]["host"]  # ...beside a busy GPU
    assert cp["paced_by"] == "device"
    assert "GPU-paced" in text and "host-paced" not in text
    assert "ms of it beside running GPU work" in text


def test_megatron_at_20k_kernels_per_step_is_host_paced() -> None:
    doc, text = _diagnose(HOST_BOUND)
    assert doc["host"]["kernels_per_step"] > 20_000
    assert doc["dominant_wall"] == "host" and doc["walls"]["host"] > 0.95
    assert doc["critical_path"]["paced_by"] == "host"
    assert ", host-paced:" in text and "GPU-paced" not in text
