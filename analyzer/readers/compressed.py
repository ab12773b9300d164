"""Compressed traces other than gzip: xz and bzip2 are read as they are (the standard library has
both); others (zstd) are for the user to decompress first (`moetune.errors.compressed_with`)."""

from __future__ import annotations

from pathlib import Path

from moetune.errors import UserError, compressed_with

# read as they are, like gzip (analyzer/readers/kineto_decode.py, `_open`)
READ_COMPRESSED = ("xz", "bzip2")


def decompress(data: bytes, path: Path) -> bytes:
    """`data` itself, or its content when xz or bzip2 compressed (READ_COMPRESSED); a damaged
    stream is a UserError naming the file."""
    import bz2
    import lzma

    packed = compressed_with(data[:8])
    if not packed or packed[0] not in READ_COMPRESSED:
        return data
    try:
        return lzma.decompress(data) if packed[0] == "xz" else bz2.decompress(data)
    except (OSError, EOFError, ValueError, lzma.LZMAError) as exc:
        raise UserError(f"corrupt or truncated {packed[0]} ({exc})", path=path) from None
