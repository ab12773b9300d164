"""Nsight Systems SQLite reader: corpus exports (counts read with sqlite3 from the exports themselves), hand-built
exports in tmp_path for the graph trace modes and bad input, and `nsys export` through a real
subprocess."""

from __future__ import annotations

import gzip
import os
import shutil
import sqlite3
import stat
import struct
import sys
from pathlib import Path

import polars as pl
import pytest
from moetune.analyzer.frames import COMMS_SCHEMA, EVENTS_SCHEMA, RANKS_SCHEMA
from moetune.analyzer.readers import load_trace
from moetune.analyzer.readers.nsys import GRAPH_MODE_WARNING, read_nsys

from moetune.errors import UserError

NSYS = "public/nsys"
H200 = "made/h200_moe_eager_loop.nsys.sqlite.gz"


def _read(corpus: Path, rel: str):
    return read_nsys(corpus / rel, first_rank=0)


def _count(ev: pl.DataFrame, **eq) -> int:
    return ev.filter(**eq).height


def _check_frames(tr) -> None:
    assert tr.events.schema == EVENTS_SCHEMA
    assert tr.comms.schema == COMMS_SCHEMA
    assert tr.ranks.schema == RANKS_SCHEMA
    assert tr.events["rank"].null_count() == 0
    assert tr.events["dur_ns"].min() >= 0


# --- corpus -------------------------------------------------------------------------------------


@pytest.mark.corpus
def test_training_before_counts(corpus: Path) -> None:
    tr = _read(corpus, f"{NSYS}/nsysai_2gpu_training_before.sqlite")
    _check_frames(tr)
    ev = tr.events
    kern = ev.filter(kind="kernel")
    assert kern.height == 4010
    assert sorted(kern["device"].unique().to_list()) == [0, 1]
    # one rank per (process, device): pid 144 → device 0 → rank 0, pid 145 → device 1 → rank 1
    assert kern.group_by("rank").agg(pl.col("device").unique()).sort("rank")["device"].to_list() == [
        [0], [1]
    ]
    sendrecv = kern.filter(pl.col("name").str.starts_with("ncclDevKernel_SendRecv"))
    assert sendrecv.height == 66
    assert sendrecv.group_by("rank").len().sort("rank")["len"].to_list() == [33, 33]
    rt = ev.filter(kind="runtime")
    assert _count(rt, name="cudaLaunchKernel") == 3604
    assert _count(rt, name="cuLaunchKernelEx") == 402
    assert not rt["name"].str.contains(r"_v\d+$").any()  # version suffixes stripped
    assert _count(rt, name="cuKernelGetAttribute") == 0  # query noise Kineto never records
    cp = ev.filter(kind="memcpy")
    assert cp.height == 1020
    assert _count(cp, copy_kind="DtoD") == 986 and _count(cp, copy_kind="HtoD") == 34
    assert _count(cp, name="Memcpy HtoD (Pageable -> Device)") == 34
    assert _count(ev, kind="memset") == 269
    sync = ev.filter(kind="sync")
    assert sync.height == 366
    assert _count(sync, sync_kind="stream_wait_event") == 200
    assert _count(sync, sync_kind="event_sync") == 133
    assert _count(sync, sync_kind="stream_sync") == 33
    assert _count(ev, kind="annotation") == 19118
    # kernels without a launch row in their process: 24, as in the raw file (launched before the
    # capture window; SQL check on globalTid>>24 = globalPid>>24): the noise filter drops no launch
    launches = rt.select("rank", "correlation").unique()
    assert kern.join(launches, on=["rank", "correlation"], how="anti").height == 24
    # NCCL API ranges → comms
    assert tr.comms.group_by("collective").len().sort("collective").rows() == [
        ("recv", 132), ("send", 132)
    ]
    r = tr.ranks
    assert r["rank"].to_list() == [0, 1]
    assert r["graph_trace_mode"].to_list() == ["graph", "graph"]
    assert r["world_size"].to_list() == [2, 2]
    assert r["backend"].to_list() == ["nccl", "nccl"]
    assert r["clock_offset_ns"].to_list() == [1779782330176752435] * 2
    # graph mode recorded but nothing was replayed: no graph warning; the missing GPU table is named
    assert not any(GRAPH_MODE_WARNING in w for w in tr.warnings)
    assert any("TARGET_INFO_GPU" in w for w in tr.warnings)


