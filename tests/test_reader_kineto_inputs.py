"""Kineto reader on odd but valid inputs and on bad inputs written into tmp_path: what it reads,
and the one-line error naming the file for what it cannot."""

from __future__ import annotations

import gzip
import json
import subprocess
import sys
from pathlib import Path

import polars as pl
import pytest
from moetune.analyzer.frames import COMMS_SCHEMA, EVENTS_SCHEMA
from moetune.analyzer.readers import load_trace
from moetune.analyzer.readers.kineto import read_kineto

from moetune.errors import UserError
from tests.kineto_reading import (
    ROOT,
    all_strings,
    ev,
    kind,
    one_line_error,
    write,
)

# --------------------------------------------------------------------------- odd but valid inputs


def test_odd_values_are_coerced_not_fatal(tmp_path: Path) -> None:
    doc = {
        "traceEvents": [
            ev(name="ünïcødé ✓ 内核", ts="1000.5", dur="2"),  # string numbers (old writers)
            ev(dur=-3),  # negative duration → dropped
            ev(dur=8 * 24 * 3600 * 1e6),  # CUPTI overflow → dropped
            ev(
                cat="kernel",
                name="k",
                pid=0,
                tid=7,
                ts=200,
                dur=1,
                args={"correlation": 2**70, "External id": 9, "device": 0, "stream": 7},
            ),
            ev(ph="i", cat=None, name="Record Window End", pid="", tid="", ts=300, dur=None),
            {"ph": "M", "name": "process_name", "pid": 10, "args": {"name": "python"}},
        ],
        "metadata": {"env": {"HF_TOKEN": "hf_abcdefghijklmnop"}},
        "distributedInfo": {"rank": 2, "world_size": 4, "backend": "nccl", "secret": "pw123456789"},
        "deviceProperties": [
            {
                "id": 0,
                "name": "GPU X",
                "numSms": 1,
                "computeMajor": 9,
                "computeMinor": 0,
                "token": "tok_ABCDEFGHIJ",
            }
        ],
    }
    t = read_kineto(write(tmp_path, "odd.json", doc), default_rank=0)
    e = t.events.sort("ts_ns")
    assert e.get_column("name").to_list() == [
        "k",
        "Record Window End",
        "ünïcødé ✓ 内核",
    ]
    assert e.get_column("ts_ns").to_list() == [200_000, 300_000, 1_000_500]
    assert e.get_column("dur_ns").to_list() == [1000, 0, 2000]
    assert e.get_column("kind").to_list() == ["kernel", "instant", "cpu_op"]
    assert "odd.json: 1 event(s) with a negative duration dropped" in t.warnings
    k = e.filter(pl.col("kind") == "kernel").row(0, named=True)
    assert (k["correlation"], k["external_id"], k["device"], k["stream"]) == (None, 9, 0, 7)
    assert any("7 days" in w for w in t.warnings)
    assert t.ranks.select("rank", "world_size", "device_name").row(0) == (2, 4, "GPU X")
    cells = all_strings(t)
    for s in ("hf_abcdefghijklmnop", "pw123456789", "tok_ABCDEFGHIJ"):
        assert not cells.str.contains(s, literal=True).any()


def test_lenient_decode_of_mistyped_fields(tmp_path: Path) -> None:
    doc = {
        "traceEvents": [
            None,
            ev(args=["not", "a", "dict"]),
            ev(ts=[1, 2]),  # unusable timestamp → row dropped with a warning
            ev(
                cat="kernel",
                pid=0,
                tid=7,
                ts=50,
                args={"stream": {"x": 1}, "device": 0, "correlation": 4},
            ),
            {"ph": "s", "id": 4, "pid": 10, "tid": 11, "ts": 49, "cat": "ac2g", "name": "ac2g"},
            {
                "ph": "f",
                "id": 4,
                "pid": 0,
                "tid": 7,
                "ts": 50,
                "cat": "ac2g",
                "name": "ac2g",
                "bp": "e",
            },
        ],
        "baseTimeNanoseconds": 1_000_000_000,
    }
    t = read_kineto(write(tmp_path, "lenient.json.gz", doc, gz=True), default_rank=1)
    assert t.events.height == 2
    k = t.events.filter(pl.col("kind") == "kernel").row(0, named=True)
    assert (k["ts_ns"], k["stream"], k["correlation"]) == (1_000_050_000, 7, 4)  # stream from tid
    assert t.flows.select("flow_id", "phase", "ts_ns").rows() == [
        (4, "s", 1_000_049_000),
        (4, "f", 1_000_050_000),
    ]
    assert any("lenient" in w for w in t.warnings)
    assert any("timestamp" in w for w in t.warnings)


