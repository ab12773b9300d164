"""Terminal rendering of moetune documents (rich). Rendering only: no analysis happens here."""

from __future__ import annotations

import hashlib
import sys
from collections.abc import Iterable, Sequence
from typing import Any, TextIO

from rich.console import Console
from rich.table import Table
from rich.text import Text

from moetune.analyzer import device_memory, observed, path_summary, phases, ranks, throughput
from moetune.report_format import count
from moetune.vocabulary import RECOMPUTE, RECOMPUTE_MEANING, RECOMPUTE_SHARE, steps_label

WALL_ORDER = ("compute", "communication", "memory", "host")

# Not a terminal (a pipe, a file, `| cat`): lines are never wrapped nor cut to a width, so a
# table is as wide as its longest cell and each kernel keeps its full name.
PIPE_WIDTH = 100_000


def make_console(file: TextIO | None = None, *, stderr: bool = False) -> Console:
    """The console every command renders to: on a terminal, its width (names shortened to fit,
    never two alike); through a pipe or into a file, no width at all (full names, no wrap)."""
    stream = file or (sys.stderr if stderr else sys.stdout)
    tty = bool(getattr(stream, "isatty", lambda: False)())
    return Console(file=stream, highlight=False, soft_wrap=True,
                   width=None if tty else PIPE_WIDTH, force_terminal=tty or None,
                   no_color=not tty or None)


def fits(out: Console) -> bool:
    """Whether `out` has a width to fit (a terminal), rather than PIPE_WIDTH."""
    return out.width < PIPE_WIDTH


def _ms(s: float | None) -> str:
    return "—" if not s else f"{s * 1e3:,.1f} ms"


def _pct(x: float) -> str:
    return f"{x * 100:.1f} %"


HEADER_FILES = 4  # more input files than this are counted, not listed, in the header


def diagnosis_header(doc: dict[str, Any]) -> str:
    names = [i["file"] for i in doc["inputs"]]
    files = (", ".join(names) if len(names) <= HEADER_FILES else
             f"{', '.join(names[:2])}, … {names[-1]} ({len(names)} files)")
    fmts = "/".join(sorted({i["format"] for i in doc["inputs"]}))
    n = len(doc.get("ranks_analyzed") or [])
    src = doc.get("window", {}).get("step_source", "")
    # a step id, never read as a count; one whole-trace step has no id worth showing
    steps = ("the whole trace as one step" if src == "whole_trace" else
             f"{steps_label(doc['steps'])} ({src.replace('_', ' ')})")
    return (
        f"moetune diagnose {files} · {fmts} · {n} rank{'s' if n != 1 else ''} · "
        f"{steps} · step {_ms(doc['step_time_s'])} (median)"
    )


def render_diagnosis(doc: dict[str, Any], console: Console | None = None) -> None:
    """Header, wall table (dominant marked), host-idle split, observed facts; warnings go to
    stderr."""
    out = console or make_console()
    out.print(Text(diagnosis_header(doc), style="bold"))
    t = Table(show_edge=False, box=None, pad_edge=False)
    for col, just in (("wall", "left"), ("exposed", "right"), ("hidden", "right"), ("share", "right"), ("", "left")):
        t.add_column(col, justify=just)  # type: ignore[arg-type]
    detail = doc["wall_detail"]
    for w in sorted(WALL_ORDER, key=lambda k: -doc["walls"][k]):
        d = detail[w]
        mark = "← dominant" if w == doc["dominant_wall"] else ""
        t.add_row(w, _ms(d["exposed_s"]), _ms(d["hidden_s"]), _pct(doc["walls"][w]), mark)
        if w == "memory" and d.get("recompute_s"):  # its own line, inside the memory wall
            step = doc.get("step_time_s") or 0.0
            t.add_row(f"  of which {RECOMPUTE}", _ms(d["recompute_s"]), "",
                      _pct(d["recompute_s"] / step) if step else "—", "")
    out.print(t)
    mem = detail["memory"]
    if mem.get("recompute_s"):
        out.print(f"{RECOMPUTE}: {RECOMPUTE_MEANING}", markup=False)
    if mem.get("offload_s"):
        pageable = f", {_ms(mem['offload_pageable_s'])} through pageable memory" if mem.get("offload_pageable_s") else ""
        out.print(f"memory includes offload round trips {_ms(mem['offload_s'])} exposed{pageable}")
    h = doc["host"]
    out.print(
        f"host idle {_ms(h['idle_s'])}: launch-starved {_ms(h['launch_starved_s'])}, "
        f"sync-blocked {_ms(h['sync_blocked_s'])}, other {_ms(h['other_s'])}"
        + (f" ({path_summary.HOST_IDLE_OTHER})" if h.get("other_s") else "") + " · "
        f"{h.get('kernels_per_step', 0):,.0f} kernels/step, median kernel "
        f"{h.get('median_kernel_us', 0):,.1f} µs", markup=False
    )
    o = doc["observed"]
    out.print(
        "observed: "
        f"dispatcher {o['dispatcher_backend']} · graph replay {'yes' if o['cuda_graph_replay'] else 'no'} · "
        f"fp8 gemm {'yes' if o['fp8_gemm'] else 'no'} · grouped gemm {'yes' if o['grouped_gemm'] else 'no'} · "
        f"{RECOMPUTE} {_pct(o['recompute_fraction'])} {RECOMPUTE_SHARE} · "
        f"offload copies {_pct(o['offload_copy_fraction'])} of step"
        + (f" · pageable copies {_pct(o['pageable_copy_fraction'])} of step" if o.get("pageable_copy_fraction") else "")
    )
    for line in (observed.summary_lines(doc) + path_summary.summary_lines(doc)
                 + ranks.summary_lines(doc) + device_memory.summary_lines(doc)):
        out.print(line, markup=False)
    render_phases(doc, out)


