"""The compiled Kineto scanner (`analyzer/readers/_kineto_scan.c`) against the pure-Python reader.

The scanner is a fast path: on every file it either gives exactly the frames and warnings of the
Python reader, or declines and lets that reader (with its errors and warnings) read the file. Each
test here reads the same bytes both ways and compares.
"""

from __future__ import annotations

import gzip
import hashlib
import json
import shutil
import sysconfig
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import polars as pl
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from moetune.analyzer.frames import Trace
from moetune.analyzer.readers import kineto_scan as k
from moetune.analyzer.readers.kineto import read_kineto
from moetune.analyzer.readers.kineto_decode import _open
from moetune.analyzer.readers.kineto_format import _ARG_KEY_OF, KIND_OF_CAT

from moetune.errors import UserError
from tests.conftest import CORPUS

ROOT = Path(__file__).resolve().parents[1]
needs_scanner = pytest.mark.skipif(k._kineto_scan is None, reason="compiled scanner not built")


@contextmanager
def _reader(compiled: bool = True, parts: int | None = None) -> Iterator[None]:
    """The reader switched to the scanner or not; `parts`: the event array cut into that many
    parts of >= 1 KiB, one thread each. Settings restored after."""
    old = k.USE_COMPILED, k.SCAN_THREADS, k.SCAN_PART_BYTES
    k.USE_COMPILED = compiled
    if parts:
        k.SCAN_THREADS, k.SCAN_PART_BYTES = parts, 1024
    try:
        yield
    finally:
        k.USE_COMPILED, k.SCAN_THREADS, k.SCAN_PART_BYTES = old


def _read(path: Path, compiled: bool, parts: int | None = None) -> Trace | str:
    with _reader(compiled, parts):
        try:
            return read_kineto(path, default_rank=0)
        except UserError as exc:
            return f"UserError: {exc}"


def _frames(t: Trace) -> list[pl.DataFrame]:
    return [t.events, t.comms, t.flows, t.ranks, t.memory]


def assert_same(path: Path, parts: int | None = None) -> Trace | str:
    """Both readers on `path`: equal frames (schema and values) and warnings, or the same error."""
    fast, slow = _read(path, True, parts), _read(path, False)
    if isinstance(slow, str) or isinstance(fast, str):
        assert fast == slow
        return fast
    assert fast.warnings == slow.warnings
    for a, b in zip(_frames(fast), _frames(slow), strict=True):
        assert a.schema == b.schema
        assert a.equals(b), (a, b)
    return fast


def verdict(path: Path) -> str:
    """"ok" when the scanner read the file itself, else its reason for declining."""
    out = k._scan_columns(_open(path))
    return "ok" if isinstance(out, dict) else str(out)


def used_parts(path: Path, parts: int) -> int:
    """How many parts the scanner kept when asked for `parts` (fewer: unproven starts)."""
    with _reader(parts=parts):
        out = k._scan_columns(_open(path))
    return len(out["parts"]) if isinstance(out, dict) else 0


def test_scanner_is_built_where_a_compiler_is() -> None:
    """`pip install` builds the extension (optional=True only for machines with no compiler): a
    silently failed build would leave every user on the slow path."""
    cc = (sysconfig.get_config_var("CC") or "cc").split()[0]
    if shutil.which(cc) is None:
        pytest.skip(f"no C compiler ({cc}) on this machine")
    assert k._kineto_scan is not None


# --------------------------------------------------------------------------- real traces

def _peek(path: Path) -> str:
    raw = path.read_bytes()
    if raw[:2] == b"\x1f\x8b":
        raw = gzip.decompress(raw)
    return raw[:4096].decode("utf-8", "replace")


def _traces() -> list[Path]:
    files = [p for p in sorted((ROOT / "fixtures").rglob("*.json*"))
             if p.name.endswith((".json", ".json.gz")) and "traceEvents" in _peek(p)]
    kin = CORPUS / "public" / "kineto"
    if kin.is_dir():
        files += sorted(kin.glob("*.json.gz"))
    return files


