"""Two runs side by side: the `moetune diff` document (schemas/diff.schema.json).

`diff_analyses(a, b)` compares two diagnoses (or `moetune.analysis.Analysis` objects, whose audits
are compared too); `diff_ledger_runs` two runs a tune ledger recorded. Pure functions over
documents: nothing is read here. Step time is the slowest rank's per step; its noise is half the
range over the analysed steps (unknown with one step), and a change is called a change only
beyond both runs' noise.
"""

from __future__ import annotations

import statistics
from collections.abc import Mapping, Sequence
from typing import Any

from moetune.redact import redact_text
from moetune.vocabulary import WALLS

SCHEMA_ID = "moetune.diff/1"
TOP = 10

# observed facts whose change is news ("graph replay: no → yes"), with the words shown
OBSERVED = {
    "cuda_graph_replay": "graph replay",
    "grouped_gemm": "grouped GEMM",
    "fp8_gemm": "fp8 GEMM",
    "dispatcher_backend": "dispatcher",
    "recompute_fraction": "recompute fraction",
    "offload_copy_fraction": "offload copy fraction",
    "pageable_copy_fraction": "pageable copy fraction",
}
MODEL_KEYS = ("num_layers", "hidden_size", "ffn_hidden_size", "num_attention_heads",
              "num_query_groups", "kv_channels", "num_experts", "moe_router_topk",
              "moe_ffn_hidden_size", "moe_shared_expert_intermediate_size", "moe_layer_freq",
              "vocab_size", "mtp_num_layers", "multi_latent_attention", "seq_length")


def step_stats(values: Sequence[float]) -> dict[str, Any]:
    """Median, range and noise (half the range) of step times in seconds. One step shows no
    variation, so its noise is unknown (None), not zero."""
    xs = sorted(float(v) for v in values if v is not None)
    if not xs:
        return {"n": 0, "median_s": None, "min_s": None, "max_s": None, "noise_s": None}
    noise = round((xs[-1] - xs[0]) / 2, 6) if len(xs) >= 2 else None
    return {"n": len(xs), "median_s": round(statistics.median(xs), 6), "min_s": round(xs[0], 6),
            "max_s": round(xs[-1], 6), "noise_s": noise}


def _step_times(diag: Mapping[str, Any]) -> list[float]:
    """Per step id, the slowest rank's step (the step every rank waits for)."""
    by: dict[int, float] = {}
    for r in diag.get("per_step") or []:
        by[r["step"]] = max(by.get(r["step"], 0.0), float(r["wall_s"]))
    return [by[k] for k in sorted(by)]


def noise_unknown(a: Mapping[str, Any], b: Mapping[str, Any]) -> str | None:
    """Why the two runs' noise is unknown (a side with fewer than two steps), else None."""
    short = [f"{side} has {x.get('n') or 0} analysed step{'s' if (x.get('n') or 0) != 1 else ''}"
             for side, x in (("A", a), ("B", b)) if x.get("noise_s") is None]
    return (" and ".join(short) + ": step-to-step noise is unknown") if short else None


def step_delta(a: Mapping[str, Any], b: Mapping[str, Any]) -> dict[str, Any]:
    """`step_time` block: a, b, delta, gain (a/b − 1) and the slowdown beyond both noises; with
    a side's noise unknown neither "beyond the noise" nor the slowdown beyond it can be said
    (None), and `noise_unknown` says why."""
    out: dict[str, Any] = {"a": dict(a), "b": dict(b), "delta_s": None, "delta_pct": None,
                           "speedup": None, "beyond_noise": None, "slower_beyond_noise_pct": None,
                           "noise_unknown": noise_unknown(a, b)}
    ma, mb = a.get("median_s"), b.get("median_s")
    if not ma or not mb:
        return out
    d = mb - ma
    out |= {"delta_s": round(d, 6), "delta_pct": round(100 * d / ma, 2),
            "speedup": round(ma / mb - 1, 4)}
    if out["noise_unknown"] is None:
        noise = a["noise_s"] + b["noise_s"]
        out |= {"beyond_noise": abs(d) > noise,
                "slower_beyond_noise_pct": round(100 * max(0.0, d - noise) / ma, 2)}
    return out


def _num(x: Any) -> float:
    return float(x) if isinstance(x, int | float) and not isinstance(x, bool) else 0.0


