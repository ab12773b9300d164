"""`moetune recommend INPUT... [--contract FILE] [--audit FILE] [--log FILE] [--memory-snapshot FILE]
[--json] [--top N] [--rules DIR] [--show-quiet] [--allow-non-equivalent]`: ranked single-knob
changes for a diagnosed run.

INPUT is trace files/directories, or one saved diagnosis document (`moetune diagnose --json`). The
reference inputs (`--log`, `--memory-snapshot`) go through `moetune.analysis.read_reference` as in
every other command; a saved diagnosis already carries the ones it was made with (`diagnose
--log`), so it takes only those again, never others.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from moetune.commands import reference_args
from moetune.errors import UserError, bad_json, read_user_text
from moetune.vocabulary import key_lines

DIAGNOSIS_SCHEMA_ID = "moetune.diagnosis/1"
_MAX_DOC_BYTES = 64 << 20  # a diagnosis document is small; bigger .json files are traces


def add_parser(subparsers: argparse._SubParsersAction) -> argparse.ArgumentParser:
    p = subparsers.add_parser(
        "recommend",
        help="rank one-knob Megatron changes that attack the dominant wall",
        description="Evaluate the rule catalog on a diagnosis (from traces or a saved "
        "`moetune diagnose --json` document), the measurement contract and the backend audit; "
        "print legal single-knob changes ranked by expected gain x confidence.",
    )
    p.add_argument("inputs", nargs="+", metavar="INPUT",
                   help="trace files/directories, or one saved diagnosis JSON")
    p.add_argument("--contract", metavar="FILE",
                   help="measurement contract (YAML/JSON): current arguments, hardware, versions")
    p.add_argument("--audit", metavar="FILE", help="saved `moetune audit --json` document")
    reference_args.add_arguments(p)
    p.add_argument("--json", action="store_true", help="print only the recommendations document (schemas/recommendation.schema.json)")
    p.add_argument("--top", type=int, metavar="N", help="show the N best recommendations")
    p.add_argument("--rules", action="append", default=[], metavar="DIR",
                   help="extra rule folder (repeatable): adds rules, overrides built-in ids")
    p.add_argument("--show-quiet", action="store_true",
                   help="also list rules checked that found nothing")
    p.add_argument("--allow-non-equivalent", action="store_true",
                   help="allow semantics-changing knobs under a training-equivalent contract")
    return p


def read_json(path: Path) -> Any:
    text = read_user_text(path)
    try:
        return json.loads(text)
    except json.JSONDecodeError:
        raise bad_json(text, path) from None
    except RecursionError:  # the parser recurses per level; no moetune document is that deep
        raise UserError("invalid JSON: nested too deeply", path=path) from None


def saved_diagnosis(inputs: list[str]) -> dict[str, Any] | None:
    """The diagnosis document when INPUT is one saved `diagnose --json` file, else None."""
    if len(inputs) != 1:
        return None
    p = Path(inputs[0])
    if p.suffix.lower() != ".json" or not p.is_file() or p.stat().st_size > _MAX_DOC_BYTES:
        return None
    try:
        doc = read_json(p)
    except UserError:  # not a saved document: the trace reader says what it is, as elsewhere
        return None
    if not isinstance(doc, dict) or doc.get("schema") != DIAGNOSIS_SCHEMA_ID:
        return None
    validate_diagnosis(doc, p)
    return doc


def validate_diagnosis(doc: dict[str, Any], path: Path) -> None:
    import jsonschema

    from moetune.rules.load import schema

    err = jsonschema.exceptions.best_match(
        jsonschema.Draft202012Validator(schema("diagnosis")).iter_errors(doc)
    )
    if err is not None:
        where = ".".join(map(str, err.absolute_path)) or "(top)"
        raise UserError(f"not a valid diagnosis document: {where}: {err.message}", path=path)


def run(args: argparse.Namespace) -> int:
    from moetune.analysis import analyze
    from moetune.analyzer.contract import thaw
    from moetune.rules.engine import Options, recommend
    from moetune.rules.load import load_rules

    if args.top is not None and args.top < 1:
        raise UserError("--top must be at least 1")
    rules = load_rules([Path(d) for d in args.rules])
    options = Options(top=args.top, show_quiet=args.show_quiet,
                      allow_non_equivalent=args.allow_non_equivalent)
    audit = _audit_doc(Path(args.audit)) if args.audit else None
    diagnosis = saved_diagnosis(args.inputs)
    reference = reference_args.from_args(args)
    if diagnosis is not None and reference is not None:
        same_reference(diagnosis, reference, Path(args.inputs[0]))
    if diagnosis is None:
        analysis = analyze(args.inputs, args.contract, reference_step_s=reference)
        if audit is None:
            doc = analysis.advise(rules, options=options).document
        else:  # the user's saved audit stands in for the one this pass made
            doc = recommend(rules, analysis.diagnosis, analysis.contract_doc, audit, options=options)
    else:
        from moetune.analysis import read_contract, stand_in_contract

        con = read_contract(stand_in_contract(args.contract, reference))
        doc = recommend(rules, diagnosis, thaw(con) if con else {}, audit, options=options)
    if args.json:
        sys.stdout.write(json.dumps(doc, indent=2, sort_keys=True, ensure_ascii=False) + "\n")
    from_log = (not args.contract and reference is not None and reference.log_contract is not None
                and reference.log is not None)
    if not args.json:
        sys.stdout.write(render(doc, contract=args.contract or (
            f"{reference.log.name}'s arguments" if from_log else None)))
    if not args.contract and not args.json:
        print(f"moetune: no --contract: {reference.log.name}'s argument dump stands in for it"
              if from_log else "moetune: no --contract: current arguments taken as Megatron "
              "defaults, preconditions unverified", file=sys.stderr)
    return 0


def same_reference(diagnosis: dict[str, Any], reference: Any, path: Path) -> None:
    """A saved diagnosis holds what-if estimates replayed from its own reference step and the
    memory evidence it was made with; other reference inputs cannot be applied to it without the
    trace. The same ones again are fine; anything else is refused in one line."""
    from moetune.analysis import apply_reference

    saved = diagnosis.get("reference") or {}
    again = apply_reference({"memory": {}}, reference)
    fresh = again.get("reference") or {}
    same_step = saved.get("file") == fresh.get("file") and saved.get("step_s") == fresh.get("step_s")
    same_memory = not reference.snapshots and (
        reference.log_memory is None or reference.log_memory.height == 0
        or (diagnosis.get("memory") or {}).get("source") != "none")
    if not (same_step and same_memory):
        raise UserError("a saved diagnosis carries the reference it was made with (its what-if "
                        "estimates start from it): --log / --memory-snapshot apply to traces; "
                        "give the trace, or save the diagnosis with `moetune diagnose TRACE --log "
                        "FILE --json`", path=path)


def _audit_doc(path: Path) -> Any:
    doc = read_json(path)
    if not isinstance(doc, dict) or "verdicts" not in doc:
        raise UserError("not an audit document (no `verdicts`)", path=path)
    return doc


# ----------------------------------------------------------------------------- text


def memory_line(mem: dict[str, Any] | None) -> str | None:
    """The run's measured memory as the verdicts read it, with its source."""
    from moetune.analyzer.device_memory import SOURCE_WORDS

    if not mem or mem.get("source") in (None, "none"):
        return None
    a, r, dev = mem.get("peak_allocated_gib"), mem.get("peak_reserved_gib"), mem.get("device_gib")
    files = f" {', '.join(mem['files'])}" if mem.get("files") else ""
    at = f", after iteration {mem['iteration']}" if mem.get("iteration") else ""
    return ("memory now: peak allocated " + (f"{a:.1f} GiB" if a is not None else "unknown")
            + ", reserved " + (f"{r:.1f} GiB" if r is not None else "unknown")
            + (f" of {dev:.1f} GiB" if dev else "")
            + f" (source: {SOURCE_WORDS.get(mem['source'], mem['source'])}{files}{at})")


