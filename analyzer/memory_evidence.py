"""Device memory from a run's own outputs when its trace holds none: Megatron's memory report lines
and PyTorch memory snapshots. Each result is a diagnosis `memory` section (the shape
analyzer/device_memory.py gives for allocator events) that says its source.

**The log** (`source: log`): Megatron-LM's `report_memory` prints, per rank of data-parallel rank 0,
`[Rank N] (after K iterations) memory (MB) | allocated: … | max allocated: … | reserved: … | max
reserved: …` (megatron/training/training.py `training_log`). `max allocated` / `max reserved` are
`torch.cuda.max_memory_allocated/reserved`, never reset: the maxima since the process started, so
a rank's latest line is its peak so far (`scope: run`). Megatron prints after iteration 1 and again
after iteration 2 because an optimizer whose state is built at its first step (torch's Adam, the
fallback without Transformer Engine and Apex) may have it only from then: a log whose only line is
after iteration 1 is said to be so (`notes`).

**A snapshot** (`source: snapshot`): `torch.cuda.memory._dump_snapshot` pickles the
`torch.cuda.memory._snapshot()` dict (torch/cuda/memory.py documents it): `segments` (cudaMalloc'd
blocks of the caching allocator: `total_size`, `blocks` with `size`, `state`, `frames`) and
`device_traces` (per device, the allocator's recorded actions: `alloc`, `free_requested`,
`free_completed`, `segment_alloc` / `segment_free` (`segment_map` / `segment_unmap` with expandable
segments), `oom`, `snapshot`). Megatron-LM writes one per rank with `--record-memory-history
--memory-snapshot-path P` at every log interval, as `<base>_<rank><ext>` of P (training.py).
From the segments come the allocated and reserved totals at the dump; replaying the recorded actions
backwards from there gives both totals over the recorded history, hence their peaks (`scope:
history`), and the allocations alive at the allocated peak, grouped by the first frame of their
stack outside torch (`largest`). A snapshot made from a profile (torch's `_profile_to_snapshot`, or
a CPU run) has no allocator segments: its reserved memory is unknown, not its address span.

A snapshot is plain data (dicts, lists, tuples, strings, numbers). It is read by an unpickler that
builds nothing else: a pickle that names any class or function (which a crafted file would need to
run code) is refused in one line.
"""

from __future__ import annotations

import pickle
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import polars as pl

from moetune.errors import UserError

GIB = 2**30
MIB = 2**20
LARGEST = 8  # allocation sites listed per snapshot

_ALLOC_GROW = ("alloc",)
_ALLOC_SHRINK = ("free_completed",)
_SEG_GROW = ("segment_alloc", "segment_map")
_SEG_SHRINK = ("segment_free", "segment_unmap")


# ----------------------------------------------------------------------------- the log


def log_section(lines: pl.DataFrame, *, device_bytes: Mapping[int, int] | int | None = None,
                file: str | None = None) -> dict[str, Any] | None:
    """The `memory` section from Megatron's memory lines (executor/logparse.py MEMORY_SCHEMA
    columns: rank, iteration, max_allocated_mb, max_reserved_mb); None when there are none.
    `device_bytes`: the GPU's total memory, per rank or one for all (the trace's device properties
    or the contract's hardware)."""
    if lines.height == 0 or "max_allocated_mb" not in lines.columns:
        return None
    rows = lines.drop_nulls("rank").filter(pl.col("max_allocated_mb").is_not_null())
    if rows.height == 0:
        return None
    by_rank: dict[str, dict[str, Any]] = {}
    for (rank,), grp in sorted(rows.group_by(["rank"]), key=lambda g: g[0][0]):
        alloc = grp.get_column("max_allocated_mb").max()
        res = grp.get_column("max_reserved_mb").drop_nulls().max()
        dev = _device(device_bytes, int(rank))
        res_b = None if res is None else float(res) * MIB
        by_rank[str(rank)] = {
            "device": None, "scope": "run", "events": grp.height,
            "peak_allocated_gib": _gib(float(alloc) * MIB),
            "peak_reserved_gib": _gib(res_b),
            "device_gib": _gib(dev),
            "reserved_share": round(res_b / dev, 4) if dev and res_b else None,
            "fragmentation": round(float(res) / float(alloc), 4) if res and alloc else None,
            "iteration": int(grp.get_column("iteration").max()),
        }
    worst = _worst(by_rank)
    notes = []
    if all(r["iteration"] <= 1 for r in by_rank.values()):
        notes.append("only the line after iteration 1: an optimizer that builds its state at its "
                     "first step (torch's Adam without Transformer Engine and Apex) may hold it "
                     "only from the second, which Megatron reports again for that reason")
    return {"memory": {
        "source": "log", "scope": "run", "events": rows.height,
        **{k: worst[k] for k in ("peak_allocated_gib", "peak_reserved_gib", "device_gib",
                                 "reserved_share", "fragmentation")},
        "iteration": worst["iteration"],
        "files": [file] if file else [],
        "notes": notes,
        "by_rank": by_rank,
    }}


