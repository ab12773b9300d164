"""The reference step (executor/logparse.py reference_step, moetune/analysis.py read_reference):
the steady unprofiled median of a Megatron log's iteration times, without warm-up and without the
iterations the profiler touched, and which iterations it is the median of. One function, read the
same way by `recommend`, `report`, `diagnose` and `diff`."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from moetune.executor.logparse import parse_file, parse_text, reference_step, span_text

from moetune.analysis import read_reference

ROOT = Path(__file__).resolve().parents[1]
TRACES = ROOT / "fixtures" / "traces"
LOGS = ROOT / "fixtures" / "logs"
MEM = TRACES / "grid_mem_mbs4_seq_rcfull_a2a_eager"
HOST8 = TRACES / "mlm_host_mbs8_rcnone"


def _iteration(i: int, ms: float, total: int = 20) -> str:
    return (f" [2026-12-04 10:00:{i:02d}.000000] iteration {i:8d}/{total:8d} | consumed samples: "
            f"{8 * i:12d} | elapsed time per iteration (ms): {ms:.1f} | learning rate: 1.0E-04 | "
            "global batch size:     8 | lm loss: 1.0E+01 | loss scale: 1.0 | grad norm: 1.0 | "
            "number of skipped iterations:   0 | number of nan iterations:   0 |")


def test_grid_log_profile_span_from_its_argument_dump() -> None:
    """profile_step_start 10, profile_step_end 12: the profiler's warm-up (9), the recorded
    iterations (10, 11) and the export (12) are left out, and so are 1–2."""
    st = reference_step(parse_file(MEM / "train.log"))
    assert st.profile_steps == (10, 12) and st.profile_source == "argument dump"
    assert st.iterations == (3, 4, 5, 6, 7, 8) and st.warmup == (1, 2)
    assert st.profiled == (9, 10, 11, 12)
    # lower median of 1685.4 1692.3 1649.1 1618.4 1531.3 1523.1
    assert st.step_s == pytest.approx(1.6184)
    assert st.describe() == "median of iterations 3–8 (left out: warm-up 1–2, profiled 9–12)"


def test_a_short_run_keeps_iteration_two() -> None:
    """A tune loop's baseline profile (8 iterations, profiled from 4): only 1 and 2 are not
    touched by the profiler, so 2 is the reference and the text says so."""
    st = reference_step(parse_file(LOGS / "h200_mcore_no_te_profile.log"))
    assert st.profile_steps == (4, 8)
    assert st.iterations == (2,) and st.warmup == (1,) and st.profiled == (3, 4, 5, 6, 7, 8)
    assert st.step_s == pytest.approx(0.4073)


def test_profile_span_from_a_command_line_and_a_slow_export() -> None:
    """The issue's case: `--profile-step-start 5 --profile-step-end 7` on the command line (no
    argument dump); iteration 7 pays the trace's export (12.1 s). The reference is the steady
    median, not pulled up by the profiled ones."""
    times = {1: 9000.0, 2: 2100.0, 3: 1580.0, 4: 2200.0, 5: 2600.0, 6: 2500.0, 7: 12100.0,
             8: 1600.0, 9: 1620.0, 10: 1590.0}
    text = "\n".join(
        ["torchrun --standalone --nproc-per-node 1 pretrain_gpt.py --num-layers 8 --profile "
         "--use-pytorch-profiler --profile-step-start 5 --profile-step-end 7 --train-iters 10"]
        + [_iteration(i, ms, 10) for i, ms in times.items()])
    parsed = parse_text(text)
    assert parsed.profile_steps == (5, 7) and parsed.profile_source == "command line"
    st = reference_step(parsed)
    assert st.profiled == (4, 5, 6, 7) and st.iterations == (3, 8, 9, 10)
    assert st.step_s == pytest.approx(1.59)  # lower median of 1580 1600 1620 1590
    everything = sorted(v for i, v in times.items() if i >= 3)
    assert st.step_s < everything[(len(everything) - 1) // 2]


def test_profile_flag_alone_means_megatrons_default_span() -> None:
    text = "\n".join(["python pretrain_gpt.py --profile --train-iters 14"]
                     + [_iteration(i, 100.0 + i, 14) for i in range(1, 15)])
    st = reference_step(parse_text(text))
    assert st.profile_steps == (10, 12) and st.profiled == (9, 10, 11, 12)
    assert st.iterations == (3, 4, 5, 6, 7, 8, 13, 14)


def test_a_logging_interval_leaves_out_lines_covering_profiled_iterations() -> None:
    """`--log-interval 5`: each line is the mean of five iterations; 10 covers 6–10, which holds
    the profiler's span 8–10 (start 9, end 10), so it goes."""
    text = "\n".join(["python pretrain_gpt.py --profile --profile-step-start 9 "
                      "--profile-step-end 10 --log-interval 5"]
                     + [_iteration(i, 100.0 * i, 20) for i in (5, 10, 15, 20)])
    st = reference_step(parse_text(text))
    assert st.profiled == (10,) and st.warmup == (5,) and st.iterations == (15, 20)


