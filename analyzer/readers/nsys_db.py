"""Read-only access to an Nsight Systems SQLite export: open, probe, fetch frames column-wise.

Exports have no indexes and their schema drifts between nsys versions (tables created lazily,
columns added over time), so every query is built from what `PRAGMA table_info` reports.
Rows are fetched in batches straight into polars frames: no per-event Python objects survive a
batch, which keeps memory bounded on multi-GB exports. Where the ADBC SQLite driver is installed
(a runtime dependency), large queries go through it instead: SQLite's C API to Arrow batches to
polars, ~3× faster than converting every value to a Python object; any query it cannot type as
asked falls back to the `sqlite3` path, so the frames are the same either way
(`MOETUNE_NSYS_ADBC=0` forces the fallback).
"""

from __future__ import annotations

import os
import sqlite3
from dataclasses import dataclass, field
from pathlib import Path

import polars as pl

from moetune.errors import UserError

BATCH_ROWS = 262_144

# Tables whose presence marks a file as an nsys export (any one suffices).
NSYS_MARKERS = ("StringIds", "NVTX_EVENTS", "CUPTI_ACTIVITY_KIND_KERNEL", "CUPTI_ACTIVITY_KIND_RUNTIME")


def connect(path: Path, *, shown: Path) -> sqlite3.Connection:
    """Open `path` read-only and immutable (no journal, no lock, never written)."""
    try:
        conn = sqlite3.connect(f"file:{path.resolve()}?mode=ro&immutable=1", uri=True)
        conn.execute("SELECT count(*) FROM sqlite_master").fetchone()
    except sqlite3.DatabaseError as exc:
        raise UserError(f"not a readable SQLite database ({exc})", path=shown) from None
    return conn


def _adbc_connect(path: Path) -> object | None:
    """A read-only, immutable ADBC connection to `path`, or None (driver missing, disabled)."""
    if os.environ.get("MOETUNE_NSYS_ADBC", "1") == "0":
        return None
    try:
        import adbc_driver_sqlite.dbapi as adbc
    except ImportError:
        return None
    try:
        return adbc.connect(f"file:{path.resolve()}?mode=ro&immutable=1")
    except Exception:
        return None


