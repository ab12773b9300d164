"""A Kineto trace file → its decoded document (`kineto_format._Doc`; `_RawDoc`, events left as
raw JSON slices, for files above `RAW_MIN_BYTES`): the file opened (gunzipped, decompressed, or
mapped privately), then one typed decode, else a lenient one.

Robustness: a file whose fields have unexpected types (strings for numbers, lists for scalars,
`null` events) is re-decoded generically and sanitized field by field; invalid UTF-8 is decoded
with replacement characters; bare NaN/Infinity read as unknown; malformed JSON or gzip is a
`UserError` naming the file and the byte position.
"""

from __future__ import annotations

import gzip
import mmap
import os
import re
import zlib
from pathlib import Path
from typing import Any

import msgspec
from moetune.analyzer.readers.compressed import decompress
from moetune.analyzer.readers.kineto_format import (
    _ARG_KEYS,
    _EVENT_FIELDS,
    _NO_ARGS,
    Num,
    StrOrList,
    _Args,
    _Device,
    _Dist,
    _Doc,
    _Event,
    _RawDoc,
)

from moetune.errors import UserError, bad_json, compressed_with

# a bare NaN / Infinity where a value belongs (not inside a string)
_NAN_LITERAL = re.compile(rb"([:\[,]\s*)-?(?:NaN|Infinity)(?=\s*[,\]}])")
RAW_MIN_BYTES = 16 << 20  # ≈ 64k events of Kineto's ~250 bytes
_DOC_DECODER = msgspec.json.Decoder(_Doc)
_RAW_DOC_DECODER = msgspec.json.Decoder(_RawDoc)


def _open(path: Path) -> bytes | mmap.mmap:
    """The file's JSON bytes: gunzipped, or a private map of the file (never written back)."""
    try:
        with path.open("rb") as fh:
            if fh.read(2) == b"\x1f\x8b":
                fh.seek(0)
                try:
                    return gzip.decompress(fh.read())
                except (OSError, EOFError, zlib.error) as exc:
                    raise UserError(f"corrupt or truncated gzip ({exc})", path=path) from None
            if os.fstat(fh.fileno()).st_size == 0:
                raise UserError("is empty", path=path)
            fh.seek(0)
            head = fh.read(8)
            if compressed_with(head):  # xz, bzip2: read whole, as gzip is
                fh.seek(0)
                return decompress(fh.read(), path)
            # No `with`: the raw event slices are views of the map, which lives as long as
            # they do (and no 1× copy of the file is made). ACCESS_COPY is a private map:
            # `_decode_chunk` writes brackets into it, the file itself is never written.
            return mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_COPY)
    except FileNotFoundError:
        raise UserError("no such file", path=path) from None
    except IsADirectoryError:
        raise UserError("is a directory where a file was expected", path=path) from None
    except OSError as exc:
        raise UserError(f"cannot read: {exc.strerror or exc}", path=path) from None


def _decode_top(data: bytes | mmap.mmap, path: Path) -> tuple[_Doc | _RawDoc, list[str]]:
    """Decode the file's top level with `traceEvents` as raw JSON slices (decoded in chunks by
    `kineto_columns._columns`); a file the fast path rejects is decoded whole by `_decode`
    (lenient, exact error messages)."""
    # Small files: one typed decode (the raw slices' extra pass would not pay for itself).
    decoder = _RAW_DOC_DECODER if len(data) > RAW_MIN_BYTES else _DOC_DECODER
    try:
        try:
            return decoder.decode(data), []
        except msgspec.DecodeError:  # includes ValidationError
            return _decode(data, path)
    except RecursionError:  # msgspec's depth limit: a trace's events are flat, this is not one
        raise UserError("is not a Kineto trace (JSON nested too deeply)", path=path) from None


def _decode(data: bytes | mmap.mmap, path: Path) -> tuple[_Doc, list[str]]:
    warnings: list[str] = []
    try:
        return _DOC_DECODER.decode(data), warnings
    except msgspec.ValidationError:
        pass  # valid JSON, unexpected types somewhere: sanitize generically below
    except msgspec.DecodeError as exc:
        if not bytes(data[:4096]).strip() and not bytes(data).strip():
            raise UserError("is empty", path=path) from None
        fixed, n_nan = _NAN_LITERAL.subn(rb"\1null", bytes(data))
        if n_nan:  # Python's json.dump writes NaN/Infinity, which JSON does not allow
            warnings.append(f"{n_nan} NaN/Infinity value(s) read as unknown")
            try:
                doc, more = _decode(fixed, path)
            except UserError:
                raise bad_json(fixed, path) from None
            return doc, warnings + more
        if "UTF-8" not in str(exc):
            raise bad_json(data, path) from None
        data = bytes(data).decode("utf-8", errors="replace").encode("utf-8")
        warnings.append("invalid UTF-8 replaced by U+FFFD")
        try:
            return _DOC_DECODER.decode(data), warnings
        except msgspec.ValidationError:
            pass
        except msgspec.DecodeError:
            raise bad_json(data, path) from None
    try:
        obj = msgspec.json.decode(data)
        if not isinstance(obj, dict) or not isinstance(obj.get("traceEvents"), list):
            raise UserError("not a Kineto trace (no traceEvents list)", path=path)
        doc = _sanitize(obj)
    except msgspec.DecodeError:  # pragma: no cover - typed decode accepted the syntax
        raise bad_json(data, path) from None
    except RecursionError:  # a trace's events are flat: this is not one (and must not crash)
        raise UserError("is not a Kineto trace (JSON nested too deeply)", path=path) from None
    warnings.append("fields with unexpected types ignored (lenient decode)")
    return doc, warnings


def _scalar(v: Any) -> Num:
    return v if isinstance(v, int | float | str) and not isinstance(v, bool) else None


def _str_or_list(v: Any) -> StrOrList:
    return v if isinstance(v, str | list) else None


def _sanitize(obj: dict[str, Any]) -> _Doc:
    """Whitelisted fields only, each coerced to the type the typed decoder expects."""
    events = []
    for e in obj["traceEvents"]:
        if not isinstance(e, dict):
            continue
        a = e.get("args")
        args = None
        if isinstance(a, dict):
            kw = {}
            for key, field in _ARG_KEYS.items():
                if key in a:
                    conv = (
                        _str_or_list if field in ("in_split", "out_split", "pg_ranks") else _scalar
                    )
                    kw[field] = conv(a[key])
            args = _Args(**kw)
        events.append(
            _Event(**{f: _scalar(e.get(f)) for f in _EVENT_FIELDS}, args=args or _NO_ARGS)
        )
    devs = obj.get("deviceProperties")
    devices = [
        _Device(**{f: _scalar(d.get(f)) for f in _Device.__struct_fields__})
        for d in (devs if isinstance(devs, list) else [])
        if isinstance(d, dict)
    ]
    di = obj.get("distributedInfo")
    dist = (
        _Dist(**{f: _scalar(di.get(f)) for f in _Dist.__struct_fields__})
        if isinstance(di, dict)
        else None
    )
    return _Doc(
        traceEvents=events,
        deviceProperties=devices,
        distributedInfo=dist,
        baseTimeNanoseconds=_scalar(obj.get("baseTimeNanoseconds")),
    )
