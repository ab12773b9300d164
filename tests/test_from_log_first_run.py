"""`contract from-log` gives a contract its own checks accept and later commands can use: on every
real log under fixtures/, `contract check` and `audit` find nothing to warn about in what it
wrote; the GPU a log states fills `hardware`; what no log states is named with the line to add,
and `fit` asks for the same line (README.md's typical session)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from moetune.analyzer.contract import check_contract
from moetune.analyzer.log_hardware import FILL, hardware_from_log
from moetune.analyzer.megatron_args import read_log

ROOT = Path(__file__).resolve().parents[1]
TRACES = ROOT / "fixtures" / "traces"
LOGS = sorted((ROOT / "fixtures" / "logs").glob("*.log")) + sorted(TRACES.glob("*/train.log"))


def cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "moetune", *args], cwd=ROOT, capture_output=True,
                          text=True, timeout=600)


@pytest.mark.parametrize("log", LOGS, ids=lambda p: f"{p.parent.name}/{p.name}")
def test_a_from_log_contract_checks_clean(log: Path) -> None:
    found = read_log(log.read_text(errors="replace"))
    if not found.contract:
        pytest.skip("states no Megatron-LM arguments (a Megatron-Bridge log)")
    assert check_contract(found.contract) == []
    for key in found.set_aside:  # left out, not lost: the provenance names it
        assert key not in found.contract["megatron_args"]


def test_the_bundled_workloads_own_settings_are_set_aside_and_audit_is_quiet(tmp_path: Path) -> None:
    run = TRACES / "gpu_ep2_allgather"
    contract = tmp_path / "contract.yaml"
    r = cli("contract", "from-log", str(run / "train.log"), "-o", str(contract))
    assert r.returncode == 0, r.stderr
    text = contract.read_text()
    assert ("# printed, but not Megatron-LM arguments (left out of megatron_args): data_pool=0, "
            "fp8_format=None, profile_dir=") in text
    doc = yaml.safe_load(text)
    assert doc["megatron_args"]["fp8"] is None and "fp8_format" not in doc["megatron_args"]
    r = cli("contract", "check", str(contract))
    assert r.returncode == 0 and "warning" not in r.stdout
    r = cli("audit", "--contract", str(contract), str(run / "rank0.pt.trace.json.gz"))
    assert r.returncode in (0, 3), r.stderr
    assert "megatron_args." not in r.stdout + r.stderr
    unaudited = next(ln for ln in r.stdout.splitlines() if ln.startswith("not audited"))
    assert "data_pool" not in unaudited and "profile_dir" not in unaudited


def test_gpu_memory_from_pytorchs_out_of_memory_error() -> None:
    found = read_log((ROOT / "fixtures" / "logs" / "megatron_oom.log").read_text())
    # `GPU 1 has a total capacity of 139.80 GiB` (an H200)
    assert found.contract["hardware"] == {"gpu_memory_gb": 139.8}
    assert "hardware.gpu_memory_gb" not in found.missing
    assert "hardware.gpu_model" in found.missing


def test_gpu_model_and_memory_from_nvidia_smi() -> None:
    """nvidia-smi 550's table (as a launch script prints it before torchrun), its -L line and its
    CSV query, each behind a launcher prefix or none."""
    table = """\
+-----------------------------------------------------------------------------------------+
| NVIDIA-SMI 550.90.07              Driver Version: 550.90.07      CUDA Version: 12.4     |
|-----------------------------------------+------------------------+----------------------+
| GPU  Name                 Persistence-M | Bus-Id          Disp.A | Volatile Uncorr. ECC |
| Fan  Temp   Perf          Pwr:Usage/Cap |           Memory-Usage | GPU-Util  Compute M. |
|                                         |                        |               MIG M. |
|=========================================+========================+======================|
|   0  NVIDIA H200                    On  |   00000000:19:00.0 Off |                    0 |
| N/A   32C    P0             76W /  700W |       1MiB / 143771MiB |      0%      Default |
"""
    assert hardware_from_log(table) == {"gpu_model": "NVIDIA H200", "gpu_memory_gb": 140.4}
    listing = "0: GPU 0: NVIDIA H100 80GB HBM3 (UUID: GPU-5e2f0c4e-1b8a-7d3e-9f61-0a2b3c4d5e6f)\n"
    assert hardware_from_log(listing) == {"gpu_model": "NVIDIA H100 80GB HBM3"}
    csv = "name, memory.total [MiB]\nNVIDIA H100 80GB HBM3, 81559 MiB\n"
    assert hardware_from_log(csv) == {"gpu_model": "NVIDIA H100 80GB HBM3", "gpu_memory_gb": 79.6}
    assert hardware_from_log("iteration 1/ 10 | elapsed time per iteration (ms): 1.0\n") == {}


def test_the_readmes_session_fit_names_the_line_to_add_and_works_with_it(tmp_path: Path) -> None:
    log = TRACES / "mlm_host_mbs8_rcnone" / "train.log"
    r = cli("contract", "from-log", str(log), "--json")
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    missing = {m["key"]: m for m in doc["missing"]}
    assert set(missing) == {"hardware.gpu_memory_gb", "hardware.gpu_model", "hardware.gpus_per_node"}
    contract = tmp_path / "contract.yaml"
    contract.write_text(yaml.safe_dump(doc["contract"]))
    r = cli("fit", "--contract", str(contract), "--gpus", "64")
    assert r.returncode == 2 and r.stdout == ""
    assert r.stderr.count("\n") == 1 and str(contract) in r.stderr
    assert f"hardware.gpu_memory_gb (needed by {FILL['hardware.gpu_memory_gb'][0]}): add `" in r.stderr
    # the line the message and the document give, added as it stands, is what fit needed
    added = yaml.safe_load(missing["hardware.gpu_memory_gb"]["add"])
    doc["contract"].setdefault("hardware", {}).update(added["hardware"])
    contract.write_text(yaml.safe_dump(doc["contract"]))
    r = cli("fit", "--contract", str(contract), "--gpus", "64")
    assert r.returncode in (0, 1) and "Traceback" not in r.stderr, r.stderr
    assert "64 GPUs × 139.8 GiB" in r.stdout