@dataclass
class Db:
    """An open export plus what its schema holds; `missing` collects what queries wanted but lacked."""

    conn: sqlite3.Connection
    shown: Path
    path: Path  # the SQLite file actually opened (a temp copy for .sqlite.gz)
    tables: dict[str, list[str]] = field(default_factory=dict)
    missing_tables: list[str] = field(default_factory=list)
    missing_columns: list[str] = field(default_factory=list)
    arrow: object | None = None  # ADBC connection, opened on first use; False when unavailable

    @classmethod
    def open(cls, path: Path, *, shown: Path) -> Db:
        conn = connect(path, shown=shown)
        db = cls(conn=conn, shown=shown, path=path)
        try:
            names = [r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type='table'")]
            for name in names:
                cols = [r[1] for r in conn.execute(f'PRAGMA table_info("{name}")')]
                db.tables[name] = cols
        except sqlite3.DatabaseError as exc:
            conn.close()
            raise UserError(f"corrupt SQLite database ({exc})", path=shown) from None
        return db

    def close(self) -> None:
        self.conn.close()
        if self.arrow:
            self.arrow.close()  # type: ignore[attr-defined]

    def has(self, table: str, *, warn: bool = True) -> bool:
        if table in self.tables:
            return True
        if warn and table not in self.missing_tables:
            self.missing_tables.append(table)
        return False

    def has_col(self, table: str, col: str) -> bool:
        return col in self.tables.get(table, ())

    def col(self, table: str, col: str, *, warn: bool = True, default: str = "NULL") -> str:
        """SQL for column `col` of `table`, or `default` (and a note) when the export lacks it."""
        if self.has_col(table, col):
            return f'"{col}"'
        if warn:
            note = f"{table}.{col}"
            if note not in self.missing_columns:
                self.missing_columns.append(note)
        return default

    def query(self, sql: str, schema: dict[str, pl.DataType]) -> pl.DataFrame:
        """Run `sql` and return its rows as a frame with `schema` (column names in select order)."""
        df = self._query_arrow(sql, schema)
        if df is not None:
            return df
        try:
            cur = self.conn.execute(sql)
            parts = []
            while rows := cur.fetchmany(BATCH_ROWS):
                parts.append(pl.DataFrame(rows, schema=schema, orient="row"))
        except sqlite3.DatabaseError as exc:
            raise UserError(f"corrupt SQLite database ({exc})", path=self.shown) from None
        except (OverflowError, TypeError, pl.exceptions.PolarsError) as exc:
            raise UserError(f"unexpected values in the export ({exc})", path=self.shown) from None
        if not parts:
            return pl.DataFrame(schema=schema)
        return pl.concat(parts, how="vertical", rechunk=True) if len(parts) > 1 else parts[0]

    def _arrow_ok(self) -> bool:
        if self.arrow is None:
            self.arrow = _adbc_connect(self.path) or False
        return bool(self.arrow)

    def _query_arrow(self, sql: str, schema: dict[str, pl.DataType]) -> pl.DataFrame | None:
        """`sql` through ADBC, cast strictly to `schema`; None where ADBC is absent or the
        result does not type as asked (SQLite columns are dynamically typed)."""
        if not self._arrow_ok():
            return None
        try:
            cur = self.arrow.cursor()  # type: ignore[attr-defined]
            try:
                cur.execute(sql)
                df = pl.DataFrame(cur.fetch_arrow())
            finally:
                cur.close()
            if df.width != len(schema):
                return None
            return df.rename(dict(zip(df.columns, schema, strict=True))).cast(schema)
        except Exception:  # driver errors (mixed types, …) and strict casts: the sqlite3 path decides
            return None

    def table_frame(
        self,
        table: str,
        cols: dict[str, tuple[str, pl.DataType]],
        *,
        where: str = "",
        constant_ok: tuple[str, ...] = (),
    ) -> pl.DataFrame:
        """SELECT `cols` (name → (SQL expression, dtype)) from `table`.

        Without ADBC, columns named in `constant_ok` are first checked with one aggregate scan
        (cheap in C); those holding a single value (typical: one process, one device, no graph
        ids) are not fetched row by row but added back as literals, since per-value Python
        conversion is what dominates reading a large export that way.
        """
        consts: dict[str, object] = {}
        # Through ADBC a fetched column costs less than the probe's extra table scan.
        probe = [] if self._arrow_ok() else [
            n for n in constant_ok if n in cols and cols[n][0] != "NULL"]
        if probe:
            aggs = ", ".join(
                f"min({cols[n][0]}), max({cols[n][0]}), count({cols[n][0]})" for n in probe
            )
            sql = f'SELECT count(*), {aggs} FROM "{table}" {where}'
            try:
                stats = self.conn.execute(sql).fetchone()
            except sqlite3.DatabaseError as exc:
                raise UserError(f"corrupt SQLite database ({exc})", path=self.shown) from None
            total = stats[0]
            for i, n in enumerate(probe):
                lo, hi, count = stats[1 + 3 * i : 4 + 3 * i]
                if count == 0:
                    consts[n] = None
                elif count == total and lo == hi:
                    consts[n] = lo
        for n in cols:
            if cols[n][0] == "NULL":
                consts[n] = None
        fetched = {n: c for n, c in cols.items() if n not in consts}
        if fetched:
            select = ", ".join(expr for expr, _ in fetched.values())
            df = self.query(
                f'SELECT {select} FROM "{table}" {where}', {n: t for n, (_, t) in fetched.items()}
            )
        else:
            n_rows = self.scalar(f'SELECT count(*) FROM "{table}" {where}')
            df = pl.DataFrame({"_": pl.zeros(int(n_rows or 0), eager=True)})
        df = df.with_columns(pl.lit(v, dtype=cols[n][1]).alias(n) for n, v in consts.items())
        return df.select(list(cols))

    def scalar(self, sql: str) -> object:
        try:
            row = self.conn.execute(sql).fetchone()
        except sqlite3.DatabaseError as exc:
            raise UserError(f"corrupt SQLite database ({exc})", path=self.shown) from None
        return row[0] if row else None

    def rows(self, sql: str) -> list[tuple]:
        """Small metadata queries only (a handful of rows)."""
        try:
            return self.conn.execute(sql).fetchall()
        except sqlite3.DatabaseError as exc:
            raise UserError(f"corrupt SQLite database ({exc})", path=self.shown) from None