LAYER_COLUMNS = 12  # more layers than this: the per-layer table is left to --json / the report


def _msf(s: float | None) -> str:
    return "—" if s is None else f"{s * 1e3:,.2f}"


def render_phases(doc: dict[str, Any], console: Console | None = None) -> None:
    """The phase table of the median step (and per layer when there are few), throughput."""
    out = console or make_console()
    ph = doc.get("phases") or {}
    rows = ph.get("rows") or []
    if rows:
        # 80 columns: the busy / hidden times, launches and TFLOP/s are in --json and the report
        t = Table(title="phases of the median step (ms; share of the step)", title_justify="left",
                  show_edge=False, box=None, pad_edge=False, padding=(0, 1, 0, 0))
        for col, just in (("phase", "left"), ("step", "right"), ("share", "right"),
                          ("exposed", "right"), ("waited", "right"), ("f/b/r %", "right"),
                          ("kernels", "right"), ("host", "right"), ("source", "left")):
            t.add_column(col, justify=just, no_wrap=True)  # type: ignore[arg-type]
        for r in rows:
            st = r["step_s"] or 0.0
            split = "/".join(f"{(r[f'{d}_s'] / st * 100) if st else 0:.0f}" for d in phases.DIRECTIONS)
            t.add_row(r["phase"], _msf(r["step_s"]), _pct(r["share"]), _msf(r["exposed_s"]),
                      _msf(r["idle_s"]), split, f"{r['kernels']:,.0f}", _msf(r["host_s"]),
                      r.get("source") or "—")
        out.print(t)
        out.print("waited: GPU idle until the phase's work started (the step waited for it to be "
                  f"issued); f/b/r: % of its step time in forward, backward, {RECOMPUTE}; host: "
                  "host time issuing it", markup=False)
    layered = ph.get("by_layer") or []
    count = (ph.get("layers") or {}).get("count") or 0
    if layered and count <= LAYER_COLUMNS:
        names = [n for n in (r["phase"] for r in rows) if any(x["phase"] == n for x in layered)]
        t = Table(title="per layer (ms of the step)", title_justify="left", show_edge=False,
                  box=None, pad_edge=False, padding=(0, 1, 0, 0))
        t.add_column("layer", justify="right")
        for n in names:
            t.add_column(n, justify="right", no_wrap=True)
        t.add_column("total", justify="right")
        for layer in sorted({r["layer"] for r in layered}):
            cells = {r["phase"]: r["step_s"] for r in layered if r["layer"] == layer}
            t.add_row(str(layer), *[_msf(cells.get(n)) if n in cells else "" for n in names],
                      _msf(sum(cells.values())))
        out.print(t)
    for line in phases.summary_lines(doc) + throughput.summary_lines(doc):
        out.print(line, markup=False)


def render_warnings(warnings: list[str], console: Console | None = None) -> None:
    err = console or make_console(stderr=True)
    for w in warnings:
        err.print(f"warning: {w}", markup=False)


_NOISE_PREFIXES = ("at::native::", "(anonymous namespace)::", "<unnamed>::", "at_cuda_detail::",
                   "cub::", "at::", "c10::")


