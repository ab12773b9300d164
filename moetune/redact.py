"""What trace metadata may be shown: one whitelist, one credential detector.

Traces carry the capturing host's metadata (environment blocks, command lines, host names and, at
times, access tokens: torch.profiler's `add_metadata_json` takes any top-level key). Every output
that shows metadata (annotated trace, diff, report, terminal) passes it through `redact_metadata`;
free text that came from a user's host (a ledger's command line) through `redact_text`.
"""

from __future__ import annotations

import math
import re
from collections import Counter
from collections.abc import Mapping
from typing import Any

REDACTED = "[redacted]"

# Top-level keys shown as they are (after the credential check on strings). Nested mappings list
# their own safe keys; a key absent here is dropped, whatever it holds.
_SCALARS = frozenset({
    "schemaVersion", "displayTimeUnit", "baseTimeNanoseconds", "deviceType",
    "cuda_driver_version", "cuda_runtime_version", "cupti_version", "hip_version",
    "roctracer_version", "torch_version", "pytorch_version", "cuda_version", "nccl_version",
    "trace_start_time", "traceStartTime",
})
_DEVICE_KEYS = frozenset({"id", "name", "totalGlobalMem", "computeMajor", "computeMinor", "numSms"})
_DIST_KEYS = frozenset({"backend", "rank", "world_size", "pg_count", "nccl_version"})
_PG_KEYS = frozenset({"pg_name", "pg_desc", "backend_config", "pg_size", "ranks"})

# Credential shapes: provider prefixes, JWTs, bearer headers. Matched anywhere in a string; the
# whole match is replaced.
_PATTERNS: tuple[re.Pattern[str], ...] = tuple(re.compile(p) for p in (
    r"\bhf_[A-Za-z0-9]{16,}",
    r"\bgh[pousr]_[A-Za-z0-9]{20,}",
    r"\bgithub_pat_[A-Za-z0-9_]{20,}",
    r"\bsk-(?:proj-|ant-)?[A-Za-z0-9_\-]{16,}",
    r"\b(?:AKIA|ASIA)[A-Z0-9]{16}\b",
    r"\bxox[abposr]-[A-Za-z0-9\-]{10,}",
    r"\beyJ[A-Za-z0-9_\-]{8,}\.[A-Za-z0-9_\-]{8,}\.[A-Za-z0-9_\-]{8,}",
    r"(?i)\bbearer\s+[A-Za-z0-9._~+/\-]+=*",
))
# `NAME=value` / `NAME: value` where NAME ends in a secret word (HF_TOKEN, DB_PASSWORD,
# AWS_SECRET_ACCESS_KEY, client_secret): the value is replaced, the name kept. A name that only
# contains one (moe_token_dispatcher_type, tokenizer_type, moe_token_drop_policy: Megatron
# arguments, where "token" is the model's unit of text) is not a credential.
_ASSIGNMENT = re.compile(
    r"(?i)\b([\w.\-]*(?:password|passwd|pwd|token|secret|api[_-]?key|access[_-]?key"
    r"|private[_-]?key|auth|authorization|credentials?))(\s*[=:]\s*)"
    r"(?:\"[^\"]*\"|'[^']*'|[^\s,;&]+)")
_URL_USERINFO = re.compile(r"(?i)(?<=://)[^/\s:@]+:[^/\s@]+@")  # user:password@ in URLs
# long runs of a base64 alphabet; `_` and `-` split runs so that kernel and op names
# (nvjet_sm90_tst_64x8_…) are never one token
_TOKEN = re.compile(r"[A-Za-z0-9+/]{24,}={0,2}")


def _high_entropy(tok: str) -> bool:
    """A long token mixing digits, lower and upper case, Shannon entropy ≥ 3.5 bits per char."""
    if not (any(c.isdigit() for c in tok) and any(c.islower() for c in tok)
            and any(c.isupper() for c in tok)):
        return False
    if re.fullmatch(r"[0-9A-Fa-f]{32}|[0-9a-f]{40}|[0-9a-f]{64}", tok):
        # hex ids (trace ids, commit and content hashes) are identifiers, not credentials
        return False
    counts = Counter(tok)
    n = len(tok)
    return -sum(c / n * math.log2(c / n) for c in counts.values()) >= 3.5


# Itanium C++ mangled symbols (`_ZN7cutlass13device_kernel…`): kernel names whose length-prefixed
# parts read as high-entropy tokens; the named credential patterns above still apply to them
_MANGLED = re.compile(r"(?<![A-Za-z0-9])_Z[0-9A-Za-z_]+")


def _entropy_sub(s: str) -> str:
    return _TOKEN.sub(lambda m: REDACTED if _high_entropy(m.group(0)) else m.group(0), s)


def redact_text(s: str) -> str:
    """`s` with every credential-shaped substring replaced by `[redacted]`."""
    for pat in _PATTERNS:
        s = pat.sub(REDACTED, s)
    s = _ASSIGNMENT.sub(lambda m: m.group(1) + m.group(2) + REDACTED, s)
    s = _URL_USERINFO.sub(REDACTED + "@", s)
    out, last = [], 0
    for m in _MANGLED.finditer(s):
        out += [_entropy_sub(s[last:m.start()]), m.group(0)]
        last = m.end()
    return "".join([*out, _entropy_sub(s[last:])])


def _value(v: Any) -> Any:
    if isinstance(v, str):
        return redact_text(v)
    if isinstance(v, bool) or v is None:
        return v
    if isinstance(v, int | float):
        return v
    if isinstance(v, list) and all(isinstance(x, int | float | str) for x in v):
        return [_value(x) for x in v]
    return None  # nested structures under a scalar key are not expected: dropped


def _pick(m: Any, keys: frozenset[str]) -> dict[str, Any]:
    if not isinstance(m, Mapping):
        return {}
    return {k: _value(m[k]) for k in sorted(keys & set(m)) if _value(m[k]) is not None}


def redact_metadata(meta: Mapping[str, Any]) -> dict[str, Any]:
    """The whitelisted part of a trace's top-level metadata, credential-shaped strings redacted.

    `traceEvents` is not metadata and is never returned; anything not whitelisted (environment
    blocks, command lines, host names, trace names that are host paths, custom keys) is dropped.
    """
    out: dict[str, Any] = {}
    for k in sorted(_SCALARS & set(meta)):
        v = _value(meta[k])
        if v is not None:
            out[k] = v
    devs = meta.get("deviceProperties")
    if isinstance(devs, list):
        out["deviceProperties"] = [_pick(d, _DEVICE_KEYS) for d in devs if isinstance(d, Mapping)]
    dist = meta.get("distributedInfo")
    if isinstance(dist, Mapping):
        d = _pick(dist, _DIST_KEYS)
        pgs = dist.get("pg_config")
        if isinstance(pgs, list):
            d["pg_config"] = [_pick(p, _PG_KEYS) for p in pgs if isinstance(p, Mapping)]
        out["distributedInfo"] = d
    return out
