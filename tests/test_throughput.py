"""The throughput section (analyzer/throughput.py), the GPU table (analyzer/gpus.yaml) and the
diagnosis' exports (`--csv`, `--parquet`), on the real H200 traces and the logs of their runs."""

from __future__ import annotations

import html
import json
from pathlib import Path

import jsonschema
import polars as pl
import pytest
import yaml
from moetune.analyzer.gpus import GPUS_PATH, gpu_model, gpu_table, validate_gpus
from moetune.analyzer.throughput import log_check, log_words, throughput_document

from moetune.analysis import analyze, read_reference
from moetune.knobs import load as load_catalog
from moetune.runlog import read_run_log
from tests.golden import run_cli

ROOT = Path(__file__).resolve().parents[1]
TRACES = ROOT / "fixtures" / "traces"
SCHEMA = json.loads((ROOT / "schemas" / "diagnosis.schema.json").read_text())
WITH_LOG = sorted(d.name for d in TRACES.iterdir() if (d / "train.log").exists())


def _input(d: Path) -> str:
    return str(d / "trace.json.gz") if (d / "trace.json.gz").exists() else str(d)


def test_gpu_table_validates_and_keeps_the_architectures() -> None:
    validate_gpus(yaml.safe_load(GPUS_PATH.read_text()), GPUS_PATH)
    assert gpu_model("NVIDIA H200").peak_tflops["bf16"] == 989
    assert gpu_model("NVIDIA H200 NVL").peak_tflops["bf16"] == 835  # the variant before its family
    assert gpu_model("NVIDIA H20").arch == "hopper" and gpu_model("NVIDIA H20").peak_tflops["bf16"] == 148
    assert gpu_model("NVIDIA H100 80GB HBM3").peak_tflops["fp8"] == 1979
    assert gpu_model("AMD Instinct MI250X") is None
    # the rules' gpu_arch fact reads the same table
    assert load_catalog().gpus == tuple((g.match, g.arch) for g in gpu_table())


@pytest.mark.parametrize("name", WITH_LOG)
def test_step_tflops_agree_with_the_runs_log(name: str) -> None:
    """The log's iterations imply the FLOPs Megatron counted; at the trace's step time they give
    the log's TFLOP/s per GPU, which this section's must match within 10 %."""
    d = TRACES / name
    ref = read_reference(d / "train.log", require_step=False)
    doc = analyze([_input(d)], audit=False, reference_step_s=ref).diagnosis
    jsonschema.validate(doc, SCHEMA)
    t = doc["throughput"]
    assert t["model_source"] == "log" and t["gpu"] == "NVIDIA H200"
    assert t["log"]["agrees"] is True, t["log"]
    assert t["tflops_per_gpu"] == pytest.approx(t["log"]["tflops_at_trace_step"], rel=0.10)
    assert t["mfu"] == pytest.approx(t["tflops_per_gpu"] / 989, rel=1e-3)
    # the step profiled is slower than the run's own iterations, never faster by much
    assert t["tflops_per_gpu"] <= t["log"]["tflops_per_gpu_median"] * 1.25
    rates = {p["phase"]: p["tflops"] for p in t["phases"]}
    assert {"attention", "experts", "loss"} <= set(rates)
    assert all(r is None or 0 < r < 989 for r in rates.values())


def test_a_log_of_another_world_size_is_reported() -> None:
    d = TRACES / "gpu_ep2_alltoall_overlap"
    run_log = read_run_log(d / "train.log")
    args = {**run_log["args"], "world_size": 1}  # as if the contract forgot the second GPU
    doc = {"step_time_s": 0.12, "observed": {}, "phases": {}}
    ranks = pl.DataFrame({"world_size": [2], "device_name": ["NVIDIA H200"]})
    t = throughput_document(doc, ranks=ranks, contract={"megatron_args": args}, run_log=run_log)
    assert t["world_size"] == 1 and t["log"]["agrees"] is False
    assert any("differs" in n for n in t["notes"])


def test_unknowns_stay_unknown() -> None:
    ranks = pl.DataFrame({"world_size": [None], "device_name": ["AMD Radeon Graphics"]},
                         schema={"world_size": pl.Int32, "device_name": pl.String})
    t = throughput_document({"step_time_s": 0.1, "observed": {}}, ranks=ranks, contract=None,
                            run_log=None)
    assert t["flops_per_step"] is None and t["mfu"] is None and t["notes"]
    model = {"megatron_args": {"num_layers": 2, "hidden_size": 64, "num_attention_heads": 4,
                               "seq_length": 32, "global_batch_size": 4, "world_size": 1,
                               "fp8_format": "e4m3"}}
    t = throughput_document({"step_time_s": 0.1, "observed": {}}, ranks=ranks, contract=model,
                            run_log=None)
    assert t["tflops_per_gpu"] > 0 and t["dtype"] == "fp8" and t["mfu"] is None
    assert any("no fp8 peak" in n for n in t["notes"])