def _short_name(name: str | None, limit: int = 72) -> str:
    """A kernel or op name that fits a table column: return type and namespaces that every
    PyTorch kernel shares dropped (they hide what tells two kernels apart), then cut."""
    n = (name or "?").removeprefix("void ")
    for p in _NOISE_PREFIXES:
        n = n.replace(p, "")
    if len(n) > limit and "<" in n:
        n = _template_label(n)
    return n if len(n) <= limit else n[: limit - 1] + "…"


# Through a pipe a name column is this wide whatever the terminal: the same text in every
# environment (COLUMNS does not change it)
PIPE_NAME_WIDTH = 96


def distinct_names(names: Sequence[str | None], limit: int | None) -> list[str]:
    """Labels for a table's name column: `_short_name` cut to `limit` (None, through a pipe:
    PIPE_NAME_WIDTH), and where two different names would read alike, each keeps a stable tag
    of its full name (`… #3fa2`), so that no two kernels ever look the same (the full names are
    in --json, --csv and the report)."""
    limit = PIPE_NAME_WIDTH if limit is None else limit
    short = [_short_name(n, limit) for n in names]
    full: dict[str, set[str]] = {}
    for n, label in zip(names, short, strict=True):
        full.setdefault(label, set()).add(n or "?")
    out = []
    for n, label in zip(names, short, strict=True):
        if len(full[label]) > 1:
            tag = hashlib.sha1((n or "?").encode()).hexdigest()[:4]
            label = f"{_short_name(n, max(limit - 6, 8))} #{tag}"
        out.append(label)
    return out


def _template_label(n: str) -> str:
    """`kernel<4, FillFunctor<float>, …>(…)` → `kernel<FillFunctor>`: the first argument that is
    not a number is what tells instantiations apart."""
    base, _, rest = n.partition("<")
    depth, arg, args = 0, "", []
    for ch in rest:
        if ch == "<":
            depth += 1
            continue
        if ch == ">":
            if depth == 0:
                break
            depth -= 1
            continue
        if ch == "," and depth == 0:
            args.append(arg.strip())
            arg = ""
            continue
        arg += ch if depth == 0 else ""
    args.append(arg.strip())
    named = [a for a in args if a and not a.replace(".", "").replace("u", "").isdigit()]
    return f"{base}<{named[0].split('(')[0].split('::')[-1]}>" if named else base


def _bytes(n: float) -> str:
    for unit, size in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if n >= size:
            return f"{n / size:,.1f} {unit}"
    return f"{n:,.0f} B"


def _top_table(title: str, columns: Iterable[tuple[str, str]]) -> Table:
    """One of `diagnose --top`'s borderless tables: (column, justify) pairs."""
    t = Table(title=title, title_justify="left", show_edge=False, box=None, pad_edge=False)
    for col, just in columns:
        t.add_column(col, justify=just, no_wrap=True)  # type: ignore[arg-type]
    return t


def render_top(doc: dict[str, Any], console: Console | None = None) -> None:
    """`diagnose --top N`: top kernels by GPU time, top host ops by self time, copy kinds; times
    per step and rank (the document's totals over `top.rank_steps`)."""
    out = console or make_console()
    top = doc.get("top") or {}
    n = max(int(top.get("rank_steps") or 1), 1)
    if top.get("kernels"):
        t = _top_table("top GPU kernels (per step and rank)",
                       (("kernel", "left"), ("class", "left"), ("count", "right"),
                        ("total", "right"), ("share", "right")))
        labels = distinct_names([r["name"] for r in top["kernels"]],
                                max(28, out.width - 52) if fits(out) else None)
        for r, label in zip(top["kernels"], labels, strict=True):
            t.add_row(Text(label), Text(r["kclass"] or "—"), count(r["count"] / n),
                      f"{r['time_s'] / n * 1e3:,.3f} ms", _pct(r["share"]))
        out.print(t)
    if top.get("ops"):
        t = _top_table("top host ops by self time (per step and rank)",
                       (("op", "left"), ("count", "right"), ("self", "right"),
                        ("total", "right"), ("share", "right")))
        labels = distinct_names([r["name"] for r in top["ops"]],
                                max(40, out.width - 40) if fits(out) else None)
        for r, label in zip(top["ops"], labels, strict=True):
            t.add_row(Text(label), count(r["count"] / n),
                      f"{r['self_s'] / n * 1e3:,.3f} ms", f"{r['total_s'] / n * 1e3:,.3f} ms",
                      _pct(r["share"]))
        out.print(t)
    elif top:
        out.print("top host ops: none in this trace (no PyTorch ops recorded)")
    copies = (doc.get("evidence") or {}).get("copies") or {}
    rows = sorted(((k, m, c) for k, by in copies.items() for m, c in by.items() if c.get("count")),
                  key=lambda r: (-r[2]["time_s"], r[0], r[1]))
    if rows:
        t = _top_table("copies by direction and memory (per step and rank)",
                       (("copy", "left"), ("memory", "left"), ("count", "right"),
                        ("bytes", "right"), ("time", "right")))
        for k, m, c in rows:
            t.add_row(k, m, count(c["count"] / n), _bytes(c["bytes"] / n),
                      f"{c['time_s'] / n * 1e3:,.3f} ms")
        out.print(t)


