"""The one error type users see: a one-line message naming the file and the problem, exit code 2."""

from __future__ import annotations

import re
from pathlib import Path


class UserError(Exception):
    """Bad input or usage. The CLI prints `moetune: <message>` on one line and exits with 2."""

    exit_code = 2

    def __init__(self, message: str, *, path: str | Path | None = None) -> None:
        self.path = str(path) if path is not None else None
        text = f"{self.path}: {message}" if self.path else message
        super().__init__(" ".join(text.split()))  # one line, always

    @property
    def message(self) -> str:
        return str(self)


# names of compressed traces (Kineto, nsys): handed where a text file goes, they are a mix-up
TRACE_NAMES = tuple(f"{base}.{z}" for base in (".json", ".sqlite", ".db")
                    for z in ("gz", "xz", "bz2", "zst"))


def read_user_text(path: str | Path, *, errors: str = "strict") -> str:
    """A user's file as text, or one `UserError` line naming it (missing, unreadable, not UTF-8)."""
    p = Path(path)
    try:
        data = p.read_bytes()
    except FileNotFoundError:
        raise UserError("no such file", path=p) from None
    except IsADirectoryError:
        raise UserError("is a directory, not a file", path=p) from None
    except OSError as exc:
        raise UserError(f"cannot read: {exc.strerror or exc}", path=p) from None
    # a compressed log or a trace given for a text file: say so, not a decoder's complaint
    packed = ("gzip", "gunzip") if data[:2] == b"\x1f\x8b" else compressed_with(data[:8])
    if packed and p.name.lower().endswith(TRACE_NAMES):
        raise UserError(f"is a compressed trace ({packed[0]}), not a text file",
                        path=p)
    if packed:  # a compressed log or contract
        raise UserError(f"is compressed with {packed[0]}: decompress it first "
                        f"({packed[1]} {p.name})", path=p)
    if data.startswith(b"SQLite format 3\x00"):
        raise UserError("is an SQLite database (an nsys export?), not a text file", path=p)
    try:
        return data.decode("utf-8", errors=errors)
    except UnicodeDecodeError as exc:
        raise UserError(f"is not UTF-8 text (byte {data[exc.start]:#04x} at offset {exc.start})",
                        path=p) from None


NEWLINE = b"\n"
TRUNCATED = "is truncated: its JSON ends before it is complete (an interrupted write or copy?)"

# The compressions a user may hand over by name: magic bytes → (name, the command that undoes it)
COMPRESSED: dict[bytes, tuple[str, str]] = {
    b"\xfd7zXZ\x00": ("xz", "xz -d"),
    b"BZh": ("bzip2", "bunzip2"),
    b"\x28\xb5\x2f\xfd": ("zstd", "zstd -d"),
}


def compressed_with(head: bytes) -> tuple[str, str] | None:
    """(compression, the command that undoes it) of a file starting with `head`, or None."""
    return next((v for magic, v in COMPRESSED.items() if head.startswith(magic)), None)


def bad_json(data: bytes | str, path: str | Path) -> UserError:
    """The one message for a user's file that is not valid JSON, whichever command read it and
    with whichever parser: empty, truncated, or where (line) and what is wrong."""
    import msgspec  # the analyzer's JSON parser; its messages tell truncation apart

    raw = data.encode("utf-8", "replace") if isinstance(data, str) else bytes(data)
    if not raw.strip():
        return UserError("is empty", path=path)
    try:
        msgspec.json.decode(raw)
    except msgspec.DecodeError as exc:
        msg = str(exc)
        if "truncated" in msg:
            return UserError(TRUNCATED, path=path)
        at = re.search(r"\s*\(byte (\d+)\)", msg)
        line = f" at line {raw.count(NEWLINE, 0, int(at[1])) + 1}" if at else ""
        what = msg.replace(at[0], "") if at else msg
        return UserError(f"is not valid JSON{line}: {what.removeprefix('JSON is malformed: ')}",
                         path=path)
    return UserError("is not valid JSON", path=path)


class GateFailed(Exception):
    """A check the user asked for failed (e.g. an audit found a contradicted claim): exit code 1."""

    exit_code = 1


class GateUndecided(GateFailed):
    """A check the user asked for could not be decided from the input (e.g. `diff
    --fail-if-slower` with a run's noise unknown, an audit that could check no claim): exit code
    3, so that a CI job tells "cannot say" from "passed" (0) and "failed" (1)."""

    exit_code = 3
