"""Turn what the user passed (.sqlite, .sqlite.gz, .nsys-rep/.qdrep) into a SQLite file to open.

A `.sqlite.gz` is decompressed to a private temp file that the caller deletes. A raw report is
exported once with the nsys CLI and the export is cached next to it (or under
~/.cache/moetune/nsys when that folder is not writable); the user's file is never modified.
"""

from __future__ import annotations

import contextlib
import gzip
import hashlib
import os
import shutil
import subprocess
import tempfile
import zlib
from collections.abc import Iterator
from pathlib import Path

from moetune.errors import UserError

REP_SUFFIXES = (".nsys-rep", ".qdrep")
EXPORT_TIMEOUT_S = 3600


@contextlib.contextmanager
def sqlite_file(path: Path) -> Iterator[Path]:
    """Yield a plain SQLite path for `path`; temp files made here are removed afterwards."""
    name = path.name.lower()
    if name.endswith(REP_SUFFIXES):
        yield export_report(path)
        return
    if _is_gzip(path):
        fd, tmp = tempfile.mkstemp(prefix="moetune-nsys-", suffix=".sqlite")
        try:
            with os.fdopen(fd, "wb") as out, gzip.open(path, "rb") as src:
                shutil.copyfileobj(src, out, length=4 << 20)
        except (OSError, EOFError, zlib.error) as exc:
            Path(tmp).unlink(missing_ok=True)
            raise UserError(f"corrupt or truncated gzip ({exc})", path=path) from None
        try:
            yield Path(tmp)
        finally:
            Path(tmp).unlink(missing_ok=True)
        return
    yield path


def _is_gzip(path: Path) -> bool:
    try:
        with path.open("rb") as fh:
            return fh.read(2) == b"\x1f\x8b"
    except OSError as exc:
        raise UserError(f"cannot read: {exc.strerror or exc}", path=path) from None


def export_command(rep: Path, out: Path) -> list[str]:
    return ["nsys", "export", "--type", "sqlite", "--output", str(out), str(rep)]


def cached_export_path(rep: Path) -> Path:
    """Where the export of `rep` lives: beside it when that folder is writable, else a user cache."""
    beside = rep.with_suffix(".sqlite")  # nsys's own default export name
    if os.access(rep.parent, os.W_OK):
        return beside
    key = hashlib.sha256(str(rep.resolve()).encode()).hexdigest()[:16]
    cache = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "moetune" / "nsys"
    return cache / f"{rep.stem}-{key}.sqlite"


def export_report(rep: Path) -> Path:
    """Export a raw report with `nsys export` once; reuse the export while it is newer."""
    if not rep.is_file():
        raise UserError("no such file", path=rep)
    out = cached_export_path(rep)
    if out.is_file() and out.stat().st_mtime >= rep.stat().st_mtime:
        return out
    nsys = shutil.which("nsys")
    if nsys is None:
        raise UserError(
            "is a raw Nsight Systems report and `nsys` is not on PATH; export it first with: "
            + " ".join(export_command(rep, rep.with_suffix(".sqlite")))
            + " and pass the .sqlite file",
            path=rep,
        )
    out.parent.mkdir(parents=True, exist_ok=True)
    # Export to a temp name and rename, so an interrupted export is never mistaken for a cache hit.
    tmp = out.with_name(f"{out.stem}.part{os.getpid()}.sqlite")  # nsys keeps a .sqlite name
    cmd = [nsys, "export", "--type", "sqlite", "--output", str(tmp), "--force-overwrite", "true",
           str(rep)]
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=EXPORT_TIMEOUT_S)
    except (OSError, subprocess.TimeoutExpired) as exc:
        tmp.unlink(missing_ok=True)
        raise UserError(f"`nsys export` failed ({exc})", path=rep) from None
    if proc.returncode != 0 or not tmp.is_file():
        tmp.unlink(missing_ok=True)
        tail = (proc.stderr or proc.stdout or "").strip().splitlines()[-1:] or ["no output"]
        raise UserError(
            f"`nsys export` exited {proc.returncode} ({tail[0]}); try: {' '.join(cmd)}", path=rep
        )
    tmp.replace(out)
    return out
