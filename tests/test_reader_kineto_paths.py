"""Kineto reader's paths agree: the project fixture, a write/read round trip, chunked decoding and
the compiled fast path against the pure-Python one."""

from __future__ import annotations

import gzip
import json
import mmap
import sys
from pathlib import Path

import polars as pl
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from moetune.analyzer.frames import Trace
from moetune.analyzer.readers import kineto_columns, kineto_decode, kineto_scan
from moetune.analyzer.readers.kineto import read_kineto

from tests.kineto_reading import (
    ev,
    kind,
    one_line_error,
    steps,
    write,
)

# --------------------------------------------------------------------------- project fixture


def test_cpu_moe_fixture(fixtures_dir: Path) -> None:
    path = fixtures_dir / "traces" / "cpu_moe" / "trace.json.gz"
    assert path.stat().st_size < 300_000
    t = read_kineto(path, default_rank=4)
    assert t.gpu.height == 0 and t.comms.height == 0 and t.warnings == ()
    assert t.events.group_by("kind").len().sort("kind").rows() == [
        ("cpu_op", 2028),
        ("annotation", 15),
        ("instant", 2),
        ("other", 1),
    ]
    assert steps(t) == [2, 3, 4]
    names = t.events.get_column("name")
    assert (names == "moe_router").sum() == (names == "moe_experts").sum() == 3
    assert (names == "aten::nonzero").sum() == (names == "aten::index_add").sum() == 12
    assert t.flows.get_column("cat").unique().to_list() == ["fwdbwd"] and t.flows.height == 246
    r = t.ranks.row(0, named=True)
    assert (r["rank"], r["device_name"], r["backend"]) == (4, None, None)
    # Each expert loop sits inside its step, and each step inside the profiler window.
    step = (
        kind(t, "annotation").filter(pl.col("name").str.starts_with("ProfilerStep#")).sort("ts_ns")
    )
    loops = kind(t, "annotation").filter(pl.col("name") == "moe_experts").sort("ts_ns")
    for s, lp in zip(step.iter_rows(named=True), loops.iter_rows(named=True), strict=True):
        assert s["ts_ns"] <= lp["ts_ns"] and lp["ts_ns"] + lp["dur_ns"] <= s["ts_ns"] + s["dur_ns"]


# --------------------------------------------------------------------------- round trip


CAT_KIND = {
    "cpu_op": "cpu_op",
    "user_annotation": "annotation",
    "gpu_user_annotation": "gpu_annotation",
    "python_function": "python",
    "cuda_runtime": "runtime",
    "cuda_driver": "runtime",
    "kernel": "kernel",
    "gpu_memcpy": "memcpy",
    "gpu_memset": "memset",
    "cuda_sync": "sync",
    "overhead": "other",
}


@settings(
    max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    rows=st.lists(
        st.tuples(
            st.sampled_from(sorted(CAT_KIND)),
            st.integers(0, 5 * 10**15),  # ts in ns after the base (Kineto: up to ~2 months)
            st.integers(-5_000, 10**7),  # dur in ns (negative → dropped)
            st.integers(0, 2**40),  # correlation
            st.text(max_size=12),
        ),
        min_size=1,
        max_size=30,
    ),
    base=st.sampled_from([0, 1_700_000_000_000_000_000]),
)
def test_round_trip(tmp_path: Path, rows: list[tuple[str, int, int, int, str]], base: int) -> None:
    """Frame → Kineto JSON (ns-precision float µs, as torch ≥2.3 writes) → reader → same frame."""
    events = [
        {
            "ph": "X",
            "cat": cat,
            "name": name,
            "pid": 3,
            "tid": 5,
            "ts": ts / 1000,
            "dur": dur / 1000,
            "args": {"correlation": corr, "External id": i},
        }
        for i, (cat, ts, dur, corr, name) in enumerate(rows)
    ]
    doc: dict = {"traceEvents": events}
    if base:
        doc["baseTimeNanoseconds"] = base
    path = tmp_path / "rt.json"
    path.write_text(json.dumps(doc))
    t = read_kineto(path, default_rank=0).events.sort("external_id")
    rows = [r for r in rows if r[2] >= 0]  # negative durations are dropped
    assert t.get_column("kind").to_list() == [CAT_KIND[r[0]] for r in rows]
    assert t.get_column("name").to_list() == [r[4] for r in rows]
    assert t.get_column("ts_ns").to_list() == [base + r[1] for r in rows]
    assert t.get_column("dur_ns").to_list() == [r[2] for r in rows]
    assert t.get_column("correlation").to_list() == [r[3] for r in rows]
    gpu = t.filter(pl.col("kind").is_in(["kernel", "memcpy", "memset", "gpu_annotation", "sync"]))
    assert set(gpu.get_column("device")) <= {3} and set(gpu.get_column("stream")) <= {5}


