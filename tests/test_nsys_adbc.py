"""The ADBC (SQLite → Arrow) query path of the nsys reader gives the sqlite3 path's frames."""

from __future__ import annotations

import gzip
import shutil
import sqlite3
from pathlib import Path

import pytest
from moetune.analyzer.readers.nsys import read_nsys
from moetune.analyzer.readers.nsys_db import Db

ROOT = Path(__file__).resolve().parents[1]
FIXTURES = sorted((ROOT / "fixtures" / "nsys").glob("*.sqlite.gz"))

pytest.importorskip("adbc_driver_sqlite")


def _both(path: Path, monkeypatch: pytest.MonkeyPatch):
    out = []
    for flag in ("0", "1"):
        monkeypatch.setenv("MOETUNE_NSYS_ADBC", flag)
        out.append(read_nsys(path, first_rank=0))
    return out


def _same(a, b) -> None:
    for k in ("events", "comms", "flows", "ranks"):
        x, y = getattr(a, k), getattr(b, k)
        assert x.schema == y.schema, k
        assert x.equals(y), k
    assert a.warnings == b.warnings


@pytest.mark.parametrize("path", FIXTURES, ids=lambda p: p.name)
def test_adbc_frames_equal_sqlite3_frames_on_fixtures(path: Path,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    a, b = _both(path, monkeypatch)
    assert a.events.height > 1000
    _same(a, b)


def test_adbc_frames_equal_on_corpus(corpus: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    files = sorted((corpus / "public" / "nsys").glob("*.sqlite"))
    assert files
    for f in files:
        _same(*_both(f, monkeypatch))


def test_adbc_is_used_and_leaves_the_file_untouched(tmp_path: Path,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MOETUNE_NSYS_ADBC", "1")
    f = tmp_path / "x.sqlite"
    with gzip.open(FIXTURES[0], "rb") as src, f.open("wb") as dst:
        shutil.copyfileobj(src, dst)
    f.chmod(0o444)  # read-only: any write attempt would fail loudly
    before = (f.read_bytes(), f.stat().st_mtime_ns)
    db = Db.open(f, shown=f)
    try:
        assert db._arrow_ok()
        import polars as pl

        df = db._query_arrow('SELECT start, "end" FROM CUPTI_ACTIVITY_KIND_KERNEL',
                             {"start": pl.Int64, "end": pl.Int64})
        assert df is not None and df.height > 0 and (df["end"] >= df["start"]).all()
    finally:
        db.close()
    assert (f.read_bytes(), f.stat().st_mtime_ns) == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["x.sqlite"]  # no -wal / -shm


def test_mixed_type_column_falls_back_to_sqlite3(tmp_path: Path,
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    """SQLite lets a column hold ints and text; the Arrow path cannot type it as Int64 and the
    sqlite3 path (which raises a clear error for such values) decides."""
    import polars as pl

    f = tmp_path / "m.sqlite"
    with sqlite3.connect(f) as c:
        c.execute("CREATE TABLE t (a INTEGER)")
        c.executemany("INSERT INTO t VALUES (?)", [(i,) for i in range(5000)] + [("x",)])
    monkeypatch.setenv("MOETUNE_NSYS_ADBC", "1")
    db = Db.open(f, shown=f)
    try:
        assert db._query_arrow("SELECT a FROM t", {"a": pl.Int64}) is None
        ok = db._query_arrow("SELECT a FROM t WHERE typeof(a) = 'integer'", {"a": pl.Int64})
        assert ok is not None and ok["a"].sum() == sum(range(5000))
    finally:
        db.close()