def _pct(x: float) -> str:
    return f"{x * 100:+.1f} %"


def _predicted(speedup: dict[str, Any]) -> str:
    """The predicted gain as the page states it: its point, then its calibrated range."""
    span = f"{_pct(speedup['low'])} … {_pct(speedup['high'])}"
    if speedup["low"] == speedup["high"]:  # a gate's zero: no range to state
        return _pct(speedup["low"])
    return f"{_pct(speedup['mid'])} ({span})" if speedup.get("mid") is not None else span


def _secs(s: float) -> str:
    return f"{s * 1e3:,.1f} ms" if s < 1 else f"{s:,.3f} s"


def _evidence_line(ev: list[dict[str, Any]]) -> str:
    parts = []
    for e in ev:
        if e["source"] != "metric" or e["held"] is not True:
            continue
        lhs = e["path"] + (f" / {e['of']}" if e.get("of") else "")
        actual = e["actual"]
        shown = f"{actual:.3g}" if isinstance(actual, float) else str(actual)
        parts.append(f"{lhs} = {shown}" + (f" ({e['op']} {e['value']})" if "value" in e else ""))
    return "; ".join(parts) or "(contract and audit facts only)"


def render(doc: dict[str, Any], *, contract: str | None = None) -> str:
    """Ruff-like text: id, title, evidence, fix (flags), gain, verify, notes. `contract`: the
    contract file given, so a contract without a label reads as such, not as no contract."""
    from moetune.analyzer.planner.verdict import describe
    from moetune.recommendation_words import memory_words, risk_text, verify_text

    d = doc["diagnosis"]
    recs = doc["recommendations"]
    where = Path(contract).name if contract else None
    label = (f"{doc['contract_label']} ({where})" if doc["contract_label"] and where
             else doc["contract_label"] or (f"{where} (unlabelled)" if where else "none"))
    lines = [
        f"moetune recommend · step {_secs(d['step_time_s'] or 0)} profiled · dominant "
        f"{d['dominant_wall']} · contract {label}"
    ]
    ref = d.get("reference") or {}
    if ref.get("step_s"):
        lines.append(f"reference: {_secs(ref['step_s'])} unprofiled, {ref['text']}: the "
                     "estimates start from it")
    if (m := memory_line(d.get("memory"))) is not None:
        lines.append(m)
    for r in recs:
        g = r["gain"]
        lines += [
            "",
            f"#{r['rank']} {r['rule']} [{r['status']}] {r['title']}",
            f" --> {_evidence_line(r['evidence'])}",
        ]
        if r["megatron_flags"] or not r["remove_flags"]:
            lines.append(f"help: {' '.join(r['megatron_flags']) or 'no flag to add'}")
        if r["remove_flags"]:
            lines.append(f"help: remove {' '.join(r['remove_flags'])}")
        if r["bridge_overrides"]:
            lines.append(f"bridge: {' '.join(r['bridge_overrides'])}")
        st = g["step_time_s"]
        ceiling = f" · ceiling {_pct(g['ceiling'])}" if g["ceiling"] is not None else ""
        alone = " alone (a gate: worth what it unlocks, below)" if r.get("gate") else ""
        lines.append(
            f"gain: {_predicted(g['speedup'])}{alone} "
            f"(step {_secs(st['before'])} → {_secs(st['low'])}–{_secs(st['high'])}){ceiling}"
            f" · confidence {r['confidence']} · risk {r['risk']['level']}"
        )
        lines += [f"  basis: {g['basis']}"] if g.get("basis") else []
        if (mem := memory_words(r)) is not None:
            lines.append(f"memory: {mem[0]}")
            lines += [f"  basis: {mem[1]}"] if mem[1] else []
        tg = r.get("targets")
        if tg:
            lines.append("targets: " + ", ".join(
                f"{x['phase']} {_secs(x['now_s'])} → {_secs(x['predicted_s'])}"
                for x in tg["phases"]) + " (predicted: the saving charged to these phases)")
        for u in r.get("unlocks") or []:
            usp, uch = u["gain"]["speedup"], u["change"]
            lines.append(f"unlocks: {u['rule']} ({uch['knob']} → {uch['to']}), predicted "
                         f"{_predicted(usp)} on top")
            if u.get("megatron_flags"):
                lines.append(f"  help: {' '.join(u['megatron_flags'])}")
            if (um := describe(u.get("memory"))) is not None:
                lines.append(f"  memory: {um[0]}")
        for c in r.get("considered") or []:
            lines.append(f"considered, not unlocked: {c['rule']} ({c['change']['knob']} → "
                         f"{c['change']['to']}): {'; '.join(c['reasons'])}")
        lines.append(f"verify: {verify_text(r)}")
        lines.append(f"risk: {risk_text(r)}")
        if not r["training_equivalent"]:
            lines.append(f"note: NOT training-equivalent: {r['equivalence_note']}")
        lines += [f"note: {c}" for c in r["caveats"]]
    if not recs and doc.get("none_because"):
        lines += ["", f"nothing to change: {doc['none_because']}"]
    for p in doc.get("prerequisites", []):
        sp = p["gain"]["speedup"]
        ch = p["change"]
        lines += ["", f"prerequisite for {p['rule']} ({ch['knob']} → {ch['to']}): "
                      + (f"unlocks {_pct(sp['low'])} … {_pct(sp['high'])}" if sp["high"]
                         else "unlocks no predicted gain on this trace")]
        lines += [f"  - needs: {n}" for n in p["needs"]]
    for b in doc["blocked"]:
        head = "considered, does not fit" if (b.get("memory") or {}).get("verdict") == \
            "does not fit" else "blocked"
        lines += ["", f"{head} {b['rule']}: {b['title']}"]
        lines += [f"  - {reason}" for reason in b["reasons"]]
        if b.get("gain"):
            bsp = b["gain"]["speedup"]
            lines.append(f"  - it would have gained {_pct(bsp['low'])} … {_pct(bsp['high'])}")
        if b.get("unlocked_by"):
            lines.append(f"  - unlocked by: {', '.join(b['unlocked_by'])}")
    for q in doc.get("quiet", []):
        lines.append(f"checked {q['rule']}: nothing found. {q['quiet']}")
    lines += [
        "",
        f"{len(recs)} recommended, {len(doc.get('prerequisites', []))} awaiting a prerequisite, "
        f"{len(doc['blocked'])} blocked, {doc['quiet_count']} checked quiet"
        f" of {doc['rules_checked']} rules"
        + ("" if "quiet" in doc else " (--show-quiet lists them)")
        + " · explain: moetune rules show ID",
    ]
    key = key_lines("\n".join(lines))  # the shorthand used above, each term once
    return "\n".join(lines + (["", *key] if key else [])) + "\n"
