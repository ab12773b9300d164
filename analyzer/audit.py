"""Backend audit: did what the contract claims actually run? (rules/signatures.yaml)

For every Megatron argument a signature tests (`cuda_graph_impl`, `moe_token_dispatcher_type`,
`fp8`, `moe_grouped_gemm`, …) the audit gives one verdict — `confirmed`, `contradicted` or
`unobservable` with the reason — and the counts, times and example kernels behind it. The facts come
from the diagnosis (analyzer/diagnose.py: steps, classified events, `observed` + `evidence`), plus
the few extra probes the signatures declare, measured over the same steady-step windows.
A config dump is not proof: a flex dispatcher can fall back to NCCL all-to-all, a graph capture can
fail to replay, `moe_grouped_gemm` on the local spec still builds per-expert GEMMs.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import TYPE_CHECKING, Any

import polars as pl
from moetune.analyzer.audit_probes import (
    class_expr,
    examples,
    graph_scope_probe,
    host_in_steps,
    host_probe,
    kernels_probe,
    known_class,
    micro_batch_probe,
    overlap_probe,
)
from moetune.analyzer.classify import KernelClasses, load_classes
from moetune.analyzer.contract import MISSING, Contract, known_megatron_args, lookup, thaw
from moetune.analyzer.frames import GPU_KINDS, Trace

from moetune import __version__, conditions, knobs
from moetune.arg_names import spelling_of
from moetune.errors import UserError
from moetune.resources import data, schema
from moetune.yamlio import line_of, read_yaml

if TYPE_CHECKING:
    import jsonschema

SIGNATURES_PATH = data("moetune.rules", "signatures.yaml")
SIGNATURES_SCHEMA = schema("signatures")
AUDIT_SCHEMA = schema("audit")
DIAGNOSIS_SCHEMA = schema("diagnosis")
SCHEMA_ID = "moetune.audit/1"
VERDICTS = ("confirmed", "contradicted", "unobservable")
MAX_EXAMPLES = 5


@dataclass(frozen=True, slots=True)
class Signatures:
    """Validated signatures, in file order (the first that fits an argument decides it)."""

    items: tuple[Mapping[str, Any], ...]
    source: str

    def keys(self) -> set[str]:
        return {s["claim"]["arg"] for s in self.items}


# --- loading ----------------------------------------------------------------------------------


def load_signatures(path: str | Path | None = None, *, classes: KernelClasses | None = None) -> Signatures:
    """Read rules/signatures.yaml (or `path`), validate it against its schema and check that every
    kernel class and `observed.*` field it names exists; any problem is a UserError naming it."""
    return _load(str(path or SIGNATURES_PATH), frozenset((classes or load_classes()).kclasses))


@cache
def _load(path: str, known: frozenset[str]) -> Signatures:
    doc, lines = read_yaml(Path(path))

    def fail(at: Sequence[Any], message: str) -> UserError:
        line = line_of(lines, at)
        return UserError(f"{path}:{line}: {message}" if line else f"{path}: {message}")

    import jsonschema  # only when validating: a heavy import the start-up does not need

    schema = json.loads(SIGNATURES_SCHEMA.read_text())
    errors = sorted(jsonschema.Draft202012Validator(schema).iter_errors(doc), key=lambda e: e.path)
    if errors:
        at, message = _schema_problem(doc, list(errors[0].absolute_path), errors[0].message)
        raise fail(at, f"invalid signatures at {'/'.join(map(str, at)) or '(top)'}: {message}")
    observed = set(json.loads(DIAGNOSIS_SCHEMA.read_text())["properties"]["observed"]["properties"])
    ids: set[str] = set()
    for i, sig in enumerate(doc["signatures"]):
        here = ("signatures", i)
        if sig["id"] in ids:
            raise fail((*here, "id"), f"duplicate signature id {sig['id']}")
        ids.add(sig["id"])
        probes = sig.get("probes") or {}
        for name, probe in probes.items():
            spec = next(iter(probe.values()))
            for c in spec.get("classes", []) if isinstance(spec, dict) else []:
                if not known_class(c, known):
                    raise fail((*here, "probes", name), f"signature {sig['id']}: unknown kernel class {c}")
        for j, c in enumerate(sig.get("examples", [])):
            if c != "graph" and not known_class(c, known):
                raise fail((*here, "examples", j), f"signature {sig['id']}: unknown kernel class {c}")
        for at, raw in _conditions(sig, here):
            try:
                _parse(raw, at)
            except conditions.ExprError as exc:
                raise fail(exc.where, f"signature {sig['id']}: {exc}") from None
        for at, p in _paths(sig, here):
            head, _, rest = p.partition(".")
            if head == "observed" and rest.split(".")[0] not in observed:
                raise fail(at, f"signature {sig['id']}: {p} is not an observed field")
            if head == "probe" and rest.split(".")[0] not in probes:
                raise fail(at, f"signature {sig['id']}: {p} names an undeclared probe")
    return Signatures(items=tuple(doc["signatures"]), source=Path(path).name)


def _schema_problem(doc: Any, at: list[Any], message: str) -> tuple[tuple[Any, ...], str]:
    """Where a schema error lies and what it says; inside a condition, the condition parser's
    word (jsonschema's `oneOf` message prints the whole subtree and names no culprit)."""
    root = None
    if len(at) > 2 and at[2] in ("ran_when", "not_ran_when"):
        root = tuple(at[:3])
    elif len(at) > 4 and at[2] == "unobservable" and at[4] == "when":
        root = tuple(at[:5])
    if root is None:
        return tuple(at), message
    node = doc
    for part in root:
        node = node[part]
    try:
        _parse(node, root)
    except conditions.ExprError as exc:
        return tuple(exc.where), str(exc)
    for leaf_at, leaf in _leaves(node, root):
        if not re.match(_FACT_PATH, str(leaf["fact"])):
            return (*leaf_at, "fact"), f"{leaf['fact']!r} is not a fact path ({_FACT_HELP})"
    return tuple(at), message


_FACT_PATH = r"^(observed|evidence|probe|claims|trace)(\.[A-Za-z0-9_]+)+$"  # signatures.schema.json
_FACT_HELP = "observed.*, evidence.*, probe.<name>.*, claims.<argument> or trace.*"


def _conditions(sig: Mapping[str, Any], here: tuple[Any, ...] = ()) -> Iterator[tuple[tuple[Any, ...], Any]]:
    """(where, raw condition) for every condition of a signature, in judging order."""
    for j, u in enumerate(sig.get("unobservable", [])):
        yield (*here, "unobservable", j, "when"), u["when"]
    yield (*here, "ran_when"), sig["ran_when"]
    yield (*here, "not_ran_when"), sig["not_ran_when"]


def _parse(raw: Any, where: tuple[Any, ...]) -> conditions.Condition:
    """A signature condition in the condition language (moetune.conditions); its predicates read
    audit facts only (`fact:`), the one source the audit resolves."""
    cond = conditions.parse(raw, where)
    for leaf_at, leaf in _leaves(raw, where):
        if "fact" not in leaf:
            raise conditions.ExprError("a signature predicate reads `fact:` (an audit fact path)", leaf_at)
    return cond


def _leaves(raw: Any, at: tuple[Any, ...]) -> Iterator[tuple[tuple[Any, ...], Mapping[str, Any]]]:
    """(where, raw predicate) for every leaf of a raw condition, in document order."""
    for kind in ("all", "any"):
        if kind in raw:
            for i, c in enumerate(raw[kind]):
                yield from _leaves(c, (*at, kind, i))
            return
    if "not" in raw:
        yield from _leaves(raw["not"], (*at, "not"))
        return
    yield at, raw


def _paths(sig: Mapping[str, Any], here: tuple[Any, ...] = ()) -> list[tuple[tuple[Any, ...], str]]:
    """(where, fact path) for every `show` entry and every predicate of a signature."""
    out = [((*here, "show", j), p) for j, p in enumerate(sig.get("show", []))]
    for at, raw in _conditions(sig, here):
        out += [((*leaf_at, "fact"), leaf["fact"]) for leaf_at, leaf in _leaves(raw, at)]
    return out


# --- claims and conditions --------------------------------------------------------------------


def _fits(matcher: Mapping[str, Any], value: Any) -> bool:
    if "in" in matcher:
        return any(value == v and type(value) is type(v) for v in matcher["in"]) or (
            value is None and None in matcher["in"]
        )
    if matcher.get("nonempty"):
        return isinstance(value, list | tuple) and len(value) > 0
    if matcher.get("set"):
        return value is not None
    return False


def claim_of(sig: Mapping[str, Any], claims: Mapping[str, Any]) -> tuple[str, dict[str, Any]] | None:
    """('ran' | 'not_ran', {arg: value, …}) when the contract's arguments make this signature's
    claim, else None."""
    spec = sig["claim"]
    arg = spec["arg"]
    if arg not in claims:
        return None
    value = claims[arg]
    for expects in ("ran", "not_ran"):
        if expects in spec and _fits(spec[expects], value):
            if expects == "ran":
                for other, matcher in (spec.get("with") or {}).items():
                    if other not in claims or not _fits(matcher, claims[other]):
                        return None
            claimed = {arg: value} | {o: claims[o] for o in (spec.get("with") or {}) if o in claims}
            return expects, claimed
    return None


def _resolver(facts: Mapping[str, Any]) -> conditions.Resolver:
    """Fact paths (`observed.*`, `evidence.*`, `probe.*`, `claims.*`, `trace.*`) into `facts`; a
    path the facts lack is missing, so a predicate on it is unknown."""

    def resolve(source: str, path: str) -> Any:
        if source != "fact":  # the loader admits no other source
            raise AssertionError(source)
        value = lookup(facts, path)
        return conditions.MISSING if value is MISSING else value

    return resolve


def _holds(raw: Mapping[str, Any], resolve: conditions.Resolver) -> bool:
    """A condition holds only when it is true: unknown (a fact it needs is missing, a null that
    cannot be ordered, a string compared with a number) is no evidence, so it does not hold."""
    return conditions.evaluate(_parse(raw, ()), resolve)[0] is True


def claim_title(sig: Mapping[str, Any], expects: str) -> str:
    """What the contract's claim states, in words: the signature's title for a claim that the
    feature ran, its `title_off` for a claim that it is off (a verdict `confirmed` then means
    "off, as claimed", never "it ran")."""
    if expects == "ran":
        return str(sig["title"])
    return str(sig.get("title_off") or f"not: {sig['title']}")


def judge(sig: Mapping[str, Any], expects: str, facts: Mapping[str, Any]) -> tuple[str, str]:
    """(verdict, reason) for one signature over the facts."""
    resolve = _resolver(facts)
    for u in sig.get("unobservable", []):
        if _holds(u["when"], resolve):
            return "unobservable", u["reason"]
    ran = _holds(sig["ran_when"], resolve)
    not_ran = not ran and _holds(sig["not_ran_when"], resolve)
    if expects == "ran":
        if ran:
            return "confirmed", f"ran: {sig['proves_ran']}"
        if not_ran:
            return "contradicted", f"claimed, but {sig['proves_not_ran']}"
    else:
        if ran:
            return "contradicted", f"claimed off, but it ran: {sig['proves_ran']}"
        if not_ran:
            return "confirmed", f"off as claimed: {sig['proves_not_ran']}"
    return "unobservable", sig["inconclusive"]


# --- the audit --------------------------------------------------------------------------------


def applicable(signatures: Signatures, claims: Mapping[str, Any]) -> list[tuple[Mapping[str, Any], str, dict]]:
    """(signature, expects, claimed) per tested argument: the first signature that fits wins."""
    out, taken = [], set()
    for sig in signatures.items:
        arg = sig["claim"]["arg"]
        if arg in taken:
            continue
        fit = claim_of(sig, claims)
        if fit:
            out.append((sig, *fit))
            taken.add(arg)
    return out


class AuditRun:
    """One audit sharing the diagnosis pass: add `section` to `diagnose_trace(sections=…)` (it
    measures the signatures' probes on the same classified events and steady-step windows), then
    call `document(diagnosis)`; moetune.analysis runs both in the one diagnosis pass."""

    def __init__(self, contract: Contract, trace: Trace, *, signatures: Signatures | None = None,
                 classes: KernelClasses | None = None) -> None:
        self.contract, self.trace = contract, trace
        self.classes = classes or load_classes()
        self.signatures = signatures or load_signatures(classes=self.classes)
        self.claims = dict(contract.claims())
        self.todo = applicable(self.signatures, self.claims)
        self.probes: dict[str, dict[str, Any]] = {}
        self.trace_facts: dict[str, Any] = {}

    @property
    def gpu_rows(self) -> int:
        return int(self.trace.events.select(pl.col("kind").is_in(GPU_KINDS).sum()).item())

    def section(self, _trace: Trace, steps: Any, ctx: Any) -> dict[str, Any]:
        """diagnose_trace section hook: measure the probes; adds nothing to the diagnosis."""
        events, trace, gpu = ctx.events, self.trace, ctx.gpu
        host = host_in_steps(events, steps.table)
        modes = set()
        if trace.ranks.height:
            modes = {str(m).lower() for m in trace.ranks.get_column("graph_trace_mode").drop_nulls()}
        self.trace_facts.update(
            gpu_kernels=gpu.filter(pl.col("kind") == "kernel").height,
            graph_trace_mode="graph" if "graph" in modes else (sorted(modes)[0] if modes else None),
            formats=trace.formats,
            cpu_ops=host.filter(pl.col("kind") == "cpu_op").height,
            annotations=host.filter(pl.col("kind") == "annotation").height,
        )
        graph_corr = events.filter(pl.col("rclass") == "graph_launch").select("rank", "correlation").unique()
        graph_k = pl.concat([
            gpu.join(graph_corr, on=["rank", "correlation"], how="semi"),
            gpu.filter(pl.col("graph_node_id").fill_null(0) != 0),
        ]).unique()
        for sig, _expects, claimed in self.todo:
            res: dict[str, Any] = {}
            for name, probe in (sig.get("probes") or {}).items():
                kind, spec = next(iter(probe.items()))
                if kind == "kernels":
                    res[name] = kernels_probe(gpu, spec)
                elif kind == "overlap":
                    res[name] = overlap_probe(gpu, spec, trace.comms, self.classes)
                elif kind == "host":
                    res[name] = host_probe(host, spec, self.classes)
                elif kind == "micro_batches":
                    res[name] = micro_batch_probe(host, spec, self.claims)
                elif kind == "graph_scope":
                    mods = claimed.get(sig["claim"]["arg"]) or []
                    res[name] = graph_scope_probe(events, gpu, spec, list(mods))
            ex: list[dict[str, Any]] = []
            for c in sig.get("examples", []):
                ex += examples(graph_k if c == "graph" else gpu.filter(class_expr([c])))
            for r in res.values():  # then what the kernel probes matched (e.g. unfused top-k)
                ex += r.get("examples", [])
            seen: set[str] = set()
            res["_examples"] = [e for e in ex if not (e["name"] in seen or seen.add(e["name"]))][:MAX_EXAMPLES]
            self.probes[sig["id"]] = res
        return {}

    def document(self, diagnosis: Mapping[str, Any] | None, *, files: Sequence[Path] = ()) -> dict[str, Any]:
        """The audit document from the diagnosis this run's `section` took part in (None: no GPU
        events, every claim unobservable)."""
        doc = diagnosis or {}
        claims, contract = self.claims, self.contract
        warnings = list(contract.warnings) + list(doc.get("warnings", []))
        if self.todo and not doc:
            warnings.append("the trace holds no GPU events (CPU-only profile?): nothing can be observed")
        verdicts: dict[str, dict[str, Any]] = {}
        for sig, expects, claimed in self.todo:
            res = self.probes.get(sig["id"], {})
            facts = {
                "observed": doc.get("observed", {}),
                "evidence": doc.get("evidence", {}),
                "probe": {k: v for k, v in res.items() if not k.startswith("_")},
                "claims": claims,
                "trace": self.trace_facts,
            }
            if doc:
                verdict, reason = judge(sig, expects, facts)
            else:
                verdict, reason = "unobservable", "the trace holds no GPU events (CPU-only profile?)"
            shown = {p: (None if (v := lookup(facts, p)) is MISSING else v) for p in sig.get("show", [])}
            verdicts[sig["claim"]["arg"]] = {
                "verdict": verdict,
                "claimed": thaw(claimed),
                "expects": expects,
                "signature": sig["id"],
                "title": claim_title(sig, expects),
                "evidence": shown,
                "examples": res.get("_examples", []),
                "reason": reason,
            }
        counts = {v: sum(1 for x in verdicts.values() if x["verdict"] == v) for v in VERDICTS}
        unaudited = unaudited_claims(claims, verdicts.values(), self.signatures.keys())
        return {
            "schema": SCHEMA_ID,
            "tool": {"name": "moetune", "version": __version__},
            "inputs": doc.get("inputs") or _inputs(self.trace, files),
            "contract": {"file": Path(contract.source).name if contract.source else None,
                         "label": contract.label, "warnings": list(contract.warnings)},
            "steps": doc.get("steps", []),
            "verdicts": dict(sorted(verdicts.items())),
            "summary": {**counts, **outcome(counts), "unaudited": unaudited},
            "warnings": sorted(set(warnings)),
        }


def outcome(counts: Mapping[str, int]) -> dict[str, Any]:
    """The audit as a gate: `failed` when a claim is contradicted (exit 1), `undecided` when no
    claim could be checked — none confirmed or contradicted, e.g. a trace with no GPU events or a
    contract that claims nothing the signatures test (exit 3: a CI gate must not pass on nothing),
    else `passed` (exit 0)."""
    checked = counts["confirmed"] + counts["contradicted"]
    out = ("failed" if counts["contradicted"] else "undecided" if checked == 0 else "passed")
    return {"checked": checked, "outcome": out, "passed": out == "passed"}


def unaudited_claims(claims: Mapping[str, Any], verdicts: Iterable[Mapping[str, Any]],
                     tested: set[str]) -> list[str]:
    """Claimed arguments no verdict covers, by name: settings of the knob catalog, arguments a
    signature tests with a value it cannot judge, and names moetune does not know (a misspelt claim
    must not pass unseen). Model shape arguments (`num_layers`) describe the run and are left out;
    an underscore flag spelling read as its argument (`fp8_format` beside `fp8`) is that argument."""
    covered = {a for v in verdicts for a in v["claimed"]}
    cat, known = knobs.load(), known_megatron_args()
    out = []
    for a, value in claims.items():
        if value is None or a in covered:
            continue
        name = spelling_of(a, cat)[0]
        if name != a and name in claims:
            continue
        if a in tested or a in cat.knobs or a not in known:
            out.append(a)
    return sorted(out)


def _inputs(trace: Trace, files: Sequence[Path]) -> list[dict[str, Any]]:
    out: dict[str, dict[str, Any]] = {}
    for r in trace.ranks.sort("rank").to_dicts() if trace.ranks.height else []:
        name = Path(str(r.get("source") or "")).name
        e = out.setdefault(name, {"file": name, "format": r.get("format") or "kineto", "ranks": []})
        e["ranks"].append(int(r["rank"]))
    for f in files:
        out.setdefault(f.name, {"file": f.name, "format": "kineto", "ranks": []})
    return [out[k] for k in sorted(out)]


@cache
def audit_validator() -> jsonschema.Draft202012Validator:
    import jsonschema

    return jsonschema.Draft202012Validator(json.loads(AUDIT_SCHEMA.read_text()))


def describe_claim(claimed: Mapping[str, Any]) -> str:
    parts = [f"{k} = {_fmt(v)}" for k, v in claimed.items()]
    return parts[0] + (f" ({', '.join(parts[1:])})" if len(parts) > 1 else "")


def _fmt(v: Any) -> str:
    if isinstance(v, list | tuple):
        return "[" + ", ".join(map(str, v)) + "]"
    return "null" if v is None else str(v).lower() if isinstance(v, bool) else str(v)