def test_explicit_span_overrides_and_no_profile_means_none_left_out() -> None:
    text = "\n".join(_iteration(i, 100.0 + i, 8) for i in range(1, 9))
    assert reference_step(parse_text(text)).profiled == ()
    st = reference_step(parse_text(text), profiled=(6, 8))
    assert st.profile_source == "given" and st.iterations == (3, 4)


def test_span_text() -> None:
    assert span_text((3, 4, 5, 8, 10, 11)) == "3–5, 8, 10–11"


def test_recommend_reads_the_reference_and_names_its_iterations() -> None:
    """`recommend --log`'s JSON and terminal give `read_reference`'s step and iterations."""
    ref = read_reference(MEM / "train.log")
    base = [sys.executable, "-m", "moetune", "recommend", str(MEM / "trace.json.gz"),
            "--log", str(MEM / "train.log")]
    doc = json.loads(subprocess.run([*base, "--json"], capture_output=True, text=True,
                                    timeout=300, check=True).stdout)
    assert doc["diagnosis"]["reference"]["step_s"] == pytest.approx(ref.step_s)
    assert doc["diagnosis"]["reference"]["iterations"] == [3, 4, 5, 6, 7, 8]
    text = subprocess.run(base, capture_output=True, text=True, timeout=300, check=True).stdout
    assert "median of iterations 3–8 (left out: warm-up 1–2, profiled 9–12) of train.log" in text


def test_a_measured_step_keeps_the_logs_memory() -> None:
    """A step measured elsewhere (the tune loop's unprofiled runs) replaces the log's median but
    keeps its memory evidence: `Reference.with_step_s`."""
    ref = read_reference(MEM / "train.log").with_step_s(1.5553)
    assert ref.step_s == 1.5553 and ref.section()["source"] == "given"
    assert ref.log_memory is not None and ref.log_memory.height == 2


def test_a_saved_diagnosis_takes_only_its_own_reference(tmp_path: Path) -> None:
    trace, log = str(MEM / "trace.json.gz"), str(MEM / "train.log")
    saved = tmp_path / "diagnosis.json"
    plain = tmp_path / "plain.json"
    run = [sys.executable, "-m", "moetune"]
    saved.write_text(subprocess.run([*run, "diagnose", trace, "--log", log, "--json"],
                                    capture_output=True, text=True, timeout=300,
                                    check=True).stdout)
    plain.write_text(subprocess.run([*run, "diagnose", trace, "--json"], capture_output=True,
                                    text=True, timeout=300, check=True).stdout)
    from_trace = json.loads(subprocess.run([*run, "recommend", trace, "--log", log, "--json"],
                                           capture_output=True, text=True, timeout=300,
                                           check=True).stdout)
    from_saved = json.loads(subprocess.run([*run, "recommend", str(saved), "--log", log, "--json"], capture_output=True, text=True,
                                           timeout=300, check=True).stdout)
    # the trace's pass audits the log's claims; a saved diagnosis carries no audit (--audit FILE)
    audited = [r["verify"].pop("verdict_now", None) for r in from_trace["recommendations"]
               if r.get("verify")]
    for r in from_saved["recommendations"]:
        if r.get("verify"):
            assert r["verify"].pop("verdict_now", None) is None
    assert "confirmed" in audited  # the log's full recompute, seen in the trace
    assert from_saved["recommendations"] == from_trace["recommendations"]
    assert from_saved["diagnosis"] == from_trace["diagnosis"]
    p = subprocess.run([*run, "recommend", str(plain), "--log", log], capture_output=True,
                       text=True, timeout=300, check=False)
    assert p.returncode == 2 and len(p.stderr.strip().splitlines()) == 1
    assert "a saved diagnosis carries the reference it was made with" in p.stderr


