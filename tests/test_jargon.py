"""Jargon with a key: every shorthand the terminal prints is explained once (recommend's key,
diagnose's not-linked line, tune's proof), and an audit claim that a feature is off reads as
what was confirmed ("no CUDA graphs …, as claimed"), never as the feature's own title. Real H200
trace and its contract; the text as the CLI prints it."""

from __future__ import annotations

import contextlib
import io
import json
from pathlib import Path

import jsonschema
from moetune.executor.ab import PROOF

from moetune.cli import main
from moetune.vocabulary import GLOSSARY

ROOT = Path(__file__).resolve().parents[1]
TRACE = ROOT / "fixtures" / "traces" / "gpu_mcore_hostbound"
CONTRACT = ROOT / "fixtures" / "contracts" / "mcore_h200_hostbound.yaml"  # claims graphs off
MEM = ROOT / "fixtures" / "traces" / "mlm_mem_mbs1_rcfull" / "trace.json.gz"


def _run(*argv: str) -> str:
    out = io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(io.StringIO()):
        main(list(argv))
    return out.getvalue()


def test_an_off_claim_reads_as_what_was_confirmed() -> None:
    text = _run("audit", "--contract", str(CONTRACT), str(TRACE))
    graphs = next(line for line in text.splitlines() if "cuda_graph_impl = none" in line)
    assert graphs.startswith("confirmed")
    assert graphs.endswith("— no CUDA graphs: every kernel launched eagerly, as claimed")
    assert "CUDA graphs are replayed" not in text
    grouped = next(line for line in text.splitlines() if "moe_grouped_gemm = true" in line)
    assert grouped.endswith("— grouped expert GEMMs")  # a claim that it ran keeps the title
    doc = json.loads(_run("audit", "--contract", str(CONTRACT), str(TRACE), "--json"))
    jsonschema.validate(doc, json.loads((ROOT / "schemas/audit.schema.json").read_text()))
    v = doc["verdicts"]["cuda_graph_impl"]
    assert (v["verdict"], v["expects"], v["title"]) == (
        "confirmed", "not_ran", "no CUDA graphs: every kernel launched eagerly")


def test_recommend_keys_each_term_it_uses_once() -> None:
    text = _run("recommend", str(TRACE), "--contract", str(CONTRACT))
    body, _, key = text.partition("\nkey: ")
    key = "key: " + key
    assert "[preview]" in body and "\nhelp: " in body and "\nbridge: " in body
    for term in GLOSSARY:
        used = term in body
        assert key.count(f"key: {term} ") == (1 if used else 0), term
    assert "help: (defaults)" not in text


def test_recompute_off_says_what_to_remove_not_defaults(tmp_path: Path) -> None:
    """A change back to Megatron's defaults has flags to drop and none to add: `help: remove`
    alone, not `help: (defaults)` above it."""
    contract = tmp_path / "c.yaml"
    contract.write_text(CONTRACT.read_text().replace(
        "megatron_args:\n", "megatron_args:\n  recompute_granularity: full\n"
        "  recompute_method: uniform\n  recompute_num_layers: 1\n"))
    text = _run("recommend", str(ROOT / "fixtures/traces/gpu_mcore_recompute_full"),
                "--contract", str(contract), "--show-quiet")
    block = text.split("memory.recompute-off [preview]", 1)[1].split("\n\n")[0]
    help_lines = [x for x in block.splitlines() if x.startswith("help:")]
    assert help_lines == ["help: remove --recompute-granularity --recompute-modules "
                          "--recompute-method --recompute-num-layers"]
    assert "(defaults)" not in text


def test_not_linked_counts_say_what_they_are() -> None:
    text = _run("diagnose", str(MEM))
    line = next(x for x in text.splitlines() if "not linked" in x)
    assert "event_wait_inferred 179 (cross-stream waits inferred from timing" in line


def test_proof_says_what_the_audit_saw() -> None:
    assert PROOF["confirmed"].startswith("confirmed: the audit saw the change run")
    assert all("not counted as proof" in v for k, v in PROOF.items() if k != "confirmed")