@pytest.mark.corpus
def test_first_rank_offsets_numbering(corpus: Path) -> None:
    tr = read_nsys(corpus / f"{NSYS}/nsysai_2gpu_training_before.sqlite", first_rank=4)
    assert tr.ranks["rank"].to_list() == [4, 5]
    assert sorted(tr.events["rank"].unique().to_list()) == [4, 5]


@pytest.mark.corpus
def test_inference_counts(corpus: Path) -> None:
    tr = _read(corpus, f"{NSYS}/nsysai_h100_2gpu_inference.sqlite")
    _check_frames(tr)
    ev = tr.events
    kern = ev.filter(kind="kernel")
    assert kern.height == 3442
    assert tr.ranks.height == 2
    span_s = (kern.select((pl.col("ts_ns") + pl.col("dur_ns")).max() - pl.col("ts_ns").min()).item()) / 1e9
    assert 0.9 < span_s < 1.0  # "~0.96 s kernel span"
    rt = ev.filter(kind="runtime")
    assert _count(rt, name="cudaLaunchKernel") == 2788
    assert _count(rt, name="cudaLaunchKernelExC") == 558
    cp = ev.filter(kind="memcpy")
    assert [_count(cp, copy_kind=k) for k in ("HtoD", "DtoD", "DtoH")] == [450, 450, 4]
    assert _count(ev, kind="memset") == 22
    assert _count(ev, kind="sync") == 244
    assert tr.comms.height == 0  # no NCCL
    assert tr.ranks["backend"].to_list() == [None, None]


@pytest.mark.corpus
def test_mock_missing_nvtx(corpus: Path) -> None:
    tr = _read(corpus, f"{NSYS}/nsysai_mock.sqlite")
    _check_frames(tr)
    ev = tr.events
    assert _count(ev, kind="kernel") == 2
    cp = ev.filter(kind="memcpy")
    assert cp.select("copy_kind", "bytes").rows() == [("DtoH", 4)]
    assert any("NVTX_EVENTS" in w for w in tr.warnings)
    assert _count(ev, kind="annotation") == 0
    r = tr.ranks.row(0, named=True)
    assert (r["device_name"], r["num_sms"], r["compute_capability"]) == (
        "NVIDIA GeForce RTX 3080", 68, "8.6"
    )
    assert r["world_size"] is None and r["graph_trace_mode"] == "graph"
    # the sync row is the cudaStreamSynchronize call's (same correlation), on stream 7
    sync = ev.filter(kind="sync").row(0, named=True)
    assert (sync["sync_kind"], sync["stream"], sync["correlation"]) == ("stream_sync", 7, 172)
    assert _count(ev, kind="runtime", name="cudaStreamSynchronize", correlation=172) == 1
    # kernels ~18 ms apart: the trace is idle-dominated
    k = ev.filter(kind="kernel").sort("ts_ns")
    gap = k["ts_ns"][1] - (k["ts_ns"][0] + k["dur_ns"][0])
    assert 17e6 < gap < 19e6 and k["dur_ns"].sum() < 5_000