def quiet_lines(doc: dict[str, Any]) -> list[str]:
    """`diagnose --quiet`: the verdict alone, one line: step time, dominant wall and its share."""
    w = doc.get("dominant_wall")
    share = (doc.get("walls") or {}).get(w) if w else None
    return [f"step {_ms(doc.get('step_time_s'))} · dominant {w or '—'}"
            + (f" {_pct(share)}" if share is not None else "")]


def _delta_ms(p: dict[str, Any]) -> str:
    if p.get("a") is None or p.get("b") is None:
        return "—"
    return f"{p['a'] * 1e3:,.2f} → {p['b'] * 1e3:,.2f} ms ({p['delta'] * 1e3:+,.2f})"


def render_diff(doc: dict[str, Any], console: Console | None = None) -> None:
    """`moetune diff`: step time with noise and gain, walls, classes, kernels, ops, groups,
    backend changes, memory."""
    from moetune.compare import config_lines

    out = console or make_console()
    st = doc["step_time"]
    a, b = st["a"], st["b"]
    out.print(Text(f"moetune diff  A: {doc['a']['label']}  B: {doc['b']['label']}", style="bold"))
    for line in config_lines(doc.get("config")):  # what changed comes before what it did
        out.print(line, markup=False)

    def side(s: dict[str, Any]) -> str:
        if s.get("median_s") is None:
            return "—"
        noise = "noise unknown" if s["noise_s"] is None else f"{s['noise_s'] * 1e3:,.2f}"
        return (f"{s['median_s'] * 1e3:,.2f} ms ± {noise} "
                f"({s['n']} step{'s' if s['n'] != 1 else ''})")

    line = f"step time: A {side(a)} · B {side(b)}"
    if st.get("delta_pct") is not None:
        verdict = ("noise unknown: a change cannot be told from step-to-step variation"
                   if st["beyond_noise"] is None else "within noise" if not st["beyond_noise"]
                   else "faster" if st["delta_s"] < 0 else "slower")
        line += f" · Δ {st['delta_pct']:+.1f} % ({verdict}; speedup {st['speedup'] * 100:+.1f} %)"
    out.print(line, markup=False)
    if doc["source"] == "ledger":
        mem = doc["memory"]["peak_allocated_gib"]
        if mem["a"] is not None or mem["b"] is not None:
            out.print(f"peak allocated memory: {mem['a']} → {mem['b']} GiB", markup=False)
        return
    t = Table(show_edge=False, box=None, pad_edge=False)
    for col, just in (("wall (exposed, median step)", "left"), ("A → B", "right")):
        t.add_column(col, justify=just, no_wrap=True)  # type: ignore[arg-type]
    for w in WALL_ORDER:
        t.add_row(w, _delta_ms(doc["walls"][w]))
    out.print(t)
    lp = doc.get("launches_per_step") or {}
    if lp.get("a") is not None and lp.get("b") is not None:
        out.print(f"launches per step: {lp['a']:,.0f} → {lp['b']:,.0f}", markup=False)
    for f in doc.get("observed") or []:
        out.print(f"observed: {f['text']}", markup=False)
    for f in doc.get("audit") or []:
        out.print(f"audit: {f['text']}", markup=False)
    for title, rows, key in (("kernel classes", doc.get("classes"), "kclass"),
                             ("kernels", doc.get("kernels"), "name"),
                             ("host ops (self time)", doc.get("ops"), "name")):
        if not rows:
            continue
        t = Table(title=f"{title} by |Δ| (per step and rank)", title_justify="left",
                  show_edge=False, box=None, pad_edge=False)
        for col, just in ((key if key == "kclass" else "name", "left"), ("", "left"),
                          ("A", "right"), ("B", "right"), ("Δ", "right")):
            t.add_column(col, justify=just, no_wrap=True)  # type: ignore[arg-type]
        labels = distinct_names([r[key] for r in rows],
                                max(34, out.width - 46) if fits(out) else None)
        for r, label in zip(rows, labels, strict=True):
            t.add_row(Text(label), r["status"],
                      f"{r['a_s'] * 1e3:,.3f} ms",
                      f"{r['b_s'] * 1e3:,.3f} ms", f"{r['delta_s'] * 1e3:+,.3f} ms")
        out.print(t)
    groups = doc.get("comm_groups") or {}
    if groups:
        out.print("communication by process group (per step and rank): " + " · ".join(
            f"{role.replace('_', ' ')} {_delta_ms(p)}" for role, p in groups.items()), markup=False)
    mem = doc["memory"]
    pa, pr = mem["peak_allocated_gib"], mem["peak_reserved_gib"]
    src = mem.get("source") or {}
    if any(v is not None for v in (pa["a"], pa["b"], pr["a"], pr["b"])):
        where = (f" (source: {src.get('a') or 'none'} → {src.get('b') or 'none'})"
                 if src else "")
        out.print(f"device memory peak: allocated {pa['a']} → {pa['b']} GiB, reserved "
                  f"{pr['a']} → {pr['b']} GiB{where}", markup=False)
    else:
        out.print("device memory peak: unknown (no allocator events, log or snapshot on "
                  "either side)")
    for line in cross_rank_diff_lines(doc.get("cross_rank")):
        out.print(line, markup=False)
    render_phase_diff(doc, out)