def _pair(a: float | None, b: float | None, digits: int = 6) -> dict[str, Any]:
    d = None if a is None or b is None else round(b - a, digits)
    return {"a": a, "b": b, "delta": d}


def _per_step(diag: Mapping[str, Any]) -> int:
    return max(1, len(diag.get("per_step") or []))


def _classes(a: Mapping[str, Any], b: Mapping[str, Any], top: int) -> list[dict[str, Any]]:
    """Kernel classes per (rank, step): appeared, disappeared or changed, largest |Δ| first."""
    ca = (a.get("evidence") or {}).get("classes") or {}
    cb = (b.get("evidence") or {}).get("classes") or {}
    na, nb = _per_step(a), _per_step(b)
    rows = []
    for k in sorted(set(ca) | set(cb)):
        ta, tb = _num((ca.get(k) or {}).get("time_s")) / na, _num((cb.get(k) or {}).get("time_s")) / nb
        xa, xb = _num((ca.get(k) or {}).get("count")) / na, _num((cb.get(k) or {}).get("count")) / nb
        rows.append({"kclass": k, "status": _status(k in ca and xa > 0, k in cb and xb > 0),
                     "a_s": round(ta, 6), "b_s": round(tb, 6), "delta_s": round(tb - ta, 6),
                     "a_count": round(xa, 2), "b_count": round(xb, 2)})
    rows = [r for r in rows if r["status"] != "absent"]
    rows.sort(key=lambda r: (-abs(r["delta_s"]), r["kclass"]))
    return rows[:top]


def _status(in_a: bool, in_b: bool) -> str:
    if in_a and in_b:
        return "changed"
    return "appeared" if in_b else "disappeared" if in_a else "absent"


def _names(a: Mapping[str, Any], b: Mapping[str, Any], key: str, value: str, top: int,
           ) -> list[dict[str, Any]] | None:
    """Kernels (`key`=kernels) or host ops (`ops`) by name, per (rank, step), from the `top`
    sections (every name); None when either side lacks one."""
    ta, tb = a.get("top"), b.get("top")
    if not ta or not tb:
        return None
    ra = {r["name"]: r for r in ta.get(key) or []}
    rb = {r["name"]: r for r in tb.get(key) or []}
    na, nb = max(1, ta.get("rank_steps") or 1), max(1, tb.get("rank_steps") or 1)
    rows = []
    for name in set(ra) | set(rb):
        x, y = ra.get(name) or {}, rb.get(name) or {}
        va, vb = _num(x.get(value)) / na, _num(y.get(value)) / nb
        row = {"name": name, "status": _status(bool(x), bool(y)),
               "a_s": round(va, 6), "b_s": round(vb, 6), "delta_s": round(vb - va, 6),
               "a_count": round(_num(x.get("count")) / na, 2),
               "b_count": round(_num(y.get("count")) / nb, 2)}
        if key == "kernels":
            row["kclass"] = x.get("kclass") or y.get("kclass")
        rows.append(row)
    rows.sort(key=lambda r: (-abs(r["delta_s"]), r["name"] or ""))
    return rows[:top]


def _comm_groups(a: Mapping[str, Any], b: Mapping[str, Any]) -> dict[str, Any]:
    """Communication time per (rank, step) by process-group role."""
    ga = (((a.get("evidence") or {}).get("comm_groups") or {}).get("by_role")) or {}
    gb = (((b.get("evidence") or {}).get("comm_groups") or {}).get("by_role")) or {}
    na, nb = _per_step(a), _per_step(b)
    out = {}
    for role in sorted(set(ga) | set(gb)):
        ta = _num((ga.get(role) or {}).get("time_s")) / na
        tb = _num((gb.get(role) or {}).get("time_s")) / nb
        if ta or tb:
            out[role] = _pair(round(ta, 6), round(tb, 6))
    return out


def _word(v: Any) -> str:
    if isinstance(v, bool):
        return "yes" if v else "no"
    return "unknown" if v is None else str(v)


def _observed(a: Mapping[str, Any], b: Mapping[str, Any]) -> list[dict[str, Any]]:
    oa, ob = a.get("observed") or {}, b.get("observed") or {}
    out = []
    for k, words in OBSERVED.items():
        va, vb = oa.get(k), ob.get(k)
        if isinstance(va, float) or isinstance(vb, float):
            changed = abs(_num(va) - _num(vb)) >= 0.01  # fractions: a point of share is news
        else:
            changed = va != vb
        if changed:
            out.append({"fact": k, "a": va, "b": vb,
                        "text": f"{words}: {_word(va)} → {_word(vb)}"})
    return out