def test_invalid_utf8_is_replaced(tmp_path: Path) -> None:
    raw = (
        json.dumps({"traceEvents": [ev(name="NAME")]}).encode().replace(b"NAME", b"bad\xff\xfename")
    )
    t = read_kineto(write(tmp_path, "latin.json", raw), default_rank=0)
    assert t.events.get_column("name").to_list() == ["bad\ufffd\ufffdname"]
    assert any("UTF-8" in w for w in t.warnings)


def test_graph_replay_ids(tmp_path: Path) -> None:
    """Newer Kineto (PR #1276): one cudaGraphLaunch, kernels sharing its correlation, each with
    `graph id` / `graph node id`."""
    launch = ev(
        cat="cuda_runtime",
        name="cudaGraphLaunch",
        ts=10,
        dur=2,
        args={"correlation": 77, "External id": 5, "cbid": 311},
    )
    kernels = [
        ev(
            cat="kernel",
            name=f"k{i}",
            pid=1,
            tid=9,
            ts=20 + i,
            dur=1,
            args={
                "correlation": 77,
                "External id": 5,
                "device": 1,
                "stream": 9,
                "graph id": 3,
                "graph node id": 100 + i,
            },
        )
        for i in range(3)
    ]
    t = read_kineto(
        write(tmp_path, "graph.json", {"traceEvents": [launch, *kernels]}), default_rank=0
    )
    k = kind(t, "kernel").sort("ts_ns")
    assert k.select("correlation", "graph_id").unique().rows() == [(77, 3)]
    assert k.get_column("graph_node_id").to_list() == [100, 101, 102]
    assert kind(t, "runtime").select("graph_id", "graph_node_id").row(0) == (None, None)


def test_two_files_two_ranks(corpus: Path) -> None:
    k = corpus / "public" / "kineto"
    # two unrelated public traces (captured months apart): merged only when asked
    t = load_trace([k / "hta_cuda_event_sync.json.gz", k / "hta_cpu_only.json.gz"],
                   allow_mixed_runs=True)
    assert t.ranks.get_column("rank").to_list() == [0, 34]
    assert t.events.group_by("rank").len().sort("rank").rows() == [(0, 35), (34, 18)]
    assert t.events.schema == EVENTS_SCHEMA and t.comms.schema == COMMS_SCHEMA


