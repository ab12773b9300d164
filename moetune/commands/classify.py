"""`moetune classify NAME... [--kind K] [--bytes N] [--classes FILE] [--json]`: which entry of
kernel_classes.yaml classifies an event name, and the later entries that also fit but never see it
(first match wins). The check a new kernel class needs: docs/extending.md."""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

KINDS = ("kernel", "memcpy", "memset", "graph", "runtime")


def add_parser(subparsers: argparse._SubParsersAction) -> argparse.ArgumentParser:
    p = subparsers.add_parser(
        "classify", help="say which kernel_classes.yaml entry classifies an event name",
        description="Classify event names as the diagnosis does and name the entry of "
        "kernel_classes.yaml that claimed each (first match wins), with the later entries it hides.")
    p.add_argument("names", nargs="+", metavar="NAME", help="event name as the trace writes it")
    p.add_argument("--kind", choices=KINDS, default="kernel",
                   help="event kind (default kernel; runtime: a CUDA/HIP API call)")
    p.add_argument("--bytes", type=int, metavar="N", dest="nbytes",
                   help="size of a copy (memcpy): offload classes need ≥ their min_bytes")
    p.add_argument("--classes", metavar="FILE",
                   help="a kernel-classes YAML to use instead of the shipped one")
    p.add_argument("--json", action="store_true",
                   help="print the document (schemas/classify.schema.json)")
    return p


def run(args: argparse.Namespace) -> int:
    from moetune.analyzer.classify import claim

    claims = [claim(n, kind=args.kind, nbytes=args.nbytes, path=args.classes) for n in args.names]
    doc = document(claims)
    if args.json:
        sys.stdout.write(json.dumps(doc, indent=2, ensure_ascii=False) + "\n")
    else:
        sys.stdout.write(render(doc))
    return 0


def document(claims: list[Any]) -> dict[str, Any]:
    return {
        "schema": "moetune.classify/1",
        "classes": claims[0].source if claims else None,
        "names": [{
            "name": c.name, "kind": c.kind, "section": c.section, "entry": c.entry, "line": c.line,
            "class": c.label, "wall": c.wall, "blocking": c.blocking, "sentence": c.sentence(),
            "shadowed": [{"entry": e, "line": ln, "class": lab} for e, ln, lab in c.shadowed],
        } for c in claims],
    }


def render(doc: dict[str, Any]) -> str:
    out: list[str] = []
    for n in doc["names"]:
        what = n["class"] or "unclassified"
        if n["wall"]:
            what += f" ({n['wall']})"
        if n["blocking"]:
            what += " (blocks the host)"
        out += [n["name"], f"  {what}: {n['sentence']}"]
        if n["shadowed"]:
            later = ", ".join(f"entry {s['entry']} {s['class']}" + (f" (line {s['line']})" if s["line"] else "")
                              for s in n["shadowed"])
            out.append(f"  also fits, never reached: {later}")
    return "\n".join(out) + "\n"