def _audit(a: Mapping[str, Any] | None, b: Mapping[str, Any] | None) -> list[dict[str, Any]]:
    va = (a or {}).get("verdicts") or {}
    vb = (b or {}).get("verdicts") or {}
    out = []
    for k in sorted(set(va) | set(vb)):
        x = (va.get(k) or {}).get("verdict")
        y = (vb.get(k) or {}).get("verdict")
        if x != y:
            out.append({"claim": k, "a": x, "b": y, "text": f"{k}: {x or 'not claimed'} → "
                                                            f"{y or 'not claimed'}"})
    return out


def _memory(a: Mapping[str, Any], b: Mapping[str, Any]) -> dict[str, Any]:
    ma, mb = a.get("memory") or {}, b.get("memory") or {}
    out: dict[str, Any] = {k: _pair(ma.get(k), mb.get(k), 4)
                           for k in ("peak_allocated_gib", "peak_reserved_gib")}
    # each side's figures say where they came from (allocator events, a log, a snapshot)
    out["source"] = {"a": ma.get("source"), "b": mb.get("source")}
    return out


def _set_change(a: Sequence[int] | None, b: Sequence[int] | None) -> dict[str, Any]:
    """Ranks on each side, which are new, which gone; None for a side with no verdict (and then
    nothing can be said new or gone)."""
    if a is None or b is None:
        return {"a": None if a is None else sorted(a), "b": None if b is None else sorted(b),
                "new": None, "gone": None}
    return {"a": sorted(a), "b": sorted(b), "new": sorted(set(b) - set(a)),
            "gone": sorted(set(a) - set(b))}


def _stragglers(c: Mapping[str, Any]) -> list[int] | None:
    """A cross-rank view's flagged ranks; None without a verdict (no view, or unobservable)."""
    st = c.get("stragglers") or {}
    return None if not st or "unobservable" in st else list(st.get("ranks") or [])


def _cross_rank(a: Mapping[str, Any], b: Mapping[str, Any]) -> dict[str, Any] | None:
    """Both sides' cross-rank views (`cross_rank`, the many-ranks path) side by side: rank count,
    step-time spread over ranks, stragglers and overloaded EP ranks (which are new, which gone),
    arrival skew per process-group role, the ranks the median step's path crosses. None when
    neither side has one; a side without one reads as empty, but as no verdict (null) for
    stragglers, as one whose stragglers are unobservable."""
    ca, cb = a.get("cross_rank") or {}, b.get("cross_rank") or {}
    if not (ca or cb):
        return None
    sa, sb = ca.get("step_time") or {}, cb.get("step_time") or {}
    ra, rb = ((ca.get("process_groups") or {}).get("by_role") or {},
              (cb.get("process_groups") or {}).get("by_role") or {})

    def over(c: Mapping[str, Any]) -> list[int]:
        return [int(o["rank"]) for o in (c.get("ep_imbalance") or {}).get("overloaded") or []]

    return {
        "ranks": _pair(ca.get("ranks"), cb.get("ranks"), 0),
        "step_time_s": {k: _pair(sa.get(k), sb.get(k)) for k in ("p50", "p90", "max")},
        "stragglers": _set_change(_stragglers(ca), _stragglers(cb)),
        "overloaded_ep_ranks": _set_change(over(ca), over(cb)),
        "arrival_skew_p50_s": {
            role: _pair(((ra.get(role) or {}).get("skew_s") or {}).get("p50"),
                        ((rb.get(role) or {}).get("skew_s") or {}).get("p50"))
            for role in sorted(set(ra) | set(rb))},
        "critical_path_ranks": {"a": list((ca.get("critical_path") or {}).get("ranks") or []),
                                "b": list((cb.get("critical_path") or {}).get("ranks") or [])},
    }


def _side(diag: Mapping[str, Any], label: str) -> dict[str, Any]:
    return {"label": redact_text(label),
            "inputs": [redact_text(str(i.get("file"))) for i in diag.get("inputs") or []],
            "ranks": list(diag.get("ranks_analyzed") or []),
            "steps": list(diag.get("steps") or []),
            "step_source": (diag.get("window") or {}).get("step_source")}


