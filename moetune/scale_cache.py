"""The many-ranks path's summary cache (`moetune.scale`): summaries kept as Parquet under
`<cache>/v<SUMMARY_VERSION>/<sha[:2]>/<sha256>-<options>-<position>/`, and an index (path, size,
mtime, position → summary directory) that lets a re-run find them without hashing a trace."""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
from pathlib import Path
from typing import Any

from moetune import __version__
from moetune.errors import UserError

CACHE_NAME = ".moetune-cache"


def summary_dir(cache: Path, sha: str, okey: str, index: int) -> Path:
    """Where the summary of a file with this content is kept. The file's position is part of
    the key because a file whose metadata names no rank takes its position as its rank."""
    from moetune.analyzer import rank_summary

    return cache / f"v{rank_summary.SUMMARY_VERSION}" / sha[:2] / f"{sha}-{okey}-{index}"


def options_key(opts: Any) -> str:
    from moetune.analyzer import rank_summary

    blob = json.dumps({"v": rank_summary.SUMMARY_VERSION, "moetune": __version__,
                       "window": opts.window, "step_range": opts.step_range}, sort_keys=True,
                      default=str)
    return hashlib.sha256(blob.encode()).hexdigest()[:12]


def cache_dir(files: list[Path], cache: Path | None) -> tuple[Path, list[str]]:
    """The cache directory, created if need be: the one given, else `.moetune-cache/` beside
    the first trace, else (that directory read-only) the user's cache directory."""
    if cache is not None:
        try:
            cache.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise UserError(f"cannot create the cache directory: {exc.strerror or exc}",
                            path=cache) from None
        if not os.access(cache, os.W_OK):
            raise UserError("cache directory is not writable", path=cache)
        return cache, []
    beside = files[0].parent / CACHE_NAME
    with contextlib.suppress(OSError):
        beside.mkdir(exist_ok=True)
        if os.access(beside, os.W_OK):
            return beside, []
    home = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "moetune" / "scale"
    try:
        home.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise UserError(f"no writable cache directory (give --cache DIR): {exc.strerror or exc}",
                        path=beside) from None
    return home, [f"{files[0].parent}: not writable, summaries cached in {home}"]


def stat_key(f: Path, index: int, okey: str) -> tuple[str, int, int, int, str]:
    try:
        st = f.stat()
    except OSError as exc:
        raise UserError(f"cannot read: {exc.strerror or exc}", path=f) from None
    return (str(f.resolve()), st.st_size, st.st_mtime_ns, index, okey)


def _index_schema() -> Any:
    import polars as pl

    return pl.Schema({"path": pl.String, "size": pl.Int64, "mtime_ns": pl.Int64,
                      "index": pl.Int64, "okey": pl.String, "dir": pl.String})


def read_index(cache: Path) -> dict[tuple[str, int, int, int, str], Path]:
    import polars as pl

    f = cache / "index.parquet"
    try:
        df = pl.read_parquet(f) if f.is_file() else pl.DataFrame(schema=_index_schema())
        rows = df.select(_index_schema().names()).iter_rows()
    except (OSError, pl.exceptions.PolarsError):
        return {}  # a damaged index costs a re-hash, nothing more
    return {(p, s, m, i, k): Path(d) for p, s, m, i, k, d in rows}


def write_index(cache: Path, new: dict[tuple[str, int, int, int, str], Path],
                 old: dict[tuple[str, int, int, int, str], Path]) -> None:
    import polars as pl

    rows = [(*k, str(d)) for k, d in {**old, **new}.items()]
    df = pl.DataFrame(rows, schema=_index_schema(), orient="row")
    tmp = cache / f".index.{os.getpid()}.parquet"
    try:
        df.write_parquet(tmp)
        tmp.replace(cache / "index.parquet")  # atomic: a concurrent run reads one or the other
    except OSError:
        tmp.unlink(missing_ok=True)  # no index: the next run hashes the files again