def test_log_check_uses_the_steady_iterations() -> None:
    its = [{"iteration": 1, "elapsed_s": 2.0, "tflops_per_gpu": 1.0}] + [
        {"iteration": i, "elapsed_s": 0.1, "tflops_per_gpu": 20.0} for i in range(2, 10)]
    out = log_check({"file": "x.log", "iterations": its}, flops=2e12, world=1, step_s=0.1,
                    tflops=20.0)
    assert out["flops_per_step"] == pytest.approx(2e12) and out["agrees"] is True
    assert out["tflops_per_gpu_median"] == 20.0


def test_cli_exports_the_tables(tmp_path: Path) -> None:
    d = TRACES / "gpu_ep2_alltoall_overlap"
    code, out, err = run_cli(["diagnose", str(d), "--log", str(d / "train.log"), "--json",
                              "--csv", str(tmp_path / "csv"), "--parquet", str(tmp_path / "pq")])
    assert code == 0, err
    doc = json.loads(out)
    phases = pl.read_csv(tmp_path / "csv" / "phases.csv")
    assert phases.filter(pl.col("layer").is_null()).get_column("phase").to_list() == [
        r["phase"] for r in doc["phases"]["rows"]]
    assert phases.filter(pl.col("layer").is_null()).get_column("step_s").sum() == pytest.approx(
        doc["step_time_s"], rel=0.02)
    kernels = pl.read_parquet(tmp_path / "pq" / "kernels.parquet")
    assert kernels.height == len(doc["top"]["kernels"]) > 10  # every kernel name
    ranks = pl.read_csv(tmp_path / "csv" / "ranks.csv")
    assert ranks.get_column("rank").to_list() == [0, 1]
    assert "phase_dispatch_s" in ranks.columns
    pq = pl.read_parquet(tmp_path / "pq" / "phases.parquet")
    assert pq.get_column("phase").to_list() == phases.get_column("phase").to_list()


def test_cli_terminal_says_what_the_json_says() -> None:
    d = TRACES / "grid_host_mbs8_grp_rcnone_a2a_eager"
    code, out, err = run_cli(["diagnose", str(d / "trace.json.gz"), "--log", str(d / "train.log")])
    assert code == 0, err
    assert "phases of the median step" in out and "per layer" in out
    assert "TFLOP/s per GPU" in out and "agrees" in out
    code, out, err = run_cli(["diagnose", str(d / "trace.json.gz"), "--log", str(d / "no.log")])
    assert code == 2 and "no.log" in err and "Traceback" not in err


def test_the_logs_steady_window_is_the_reference_steps(tmp_path: Path) -> None:
    """A real Megatron-LM log (MBS 1, profiled iterations 10–11 of 12): the throughput check reads
    the iterations recommend's reference step is the median of (3–8; warm-up and profiled ones
    left out), not the last two thirds (once 5–12, the profiled 22 s iteration 12 with them),
    and the terminal and the page say in the same words what agrees with what."""
    d = TRACES / "mlm_host_mbs1_rcfull"
    args = [str(d / "trace.json.gz"), "--log", str(d / "train.log")]
    code, out, err = run_cli(["diagnose", "--json", *args])
    assert code == 0, err
    log = json.loads(out)["throughput"]["log"]
    code, out, err = run_cli(["recommend", "--json", *args])
    assert code == 0, err
    ref = json.loads(out)["diagnosis"]["reference"]
    assert "median of iterations 3–8" in ref["text"]
    assert log["iterations"] == 6 and log["step_time_s_median"] == pytest.approx(ref["step_s"])
    said = log_words(log)
    assert said is not None and "FLOPs per step" in said and " agrees (" in said
    code, term, err = run_cli(["diagnose", *args])
    assert code == 0, err
    assert f"  {said}" in term.splitlines()
    pytest.importorskip("plotly")
    code, _out, err = run_cli(["report", *args, "-o", str(tmp_path / "r.html")])
    assert code == 0, err
    page = html.unescape((tmp_path / "r.html").read_text())
    assert said[0].upper() + said[1:] + "." in page and "(model from the log, 1 GPU)." in page