# --------------------------------------------------------------------------- chunked decoding
# These tests are about the pure-Python reader's own paths: the compiled scanner (which reads the
# clean files first) is switched off for them; tests/test_kineto_scan.py checks the two agree.


@pytest.fixture
def python_reader(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(kineto_scan, "USE_COMPILED", False)


def _frames(t: Trace) -> tuple[pl.DataFrame, ...]:
    return (t.events, t.comms, t.flows, t.ranks)


def _same(a: Trace, b: Trace) -> bool:
    return a.warnings == b.warnings and all(
        x.schema == y.schema and x.equals(y) for x, y in zip(_frames(a), _frames(b), strict=True)
    )


def _whole_and_chunked(path: Path, monkeypatch: pytest.MonkeyPatch,
                       chunk: int | None = None) -> tuple:
    """`path` read by the whole-file typed decode, then by the raw-slice chunked path (`chunk`
    events at a time when given)."""
    monkeypatch.setattr(kineto_decode, "RAW_MIN_BYTES", 1 << 40)
    whole = read_kineto(path, default_rank=0)
    monkeypatch.setattr(kineto_decode, "RAW_MIN_BYTES", 0)
    if chunk is not None:
        monkeypatch.setattr(kineto_columns, "CHUNK", chunk)
    return whole, read_kineto(path, default_rank=0)


@pytest.mark.usefixtures("python_reader")
def test_chunked_decode_equals_whole_decode(corpus: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Raw slices decoded 1,000 events at a time (rows renumbered per chunk, side frames concatenated)
    give the same frames as one typed decode of the whole file."""

    path = corpus / "public" / "kineto" / "hta_a100_2rank_nccl.json.gz"
    whole, chunked = _whole_and_chunked(path, monkeypatch, 1000)
    assert _same(whole, chunked)
    assert (chunked.events.height, chunked.flows.height, chunked.comms.height) == (
        whole.events.height,
        whole.flows.height,
        whole.comms.height,
    )
    assert chunked.flows.height > 0 and chunked.comms.height > 0


@pytest.mark.usefixtures("python_reader")
@pytest.mark.parametrize("bad", ["mistyped", "utf8"])
def test_chunk_failing_typed_decode_falls_back_to_whole_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, bad: str
) -> None:
    """A bad event in a late chunk (after good chunks were built) restarts the lenient whole-file
    decode: same frames and warnings as the small-file path."""

    evs = [ev(ts=100 + i, args={"External id": i}) for i in range(7)]
    evs.append(ev(ts=[1, 2]) if bad == "mistyped" else ev(name="NAME"))
    raw = json.dumps({"traceEvents": evs}).encode().replace(b"NAME", b"bad\xffname")
    path = write(tmp_path, "late_bad.json", raw)
    whole, chunked = _whole_and_chunked(path, monkeypatch, 3)
    assert _same(whole, chunked)
    expect = "lenient" if bad == "mistyped" else "UTF-8"
    assert any(expect in w for w in chunked.warnings)
    assert chunked.events.height == (7 if bad == "mistyped" else 8)
    assert chunked.events.get_column("external_id").to_list()[:7] == list(range(7))


# --------------------------------------------------------------------------- fast-path equivalences


@pytest.mark.usefixtures("python_reader")
def test_in_place_chunks_equal_whole_decode_and_leave_file_intact(
    corpus: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An uncompressed file is decoded chunk by chunk in its private map (brackets written around
    each span, then put back): same frames as the whole-file typed decode, file bytes and mtime
    untouched."""
    import hashlib

    src = corpus / "public" / "kineto" / "hta_a100_2rank_nccl.json.gz"
    path = write(tmp_path, "a100.json", gzip.decompress(src.read_bytes()))
    digest, mtime = hashlib.sha256(path.read_bytes()).hexdigest(), path.stat().st_mtime_ns
    # 41 chunks, boundaries at every separator layout
    whole, chunked = _whole_and_chunked(path, monkeypatch, 999)
    assert _same(whole, chunked) and chunked.events.height == 26935
    assert hashlib.sha256(path.read_bytes()).hexdigest() == digest
    assert path.stat().st_mtime_ns == mtime

    # The span located from the raw slices' addresses starts and ends on those slices' bytes, with
    # a separator on either side (where the brackets go); the map holds the file's bytes after.
    data = kineto_decode._open(path)
    doc, _ = kineto_decode._decode_top(data, path)
    origin = kineto_columns._address(data)
    assert origin is not None and isinstance(data, mmap.mmap)
    evs = doc.traceEvents
    for base in range(0, len(evs), 999):
        chunk = evs[base : base + 999]
        start = kineto_columns._address(chunk[0]) - origin
        end = kineto_columns._address(chunk[-1]) - origin + len(chunk[-1])
        assert bytes(data[start : start + len(chunk[0])]) == bytes(chunk[0])
        assert bytes(data[end - len(chunk[-1]) : end]) == bytes(chunk[-1])
        assert data[start - 1 : start] in (b"[", b",", b" ", b"\n") and data[end : end + 1] in (
            b"]",
            b",",
            b" ",
            b"\n",
        )
        assert len(kineto_columns._decode_chunk(chunk, data, origin)) == len(chunk)
    assert hashlib.sha256(data[:]).hexdigest() == digest


@pytest.mark.usefixtures("python_reader")
@pytest.mark.parametrize("gz", [False, True])
def test_bad_gpu_args_in_late_chunk_fall_back(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, gz: bool
) -> None:
    """GPU args are decoded in a second pass, from the rows' raw slices: a mistyped one there still
    sends the whole file through the lenient decode (same frames and warning as the small path)."""

    evs = [ev(ts=100 + i, args={"External id": i}) for i in range(7)]
    evs.append(ev(cat="kernel", pid=0, tid=7, ts=200, args={"stream": {"x": 1}, "device": 0}))
    path = write(tmp_path, "late_gpu.json" + (".gz" if gz else ""), {"traceEvents": evs}, gz=gz)
    whole, chunked = _whole_and_chunked(path, monkeypatch, 3)
    assert _same(whole, chunked)
    assert any("lenient" in w for w in chunked.warnings)
    kern = chunked.events.filter(pl.col("kind") == "kernel").row(0, named=True)
    assert (kern["device"], kern["stream"]) == (0, 7)  # bad stream → null → the row's tid


@pytest.mark.usefixtures("python_reader")
def test_unused_mistyped_arg_does_not_force_lenient_decode(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Above RAW_MIN_BYTES only the args a row's category uses are decoded: a `stream` list on a
    cpu_op (never read) no longer costs the lenient whole-file pass; the frames are those of the
    lenient decode, which drops that field anyway."""

    evs = [ev(ts=100 + i, args={"External id": i, "stream": [1, 2]}) for i in range(5)]
    path = write(tmp_path, "unused.json", {"traceEvents": evs})
    whole, chunked = _whole_and_chunked(path, monkeypatch)
    assert any("lenient" in w for w in whole.warnings)
    assert chunked.warnings == ()
    assert all(x.equals(y) for x, y in zip(_frames(whole), _frames(chunked), strict=True))
    assert chunked.events.get_column("external_id").to_list() == list(range(5))


def test_gpu_masks_match_categories() -> None:
    """GPU rows are found through the category's kind: the same rows as `cat ∈ GPU_CATS`."""
    from moetune.analyzer.readers.kineto_format import GPU_CAT_KINDS, GPU_CATS, KIND_OF_CAT

    cats = [*KIND_OF_CAT, "ac2g", "Trace", "fwdbwd", "", "KERNEL"]
    assert [c in GPU_CATS for c in cats] == [
        KIND_OF_CAT.get(c, "other") in GPU_CAT_KINDS for c in cats
    ]


@settings(max_examples=60, deadline=None)
@given(
    st.lists(
        st.one_of(st.none(), st.integers(-(2**63), 2**63 - 1), st.integers(2**52, 2**54)),
        max_size=40,
    )
)
def test_float_column_from_ints_rounds_like_float(values: list[int | None]) -> None:
    """ts/dur ints are built as Int64 then cast: identical to float(v) for every int64."""
    from moetune.analyzer.readers.kineto_columns import _num_series

    got = _num_series("ts", values, pl.Float64)
    assert got.dtype == pl.Float64
    assert got.to_list() == [None if v is None else float(v) for v in values]


def test_id_series_fast_and_fallback_paths() -> None:
    from moetune.analyzer.readers.kineto_columns import _id_series

    assert _id_series("pid", [1, None, 2**40]).to_list() == [1, None, 2**40]
    odd = [1, "Spans", "stream 7", "", 2.0, 2**70, None, "-3"]
    assert _id_series("tid", odd).to_list() == [1, None, 7, None, 0, None, None, -3]


KIND_OF_CAT_FOR_TEST = ["cpu_op", "kernel", "Kernel", "gpu_memcpy", "cuda_runtime", "cuda_sync"]
_ODD_ARGS = st.fixed_dictionaries(
    {},
    optional={
        "External id": st.integers(0, 2**40),
        "correlation": st.integers(0, 2**40),
        "device": st.integers(0, 7),
        "stream": st.integers(0, 300),
        "bytes": st.integers(0, 2**31),
        "graph id": st.integers(0, 9),
        "Collective name": st.sampled_from(["allreduce", "all_to_allv"]),
        "In msg nelems": st.integers(0, 2**30),
        "Group size": st.integers(1, 8),
        "dtype": st.sampled_from(["Float", "BFloat16"]),
        "In split size": st.sampled_from(["[]", "[1, 2]"]),
        "Process Group Ranks": st.sampled_from(["[0, 1]", "[0, 1, 2, 3]"]),
        "Seq": st.integers(0, 99),
    },
)


@settings(
    max_examples=30, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    rows=st.lists(
        st.tuples(
            st.sampled_from(["X", "X", "i", "s", "f", "M"]),
            st.sampled_from([*KIND_OF_CAT_FOR_TEST, "ac2g", "Trace"]),
            st.sampled_from(["aten::mm", "record_param_comms", "Memcpy DtoH (Device -> Pinned)"]),
            st.integers(0, 10**6),
            _ODD_ARGS,
        ),
        min_size=1,
        max_size=40,
    ),
    chunk=st.integers(1, 7),
)
def test_lean_chunks_equal_full_decode(
    tmp_path_factory: pytest.TempPathFactory,
    rows: list[tuple[str, str, str, int, dict]],
    chunk: int,
) -> None:
    """Random mixes of categories, phases and args: lean Structs + second-pass GPU/collective
    args, decoded in place in chunks, give the frames of the full whole-file typed decode."""
    evs = [
        {"ph": ph, "cat": cat, "name": name, "pid": 1, "tid": 2, "ts": ts, "dur": 3, "id": i}
        | ({"args": args} if args else {})
        for i, (ph, cat, name, ts, args) in enumerate(rows)
    ]
    path = write(tmp_path_factory.mktemp("lean"), "t.json", {"traceEvents": evs})
    old = (kineto_decode.RAW_MIN_BYTES, kineto_columns.CHUNK, kineto_scan.USE_COMPILED)
    try:
        kineto_scan.USE_COMPILED = False
        kineto_decode.RAW_MIN_BYTES = 1 << 40
        whole = read_kineto(path, default_rank=0)
        kineto_decode.RAW_MIN_BYTES, kineto_columns.CHUNK = 0, chunk
        chunked = read_kineto(path, default_rank=0)
    finally:
        kineto_decode.RAW_MIN_BYTES, kineto_columns.CHUNK, kineto_scan.USE_COMPILED = old
    assert _same(whole, chunked)


@pytest.mark.usefixtures("python_reader")
def test_two_copies_of_the_reader_coexist(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The buffer-address helper (`kineto_columns._address`) declares its own ctypes function
    objects: a second copy of its module (importlib.reload, a bench comparing two readers) must
    not retype the first's."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("kineto_columns_copy", kineto_columns.__file__)
    assert spec and spec.loader
    copy = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, "kineto_columns_copy", copy)
    spec.loader.exec_module(copy)
    path = write(tmp_path, "t.json", {"traceEvents": [ev(ts=100 + i) for i in range(9)]})
    monkeypatch.setattr(kineto_decode, "RAW_MIN_BYTES", 0)  # raw slices, decoded in place
    for mod in (kineto_columns, copy, kineto_columns):
        monkeypatch.setattr(mod, "CHUNK", 4)
        data = kineto_decode._open(path)
        doc, _ = kineto_decode._decode_top(data, path)
        assert mod._address(data) is not None
        raw, _ = mod._columns(doc.traceEvents, data)
        assert raw.height == 9


@pytest.mark.usefixtures("python_reader")
def test_released_pages_read_back_from_the_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Pages of decoded chunks are dropped from the private map; anything touching them again
    (the lenient fallback here, forced by a mistyped event near the end) reads the file's bytes."""
    evs = [{"ph": "X", "cat": "kernel", "name": f"k{i}", "pid": 0, "tid": 7, "ts": 10.0 * i,
            "dur": 5.0, "args": {"correlation": i, "stream": 7, "device": 0}} for i in range(3000)]
    good = tmp_path / "good.json"
    good.write_text(json.dumps({"traceEvents": evs}, indent=1))
    bad_evs = [*evs[:-1], {**evs[-1], "dur": {"oops": 1}}]
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"traceEvents": bad_evs}, indent=1))
    released: list[int] = []
    real = kineto_columns._release_pages

    def spy(data, origin, last):  # type: ignore[no-untyped-def]
        released.append(1)
        real(data, origin, last)

    monkeypatch.setattr(kineto_columns, "_release_pages", spy)
    monkeypatch.setattr(kineto_decode, "RAW_MIN_BYTES", 0)
    monkeypatch.setattr(kineto_columns, "CHUNK", 100)
    before = bad.read_bytes()
    a = read_kineto(good, default_rank=0)
    n_good = len(released)
    b = read_kineto(bad, default_rank=0)  # chunks released, then the whole file re-decoded
    assert n_good == 30 and len(released) > n_good
    assert bad.read_bytes() == before
    assert a.events.height == b.events.height == 3000  # the mistyped field is nulled, not the row
    assert a.events.head(2999).equals(b.events.head(2999))  # every other byte read back intact
    assert b.events.get_column("name")[-1] == "k2999"
    assert b.warnings == (f"{bad.name}: fields with unexpected types ignored (lenient decode)",)


