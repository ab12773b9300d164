"""`moetune annotate PATH... -o OUT.json[.gz] [--contract FILE] [--window A:B]
[--step-range NAME] [--allow-mixed-runs]`.

Writes the input trace plus moetune's tracks (`moetune.analyzer.annotate`) as Chrome trace JSON
that Perfetto and chrome://tracing open as is. Kineto inputs: the files' own events are copied
byte for byte (metadata events' strings redacted), their top-level metadata replaced by the
whitelisted part (`moetune.redact`); nsys inputs: the analysed window's GPU work, runtime calls
and NVTX ranges. The inputs are only read.
"""

from __future__ import annotations

import argparse
import gzip
import io
import sys
from pathlib import Path
from typing import IO, Any

import msgspec

from moetune.errors import UserError, bad_json
from moetune.redact import redact_metadata, redact_text


def add_parser(subparsers: argparse._SubParsersAction) -> argparse.ArgumentParser:
    p = subparsers.add_parser(
        "annotate",
        help="write the trace plus moetune's tracks (walls, critical path, blocking, audit) for Perfetto",
        description="Write a Chrome trace (Perfetto, chrome://tracing) of the input with moetune's "
        "tracks: walls per step, the median step's critical path, blocking communication as flow "
        "arrows, observed backends and audit verdicts as markers. nsys inputs: the analysed "
        "window's events. Trace metadata is reduced to a whitelist (moetune/redact.py).",
    )
    p.add_argument("paths", nargs="+", metavar="PATH", help="trace files or rank directories")
    p.add_argument("-o", "--output", required=True, metavar="OUT",
                   help="output file (.json, or .json.gz to compress)")
    p.add_argument("--contract", metavar="FILE", help="measurement contract: adds audit verdicts")
    p.add_argument("--window", metavar="A:B", help="analyze steps A..B (inclusive step ids)")
    p.add_argument("--step-range", metavar="NAME", help="annotation/NVTX range that marks one step")
    p.add_argument("--allow-mixed-runs", action="store_true",
                   help="analyse files together even when their metadata says they are not ranks of one run")
    return p


def _check_output(out: Path, files: list[Path]) -> None:
    target = out.resolve()
    for f in files:
        if f.resolve() == target:
            raise UserError("is an input; annotate never overwrites its input (choose another -o)",
                            path=out)
    if out.exists() and out.is_dir():
        raise UserError("is a directory (give a file name)", path=out)
    if not out.parent.exists():
        raise UserError("no such directory for the output", path=out.parent)


class _Kineto:
    """One Kineto file: top-level values kept raw; events raw, decoded only where rewritten."""

    def __init__(self, path: Path) -> None:
        from moetune.analyzer.readers import open_bytes

        self.path = path
        try:
            top = msgspec.json.decode(open_bytes(path), type=dict[str, msgspec.Raw])
            self.events = msgspec.json.decode(top.pop("traceEvents", b"[]"), type=list[msgspec.Raw])
            self.meta = {k: msgspec.json.decode(v) for k, v in top.items()}
        except msgspec.DecodeError:
            raise bad_json(open_bytes(path), path) from None
        base = self.meta.get("baseTimeNanoseconds")
        self.base_ns = int(base) if isinstance(base, int | float) else 0


def _clean_meta_event(ev: dict[str, Any]) -> dict[str, Any]:
    """A metadata event (process/thread names, labels) with its strings redacted: process names
    may be command lines."""
    args = ev.get("args")
    if isinstance(args, dict):
        ev["args"] = {k: redact_text(v) if isinstance(v, str) else v for k, v in args.items()}
    return ev


def _write_kineto(fh: IO[bytes], src: _Kineto, index: int, shift_us: float,
                  taken_pids: set[int], first: bool) -> tuple[set[int], bool]:
    """Copy one file's events. The first file's events pass byte for byte (metadata events
    redacted); a later file's are rewritten only as needed: timestamps shifted to the first
    file's clock, flow ids made unique, pids that an earlier file used moved out of the way."""
    enc = msgspec.json.encode
    decoded = [msgspec.json.decode(r) for r in src.events] if index > 0 else None
    pids: set[int] = set()
    if decoded is not None:
        pids = {e["pid"] for e in decoded
                if isinstance(e, dict) and isinstance(e.get("pid"), int) and e.get("ph") != "M"}
    moved = pids & taken_pids
    for k, r in enumerate(src.events):
        if decoded is None:
            b = bytes(r)
            if b'"M"' in b:
                ev = msgspec.json.decode(b)
                if isinstance(ev, dict) and ev.get("ph") == "M":
                    b = enc(_clean_meta_event(ev))
            else:
                p = _pid(b)
                if p is not None:
                    pids.add(p)
        else:
            ev = decoded[k]
            if not isinstance(ev, dict):
                continue
            if ev.get("ph") == "M":
                _clean_meta_event(ev)
            if shift_us and isinstance(ev.get("ts"), int | float):
                ev["ts"] = ev["ts"] + shift_us
            if ev.get("ph") in ("s", "t", "f") and isinstance(ev.get("id"), int):
                ev["id"] = ev["id"] + (index << 40)
            if ev.get("pid") in moved:
                ev["pid"] = ev["pid"] + 1_000_000 * index
            b = enc(ev)
        if not first:
            fh.write(b",\n")
        fh.write(b)
        first = False
    return taken_pids | {p + (1_000_000 * index if p in moved else 0) for p in pids}, first


