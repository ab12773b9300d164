"""Terminal rendering of moetune documents (rich). Rendering only: no analysis happens here."""

from __future__ import annotations

from typing import Any

from rich.console import Console
from rich.table import Table
from rich.text import Text

from moetune.analyzer import critical_path, device_memory, observed, ranks

WALL_ORDER = ("compute", "communication", "memory", "host")


def _ms(s: float | None) -> str:
    return "—" if not s else f"{s * 1e3:,.1f} ms"


def _pct(x: float) -> str:
    return f"{x * 100:.1f} %"


def _steps(ids: list[int]) -> str:
    if len(ids) > 2 and ids == list(range(ids[0], ids[-1] + 1)):
        return f"{ids[0]}–{ids[-1]}"
    return ", ".join(map(str, ids))


def diagnosis_header(doc: dict[str, Any]) -> str:
    files = ", ".join(i["file"] for i in doc["inputs"])
    fmts = "/".join(sorted({i["format"] for i in doc["inputs"]}))
    n = len(doc.get("ranks_analyzed") or [])
    src = doc.get("window", {}).get("step_source", "")
    return (
        f"moetune diagnose {files} · {fmts} · {n} rank{'s' if n != 1 else ''} · "
        f"steps {_steps(doc['steps'])} ({src}) · step {_ms(doc['step_time_s'])} (median)"
    )


def render_diagnosis(doc: dict[str, Any], console: Console | None = None) -> None:
    """Header, wall table (dominant marked), host-idle split, observed facts; warnings go to
    stderr."""
    out = console or Console(highlight=False, soft_wrap=True)
    out.print(Text(diagnosis_header(doc), style="bold"))
    t = Table(show_edge=False, box=None, pad_edge=False)
    for col, just in (("wall", "left"), ("exposed", "right"), ("hidden", "right"), ("share", "right"), ("", "left")):
        t.add_column(col, justify=just)  # type: ignore[arg-type]
    detail = doc["wall_detail"]
    for w in sorted(WALL_ORDER, key=lambda k: -doc["walls"][k]):
        d = detail[w]
        mark = "← dominant" if w == doc["dominant_wall"] else ""
        t.add_row(w, _ms(d["exposed_s"]), _ms(d["hidden_s"]), _pct(doc["walls"][w]), mark)
    out.print(t)
    mem = detail["memory"]
    if mem.get("recompute_s"):
        out.print(f"memory includes recompute {_ms(mem['recompute_s'])} (forward re-run in backward)")
    if mem.get("offload_s"):
        pageable = f", {_ms(mem['offload_pageable_s'])} through pageable memory" if mem.get("offload_pageable_s") else ""
        out.print(f"memory includes offload round trips {_ms(mem['offload_s'])} exposed{pageable}")
    h = doc["host"]
    out.print(
        f"host idle {_ms(h['idle_s'])}: launch-starved {_ms(h['launch_starved_s'])}, "
        f"sync-blocked {_ms(h['sync_blocked_s'])}, other {_ms(h['other_s'])} · "
        f"{h.get('kernels_per_step', 0):,.0f} kernels/step, median kernel "
        f"{h.get('median_kernel_us', 0):,.1f} µs"
    )
    o = doc["observed"]
    out.print(
        "observed: "
        f"dispatcher {o['dispatcher_backend']} · graph replay {'yes' if o['cuda_graph_replay'] else 'no'} · "
        f"fp8 gemm {'yes' if o['fp8_gemm'] else 'no'} · grouped gemm {'yes' if o['grouped_gemm'] else 'no'} · "
        f"recompute {_pct(o['recompute_fraction'])} of compute · offload copies {_pct(o['offload_copy_fraction'])} of step"
        + (f" · pageable copies {_pct(o['pageable_copy_fraction'])} of step" if o.get("pageable_copy_fraction") else "")
    )
    for line in (observed.summary_lines(doc) + critical_path.summary_lines(doc)
                 + ranks.summary_lines(doc) + device_memory.summary_lines(doc)):
        out.print(line, markup=False)


def render_warnings(warnings: list[str], console: Console | None = None) -> None:
    err = console or Console(stderr=True, highlight=False, soft_wrap=True)
    for w in warnings:
        err.print(f"warning: {w}", markup=False)