def comparability(a: Mapping[str, Any], b: Mapping[str, Any], *,
                  model_a: Mapping[str, Any] | None = None,
                  model_b: Mapping[str, Any] | None = None) -> list[str]:
    """Why A and B may not be comparable ([] when nothing says so). `model_*`: the contracts'
    `model` sections (with `shape.seq_length` folded in), when given."""
    out = []
    ra, rb = a.get("ranks_analyzed") or [], b.get("ranks_analyzed") or []
    if len(ra) != len(rb):
        out.append(f"different number of ranks analysed: {len(ra)} vs {len(rb)}")
    sa = (a.get("window") or {}).get("step_source")
    sb = (b.get("window") or {}).get("step_source")
    if sa != sb:
        out.append(f"different step definition: {sa} vs {sb}")
    out += _model_differences(model_a, model_b)
    return out


def _model_differences(model_a: Mapping[str, Any] | None, model_b: Mapping[str, Any] | None
                       ) -> list[str]:
    """A "different model" warning when both model shapes are known and a stated field differs."""
    if not (model_a and model_b):
        return []
    diffs = [f"{k} {model_a.get(k)} vs {model_b.get(k)}" for k in MODEL_KEYS
             if model_a.get(k) is not None and model_b.get(k) is not None
             and model_a.get(k) != model_b.get(k)]
    return ["different model: " + ", ".join(diffs)] if diffs else []


def model_of(contract: Mapping[str, Any] | None) -> dict[str, Any]:
    """The model-shape fields of a contract (its `model` section, `megatron_args` mirror and
    `shape.seq_length`)."""
    if not contract:
        return {}
    args = contract.get("megatron_args") or {}
    model = contract.get("model") or {}
    shape = contract.get("shape") or {}
    out = {k: args[k] for k in MODEL_KEYS if k in args}
    out |= {k: v for k, v in model.items() if k in MODEL_KEYS}
    if shape.get("seq_length") is not None:
        out["seq_length"] = shape["seq_length"]
    return out


# arguments that say where a run wrote or read, not what it ran: never a configuration change
RUN_ONLY_ARGS = frozenset({"save", "load", "data_path", "tensorboard_dir", "profile_dir",
                           "wandb_project", "wandb_exp_name", "wandb_save_dir", "data_cache_path",
                           "tokenizer_model", "vocab_file", "merge_file", "pretrained_checkpoint",
                           "timing_log_option", "log_interval", "data_pool",
                           "profile_step_start", "profile_step_end", "profile_ranks"})


def config_of(contract: Mapping[str, Any] | None) -> dict[str, Any]:
    """A run's Megatron arguments (a contract's `megatron_args`, a log's via
    `contract_from_log`): what `config_delta` compares."""
    return dict((contract or {}).get("megatron_args") or {})


def arg_word(v: Any) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if v is None:
        return "unset"
    if isinstance(v, list | tuple):
        return "[" + ", ".join(map(arg_word, v)) + "]"
    return str(v)


def config_delta(a: Mapping[str, Any] | None, b: Mapping[str, Any] | None, *,
                 sources: tuple[str | None, str | None] = (None, None)) -> dict[str, Any]:
    """What configuration changed from A to B: every Megatron argument both runs state with a
    different value (`micro_batch_size: 1 → 2`, `moe_grouped_gemm: true → false`), paths and
    run bookkeeping left out. `sources`: where each side's arguments came from (contract, log,
    ledger session); a side without any leaves the delta unknown (`changes` None)."""
    out: dict[str, Any] = {"a_from": sources[0] if a else None,
                           "b_from": sources[1] if b else None, "changes": None}
    if not (a and b):
        return out
    changes = []
    for k in sorted(set(a) & set(b)):
        va, vb = a[k], b[k]
        if va == vb or k in RUN_ONLY_ARGS or any(isinstance(v, str) and "/" in v
                                                  for v in (va, vb)):
            continue
        changes.append({"arg": k, "a": va, "b": vb,
                        "text": f"{k}: {arg_word(va)} → {arg_word(vb)}"})
    out["changes"] = changes
    return out


def config_of_command(argv: Sequence[str] | None) -> dict[str, Any]:
    """A ledger run's Megatron arguments from its command line; a flag one run gives and the other
    omits reads as unset (the default) on the other side."""
    from moetune.analyzer.megatron_flags import parse_flags

    return dict(parse_flags([str(w) for w in argv or []]).args) if argv else {}