@pytest.mark.corpus
def test_synthetic_healthy_minimal_schema(corpus: Path) -> None:
    tr = _read(corpus, f"{NSYS}/nsysai_synthetic_healthy.sqlite")
    _check_frames(tr)
    kern = tr.events.filter(kind="kernel")
    assert kern.height == 400
    assert _count(kern, dur_ns=1_000_000) == 400
    span = (kern["ts_ns"] + kern["dur_ns"]).max() - kern["ts_ns"].min()
    idle_pct = 100 * (span - kern["dur_ns"].sum()) / span
    assert idle_pct == pytest.approx(0.9876, abs=5e-4)  # from the export's own kernel rows: 400 × 1 ms in the span
    assert tr.ranks["device_name"].to_list() == ["NVIDIA H100 80GB HBM3"]
    assert tr.ranks["graph_trace_mode"].to_list() == [None]
    assert _count(tr.events, kind="runtime", name="cudaLaunchKernel") == 400
    text = " ".join(tr.warnings)
    assert "graphNodeId" in text and "NVTX_EVENTS" in text and "SYNCHRONIZATION" in text


@pytest.mark.corpus
def test_h200_node_mode_gz(corpus: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import tempfile

    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    tr = _read(corpus, H200)
    assert list(tmp_path.iterdir()) == []  # the decompressed temp copy is removed
    _check_frames(tr)
    ev = tr.events
    kern = ev.filter(kind="kernel")
    assert kern.height == 44266
    assert kern["graph_node_id"].null_count() == kern.height  # eager: no graph-replayed kernels
    iters = ev.filter((pl.col("kind") == "annotation") & pl.col("name").str.starts_with("iteration"))
    assert iters["name"].to_list() == [f"iteration {i}" for i in range(8)]
    assert _count(ev, kind="memcpy") == 8610
    rt = ev.filter(kind="runtime")
    assert _count(rt, name="cudaLaunchKernel") == 26754
    assert _count(rt, name="cuLaunchKernelEx") == 17501
    assert _count(rt, name="cudaMemcpyAsync") == 8610
    launches = rt.select("correlation").unique()
    assert kern.join(launches, on="correlation", how="anti").height == 0
    r = tr.ranks.row(0, named=True)
    assert (r["device_name"], r["num_sms"], r["compute_capability"]) == ("NVIDIA H200", 132, "9.0")
    assert r["graph_trace_mode"] == "node"  # PROCESS_0:CUDA_GRAPH_TRACE_OPTIONS:MODE = Node
    assert tr.warnings == ()


@pytest.mark.corpus
def test_load_trace_dispatches_nsys(corpus: Path) -> None:
    tr = load_trace([corpus / f"{NSYS}/nsysai_mock.sqlite", corpus / f"{NSYS}/nsysai_synthetic_healthy.sqlite"])
    assert tr.ranks["rank"].to_list() == [0, 1]
    assert tr.formats == ["nsys"]


# --- hand-built exports (real SQLite, nsys table and column names) -------------------------------

DDL = {
    "StringIds": "id INTEGER PRIMARY KEY, value TEXT NOT NULL",
    "CUPTI_ACTIVITY_KIND_KERNEL": (
        'start INTEGER, "end" INTEGER, deviceId INTEGER, streamId INTEGER, correlationId INTEGER, '
        "globalPid INTEGER, demangledName INTEGER, shortName INTEGER, graphNodeId INTEGER, "
        "graphId INTEGER"
    ),
    "CUPTI_ACTIVITY_KIND_RUNTIME": (
        'start INTEGER, "end" INTEGER, eventClass INTEGER, globalTid INTEGER, '
        "correlationId INTEGER, nameId INTEGER"
    ),
    "CUPTI_ACTIVITY_KIND_GRAPH_TRACE": (
        'start INTEGER, "end" INTEGER, deviceId INTEGER, streamId INTEGER, correlationId INTEGER, '
        "globalPid INTEGER, graphId INTEGER, graphExecId INTEGER"
    ),
    "NVTX_EVENTS": (
        'start INTEGER, "end" INTEGER, eventType INTEGER, text TEXT, globalTid INTEGER, '
        "textId INTEGER, binaryData BLOB"
    ),
    "NVTX_PAYLOAD_SCHEMA_ENTRIES": 'schemaId INTEGER, idx INTEGER, name TEXT, "offset" INTEGER',
    "META_DATA_CAPTURE": "name TEXT, value TEXT",
}
GPID = (1 << 48) + (731 << 24)  # globalPid of pid 731 on host 1 (as in the H200 export)


def _gtid(pid: int, tid: int) -> int:
    return (1 << 48) + (pid << 24) + tid


def make_export(path: Path, rows: dict[str, list[tuple]], tables: tuple[str, ...] = ()) -> Path:
    """A small SQLite file with nsys table/column names; `rows` fills the named tables."""
    conn = sqlite3.connect(path)
    for name in dict.fromkeys((*rows, *tables)):
        conn.execute(f'CREATE TABLE "{name}" ({DDL[name]})')
        for row in rows.get(name, []):
            conn.execute(f'INSERT INTO "{name}" VALUES ({",".join("?" * len(row))})', row)
    conn.commit()
    conn.close()
    return path


STRINGS = [(1, "cudaGraphLaunch_v10000"), (2, "gemm_kernel"), (3, "nccl_allgather_kernel"),
           (4, "cudaLaunchKernel_v7000"), (5, "cuKernelGetName"), (6, "ncclCommInitRank")]


def test_node_mode_graph_kernels_share_launch(tmp_path: Path) -> None:
    # one cudaGraphLaunch (correlation 10) replays 3 kernels; one eager kernel (correlation 11)
    f = make_export(tmp_path / "node.sqlite", {
        "StringIds": STRINGS,
        "CUPTI_ACTIVITY_KIND_RUNTIME": [
            (100, 150, 0, _gtid(731, 5), 10, 1),
            (160, 170, 0, _gtid(731, 5), 11, 4),
            (161, 162, 0, _gtid(731, 5), 11, 5),  # nested driver query: dropped
        ],
        "CUPTI_ACTIVITY_KIND_KERNEL": [
            (200, 300, 0, 7, 10, GPID, 2, 2, 41, 3),
            (300, 350, 0, 7, 10, GPID, 3, 3, 42, 3),
            (350, 400, 0, 7, 10, GPID, 2, 2, 43, 3),
            (410, 420, 0, 7, 11, GPID, 2, 2, 0, 0),
        ],
        "META_DATA_CAPTURE": [("PROCESS_0:CUDA_GRAPH_TRACE_OPTIONS:MODE", "Node"),
                              ("PROCESS_0:ENVIRONMENT_VARIABLE", "SECRET=hunter2")],
    })
    tr = read_nsys(f, first_rank=0)
    ev = tr.events
    kern = ev.filter(kind="kernel").sort("ts_ns")
    assert kern["graph_node_id"].to_list() == [41, 42, 43, None]
    assert kern["graph_id"].to_list() == [3, 3, 3, None]
    assert kern["correlation"].to_list() == [10, 10, 10, 11]
    assert kern["pid"].to_list() == [0] * 4 and kern["tid"].to_list() == [7] * 4
    rt = ev.filter(kind="runtime").sort("ts_ns")
    assert rt["name"].to_list() == ["cudaGraphLaunch", "cudaLaunchKernel"]
    assert rt["pid"].to_list() == [731, 731] and rt["tid"].to_list() == [5, 5]
    assert tr.ranks["graph_trace_mode"].to_list() == ["node"]
    assert not any(GRAPH_MODE_WARNING in w for w in tr.warnings)
    assert "hunter2" not in repr(tr)  # capture metadata never leaks


def test_graph_mode_replays_become_graph_rows(tmp_path: Path) -> None:
    f = make_export(tmp_path / "graph.sqlite", {
        "StringIds": STRINGS,
        "CUPTI_ACTIVITY_KIND_RUNTIME": [(100, 150, 0, _gtid(731, 5), 10, 1),
                                        (500, 550, 0, _gtid(731, 5), 12, 1)],
        "CUPTI_ACTIVITY_KIND_GRAPH_TRACE": [(200, 400, 0, 7, 10, GPID, 3, 9),
                                            (600, 800, 0, 7, 12, GPID, 3, 9)],
    }, tables=("CUPTI_ACTIVITY_KIND_KERNEL",))
    tr = read_nsys(f, first_rank=0)
    g = tr.events.filter(kind="graph").sort("ts_ns")
    assert g.select("correlation", "graph_id", "dur_ns", "device", "stream").rows() == [
        (10, 3, 200, 0, 7), (12, 3, 200, 0, 7)
    ]
    assert tr.gpu.height == 2
    assert tr.ranks["graph_trace_mode"].to_list() == ["graph"]  # inferred from GRAPH_TRACE rows
    assert any(GRAPH_MODE_WARNING in w for w in tr.warnings)


def test_one_process_two_devices_ranks_by_correlation(tmp_path: Path) -> None:
    f = make_export(tmp_path / "multi.sqlite", {
        "StringIds": STRINGS,
        "CUPTI_ACTIVITY_KIND_RUNTIME": [(100, 110, 0, _gtid(731, 5), 20, 4),
                                        (120, 130, 0, _gtid(731, 5), 21, 4),
                                        (140, 150, 0, _gtid(999, 1), 22, 4)],  # no GPU work
        "CUPTI_ACTIVITY_KIND_KERNEL": [(200, 300, 1, 7, 20, GPID, 2, 2, 0, 0),
                                       (200, 300, 0, 7, 21, GPID, 2, 2, 0, 0)],
    })
    tr = read_nsys(f, first_rank=0)
    rt = tr.events.filter(kind="runtime").sort("ts_ns")
    # ranks in device order: device 0 → rank 0; each launch follows its kernel's device
    assert rt.select("correlation", "rank").rows() == [(20, 1), (21, 0)]
    assert tr.ranks["world_size"].to_list() == [2, 2]


def test_nccl_payload_gives_real_ranks(tmp_path: Path) -> None:
    # two processes whose ncclCommInitRank payloads say rank 1 (pid 10) and rank 0 (pid 11)
    def blob(nranks: int, rank: int, dev: int) -> bytes:
        return struct.pack("<Qiii", 0xABC, nranks, rank, dev)

    f = make_export(tmp_path / "nccl.sqlite", {
        "StringIds": STRINGS,
        "CUPTI_ACTIVITY_KIND_RUNTIME": [(100, 110, 0, _gtid(10, 1), 1, 4),
                                        (100, 110, 0, _gtid(11, 1), 1, 4)],
        "CUPTI_ACTIVITY_KIND_KERNEL": [(200, 300, 0, 7, 1, (1 << 48) + (10 << 24), 3, 3, 0, 0),
                                       (200, 300, 1, 7, 1, (1 << 48) + (11 << 24), 3, 3, 0, 0)],
        "NVTX_EVENTS": [(50, 60, 59, None, _gtid(10, 1), 6, blob(2, 1, 0)),
                        (50, 60, 59, None, _gtid(11, 1), 6, blob(2, 0, 1))],
        "NVTX_PAYLOAD_SCHEMA_ENTRIES": [(1, 0, "NCCL communicator ID", 0), (1, 1, "No. of ranks", 8),
                                        (1, 2, "Rank", 12), (1, 3, "CUDA device", 16)],
    })
    tr = read_nsys(f, first_rank=0)
    kern = tr.events.filter(kind="kernel").sort("device")
    assert kern.select("device", "rank").rows() == [(0, 1), (1, 0)]
    assert tr.ranks["world_size"].to_list() == [2, 2]


# --- bad input ----------------------------------------------------------------------------------


def _user_error(path: Path) -> str:
    with pytest.raises(UserError) as info:
        load_trace([path])
    msg = str(info.value)
    assert "\n" not in msg and str(path) in msg
    return msg


def test_not_sqlite(tmp_path: Path) -> None:
    f = tmp_path / "x.sqlite"
    f.write_text("hello, not a database\n")
    assert "not a trace" in _user_error(f)


def test_sqlite_but_not_nsys(tmp_path: Path) -> None:
    f = tmp_path / "app.sqlite"
    conn = sqlite3.connect(f)
    conn.execute("CREATE TABLE users (id INTEGER, name TEXT)")
    conn.commit()
    conn.close()
    assert "not an Nsight Systems export" in _user_error(f)


def test_cpu_only_capture(tmp_path: Path) -> None:
    f = make_export(tmp_path / "cpu.sqlite", {
        "StringIds": STRINGS,
        "CUPTI_ACTIVITY_KIND_RUNTIME": [(100, 110, 0, _gtid(731, 5), 1, 4)],
    }, tables=("CUPTI_ACTIVITY_KIND_KERNEL", "NVTX_EVENTS"))
    assert "no GPU kernels" in _user_error(f)


@pytest.mark.corpus
def test_truncated_and_garbled(corpus: Path, tmp_path: Path) -> None:
    data = (corpus / f"{NSYS}/nsysai_mock.sqlite").read_bytes()
    cut = tmp_path / "cut.sqlite"
    cut.write_bytes(data[: len(data) // 3])
    msg = _user_error(cut)
    assert "SQLite" in msg or "malformed" in msg
    bad = tmp_path / "bad.sqlite"
    bad.write_bytes(data[:100] + b"\xff" * (len(data) - 100))
    _user_error(bad)
    gz = tmp_path / "trunc.sqlite.gz"
    gz.write_bytes(gzip.compress(data)[:5000])
    assert "gzip" in _user_error(gz)


@pytest.mark.corpus
def test_read_only_even_when_locked(corpus: Path, tmp_path: Path) -> None:
    f = tmp_path / "mock.sqlite"
    shutil.copy(corpus / f"{NSYS}/nsysai_mock.sqlite", f)
    f.chmod(stat.S_IRUSR)
    before = (f.read_bytes(), f.stat().st_mtime_ns)
    holder = sqlite3.connect(f"file:{f}?mode=ro", uri=True)
    holder.execute("BEGIN")
    holder.execute("SELECT count(*) FROM StringIds").fetchone()  # shared lock held
    try:
        tr = read_nsys(f, first_rank=0)
    finally:
        holder.close()
    assert tr.events.filter(kind="kernel").height == 2
    assert (f.read_bytes(), f.stat().st_mtime_ns) == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["mock.sqlite"]  # no journal / wal


# --- .nsys-rep ----------------------------------------------------------------------------------


def test_rep_without_nsys_names_the_command(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    rep = tmp_path / "run.nsys-rep"
    rep.write_bytes(b"not really a report")
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    msg = _user_error(rep)
    assert "nsys export --type sqlite --output" in msg and "run.sqlite" in msg


@pytest.mark.corpus
def test_rep_exported_once_and_cached(corpus: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # A stand-in `nsys` executable (a real subprocess) that "exports" by copying a real export
    # and counts its calls.
    bindir = tmp_path / "bin"
    bindir.mkdir()
    calls = tmp_path / "calls"
    fake = bindir / "nsys"
    fake.write_text(
        f"#!{sys.executable}\n"
        "import shutil, sys\n"
        f"open({str(calls)!r}, 'a').write(' '.join(sys.argv[1:]) + '\\n')\n"
        "out = sys.argv[sys.argv.index('--output') + 1]\n"
        f"shutil.copy({str(corpus / NSYS / 'nsysai_mock.sqlite')!r}, out)\n"
    )
    fake.chmod(0o755)
    monkeypatch.setenv("PATH", f"{bindir}{os.pathsep}{os.environ['PATH']}")
    rep = tmp_path / "run.nsys-rep"
    rep.write_bytes(b"report")
    for _ in range(2):
        tr = load_trace([rep])
        assert tr.events.filter(kind="kernel").height == 2
    lines = calls.read_text().splitlines()
    assert len(lines) == 1 and lines[0].startswith("export --type sqlite --output")
    assert (tmp_path / "run.sqlite").is_file()
    # a newer report invalidates the cache
    os.utime(rep, ns=(rep.stat().st_atime_ns, (tmp_path / "run.sqlite").stat().st_mtime_ns + 10**9))
    load_trace([rep])
    assert len(calls.read_text().splitlines()) == 2


# --- end to end: moetune diagnose on nsys exports -----------------------------------------------


def _diagnose_json(argv: list[str], capsys: pytest.CaptureFixture[str]) -> dict:
    import json

    import jsonschema

    pytest.importorskip("moetune.analyzer.diagnose")
    pytest.importorskip("moetune.commands.diagnose")
    from moetune.cli import main

    capsys.readouterr()
    assert main(["diagnose", *argv, "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    schema = json.loads((Path(__file__).parents[1] / "schemas/diagnosis.schema.json").read_text())
    jsonschema.validate(doc, schema)
    return doc


@pytest.mark.corpus
def test_diagnose_synthetic_healthy(corpus: Path, capsys: pytest.CaptureFixture[str]) -> None:
    doc = _diagnose_json([str(corpus / NSYS / "nsysai_synthetic_healthy.sqlite")], capsys)
    walls = doc["walls"]
    # 4 ms of 10 µs gaps in a 403.99 ms span: host/idle ≈ 0.99 %, no communication
    assert walls["host"] == pytest.approx(0.0099, abs=0.001)
    assert walls["communication"] == 0
    assert doc["dominant_wall"] == "compute"
    assert doc["step_time_s"] == pytest.approx(0.40399, abs=1e-5)


@pytest.mark.corpus
def test_diagnose_mock_idle_dominated(corpus: Path, capsys: pytest.CaptureFixture[str]) -> None:
    doc = _diagnose_json([str(corpus / NSYS / "nsysai_mock.sqlite")], capsys)
    assert doc["walls"]["communication"] == 0
    assert doc["dominant_wall"] == "host" and doc["walls"]["host"] > 0.99
    assert doc["inputs"][0]["format"] == "nsys"


@pytest.mark.corpus
def test_diagnose_h200_nvtx_steps(corpus: Path, capsys: pytest.CaptureFixture[str]) -> None:
    doc = _diagnose_json([str(corpus / H200)], capsys)
    assert doc["steps"] == list(range(8))  # NVTX `iteration N` ranges
    assert doc["dominant_wall"] == "host"  # eager expert loop: launch-bound by construction
    assert doc["inputs"][0]["graph_trace_mode"] == "node"


def test_cli_bad_input_one_line_exit_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    pytest.importorskip("moetune.commands.diagnose")
    from moetune.cli import main

    f = tmp_path / "app.sqlite"
    conn = sqlite3.connect(f)
    conn.execute("CREATE TABLE t (x)")
    conn.commit()
    conn.close()
    capsys.readouterr()
    assert main(["diagnose", str(f)]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and err.startswith("moetune: ") and "not an Nsight Systems" in err


# --- fixtures/nsys: real H200 exports (the lead's graph-replay pair; the 2-step eager cut) -------

FIX = Path(__file__).resolve().parents[1] / "fixtures" / "nsys"


def _fixture(name: str):
    path = FIX / name
    if not path.exists():
        pytest.skip(f"{name} not made yet (fixtures/gpu/device_run.sh)")
    return read_nsys(path, first_rank=0)


def test_h200_graph_replay_node_vs_graph_mode() -> None:
    node, graph = _fixture("h200_graphs_replay_node.sqlite.gz"), _fixture("h200_graphs_replay_graph.sqlite.gz")
    nk, gk = node.events.filter(kind="kernel"), graph.events.filter(kind="kernel")
    launches = node.events.filter(kind="runtime", name="cudaGraphLaunch")
    assert launches.height == 10 and _count(graph.events, kind="runtime", name="cudaGraphLaunch") == 10
    # node mode: 360 graph kernels, each replay's kernels share its launch's correlation (24 or 48)
    replayed = nk.filter(pl.col("graph_node_id").is_not_null())
    assert replayed.height == 360
    per_launch = replayed.join(launches.select("correlation"), on="correlation").group_by("correlation").len()
    assert per_launch.height == 10 and sorted(set(per_launch["len"].to_list())) == [24, 48]
    # graph mode: the same 10 replays are opaque `graph` rows; only the 180 eager kernels remain
    rows = graph.events.filter(kind="graph")
    assert rows.height == 10 and gk.height == 180 == nk.height - replayed.height
    glaunch = graph.events.filter(kind="runtime", name="cudaGraphLaunch").select("correlation")
    assert rows.join(glaunch, on="correlation").height == 10  # each replay row ↔ its launch
    assert rows["graph_id"].is_not_null().all()
    assert (node.ranks["graph_trace_mode"].item(), graph.ranks["graph_trace_mode"].item()) == ("node", "graph")
    assert any(GRAPH_MODE_WARNING in w for w in graph.warnings)
    assert not any(GRAPH_MODE_WARNING in w for w in node.warnings)


def test_eager_2step_fixture_is_self_contained() -> None:
    tr = _fixture("h200_eager_2steps.sqlite.gz")
    ev = tr.events
    assert _count(ev, kind="kernel") == 8040
    assert ev.filter(pl.col("name").str.starts_with("iteration"))["name"].to_list() == ["iteration 2", "iteration 3"]
    assert tr.ranks.select("device_name", "graph_trace_mode").row(0) == ("NVIDIA H200", "node")
    # only the graph-trace mode survives from the capture metadata (no host environment)
    raw = gzip.decompress((FIX / "h200_eager_2steps.sqlite.gz").read_bytes())
    assert b"ENVIRONMENT_VARIABLE" not in raw and b"NCCL_VERSION=" not in raw and b"/opt/" not in raw


def test_nccl_api_ranges_become_comms_linked_to_their_launch(tmp_path: Path) -> None:
    f = make_export(tmp_path / "ar.sqlite", {
        "StringIds": [*STRINGS, (7, "ncclAllReduce"), (8, "ncclSend"), (9, "ncclGroupEnd")],
        "CUPTI_ACTIVITY_KIND_RUNTIME": [(120, 130, 0, _gtid(731, 5), 30, 4),   # inside ncclAllReduce
                                        (320, 330, 0, _gtid(731, 5), 31, 4)],  # inside ncclGroupEnd
        "CUPTI_ACTIVITY_KIND_KERNEL": [(200, 300, 0, 9, 30, GPID, 3, 3, 0, 0),
                                       (400, 500, 0, 9, 31, GPID, 3, 3, 0, 0)],
        "NVTX_EVENTS": [(100, 150, 59, None, _gtid(731, 5), 7, None),
                        (280, 290, 59, None, _gtid(731, 5), 8, None),
                        (300, 350, 59, None, _gtid(731, 5), 9, None)],
    })
    tr = read_nsys(f, first_rank=0)
    assert tr.comms.select("collective", "ts_ns", "dur_ns", "correlation").rows() == [
        ("allreduce", 100, 50, 30), ("send", 280, 10, None)
    ]
    assert tr.ranks["backend"].to_list() == ["nccl"]


@pytest.mark.corpus
def test_worker_process_read_equals_serial(corpus: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Large exports read their kernel side in a spawned worker; the frames must be identical."""
    import moetune.analyzer.readers.nsys as nsys

    monkeypatch.setenv("MOETUNE_NSYS_WORKERS", "1")
    serial = _read(corpus, f"{NSYS}/nsysai_2gpu_training_before.sqlite")
    monkeypatch.setenv("MOETUNE_NSYS_WORKERS", "2")
    monkeypatch.setattr(nsys, "PARALLEL_MIN_ROWS", 0)
    if (os.cpu_count() or 1) < 2:
        pytest.skip("one core: the worker path is never taken")
    par = _read(corpus, f"{NSYS}/nsysai_2gpu_training_before.sqlite")
    assert par.events.equals(serial.events)
    assert par.comms.equals(serial.comms) and par.ranks.equals(serial.ranks)
    assert par.warnings == serial.warnings
