"""Trace metadata never reaches an output verbatim: whitelist + credential redaction.

The end-to-end tests plant tokens in a real trace's metadata (an env block, a command line, a host
name, a custom key, a process-name metadata event) and check that none of them survives in
`diagnose --json`, `annotate` and `diff` (JSON and terminal).
"""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest

from moetune.cli import main
from moetune.redact import REDACTED, redact_metadata, redact_text

ROOT = Path(__file__).resolve().parent.parent
HOSTBOUND = ROOT / "fixtures" / "traces" / "gpu_mcore_hostbound" / "trace.json.gz"

PLANTED = {
    "hf": "hf_PlantedHuggingFaceToken0123456789",
    "gh": "ghp_PlantedGitHubToken0123456789abcdefAB",
    "aws": "AKIAPLANTEDAWSKEY123",
    "pw": "hunter2-planted-pw",
    "host": "planted-hostname-node17.internal",
    "custom": "planted-custom-value-42",
    "jwt": "eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiJwbGFudGVkIn0.c2lnbmF0dXJlcGxhbnRlZDEyMzQ",
}


def planted_trace(dst: Path) -> Path:
    """The hostbound fixture with credentials planted where real harnesses put metadata."""
    with gzip.open(HOSTBOUND, "rt") as f:
        doc = json.load(f)
    doc["envVars"] = {"HF_TOKEN": PLANTED["hf"], "GITHUB_TOKEN": PLANTED["gh"],
                      "AWS_ACCESS_KEY_ID": PLANTED["aws"]}
    doc["cmdline"] = f"python pretrain_gpt.py --password={PLANTED['pw']} --jwt {PLANTED['jwt']}"
    doc["hostname"] = PLANTED["host"]
    doc["my_harness_key"] = {"note": PLANTED["custom"]}
    doc["deviceProperties"][0]["uuid"] = PLANTED["custom"]  # a non-whitelisted device field
    doc["traceEvents"].append({"name": "process_name", "ph": "M", "pid": 1027, "tid": 0,
                               "args": {"name": f"python --hf {PLANTED['hf']}"}})
    dst.parent.mkdir(parents=True, exist_ok=True)
    with gzip.open(dst, "wt") as f:
        json.dump(doc, f)
    return dst