# ----------------------------------------------------------------------------- snapshots


class _Refused(pickle.UnpicklingError):
    """The pickle asks for something that is not plain data."""


class _PlainData(pickle.Unpickler):
    """Builds dicts, lists, tuples, sets, strings, bytes, numbers, booleans and None only."""

    def find_class(self, module: str, name: str) -> Any:
        raise _Refused(f"it names {module}.{name}")

    def persistent_load(self, pid: Any) -> Any:
        raise _Refused("it holds a persistent reference")


def read_snapshot(path: str | Path) -> dict[str, Any]:
    """A pickled memory snapshot as plain data; UserError (one line) for anything else."""
    p = Path(path)
    try:
        with p.open("rb") as f:
            doc = _PlainData(f).load()
    except OSError as exc:
        raise UserError(f"cannot read memory snapshot: {exc.strerror or exc}", path=p) from None
    except _Refused as exc:
        raise UserError(f"not a plain-data memory snapshot ({exc}); a snapshot holds only dicts, "
                        "lists, strings and numbers", path=p) from None
    except (pickle.UnpicklingError, EOFError, ValueError, TypeError, IndexError, KeyError, AttributeError, MemoryError,
            RecursionError, OverflowError, UnicodeDecodeError) as exc:
        raise UserError(f"not a readable pickle ({type(exc).__name__})", path=p) from None
    if not isinstance(doc, dict) or not isinstance(doc.get("segments"), list):
        raise UserError("not a memory snapshot (no `segments` list): expected the pickle of "
                        "torch.cuda.memory._snapshot(), as _dump_snapshot writes it", path=p)
    traces = doc.get("device_traces", [])
    if not isinstance(traces, list) or not all(isinstance(t, list) for t in traces):
        raise UserError("memory snapshot: `device_traces` is not a list of lists", path=p)
    return doc


def snapshot_summary(doc: Mapping[str, Any], *, file: str | None = None) -> dict[str, Any]:
    """Peaks, fragmentation and the largest live allocations of one snapshot (bytes as GiB), for
    the device with the most memory in it. Malformed entries are a UserError naming the file."""
    try:
        return _summary(doc, file)
    except (KeyError, TypeError, ValueError, AttributeError) as exc:
        raise UserError(f"memory snapshot: unexpected entry ({type(exc).__name__}: {exc})",
                        path=file) from None


