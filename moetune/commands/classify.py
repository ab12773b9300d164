"""`moetune classify NAME... [--kind K] [--bytes N] [--classes FILE] [--json]`: which entry of
kernel_classes.yaml classifies an event name, and the later entries that also fit but never see it
(first match wins); and which signature of phases.yaml labels its phase (`--kind range`: a host
range's). The check a new kernel class or phase signature needs: docs/extending.md."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

KINDS = ("kernel", "memcpy", "memset", "graph", "runtime", "range")


def add_parser(subparsers: argparse._SubParsersAction) -> argparse.ArgumentParser:
    p = subparsers.add_parser(
        "classify", help="say which kernel_classes.yaml entry classifies an event name, and "
        "which phases.yaml signature labels its phase",
        description="Classify event names as the diagnosis does and name the entry of "
        "kernel_classes.yaml that claimed each (first match wins), with the later entries it "
        "hides; and the signature of phases.yaml whose phase label the work takes, with the "
        "others that fit.")
    p.add_argument("names", nargs="+", metavar="NAME", help="event name as the trace writes it")
    p.add_argument("--kind", choices=KINDS, default="kernel",
                   help="event kind (default kernel; runtime: a CUDA/HIP API call; range: a host "
                   "range, NVTX range, Kineto scope, aten op or Python frame: its phase only)")
    p.add_argument("--bytes", type=int, metavar="N", dest="nbytes",
                   help="size of a copy (memcpy): offload classes need ≥ their min_bytes")
    p.add_argument("--classes", metavar="FILE",
                   help="a kernel-classes YAML to use instead of the shipped one")
    p.add_argument("--json", action="store_true",
                   help="print the document (schemas/classify.schema.json)")
    return p


def run(args: argparse.Namespace) -> int:
    from moetune.analyzer.classify import claim
    from moetune.analyzer.phases_book import load_phases, signature_lines

    book, lines = load_phases(), signature_lines()
    names = []
    for n in args.names:
        c = None if args.kind == "range" else claim(n, kind=args.kind, nbytes=args.nbytes,
                                                    path=args.classes)
        names.append(_name(n, args.kind, c) | {"phase": _phase(n, args.kind, c, book, lines)})
    doc = {"schema": "moetune.classify/1", "classes": _classes_file(args.classes),
           "phases": book.source, "names": names}
    if args.json:
        sys.stdout.write(json.dumps(doc, indent=2, ensure_ascii=False) + "\n")
    else:
        sys.stdout.write(render(doc))
    return 0


def _classes_file(path: str | None) -> str:
    from moetune.analyzer.classify import CLASSES_PATH

    return Path(path).name if path else CLASSES_PATH.name


def _name(name: str, kind: str, c: Any) -> dict[str, Any]:
    if c is None:  # a host range: kernel classes do not apply
        return {"name": name, "kind": kind, "section": None, "entry": None, "line": None,
                "class": None, "wall": None, "blocking": False,
                "sentence": "a host range: kernel classes classify GPU work and runtime calls",
                "shadowed": []}
    return {"name": c.name, "kind": c.kind, "section": c.section, "entry": c.entry, "line": c.line,
            "class": c.label, "wall": c.wall, "blocking": c.blocking, "sentence": c.sentence(),
            "shadowed": [{"entry": e, "line": ln, "class": lab} for e, ln, lab in c.shadowed]}


def _phase(name: str, kind: str, c: Any, book: Any, lines: dict[int, int]) -> dict[str, Any] | None:
    """The phases.yaml signature whose label the work takes, and the others that fit."""
    from moetune.analyzer.phases_book import claim_kernel, claim_range

    if kind == "runtime":
        return None  # a runtime call is labelled by the work it launches
    got = claim_range(name, book) if kind == "range" else claim_kernel(c.label, name, None, book)

    def sig(i: int) -> dict[str, Any]:
        return {"signature": i + 1, "line": lines.get(i), "phases": list(book.signatures[i].phases)}

    who = got.claimant
    label = (None if who is None else "definite" if who == got.definite
             else "ambiguous" if who == got.ambiguous else "boundary")
    return {"label": label, **(sig(who) if who is not None else
                                {"signature": None, "line": None, "phases": []}),
            "hidden": [sig(i) for i in got.hidden if i != who]}


def render(doc: dict[str, Any]) -> str:
    out: list[str] = []
    for n in doc["names"]:
        what = n["class"] or "unclassified"
        if n["wall"]:
            what += f" ({n['wall']})"
        if n["blocking"]:
            what += " (blocks the host)"
        out += [n["name"], f"  {what}: {n['sentence']}"] if n["kind"] != "range" else [n["name"]]
        if n["shadowed"]:
            later = ", ".join(f"entry {s['entry']} {s['class']}" + (f" (line {s['line']})" if s["line"] else "")
                              for s in n["shadowed"])
            out.append(f"  also fits, never reached: {later}")
        ph = n.get("phase")
        if ph is None:
            continue
        src = doc.get("phases", "phases.yaml")
        if ph["label"] is None:
            out.append(f"  phase: no signature of {src} fits (the layer pass places it)")
            continue
        at = f" (line {ph['line']})" if ph["line"] else ""
        what = {"definite": ph["phases"][0] if ph["phases"] else "",
                "ambiguous": "one of " + ", ".join(ph["phases"]) + " (the layer pass decides)",
                "boundary": "none; starts a block of the layer pass"}[ph["label"]]
        out.append(f"  phase: {what}, by signature {ph['signature']} of {src}{at}")
        if ph["hidden"]:
            out.append("  also fit, label never taken: " + ", ".join(
                f"signature {h['signature']} [{', '.join(h['phases'])}]"
                + (f" (line {h['line']})" if h["line"] else "") for h in ph["hidden"]))
    return "\n".join(out) + "\n"