def config_lines(config: Mapping[str, Any] | None) -> list[str]:
    """The delta in words, one line first in every comparison (diff's terminal, the report)."""
    if not config or config.get("changes") is None:
        missing = [side for side, k in (("A", "a_from"), ("B", "b_from"))
                   if not (config or {}).get(k)]
        return [f"configuration: not compared (no contract or Megatron log for "
                f"{' and '.join(missing) or 'either run'})"]
    ch = config["changes"]
    src = f" (from A's {config['a_from']} and B's {config['b_from']})"
    if not ch:
        return ["configuration: no Megatron argument differs" + src]
    return [f"configuration{src}: " + ", ".join(c["text"] for c in ch)]


def _doc_and_audit(x: Any) -> tuple[Mapping[str, Any], Mapping[str, Any] | None]:
    if isinstance(x, Mapping):
        return x, None
    return x.diagnosis or {}, getattr(x, "audit", None)


def diff_analyses(a: Any, b: Any, *, top: int = TOP, labels: tuple[str, str] = ("A", "B"),
                  model_a: Mapping[str, Any] | None = None,
                  model_b: Mapping[str, Any] | None = None,
                  config: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """The diff document of two diagnoses (mappings) or `Analysis` objects (audits compared
    too). Kernel and op names are compared when both diagnoses have a `top` section
    (`moetune.analyzer.top.top_section(None)`), classes always."""
    da, aa = _doc_and_audit(a)
    db, ab = _doc_and_audit(b)
    warnings = comparability(da, db, model_a=model_a, model_b=model_b)
    if not (model_a and model_b):
        warnings.append("model shape not compared (give each run's contract or Megatron log)")
    wa, wb = da.get("wall_detail") or {}, db.get("wall_detail") or {}
    ha, hb = da.get("host") or {}, db.get("host") or {}
    return {
        "schema": SCHEMA_ID,
        "source": "traces",
        "a": _side(da, labels[0]),
        "b": _side(db, labels[1]),
        "comparable": not any(w.startswith("different") for w in warnings),
        "warnings": warnings,
        "config": dict(config) if config is not None else config_delta(None, None),
        "step_time": step_delta(step_stats(_step_times(da)), step_stats(_step_times(db))),
        "walls": {w: _pair((wa.get(w) or {}).get("exposed_s"), (wb.get(w) or {}).get("exposed_s"))
                  for w in WALLS},
        "dominant_wall": {"a": da.get("dominant_wall"), "b": db.get("dominant_wall")},
        "launches_per_step": _pair(ha.get("launches_per_step"), hb.get("launches_per_step"), 2),
        "classes": _classes(da, db, top),
        "kernels": _names(da, db, "kernels", "time_s", top),
        "ops": _names(da, db, "ops", "self_s", top),
        "comm_groups": _comm_groups(da, db),
        "observed": _observed(da, db),
        "audit": _audit(aa, ab),
        "memory": _memory(da, db),
    } | ({"cross_rank": cr} if (cr := _cross_rank(da, db)) is not None else {}) | _phase_diff(da, db)


def _phase_diff(a: Mapping[str, Any], b: Mapping[str, Any]) -> dict[str, Any]:
    """`phases` (each phase's step time in A and B, largest change first, and per layer where
    both tell their layers apart) and `throughput` (TFLOP/s per GPU, MFU), where both diagnoses
    have them."""
    pa, pb = a.get("phases") or {}, b.get("phases") or {}
    out: dict[str, Any] = {}
    if pa and pb:
        ra = {r["phase"]: r for r in pa.get("rows") or []}
        rb = {r["phase"]: r for r in pb.get("rows") or []}
        rows = []
        for name in sorted(set(ra) | set(rb)):
            x, y = ra.get(name) or {}, rb.get(name) or {}
            sa, sb = _num(x.get("step_s")), _num(y.get("step_s"))
            rows.append({"phase": name, "status": _status(name in ra, name in rb),
                         "a_s": round(sa, 6), "b_s": round(sb, 6), "delta_s": round(sb - sa, 6),
                         "share_a": round(_num(x.get("share")), 4),
                         "share_b": round(_num(y.get("share")), 4),
                         "busy_delta_s": round(_num(y.get("busy_s")) - _num(x.get("busy_s")), 6),
                         "launches_delta": round(_num(y.get("launches")) - _num(x.get("launches")), 2)})
        rows.sort(key=lambda r: (-abs(r["delta_s"]), r["phase"]))
        out["phases"] = {"rows": rows, "by_layer": _layer_diff(pa, pb)}
    ta, tb = a.get("throughput") or {}, b.get("throughput") or {}
    if ta and tb:
        out["throughput"] = {k: _pair(ta.get(k), tb.get(k), 4) for k in ("tflops_per_gpu", "mfu")}
    return out


def _layer_diff(pa: Mapping[str, Any], pb: Mapping[str, Any]) -> list[dict[str, Any]]:
    """Per (layer, phase) step time A → B, when both runs' layers are told apart alike."""
    la, lb = pa.get("layers") or {}, pb.get("layers") or {}
    if not (la.get("distinguishable") and lb.get("distinguishable")) or la.get("count") != lb.get("count"):
        return []
    xa = {(r["layer"], r["phase"]): r["step_s"] for r in pa.get("by_layer") or []}
    xb = {(r["layer"], r["phase"]): r["step_s"] for r in pb.get("by_layer") or []}
    return [{"layer": k[0], "phase": k[1], "a_s": round(xa.get(k, 0.0), 6),
             "b_s": round(xb.get(k, 0.0), 6), "delta_s": round(xb.get(k, 0.0) - xa.get(k, 0.0), 6)}
            for k in sorted(set(xa) | set(xb))]


def _run_side(run: Mapping[str, Any]) -> dict[str, Any]:
    m = run.get("metrics") or {}
    return {"label": redact_text(f"run {run.get('id')} ({run.get('label')})"), "inputs": [],
            "ranks": [], "steps": [], "step_source": f"log window {m.get('window')}"}


def diff_ledger_runs(run_a: Mapping[str, Any], run_b: Mapping[str, Any], *,
                     model_a: Mapping[str, Any] | None = None,
                     model_b: Mapping[str, Any] | None = None,
                     config: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """The diff document of two ledger runs (`Ledger.runs()` rows): step time from their logs'
    iterations, peak memory; walls and kernels are unknown without traces."""
    ma, mb = run_a.get("metrics") or {}, run_b.get("metrics") or {}
    sa = step_stats([x / 1e3 for x in ma.get("step_ms_all") or [] if x is not None])
    sb = step_stats([x / 1e3 for x in mb.get("step_ms_all") or [] if x is not None])
    warnings = _model_differences(model_a, model_b)
    if ma.get("window") != mb.get("window"):
        warnings.append(f"different step definition: log window {ma.get('window')} vs "
                        f"{mb.get('window')}")
    warnings.append("walls, kernels and communication not compared (ledger runs record no trace)")
    pa, pb = ma.get("peak_memory_mb"), mb.get("peak_memory_mb")
    gib = lambda v: None if v is None else round(v / 1024, 4)  # noqa: E731
    return {
        "schema": SCHEMA_ID,
        "source": "ledger",
        "a": _run_side(run_a),
        "b": _run_side(run_b),
        "comparable": not any(w.startswith("different") for w in warnings),
        "warnings": warnings,
        "config": dict(config) if config is not None else _ledger_config(run_a, run_b),
        "step_time": step_delta(sa, sb),
        "walls": {w: _pair(None, None) for w in WALLS},
        "dominant_wall": {"a": None, "b": None},
        "launches_per_step": _pair(None, None),
        "classes": [],
        "kernels": None,
        "ops": None,
        "comm_groups": {},
        "observed": [],
        "audit": [],
        "memory": {"peak_allocated_gib": _pair(gib(pa), gib(pb), 4),
                   "peak_reserved_gib": _pair(None, None)},
    }


def _ledger_config(run_a: Mapping[str, Any], run_b: Mapping[str, Any]) -> dict[str, Any]:
    """Two ledger runs' configuration delta from their command lines."""
    ca, cb = config_of_command(run_a.get("command")), config_of_command(run_b.get("command"))
    if ca and cb:
        ca, cb = {k: ca.get(k) for k in ca.keys() | cb.keys()}, {k: cb.get(k) for k in ca.keys() | cb.keys()}
    return config_delta(ca, cb, sources=("command line", "command line"))
