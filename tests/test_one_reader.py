"""One reader, one message: the same bad file gives the same one-line message in every command
that reads traces (exit 2), the reader's warnings name their file, and compressed traces are read
(xz, bzip2: the standard library has both) or refused with the command that decompresses them
(zstd; an nsys export in any of them)."""

from __future__ import annotations

import bz2
import contextlib
import gzip
import io
import json
import lzma
import subprocess
import sys
from pathlib import Path

import pytest

from moetune.cli import main
from moetune.errors import TRUNCATED

ROOT = Path(__file__).resolve().parents[1]
TRACE = ROOT / "fixtures" / "traces" / "gpu_mcore_hostbound" / "trace.json.gz"
NSYS = ROOT / "fixtures" / "nsys" / "h200_graphs_replay_node.sqlite.gz"
LOG = ROOT / "fixtures" / "traces" / "mlm_host_mbs8_rcnone" / "train.log"
NOT_A_TRACE = ("is not a trace moetune can read "
               "(expected Kineto .json/.json.gz or an nsys .sqlite export)")


def _argv(command: str, path: Path, tmp: Path) -> list[str]:
    return {"diff": ["diff", str(path), str(path)],
            "report": ["report", str(path), "-o", str(tmp / "r.html")],
            "annotate": ["annotate", str(path), "-o", str(tmp / "a.json")],
            }.get(command, [command, str(path)])


def _run(argv: list[str]) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        rc = main(argv)
    return rc, out.getvalue(), err.getvalue()


@pytest.fixture(scope="module")
def bad(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    d = tmp_path_factory.mktemp("bad")
    text = gzip.decompress(TRACE.read_bytes())
    files = {"empty.json": b"", "cut.json": text[: len(text) // 3],
             "cut.json.gz": gzip.compress(text[: len(text) // 3]),
             "trace.json.zst": b"\x28\xb5\x2f\xfd" + b"\x00" * 64,
             "export.sqlite.xz": lzma.compress(gzip.decompress(NSYS.read_bytes())),
             "quote.json": b'{"traceEvents": [{"ph": "X", "name": "say "hi"", "ts": 1}]}',
             # a real Megatron log saved under a trace's name: recommend once called it bad JSON
             "log.json": LOG.read_bytes()}
    for name, data in files.items():
        (d / name).write_bytes(data)
    return {name: d / name for name in files}


EXPECTED = {
    "empty.json": "is empty",
    "cut.json": TRUNCATED,
    "cut.json.gz": TRUNCATED,
    "trace.json.zst": "is compressed with zstd: decompress it first (zstd -d trace.json.zst)",
    "export.sqlite.xz": "is compressed with xz: decompress it first (xz -d export.sqlite.xz)",
    "quote.json": "is not valid JSON at line 1: expected ',' or '}'",
    "log.json": NOT_A_TRACE,
}


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_every_command_says_the_same_line(name: str, bad: dict[str, Path], tmp_path: Path) -> None:
    said = set()
    for command in ("diagnose", "recommend", "report", "diff", "annotate"):
        rc, _out, err = _run(_argv(command, bad[name], tmp_path))
        assert rc == 2, (command, err)
        lines = [ln for ln in err.splitlines() if ln.strip()]
        assert len(lines) == 1, (command, err)
        said.add(lines[0])
    assert said == {f"moetune: {bad[name]}: {EXPECTED[name]}"}


def test_xz_and_bzip2_traces_are_read_as_gzip_is(tmp_path: Path) -> None:
    text = gzip.decompress(TRACE.read_bytes())
    (tmp_path / "t.json.xz").write_bytes(lzma.compress(text))
    (tmp_path / "t.json.bz2").write_bytes(bz2.compress(text))
    (tmp_path / "cut.json.xz").write_bytes(lzma.compress(text)[:5000])
    want = _run(["diagnose", str(TRACE), "--quiet"])
    assert want[0] == 0
    for name in ("t.json.xz", "t.json.bz2"):
        assert _run(["diagnose", str(tmp_path / name), "--quiet"]) == want
    rc, _out, err = _run(["diagnose", str(tmp_path / "cut.json.xz")])
    assert rc == 2 and err.startswith(f"moetune: {tmp_path / 'cut.json.xz'}: corrupt or truncated xz")
    # a folder of ranks finds them too
    (tmp_path / "ranks").mkdir()
    (tmp_path / "t.json.xz").rename(tmp_path / "ranks" / "rank0.json.xz")
    assert _run(["diagnose", str(tmp_path / "ranks"), "--quiet"])[1] == want[1]


def test_reader_warnings_name_their_file(tmp_path: Path) -> None:
    """A NaN written by Python's json.dump and a negative duration: each warning names the file
    (among several ranks' files, which one was damaged), through a real subprocess."""
    doc = json.loads(gzip.decompress(TRACE.read_bytes()))
    events = doc["traceEvents"]
    kernels = [e for e in events if e.get("cat") == "kernel"]
    kernels[0]["dur"] = float("nan")
    kernels[1]["dur"] = -5
    path = tmp_path / "damaged.json"
    path.write_text(json.dumps(doc))
    done = subprocess.run([sys.executable, "-m", "moetune", "diagnose", str(path)],
                          capture_output=True, text=True, check=True, timeout=300)
    warnings = [ln for ln in done.stderr.splitlines() if ln.startswith("warning:")]
    assert "warning: damaged.json: 1 NaN/Infinity value(s) read as unknown" in warnings
    assert "warning: damaged.json: 1 event(s) with a negative duration dropped" in warnings


def test_a_trace_or_compressed_log_where_text_goes(tmp_path: Path) -> None:
    """Where a contract or a log goes (contract check, fit, contract from-log, audit --contract),
    a real compressed trace reads as one, and a gzipped real Megatron log gets the command that
    decompresses it: never a decoder's "'utf-8' codec can't decode byte 0x8b", never "no
    arguments found" for a log the reader never saw."""
    log_gz = tmp_path / "train.log.gz"
    log_gz.write_bytes(gzip.compress(LOG.read_bytes()))
    raw = tmp_path / "export.sqlite"
    raw.write_bytes(gzip.decompress(NSYS.read_bytes()))
    cases = {TRACE: "is a compressed trace (gzip), not a text file",
             NSYS: "is a compressed trace (gzip), not a text file",
             log_gz: "is compressed with gzip: decompress it first (gunzip train.log.gz)",
             raw: "is an SQLite database (an nsys export?), not a text file"}
    for path, said in cases.items():
        for argv in (["contract", "check", str(path)], ["fit", "--contract", str(path)],
                     ["contract", "from-log", str(path)],
                     ["audit", "--contract", str(path), str(TRACE)]):
            rc, _out, err = _run(argv)
            assert rc == 2 and err.splitlines() == [f"moetune: {path}: {said}"], (argv, err)


def test_an_empty_log_is_empty(tmp_path: Path) -> None:
    """`contract from-log` of an empty file says so, as every reader does, rather than listing
    the argument sources it looked for."""
    empty = tmp_path / "train.log"
    empty.write_text("")
    rc, _out, err = _run(["contract", "from-log", str(empty)])
    assert rc == 2 and err.splitlines() == [f"moetune: {empty}: is empty: no Megatron log to read"]