def test_rank_files_read_side_by_side_same_as_one_by_one(
    corpus: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Several ranks' files are read by a thread pool: the Trace equals the one read with one
    worker, and of two bad files the first in the given order is the error reported."""
    import moetune.analyzer.readers as readers

    k = corpus / "public" / "kineto"
    files = [k / "hta_cuda_event_sync.json.gz", k / "hta_cpu_only.json.gz",
             k / "hta_mi250_minitoy.json.gz", k / "hta_a100_alltoall_rank3of8.json.gz"]
    monkeypatch.setattr(readers, "cpu_count", lambda: 4)
    many = load_trace(files, allow_mixed_runs=True)  # unrelated public traces, as asked
    monkeypatch.setattr(readers, "cpu_count", lambda: 1)
    one = load_trace(files, allow_mixed_runs=True)
    assert all(a.equals(b) for a, b in zip(
        (many.events, many.comms, many.flows, many.ranks, many.memory),
        (one.events, one.comms, one.flows, one.ranks, one.memory), strict=True))
    text = json.dumps({"traceEvents": [ev()] * 20})
    bad1 = write(tmp_path, "b1.json", text[: len(text) // 2])
    bad2 = write(tmp_path, "b2.json.gz", b"\x1f\x8b garbage")
    monkeypatch.setattr(readers, "cpu_count", lambda: 4)
    for order in ([files[0], bad2, bad1], [files[0], bad1, bad2]):
        with pytest.raises(UserError) as info:
            load_trace(order)
        assert str(order[1]) in str(info.value)


def test_absurd_header_values_read_as_unknown(tmp_path: Path) -> None:
    doc = {
        "distributedInfo": {"rank": 2**40, "world_size": -(2**63) - 1, "backend": 7},
        "deviceProperties": [{"id": 0, "name": None, "numSms": 2**33, "computeMajor": "9"}],
        "traceEvents": [ev(cat="kernel", pid=0, tid=7)],
    }
    t = read_kineto(write(tmp_path, "hdr.json", doc), default_rank=6)
    r = t.ranks.row(0, named=True)
    assert (r["rank"], r["world_size"], r["backend"], r["num_sms"], r["compute_capability"]) == (
        6,
        None,
        "7",
        None,
        "9.0",
    )


def test_rank_strings_and_old_tid_spelling(tmp_path: Path) -> None:
    doc = {
        "distributedInfo": {"rank": "5"},
        "traceEvents": [ev(cat="Kernel", pid=0, tid="stream 12", args={"correlation": 1})],
    }
    t = read_kineto(write(tmp_path, "old.json", doc), default_rank=0)
    row = t.events.row(0, named=True)
    assert (row["rank"], row["kind"], row["tid"], row["stream"], row["device"]) == (
        5,
        "kernel",
        12,
        12,
        0,
    )


# --------------------------------------------------------------------------- bad inputs


def test_truncated_gzip(tmp_path: Path) -> None:
    full = gzip.compress(json.dumps({"traceEvents": [ev()] * 200}).encode())
    one_line_error(write(tmp_path, "cut.json.gz", full[: len(full) // 2]), "gzip")


def test_corrupt_gzip_body(tmp_path: Path) -> None:
    full = bytearray(gzip.compress(json.dumps({"traceEvents": [ev()] * 200}).encode()))
    full[20:40] = b"\x00" * 20  # deflate stream garbage → zlib.error, not OSError
    one_line_error(write(tmp_path, "garbled.json.gz", bytes(full)), "gzip")


def test_truncated_json(tmp_path: Path) -> None:
    text = json.dumps({"traceEvents": [ev()] * 20})
    one_line_error(write(tmp_path, "cut.json", text[: len(text) // 2]), "is truncated: its JSON ends")


def test_unescaped_quote_names_position(tmp_path: Path) -> None:
    text = '{"traceEvents": [{"ph": "X", "name": "say "hi"", "ts": 1, "dur": 1}]}'
    with pytest.raises(UserError, match=r"not valid JSON at line 1: expected") as info:
        read_kineto(write(tmp_path, "quote.json", text), default_rank=0)
    assert "quote.json" in str(info.value)


def test_not_json(tmp_path: Path) -> None:
    one_line_error(write(tmp_path, "notes.json", "hello, this is text"), "not a trace")
    with pytest.raises(UserError, match="not valid JSON"):
        read_kineto(write(tmp_path, "brace.json", "{ nope"), default_rank=0)


def test_empty_file(tmp_path: Path) -> None:
    one_line_error(write(tmp_path, "empty.json", b""), "empty")
    with pytest.raises(UserError, match="empty"):
        read_kineto(write(tmp_path, "empty.json.gz", b"   \n", gz=True), default_rank=0)


def test_json_without_trace_events(tmp_path: Path) -> None:
    one_line_error(write(tmp_path, "cfg.json", {"model": "x", "layers": 4}), "not a Kineto trace")
    one_line_error(write(tmp_path, "nulls.json", {"traceEvents": None}), "not a Kineto trace")
    with pytest.raises(UserError, match="not a Kineto trace"):
        read_kineto(write(tmp_path, "arr.json", "[1, 2]"), default_rank=0)


def test_missing_file(tmp_path: Path) -> None:
    with pytest.raises(UserError, match="no such file"):
        read_kineto(tmp_path / "absent.json", default_rank=0)


def test_cli_reports_bad_trace_in_one_line(tmp_path: Path) -> None:
    from moetune.cli import build_parser

    sub = next(a for a in build_parser()._actions if a.dest == "command")
    if "diagnose" not in sub.choices:
        pytest.skip("diagnose command not there yet")
    bad = write(tmp_path, "cut.json", '{"traceEvents": [')
    proc = subprocess.run(
        [sys.executable, "-m", "moetune", "diagnose", str(bad)],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=60,
    )
    assert proc.returncode == 2
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and str(bad) in lines[0] and "Traceback" not in proc.stderr