def test_deeply_nested_json_is_one_line_not_a_traceback(tmp_path: Path) -> None:
    """100,000 levels of nesting overflow any recursive decoder: one line, exit 2 (issue #17)."""
    deep = b'{"traceEvents": [' + b"[" * 100_000 + b"]" * 100_000 + b"]}"
    one_line_error(write(tmp_path, "deep.json", deep), "nested too deeply")
    one_line_error(write(tmp_path, "deep.json.gz", deep, gz=True), "nested too deeply")


@pytest.mark.parametrize("compiled", [True, False])
def test_negative_durations_are_dropped_and_counted(tmp_path: Path, compiled: bool,
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    """A writer's negative `dur` is no interval: dropped, with the count in one warning (it had
    been clipped to 0 silently and moved the walls; issue #17)."""
    monkeypatch.setattr(kineto_scan, "USE_COMPILED", compiled)
    events = [ev(ts=100 + i * 10, dur=-3 if i < 3 else 5) for i in range(8)]
    tr = read_kineto(write(tmp_path, "neg.json", {"traceEvents": events}), default_rank=0)
    assert tr.events.height == 5 and (tr.events["dur_ns"] >= 0).all()
    assert "neg.json: 3 event(s) with a negative duration dropped" in tr.warnings  # names it


def test_nan_literals_are_read_as_unknown_not_a_parse_error(tmp_path: Path) -> None:
    """Python's json.dump writes NaN; JSON has no such literal. The values read as unknown and
    the warning counts them, instead of 'invalid character (byte N)'."""
    text = json.dumps({"traceEvents": [ev(ts=100, dur=float("nan")), ev(ts=200, dur=5),
                                       ev(ts=300, name="NaN handling", dur=float("inf"))]})
    assert "NaN" in text and "Infinity" in text
    tr = read_kineto(write(tmp_path, "nan.json", text), default_rank=0)
    assert "nan.json: 2 NaN/Infinity value(s) read as unknown" in tr.warnings  # names the file
    assert "NaN handling" in tr.events["name"].to_list()  # a name that says NaN is untouched