# The one real file the scanner leaves to the Python reader: ROCm writes "0x0"-style strings where
# Kineto writes numbers (kept as the Python reader's lenient path defines them).
DECLINED = {"hta_mi250_minitoy.json.gz": "an args field of unexpected type"}


@needs_scanner
@pytest.mark.parametrize("path", _traces(), ids=lambda p: str(p.relative_to(p.parents[1])))
def test_real_traces_read_the_same_both_ways(path: Path) -> None:
    assert_same(path)
    expect = DECLINED.get(path.name, "ok")
    assert verdict(path).startswith(expect)
    # Cut into 7 parts read by 7 threads (real layouts: each part's start is proven), same frames.
    assert_same(path, parts=7)
    if expect == "ok" and _size(path) > 64 << 10:  # ≥ 9 KiB a part: every start proven
        assert used_parts(path, 7) == 7


def _size(path: Path) -> int:
    raw = path.read_bytes()
    return len(gzip.decompress(raw) if raw[:2] == b"\x1f\x8b" else raw)


def _nested_event(i: int) -> dict:
    ev = {"ph": "X", "cat": "cpu_op", "name": f"op{i}", "pid": 1, "tid": 1, "ts": i, "dur": 1,
          "args": {"External id": i}}
    if i % 3 == 0:  # text and nested objects that read like the start of an event: '}, {'
        ev["name"] = f'op}}, {{"ph": "X"}}, {{{i}'
        ev["args"]["nested"] = [{"a": 1}, {"b": [{"c": 2}, {"d": 3}]}] * 3
    return ev


@needs_scanner
def test_part_starts_inside_events_are_refused(tmp_path: Path) -> None:
    """A part's start is a guess: one that falls inside an event (a nested object, a name) is
    not proven by the part before it, which then reads on alone. Whatever the cut, the frames
    are the one-thread frames; on this file some cuts keep several parts, some keep one."""
    path = tmp_path / "nested.json"
    path.write_text(json.dumps({"traceEvents": [_nested_event(i) for i in range(400)]}, indent=1))
    one = assert_same(path)
    assert isinstance(one, Trace) and one.events.height == 400
    kept = {}
    for parts in (2, 3, 5, 8, 13, 32):
        assert_same(path, parts=parts)
        kept[parts] = used_parts(path, parts)
    assert min(kept.values()) == 1 and max(kept.values()) >= 3, kept


@needs_scanner
def test_decline_in_a_later_part_declines_the_file(tmp_path: Path) -> None:
    evs = [_nested_event(i) for i in range(1, 400, 3)] * 3
    evs[-1] = {**evs[-1], "dur": {"oops": 1}}
    path = tmp_path / "late.json"
    path.write_text(json.dumps({"traceEvents": evs}, indent=1))
    with _reader(parts=8):
        assert str(k._scan_columns(_open(path))).startswith("an event field of unexpected type")
    t = assert_same(path, parts=8)
    assert isinstance(t, Trace) and any("lenient" in w for w in t.warnings)


# --------------------------------------------------------------------------- odd values

_ARG_KEYS = [_ARG_KEY_OF[f] for f in k._SCAN_ARG_FIELDS]
_SCALARS = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-(2**63), 2**63 - 1),
    st.integers(2**63, 2**70),
    st.floats(allow_nan=False, allow_infinity=False),
    st.sampled_from(["stream 7", "Spans", "", "-3", " 12 ", "0x0", "٣", "\\", '"', "é", "\U0001f600"]),
    st.text(max_size=6),
)
_VALUES = st.one_of(_SCALARS, st.lists(_SCALARS, max_size=2), st.dictionaries(st.text(max_size=3), _SCALARS, max_size=2))
_CLEAN = {
    "ph": st.sampled_from(["X", "i", "s", "f", "t", "M", "C"]),
    "cat": st.sampled_from([*KIND_OF_CAT, "ac2g", "fwdbwd", "Trace"]),
    "name": st.sampled_from(["aten::mm", "record_param_comms", "[memory]", "ProfilerStep#3",
                             "nccl:all_reduce", "Memcpy DtoH (Device -> Pinned)", "k\u00e9rnel"]),
    "pid": st.one_of(st.integers(0, 9), st.sampled_from(["Spans", "Traces", "stream 3"])),
    "tid": st.one_of(st.integers(0, 300), st.just("stream 7")),
    "ts": st.one_of(st.integers(0, 10**9), st.floats(0, 1e9)),
    "dur": st.one_of(st.integers(0, 10**4), st.floats(0, 1e4)),
    "id": st.integers(0, 50),
}