def _summary(doc: Mapping[str, Any], file: str | None) -> dict[str, Any]:
    segs = [s for s in doc["segments"] if isinstance(s, Mapping)]
    traces = doc.get("device_traces") or []
    devices = sorted({int(s.get("device") or 0) for s in segs}
                     | {i for i, t in enumerate(traces) if t})
    if not devices:
        raise ValueError("no segment and no recorded action")

    def held(d: int) -> int:
        return sum(int(s.get("total_size") or 0) for s in segs if int(s.get("device") or 0) == d)

    device = max(devices, key=lambda d: (held(d), -d))
    mine = [s for s in segs if int(s.get("device") or 0) == device]
    history = [e for e in (traces[device] if device < len(traces) else []) if isinstance(e, Mapping)]
    # a CUDA snapshot's segments are cudaMalloc'd blocks; one made from a profile has a single
    # stand-in segment spanning the addresses it saw, and no segment actions
    has_segments = any("segment_type" in s or "allocated_size" in s for s in mine) or any(
        e.get("action") in (*_SEG_GROW, *_SEG_SHRINK) for e in history)
    live = _live_blocks(mine)
    alloc_end = sum(size for size, _ in live.values())
    res_end = sum(int(s.get("total_size") or 0) for s in mine) if has_segments else None
    peak_i, peak_a, peak_r, first_a = _replay(history, alloc_end, res_end)
    at_peak = _live_at(history, live, peak_i)
    sites: dict[str, list[int]] = {}
    for size, frames in at_peak.values():
        s = sites.setdefault(_site(frames), [0, 0])
        s[0] += size
        s[1] += 1
    largest = [{"site": site, "gib": _gib(b), "allocations": n,
                "share": round(b / peak_a, 4) if peak_a else None}
               for site, (b, n) in sorted(sites.items(), key=lambda kv: (-kv[1][0], kv[0]))
               ][:LARGEST]
    ooms = [e for e in history if e.get("action") == "oom"]
    notes = []
    if not has_segments:
        notes.append("no allocator segments (a snapshot made from a profile): reserved memory "
                     "unknown")
    if history and first_a > 0:
        notes.append(f"{size_text(first_a)} were allocated before the recorded history began: "
                     "their stacks are not known")
    if ooms:
        last = ooms[-1]
        notes.append(f"{len(ooms)} out-of-memory event(s) recorded; the last asked for "
                     f"{size_text(int(last.get('size') or 0))} with "
                     f"{size_text(int(last.get('device_free') or 0))} free on the device")
    return {
        "file": file, "device": device, "entries": len(history),
        "peak_allocated_gib": _gib(peak_a), "peak_reserved_gib": _gib(peak_r),
        "allocated_at_dump_gib": _gib(alloc_end), "reserved_at_dump_gib": _gib(res_end),
        "fragmentation": round(peak_r / peak_a, 4) if peak_r and peak_a else None,
        "largest": largest, "oom_events": len(ooms), "notes": notes,
    }


def _live_blocks(segs: Sequence[Mapping[str, Any]]) -> dict[int, tuple[int, list[Any]]]:
    """address -> (size, frames) of every allocated block at the dump. Blocks without an
    address (a profile-made snapshot) are placed by their offsets in the segment."""
    out: dict[int, tuple[int, list[Any]]] = {}
    for s in segs:
        addr = int(s.get("address") or 0)
        for b in s.get("blocks") or []:
            size = int(b.get("size") or 0)
            at = int(b["address"]) if b.get("address") is not None else addr
            if b.get("state") == "active_allocated":
                out[at] = (size, list(b.get("frames") or []))
            addr = at + size
    return out


def _replay(history: Sequence[Mapping[str, Any]], alloc_end: int, res_end: int | None
            ) -> tuple[int, int, int | None, int]:
    """Walk the recorded actions back from the dump. Returns (index of the allocated peak: the
    state after that action, len(history) for the dump itself, −1 before the first action; the
    allocated peak; the reserved peak or None; the allocated level before the first action)."""
    a, r = alloc_end, res_end
    peak_a, peak_i, peak_r = a, len(history), r
    for i in range(len(history) - 1, -1, -1):
        e = history[i]
        act, size = e.get("action"), int(e.get("size") or 0)
        # the level after action i is (a, r); before it:
        if act in _ALLOC_GROW:
            a -= size
        elif act in _ALLOC_SHRINK:
            a += size
        elif r is not None and act in _SEG_GROW:
            r -= size
        elif r is not None and act in _SEG_SHRINK:
            r += size
        if a > peak_a:
            peak_a, peak_i = a, i - 1
        if r is not None and peak_r is not None and r > peak_r:
            peak_r = r
    return peak_i, peak_a, peak_r, a


def _live_at(history: Sequence[Mapping[str, Any]], live: Mapping[int, tuple[int, list[Any]]],
             index: int) -> dict[int, tuple[int, list[Any]]]:
    """The allocations alive after action `index` (len(history): at the dump)."""
    out = dict(live)
    for e in reversed(history[index + 1:]):
        act = e.get("action")
        addr = e.get("addr")
        if act in _ALLOC_GROW:
            out.pop(addr, None)
        elif act in _ALLOC_SHRINK:
            out[addr] = (int(e.get("size") or 0), list(e.get("frames") or []))
    return out


# frames that say where torch or the interpreter was, not the model
_NOT_USER = ("/torch/", "torch/", "<built-in", "nn.Module:", "/site-packages/", "ceval", "PyEval_",
             "_call_impl", "_wrapped_call_impl", "unwind::", "CapturedTraceback", "c10::",
             "at::", "/Register", "/Redispatch", "core/boxing", "??")