@pytest.fixture(scope="module")
def planted(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return planted_trace(tmp_path_factory.mktemp("planted") / "run" / "trace.json.gz")


def assert_clean(text: str) -> None:
    for what, tok in PLANTED.items():
        assert tok not in text, f"planted {what} token leaked"


@pytest.mark.parametrize("tok", [
    "hf_abcdefghijklmnopqrstuv1234", "ghp_" + "a1" * 15, "github_pat_11ABCDEFG0123456789_abcdefghijkl",
    "sk-proj-abcdefghijklmnop1234", "AKIAIOSFODNN7EXAMPLE", "xoxb-1234567890-abcdefghij",
    "Bearer abc.def-ghi", "password=letmein", "token: abc123", "MY_SECRET=shh",
    PLANTED["jwt"], "aB3dE5fG7hJ9kL1mN3pQ5rS7tU9vW1xY3zA5",
])
def test_credentials_redacted(tok: str) -> None:
    out = redact_text(f"run --x {tok} --y")
    assert REDACTED in out and out.startswith("run --x ") and out.endswith(" --y")


@pytest.mark.parametrize("safe", [
    "nvjet_sm90_tst_64x8_64x16_2x4_h_bz_NNT", "ncclDevKernel_SendRecv(ncclDevKernelArgsStorage<4096ul>)",
    "FA1CA59064B247B09293157BC6A69195", "ProfilerStep#11", "NVIDIA H200", "cuda:nccl",
    "EXPERT_TENSOR_MODEL_PIPELINE_PARALLEL_GROUP_WITH_EGTP",
])
def test_names_kept(safe: str) -> None:
    assert redact_text(safe) == safe


def test_url_userinfo() -> None:
    assert redact_text("https://me:pw@example.com/x") == f"https://{REDACTED}@example.com/x"


def test_metadata_whitelist(planted: Path) -> None:
    with gzip.open(planted, "rt") as f:
        doc = json.load(f)
    meta = {k: v for k, v in doc.items() if k != "traceEvents"}
    out = redact_metadata(meta)
    assert_clean(json.dumps(out))
    assert set(out) <= {"schemaVersion", "displayTimeUnit", "baseTimeNanoseconds", "deviceProperties",
                        "distributedInfo", "cuda_driver_version", "cuda_runtime_version",
                        "cupti_version"}
    assert "traceName" not in out and "envVars" not in out and "hostname" not in out
    assert out["deviceProperties"][0] == {"id": 0, "name": "NVIDIA H200", "totalGlobalMem": 150109880320,
                                          "computeMajor": 9, "computeMinor": 0, "numSms": 132}
    assert out["distributedInfo"]["world_size"] == 1 and out["distributedInfo"]["backend"] == "nccl"
    assert out["distributedInfo"]["nccl_version"] == "2.28.9"


def test_metadata_values_redacted() -> None:
    out = redact_metadata({"distributedInfo": {"backend": "token=abc123", "rank": 0},
                           "pytorch_version": PLANTED["hf"], "deviceProperties": "junk"})
    assert out["distributedInfo"] == {"backend": f"token={REDACTED}", "rank": 0}  # name kept
    assert out["pytorch_version"] == REDACTED and "deviceProperties" not in out


def test_diagnose_json_clean(planted: Path, capsys: pytest.CaptureFixture[str]) -> None:
    trace = planted
    assert main(["diagnose", str(trace), "--json"]) == 0
    out = capsys.readouterr()
    assert_clean(out.out + out.err)
    assert json.loads(out.out)["step_time_s"] > 0


def test_annotate_clean(planted: Path, tmp_path: Path) -> None:
    trace = planted
    out = tmp_path / "annotated.json.gz"
    assert main(["annotate", str(trace), "-o", str(out)]) == 0
    with gzip.open(out, "rt") as f:
        text = f.read()
    assert_clean(text)
    doc = json.loads(text)
    assert "envVars" not in doc and "cmdline" not in doc and "my_harness_key" not in doc
    names = [e["args"]["name"] for e in doc["traceEvents"]
             if e.get("ph") == "M" and e.get("name") == "process_name" and e.get("pid") == 1027]
    assert f"python --hf {REDACTED}" in names  # the metadata event kept, its token gone


def test_diff_clean(planted: Path, capsys: pytest.CaptureFixture[str]) -> None:
    a = b = planted  # the same run twice: every metadata field on both sides
    assert main(["diff", str(a), str(b), "--json"]) == 0
    out = capsys.readouterr()
    assert_clean(out.out + out.err)
    assert json.loads(out.out)["comparable"]
    assert main(["diff", str(a), str(b), "--top", "3"]) == 0
    out = capsys.readouterr()
    assert_clean(out.out + out.err)
    assert "step time" in out.out


def test_diagnose_top_clean(planted: Path, capsys: pytest.CaptureFixture[str]) -> None:
    trace = planted
    assert main(["diagnose", str(trace), "--top", "50"]) == 0
    out = capsys.readouterr()
    assert_clean(out.out + out.err)


def test_mangled_kernel_names_are_not_credentials() -> None:
    """A real H200 grouped-GEMM kernel name (fixtures/traces/grid_*): its length-prefixed parts
    look like high-entropy tokens, the name is not a secret; a token beside it still goes."""
    from moetune.redact import redact_text

    name = ("_ZN7cutlass13device_kernelIN2at4cuda6detail11GroupedGemm16GroupedGemmKernelILb1ELb0E"
            "NS3_30Sm90GroupedGemmArchSpecializedELNS3_10SwizzleAXXEENS3_27GroupedGemmBlockConfig"
            "Sm90EEEEvNT_6ParamsE")
    assert redact_text(name) == name
    assert redact_text(f"{name} aZ3kQ9xL2mN7pR5tV8wY1bC4dF6gH0jK") == f"{name} [redacted]"


def test_argument_names_are_not_credentials() -> None:
    """Megatron argument names that contain a secret word but do not end in one read as they are
    (the report's baseline once printed `[redacted] claimed → unobservable` for the diff's audit
    line `moe_token_dispatcher_type: not claimed → unobservable`); every knob of the catalog, in
    each spelling a trace, log or diff shows it, is kept."""
    from moetune.compare import diff_analyses
    from moetune.knobs import load

    for text in ("moe_token_dispatcher_type: not claimed → unobservable",
                 "tokenizer_type: GPT2BPETokenizer", "moe_token_drop_policy: probs",
                 "--moe-token-dispatcher-type=alltoall", "tokenizer_model=/data/tok.model"):
        assert redact_text(text) == text
    for k in load().knobs.values():
        for name in {k.name, *([k.flag] if k.flag else [])}:
            for text in (f"{name}: flex", f"{name}=flex"):
                assert redact_text(text) == text, text

    class Side:  # an Analysis: a diagnosis and the audit of its contract
        def __init__(self, verdicts: dict) -> None:
            self.diagnosis, self.audit = {}, {"verdicts": verdicts}

    doc = diff_analyses(Side({}), Side({"moe_token_dispatcher_type": {"verdict": "unobservable"}}))
    (line,) = [a["text"] for a in doc["audit"]]
    assert redact_text(line) == line == "moe_token_dispatcher_type: not claimed → unobservable"


@pytest.mark.parametrize("text, shown", [
    ("HF_TOKEN=abc123def", f"HF_TOKEN={REDACTED}"),
    ("export AWS_SECRET_ACCESS_KEY=wJalrXUtnFEMI", f"export AWS_SECRET_ACCESS_KEY={REDACTED}"),
    ("client_secret: 'xyz'", f"client_secret: {REDACTED}"),
    ("--password=letmein --x", f"--password={REDACTED} --x"),
])
def test_secret_names_keep_the_name(text: str, shown: str) -> None:
    assert redact_text(text) == shown