_STR_ARGS = {_ARG_KEY_OF[f] for f in k._SCAN_META if f not in ("in_nelems", "out_nelems",
                                                                "group_size", "seq")}
_CLEAN_ARG = {key: st.text(max_size=8) if key in _STR_ARGS else st.integers(-(2**63), 2**63 - 1)
              for key in _ARG_KEYS}


@st.composite
def events(draw: st.DrawFn) -> dict:
    ev = {key: draw(strat) for key, strat in _CLEAN.items() if draw(st.integers(0, 5))}
    if draw(st.integers(0, 3)):
        keys = draw(st.lists(st.sampled_from([*_ARG_KEYS, "Input Dims", "Ev Idx"]), max_size=6))
        ev["args"] = {key: draw(_CLEAN_ARG.get(key, _VALUES) if draw(st.integers(0, 9)) else _VALUES)
                      for key in keys}
    if not draw(st.integers(0, 20)):  # now and then, one field of any type
        ev[draw(st.sampled_from([*_CLEAN, "args"]))] = draw(_VALUES)
    return ev


@settings(max_examples=150, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(evs=st.lists(events(), min_size=1, max_size=12), ascii_only=st.booleans(),
       indent=st.sampled_from([None, 1]), gz=st.booleans())
@needs_scanner
def test_random_events_read_the_same_both_ways(
    tmp_path_factory: pytest.TempPathFactory, evs: list, ascii_only: bool, indent: int | None,
    gz: bool,
) -> None:
    """Mixed categories and phases, pid strings, float and int times, args of every JSON type,
    escapes and non-ASCII text: the two readers agree (same frames, warnings, or error)."""
    doc = {"schemaVersion": 1, "traceEvents": evs, "baseTimeNanoseconds": 1_700_000_000_000_000_000}
    raw = json.dumps(doc, ensure_ascii=ascii_only, indent=indent).encode()
    path = tmp_path_factory.mktemp("scan") / ("t.json.gz" if gz else "t.json")
    path.write_bytes(gzip.compress(raw) if gz else raw)
    assert_same(path)
    assert_same(path, parts=3)


NUMBERS = [
    "0", "-0", "-0.0", "1", "0.1", "0.3", "5e-324", "2.2250738585072011e-308", "1e22", "1e23",
    "9007199254740993", "9007199254740993.0", "4458703091234.567", "1712345678901234.567",
    "123456789012345678901234567890.5", "0.000000000000000000000000000001234",
    "1.00000000000000011102230246251565404236316680908203125", "7.3177701707893310e+15",
    "1E2", "1e+2", "12345678901234567890", "-9223372036854775808", "9223372036854775807",
    "9223372036854775808", "1e400",
]


@needs_scanner
@pytest.mark.parametrize("text", NUMBERS)
def test_number_texts_parse_like_python(tmp_path: Path, text: str) -> None:
    """Times are Float64 built from the exact double of the JSON text (correct rounding on the
    fast and the long path), ints beyond int64 and overflowing floats go to the Python reader."""
    body = (f'{{"traceEvents": [{{"ph": "X", "cat": "kernel", "name": "k", "pid": 0, "tid": 7, '
            f'"ts": {text}, "dur": 2.5, "args": {{"correlation": 1}}}}, {{"ph": "X", "cat": "kernel", '
            f'"name": "k", "pid": 0, "tid": 7, "ts": 0, "dur": {text}}}]}}')
    path = tmp_path / "n.json"
    path.write_text(body)
    got = assert_same(path)
    value = float(text)
    if 0 <= value < 1e15 and verdict(path) == "ok":  # a time the frames keep (ns fit int64)
        assert isinstance(got, Trace)
        ts_ns = got.events.filter(pl.col("dur_ns") == 2500).get_column("ts_ns").item()
        whole = int(value)
        assert ts_ns == whole * 1000 + round((value - whole) * 1000)


# --------------------------------------------------------------------------- bad bytes


@needs_scanner
def test_damaged_files_give_the_python_readers_errors(corpus: Path, tmp_path: Path) -> None:
    """Truncated at many places, a byte flipped to a quote, a brace or a control character: the
    scanner declines and the error (or lenient read) is the Python reader's."""
    raw = gzip.decompress((corpus / "public" / "kineto" / "hta_simple_add.json.gz").read_bytes())
    path = tmp_path / "bad.json"
    cuts = range(1, len(raw), max(1, len(raw) // 25))
    for i, cut in enumerate(cuts):
        path.write_bytes(raw[:cut])
        assert_same(path)
        flipped = bytearray(raw)
        flipped[cut] = b'"{\x01]'[i % 4]
        path.write_bytes(bytes(flipped))
        assert_same(path)


@needs_scanner
def test_invalid_utf8_and_escapes(tmp_path: Path) -> None:
    evs = [{"ph": "X", "cat": "cpu_op", "name": "NAME", "pid": 1, "tid": 1, "ts": 1, "dur": 1},
           {"ph": "X", "cat": "cpu_op", "name": 'q"\\/\b\f\n\r\t\u00e9\U0001f600', "pid": 1,
            "tid": 1, "ts": 2, "dur": 1, "args": {"Input Dims": "x\xff"}}]
    text = json.dumps({"traceEvents": evs})
    path = tmp_path / "t.json"
    path.write_bytes(text.encode())
    assert verdict(path) == "ok"
    t = assert_same(path)
    assert isinstance(t, Trace) and t.events.get_column("name")[1] == evs[1]["name"]
    # invalid UTF-8 in a kept string: the Python reader replaces it and warns
    path.write_bytes(text.encode().replace(b"NAME", b"N\xffME"))
    assert verdict(path).startswith("invalid UTF-8")
    t = assert_same(path)
    assert isinstance(t, Trace) and any("UTF-8" in w for w in t.warnings)
    # in a skipped string it is not looked at, by either reader (msgspec skips it too)
    path.write_bytes(text.encode().replace(b'"x\\u00ff"', b'"x\xff"'))
    assert verdict(path) == "ok"
    assert_same(path)
    # a lone surrogate anywhere is malformed JSON for both
    path.write_bytes(text.encode().replace(b"\\u00e9", b"\\ud800"))
    assert verdict(path).startswith("lone surrogate")
    assert_same(path)


@needs_scanner
def test_large_file_pages_released_file_untouched(tmp_path: Path) -> None:
    """Every 8 MB the scanner drops the pages it has read from its private map; the file is never
    written, and a decline at the very end (a mistyped last event) reads those pages back."""
    ev = {"ph": "X", "cat": "kernel", "name": "void gemm_kernel<float>(float*)", "pid": 0,
          "tid": 7, "ts": 0.0, "dur": 5.5, "args": {"correlation": 0, "stream": 7, "device": 0,
                                                    "grid": [1, 1, 1], "block": [128, 1, 1]}}
    n = 160_000
    evs = [{**ev, "ts": 10.0 * i, "args": {**ev["args"], "correlation": i}} for i in range(n)]
    good = tmp_path / "good.json"
    good.write_text(json.dumps({"traceEvents": evs}, indent=2))
    assert good.stat().st_size > 40 << 20
    evs[-1] = {**evs[-1], "dur": "5.5"}
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"traceEvents": evs}, indent=2))
    digests = {p: hashlib.sha256(p.read_bytes()).hexdigest() for p in (good, bad)}
    assert verdict(good) == "ok" and verdict(bad).startswith("an event field of unexpected type")
    a, b = assert_same(good), assert_same(bad)
    assert isinstance(a, Trace) and isinstance(b, Trace)
    assert a.events.height == b.events.height == n
    assert a.events.head(n - 1).equals(b.events.head(n - 1))
    assert {p: hashlib.sha256(p.read_bytes()).hexdigest() for p in (good, bad)} == digests