def _site(frames: Sequence[Any]) -> str:
    """The first frame of an allocation's stack (innermost first) outside torch and the
    interpreter, as `file.py:line:function` (the file's name only)."""
    if not frames:
        return "(unknown: allocated before the recorded history, or without stacks)"
    texts = [_frame_text(f) for f in frames if isinstance(f, Mapping)]
    for full, short in texts:
        if full and not any(x in full for x in _NOT_USER):
            return short
    return texts[0][1] if texts else "(unknown)"


def _frame_text(f: Mapping[str, Any]) -> tuple[str, str]:
    """(the frame as written, as shown: the file's name only)."""
    name = str(f.get("name") or "")
    filename = str(f.get("filename") or "")
    if filename in ("", "none", "??"):  # a profile-made frame: the profiler's event name
        return name, (name.rsplit("/", 1)[-1] if ".py(" in name else name)
    return f"{filename}:{name}", f"{filename.rsplit('/', 1)[-1]}:{f.get('line')}:{name}"


def snapshot_section(summaries: Sequence[Mapping[str, Any]], *,
                     device_bytes: Mapping[int, int] | int | None = None,
                     ranks: Sequence[int] | None = None) -> dict[str, Any]:
    """The `memory` section from one snapshot per rank (`ranks[i]` for `summaries[i]`: from the
    `<base>_<rank>` name Megatron gives it, else the order given)."""
    by_rank: dict[str, dict[str, Any]] = {}
    for i, s in enumerate(summaries):
        rank = ranks[i] if ranks is not None else i
        dev = _device(device_bytes, int(rank))
        res = s["peak_reserved_gib"]
        by_rank[str(rank)] = {
            "device": s["device"], "scope": "history", "events": s["entries"],
            "peak_allocated_gib": s["peak_allocated_gib"], "peak_reserved_gib": res,
            "device_gib": _gib(dev),
            "reserved_share": round(res * GIB / dev, 4) if dev and res else None,
            "fragmentation": s["fragmentation"], "iteration": None,
        }
    worst_rank, worst = max(by_rank.items(), key=lambda kv: (
        kv[1]["reserved_share"] or -1.0, kv[1]["peak_reserved_gib"] or 0.0,
        kv[1]["peak_allocated_gib"] or 0.0))
    top = summaries[list(by_rank).index(worst_rank)]
    return {"memory": {
        "source": "snapshot", "scope": "history",
        "events": sum(r["events"] for r in by_rank.values()),
        **{k: worst[k] for k in ("peak_allocated_gib", "peak_reserved_gib", "device_gib",
                                 "reserved_share", "fragmentation")},
        "iteration": None,
        "files": [s["file"] for s in summaries if s.get("file")],
        "notes": list(top["notes"]),
        "largest": list(top["largest"]),
        "by_rank": by_rank,
    }}


def snapshot_rank(path: str | Path) -> int | None:
    """The rank in Megatron's snapshot name `<base>_<rank><ext>`, else None."""
    stem = Path(path).stem
    tail = stem.rsplit("_", 1)[-1]
    return int(tail) if "_" in stem and tail.isdigit() else None


# ----------------------------------------------------------------------------- helpers


def _device(device_bytes: Mapping[int, int] | int | None, rank: int) -> int | None:
    if isinstance(device_bytes, Mapping):
        got = device_bytes.get(rank)
        if got is None and len(set(device_bytes.values())) == 1:
            got = next(iter(device_bytes.values()))  # one GPU model for every rank
        return got
    return device_bytes


def _worst(by_rank: Mapping[str, Mapping[str, Any]]) -> Mapping[str, Any]:
    return max(by_rank.values(), key=lambda r: (r["reserved_share"] or -1.0,
                                                r["peak_reserved_gib"] or 0.0,
                                                r["peak_allocated_gib"] or 0.0))


def size_text(b: float) -> str:
    """`1.25 GiB`, `3.0 MiB`."""
    return f"{b / GIB:.2f} GiB" if b >= GIB / 10 else f"{b / MIB:.1f} MiB"


def _gib(b: float | None) -> float | None:
    return None if b is None else round(b / GIB, 4)