def _pid(b: bytes) -> int | None:
    """An event's integer pid, read from its bytes without decoding it (None: a string pid)."""
    i = b.find(b'"pid":')
    if i < 0:
        return None
    j = i + 6
    while j < len(b) and b[j:j + 1] == b" ":
        j += 1
    k = j
    while k < len(b) and b[k:k + 1].isdigit():
        k += 1
    return int(b[j:k]) if k > j else None


def run(args: argparse.Namespace) -> int:
    import polars as pl

    from moetune.analysis import analyze_trace
    from moetune.analyzer.annotate import median_paths, moetune_events, window_events
    from moetune.analyzer.frames import Trace
    from moetune.analyzer.readers import expand, load_trace
    from moetune.progress import describe, progress

    out = Path(args.output)
    files = expand(args.paths)
    _check_output(out, files)
    captured: dict[str, Any] = {}

    def capture(_trace: Any, steps: Any, ctx: Any) -> dict[str, Any]:
        captured["steps"], captured["events"] = steps.table, ctx.events
        return {}

    with progress(f"reading and analysing {describe(args.paths)}"):
        trace = load_trace(args.paths, allow_mixed_runs=args.allow_mixed_runs)
        analysis = analyze_trace(trace, args.contract, files=files, window=args.window,
                                 step_range=args.step_range, audit=args.contract is not None,
                                 extra_sections=[("annotate", capture)])
    doc = analysis.diagnosis or {}
    steps: pl.DataFrame = captured["steps"]
    events: pl.DataFrame = captured["events"]
    tr = Trace(events=events, comms=trace.comms, flows=trace.flows, ranks=trace.ranks,
               warnings=trace.warnings)
    segments, names = median_paths(tr, steps, doc)

    formats = dict(trace.ranks.select("source", "format").iter_rows())
    kineto = [f for f in files if formats.get(str(f)) == "kineto"]
    with progress(f"reading {len(kineto)} Kineto file(s) to copy"):
        srcs = [_Kineto(f) for f in kineto]
    rank_of_src = dict(trace.ranks.select("source", "rank").iter_rows())
    ref = srcs[0].base_ns if srcs else 0
    base = {int(rank_of_src[str(s.path)]): s.base_ns for s in srcs if str(s.path) in rank_of_src}

    def to_us(rank: int, ns: int) -> float:
        # every rank on the first file's clock: ts_ns is the file's µs plus its base
        return (ns - ref) / 1000 if rank in base else ns / 1000

    ours = moetune_events(doc, steps, segments, names, events, to_us, audit=analysis.audit)
    n_ours = len(ours)
    nsys_ranks = [int(r) for r, f in trace.ranks.select("rank", "format").iter_rows() if f == "nsys"]
    if nsys_ranks:
        win = steps.filter(pl.col("rank").is_in(nsys_ranks))
        lo, hi = win["win_start_ns"].min(), win["win_end_ns"].max()
        if lo is not None:
            ev = events.filter(pl.col("rank").is_in(nsys_ranks))
            ours = window_events(ev, int(lo), int(hi), to_us) + ours
    meta = redact_metadata(srcs[0].meta) if srcs else {"displayTimeUnit": "ns"}
    meta["moetune"] = {"tool": doc.get("tool"), "steps": doc.get("steps"),
                       "step_time_s": doc.get("step_time_s"), "dominant_wall": doc.get("dominant_wall"),
                       "inputs": [i.get("file") for i in doc.get("inputs") or []]}
    with progress(f"writing {out.name}"):
        _write(out, srcs, ours, meta)
    print(f"moetune annotate: wrote {out} (moetune's tracks: {n_ours} events); open it in "
          "https://ui.perfetto.dev or chrome://tracing", file=sys.stderr)
    return 0


def _write(out: Path, srcs: list[_Kineto], ours: list[dict[str, Any]], meta: dict[str, Any]) -> None:
    tmp = out.with_name(out.name + ".part")
    try:
        with (gzip.open(tmp, "wb", compresslevel=6) if out.name.endswith(".gz")
              else open(tmp, "wb")) as fh0:
            fh: IO[bytes] = io.BufferedWriter(fh0, buffer_size=1 << 20)  # type: ignore[arg-type]
            fh.write(b'{"traceEvents":[\n')
            first, taken = True, set()
            for i, s in enumerate(srcs):
                shift = (s.base_ns - srcs[0].base_ns) / 1000
                taken, first = _write_kineto(fh, s, i, shift, taken, first)
            for ev in ours:
                if not first:
                    fh.write(b",\n")
                fh.write(msgspec.json.encode(ev))
                first = False
            fh.write(b"\n]")
            for k, v in meta.items():
                fh.write(b",\n" + msgspec.json.encode(k) + b":" + msgspec.json.encode(v))
            fh.write(b"}\n")
            fh.flush()
        tmp.replace(out)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