def test_without_a_contract_the_logs_arguments_stand_in() -> None:
    """Megatron-LM at MBS 8 = GBS 8 without TE: with its log, nothing proposes a larger
    micro-batch (none is legal), TE's graphs (the log says local), or local graphs of the MoE
    scopes (its log says GPT, not hybrid: they ran eager on the H200, bench/grid_mlm)."""
    run = [sys.executable, "-m", "moetune", "recommend", str(HOST8 / "trace.json.gz")]
    bare = subprocess.run([*run, "--json"], capture_output=True, text=True, timeout=300,
                          check=True)
    p = subprocess.run([*run, "--log", str(HOST8 / "train.log"), "--json"], capture_output=True,
                       text=True, timeout=300, check=True)
    rules = [r["rule"] for r in json.loads(p.stdout)["recommendations"]]
    assert "host.larger-micro-batch" in [r["rule"] for r in json.loads(bare.stdout)["recommendations"]]
    assert "host.larger-micro-batch" not in rules and "host.cuda-graphs" not in rules
    assert "host.cuda-graphs-local" not in rules
    blocked = {b["rule"]: b for b in json.loads(p.stdout).get("blocked") or []}
    assert "MoETransformerLayer" in " ".join(blocked["host.cuda-graphs-local"]["reasons"])
    text = subprocess.run([*run, "--log", str(HOST8 / "train.log")], capture_output=True,
                          text=True, timeout=300, check=True)
    assert "train.log's arguments" in text.stdout.splitlines()[0]
    assert text.stderr.strip() == "moetune: no --contract: train.log's argument dump stands in for it"


def test_audit_takes_the_logs_arguments_as_its_claims() -> None:
    """`audit --log`: the argument dump is the claim; the same verdicts as its from-log contract."""
    run = [sys.executable, "-m", "moetune", "audit", str(HOST8 / "trace.json.gz")]
    p = subprocess.run([*run, "--log", str(HOST8 / "train.log"), "--json"], capture_output=True,
                       text=True, timeout=300, check=False)
    assert p.returncode == 0, p.stderr
    doc = json.loads(p.stdout)
    assert doc["contract"]["file"] == "train.log's arguments"
    got = {k: v["verdict"] for k, v in doc["verdicts"].items()}
    assert got["micro_batch_size"] == "confirmed" and got["recompute_granularity"] == "confirmed"
    assert got["moe_grouped_gemm"] == "confirmed"  # false, as the log says: per-expert GEMMs
    none = subprocess.run(run, capture_output=True, text=True, timeout=300, check=False)
    assert none.returncode == 2 and "--contract FILE, or --log FILE" in none.stderr
    assert len(none.stderr.strip().splitlines()) == 1


def test_a_micro_batch_step_is_weighed_by_what_it_leaves_possible() -> None:
    """Megatron-LM's memory shape from MBS 1 with full recompute (tune session 3's own profile,
    bench/grid_mlm): ×8 alone replays to +109 % and leaves no room to turn recompute off (MBS 8
    without recompute ran out of memory on the H200); ×4 replays to +88 % and then recompute off
    fits, chained +181 %. Measured in one call: ×8 +77 % (call 5); ×4 +110.6 %, then without
    recompute +204 % (tune session 5, call 9). The host shape, where recompute off fits at ×8
    too, keeps ×8."""
    states = ROOT / "fixtures" / "mlm_states"

    def top(name: str) -> dict:
        d = states / name
        p = subprocess.run([sys.executable, "-m", "moetune", "recommend", str(d / "trace.json.gz"),
                            "--log", str(d / "train.log"), "--json"], capture_output=True,
                           text=True, timeout=300, check=True)
        return json.loads(p.stdout)["recommendations"][0]

    mem = top("tune3_mem_mbs1_rcfull")
    assert mem["rule"] == "host.larger-micro-batch" and mem["change"]["to"] == 4
    note = next(c for c in mem["caveats"] if c.startswith("micro_batch_size 4 rather than 8"))
    assert "after 8 memory.recompute-off would not fit" in note and "+181%" in note
    host = top("tune4_host_mbs1_rcfull")
    assert host["change"]["to"] == 8
    assert not any("rather than" in c for c in host["caveats"])


def test_the_whatif_steps_from_the_logs_micro_batch() -> None:
    """Without a contract the what-if took MBS 1: at Megatron-LM's MBS 4 (GBS 8) it replayed
    ×2/×4/×8 'to' 2/4/8. The log's arguments give MBS 4: only ×2 (to 8) divides GBS 8."""
    d = ROOT / "bench" / "grid_mlm" / "profiles" / "mem_mbs4_seq_rcselective_a2a_eager"
    p = subprocess.run([sys.executable, "-m", "moetune", "diagnose", str(d / "trace.json.gz"),
                        "--log", str(d / "train.log"), "--json"], capture_output=True, text=True,
                       timeout=300, check=True)
    steps = {k: v["to"] for k, v in json.loads(p.stdout)["whatif"]["transforms"].items()
             if k.startswith("micro_batch")}
    assert steps == {"micro_batch_x2": 8}