def render_phase_diff(doc: dict[str, Any], console: Console | None = None) -> None:
    """`moetune diff`'s phase table (step time per phase, A → B, largest change first) and the
    throughput change."""
    out = console or make_console()
    ph = doc.get("phases") or {}
    if ph.get("rows"):
        t = Table(title="phases of the median step by |Δ|", title_justify="left",
                  show_edge=False, box=None, pad_edge=False, padding=(0, 1, 0, 0))
        for col, just in (("phase", "left"), ("", "left"), ("A ms", "right"), ("B ms", "right"),
                          ("Δ ms", "right"), ("share A → B", "right")):
            t.add_column(col, justify=just, no_wrap=True)  # type: ignore[arg-type]
        for r in ph["rows"]:
            t.add_row(r["phase"], r["status"], _msf(r["a_s"]), _msf(r["b_s"]),
                      f"{r['delta_s'] * 1e3:+,.2f}",
                      f"{r['share_a'] * 100:.1f} → {r['share_b'] * 100:.1f} %")
        out.print(t)
    tp = doc.get("throughput") or {}
    f = tp.get("tflops_per_gpu") or {}
    if f.get("a") is not None and f.get("b") is not None:
        m = tp.get("mfu") or {}
        mfu = (f", MFU {m['a'] * 100:.1f} → {m['b'] * 100:.1f} %"
               if m.get("a") is not None and m.get("b") is not None else "")
        out.print(f"throughput: {f['a']:,.1f} → {f['b']:,.1f} TFLOP/s per GPU{mfu}", markup=False)


def cross_rank_diff_lines(cr: dict[str, Any] | None) -> list[str]:
    """The diff's cross-rank lines: rank count, step-time spread, stragglers, overloaded EP
    ranks, arrival skew per role, the median step's path."""
    if not cr:
        return []

    def ranks(xs: list[int] | None) -> str:
        return "unobservable" if xs is None else ", ".join(map(str, xs)) or "none"

    def change(c: dict[str, Any]) -> str:
        moved = [f"new {ranks(c['new'])}"] * bool(c["new"]) + [f"gone {ranks(c['gone'])}"] * bool(
            c["gone"])
        return f"{ranks(c['a'])} → {ranks(c['b'])}" + (f" ({'; '.join(moved)})" if moved else "")

    n, st = cr["ranks"], cr["step_time_s"]
    lines = [f"cross-rank: ranks {n['a'] or '—'} → {n['b'] or '—'} · step p50 "
             f"{_delta_ms(st['p50'])}, max {_delta_ms(st['max'])}",
             f"  stragglers {change(cr['stragglers'])} · overloaded EP ranks "
             f"{change(cr['overloaded_ep_ranks'])}"]
    skew = cr.get("arrival_skew_p50_s") or {}
    if skew:
        lines.append("  arrival skew p50: " + " · ".join(
            f"{role.replace('_', ' ')} {_delta_us(p)}" for role, p in skew.items()))
    path = cr["critical_path_ranks"]
    lines.append(f"  median step's path crosses ranks {path['a'] or '—'} → {path['b'] or '—'}")
    return lines


def _delta_us(p: dict[str, Any]) -> str:
    a, b = p.get("a"), p.get("b")
    return (f"{'—' if a is None else f'{a * 1e6:,.1f}'} → "
            f"{'—' if b is None else f'{b * 1e6:,.1f}'} µs")
