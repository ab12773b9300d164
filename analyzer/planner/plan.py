"""Fit and scale plans: legal layouts × the fit ladder, filtered by the memory model, ranked.

The "fit, then scale" steps of Megatron-Bridge's MoE optimization workflow (skill
nemo-mbridge-perf-moe-optimization-workflow): for every legal layout
take the first rung of the fit ladder that fits (expandable segments first; distributed optimizer;
selective recompute before full; offload last), then rank by the Megatron-Core MoE README's parallel-mapping priorities: minimal model
parallelism / max DP, EP×TP inside the NVLink domain, PP (+VPP) across nodes, EP rather than ETP,
CP only for long context. Each plan carries the terms of its score as its reasons.

The ladder's order, costs and whys, the headroom wanted and the score weights are data
(`planner.yaml`, config.py); `Request.config` carries them, merged with a user override if any.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from moetune.analyzer.log_hardware import FILL, fill_hint
from moetune.analyzer.planner.config import PlannerConfig, builtin
from moetune.analyzer.planner.layouts import (
    CONSTRAINTS,
    Enumeration,
    Topology,
    enumerate_layouts,
    topology_problem,
)
from moetune.analyzer.planner.memory import (
    GIB,
    FitOptions,
    Layout,
    MemoryEstimate,
    ModelSpec,
    Workload,
    estimate_memory,
    model_spec,
    total_params,
)
from moetune.analyzer.planner.predict import options_cost, stated_options, workload_from_contract

from moetune.errors import UserError
from moetune.knob_flags import render_flag

SCHEMA_ID = "moetune.fit/1"


# --------------------------------------------------------------------------------------------
# the fit ladder: cumulative rungs with their approximate step-time cost (fraction)


@dataclass(frozen=True, slots=True)
class Rung:
    name: str
    options: FitOptions
    cost: float  # approximate added step time, fraction
    why: str


def fit_ladder(model: ModelSpec, *, distributed_optimizer: bool,
               cfg: PlannerConfig | None = None) -> list[Rung]:
    """Rungs in planner.yaml's order (the Megatron-Bridge memory-tuning order); each includes all earlier ones.

    A rung's cost is the sum over the options in effect: selective modules add up, full recompute
    replaces them, a later offload fraction replaces an earlier one."""
    c = cfg or builtin()
    facts = {"moe": bool(model.num_experts), "dense": not model.num_experts,
             "mla": model.multi_latent_attention,
             "no_distributed_optimizer": not distributed_optimizer}
    cur = FitOptions(expandable_segments=False, distributed_optimizer=distributed_optimizer)
    costs: dict[str, float] = {}  # option slot -> cost of what is in effect there
    rungs = []
    for spec in c.ladder:
        if not all(facts[w] for w in spec.when):
            continue
        if spec.recompute_module:
            modules = (*(cur.recompute_modules if cur.recompute == "selective" else ()),
                       spec.recompute_module)
            cur = replace(cur, recompute="selective", recompute_modules=modules)
            selective = costs.get("recompute", 0.0) if "recompute:full" not in costs else 0.0
            costs.pop("recompute:full", None)
            costs["recompute"] = selective + spec.cost
            name = spec.name or f"recompute:{'+'.join(modules)}"
        else:
            [(key, val)] = spec.set  # the schema allows one option per rung
            slot = key
            if key == "recompute":  # full recompute supersedes the selective modules
                costs.pop("recompute", None)
                slot = "recompute:full"
                cur = replace(cur, recompute_modules=())
            cur = replace(cur, **{key: float(val) if key.endswith("fraction") else val})
            costs[slot] = spec.cost
            name = spec.name or key
        rungs.append(Rung(name, cur, sum(costs.values(), 0.0), spec.why))
    return rungs


# --------------------------------------------------------------------------------------------
# planning request and result


@dataclass(frozen=True, kw_only=True, slots=True)
class Request:
    model: ModelSpec
    work: Workload
    topo: Topology
    gpu_memory_gib: float
    distributed_optimizer: bool
    ep_overlap: bool
    dispatcher: str | None
    current: tuple[int, int, int, int | None, int, int] | None  # tp, cp, pp, vpp, ep, etp
    source: str | None = None
    config: PlannerConfig = field(default_factory=builtin)  # planner.yaml (+ user override)
    given: Rung | None = None  # the contract's own recompute/offload settings, priced as given


@dataclass(frozen=True, slots=True)
class Plan:
    layout: Layout
    rung: Rung
    memory: MemoryEstimate
    score: float
    reasons: tuple[tuple[str, float, str], ...]


def request_from_contract(doc: Mapping[str, Any], *, gpus: int | None = None,
                          source: str | None = None,
                          config: PlannerConfig | None = None) -> Request:
    """Everything the planner needs from a contract document (raises UserError when missing);
    `config` is the planner knowledge (`config.load_planner_config`), the built-in one if None."""
    cfg = config or builtin()
    model = model_spec(doc.get("model") or {}, path=source)
    hw = doc.get("hardware") or {}
    shape = doc.get("shape") or {}
    margs = doc.get("megatron_args") or {}
    training = doc.get("training") or {}
    missing = []
    if hw.get("gpu_memory_gb") is None:
        missing.append("hardware.gpu_memory_gb")
    seq = shape.get("seq_length") or (doc.get("model") or {}).get("seq_length")
    if seq is None:
        missing.append("shape.seq_length")
    per_node = hw.get("gpus_per_node")
    if gpus is None and (hw.get("nodes") is None or per_node is None):
        missing.append("hardware.gpus_per_node")
    if missing:
        raise UserError("contract lacks " + "; ".join(
            fill_hint(k) if k in FILL else f"{k} (needed by fit)" for k in missing), path=source)
    per_node = int(per_node or 8)
    world = int(gpus) if gpus is not None else int(hw["nodes"]) * per_node
    work = workload_from_contract(doc, cfg, source=source)  # shapes + the attention that runs
    ep_overlap = work.ep_overlap
    dist = training.get("distributed_optimizer", margs.get("use_distributed_optimizer"))
    given = stated_options(doc)  # the contract's own recompute/offload, priced as given
    if given is not None:  # with expandable segments: plan_env sets them for every plan
        given = replace(given, expandable_segments=True, distributed_optimizer=bool(dist))
    par = doc.get("parallelism") or {}
    current = None
    if par:
        tp = int(par.get("tp") or 1)
        current = (tp, int(par.get("cp") or 1), int(par.get("pp") or 1), par.get("vpp"),
                   int(par.get("ep") or 1), int(par.get("etp") or tp))
    return Request(
        model=model, work=work,
        topo=Topology(world, per_node, int(hw.get("nvlink_domain_size") or per_node)),
        gpu_memory_gib=float(hw["gpu_memory_gb"]),
        distributed_optimizer=bool(dist), ep_overlap=ep_overlap,
        dispatcher=margs.get("moe_token_dispatcher_type"), current=current, source=source,
        config=cfg,
        given=None if given is None else Rung(
            "as_given", given, options_cost(given, cfg, model=model),
            f"the contract's own settings ({fit_summary(given)}), priced as given"),
    )


def read_contract(path: str | Path) -> Mapping[str, Any]:
    """The contract document, validated by the contract module (the one place contracts load)."""
    from moetune.analyzer.contract import load_contract

    return load_contract(path).raw


# --------------------------------------------------------------------------------------------
# fitting and ranking


def fit_layout(req: Request, lay: Layout, ladder: list[Rung]) -> tuple[Rung, MemoryEstimate] | None:
    """The first rung that leaves `fit.headroom_wanted` free, else the first that fits at all,
    else None."""
    cap = req.gpu_memory_gib * GIB
    if req.given is not None and req.current == (lay.tp, lay.cp, lay.pp, lay.vpp, lay.ep, lay.etp):
        # the contract's own layout with its own settings, as given; the ladder only if that
        # does not fit
        est = estimate_memory(req.model, lay, req.work, req.given.options, cfg=req.config)
        if est.peak_bytes <= cap:
            return req.given, est
    first_fit = None
    for rung in ladder:
        est = estimate_memory(req.model, lay, req.work, rung.options, cfg=req.config)
        if est.peak_bytes <= cap * (1 - req.config.headroom_wanted):
            return rung, est
        if first_fit is None and est.peak_bytes <= cap:
            first_fit = (rung, est)
    return first_fit


def _cp_terms(cp: int, seq: int, wt: Any) -> list[tuple[str, float, str]]:
    """Context parallelism against the rule it follows (Megatron-LM MoE README, guideline 5: CP
    for sequences of ≥ 8K tokens; Megatron-Bridge: 4K–8K tokens per shard). Each doubling of CP
    that keeps shards at or above the shard floor on a long enough context is a small penalty; a
    doubling below either floor is a cost (the ring's KV exchange no longer hides under the
    shard's attention), weighed like a fit rung, so that CP below the floor ranks after layouts
    that do not need it unless everything else costs more."""
    per = seq // cp
    floor_ctx = int(wt("context_parallel_min_context_tokens"))
    floor_shard = int(wt("context_parallel_long_shard_tokens"))
    doublings = math.log2(cp)
    # doublings that keep each shard at or above the shard floor, on a context that wants CP
    fine = 0.0 if seq < floor_ctx else min(doublings, max(0.0, math.log2(seq / floor_shard)))
    below = doublings - fine
    rule = (f"the rule: CP for ≥ {floor_ctx // 1024}K context, {floor_shard // 1024}K–"
            f"{2 * floor_shard // 1024}K tokens per shard (Megatron-LM MoE README guideline 5; "
            "Megatron-Bridge long-context skill)")
    out = []
    if fine:
        out.append(("context_parallel", wt("context_parallel_per_doubling_long_shard") * fine,
                    f"CP{cp}: {per} tokens per CP shard ({rule})"))
    if below:
        why = (f"seq {seq} is below the {floor_ctx}-token context" if seq < floor_ctx
               else f"{per} tokens per shard is below the {floor_shard}-token shard floor")
        out.append(("context_parallel_below_floor",
                    round(wt("context_parallel_below_floor_per_doubling") * below, 6),
                    f"CP{cp}: {per} tokens per CP shard, below the floor of {rule}: {why}; a cost "
                    f"of {below:g} CP doubling(s): its communication no longer hides under "
                    "attention"))
    return out


def score_terms(req: Request, lay: Layout, rung: Rung, est: MemoryEstimate
                ) -> list[tuple[str, float, str]]:
    """(term, penalty, why) — lower total ranks higher. Weights are heuristics (planner.yaml
    `ranking`, docs/planner.md); each term names the seed guideline it encodes."""
    topo, w, wt = req.topo, req.work, req.config.weight
    terms: list[tuple[str, float, str]] = []
    if rung.cost:
        terms.append(("fit", rung.cost, f"needs {rung.name}: {rung.why}"))
    mp = lay.tp * lay.cp * lay.pp
    if mp > 1:
        terms.append(("model_parallel", wt("model_parallel_per_doubling") * math.log2(mp),
                      f"model parallelism TP·CP·PP = {mp}, DP {lay.dp} (MoE README, parallel mapping, priority 1: the "
                      "smallest model parallelism that fits, max DP)"))
    if lay.pp > 1:
        m = (w.microbatches(lay.dp)
             or int(wt("pipeline_default_microbatches_per_stage")) * lay.pp)
        bubble = (lay.pp - 1) / (m * lay.chunks)
        terms.append(("pipeline_bubble", bubble,
                      f"PP{lay.pp}{f' VPP{lay.vpp}' if lay.vpp else ''} bubble (PP−1)/(m·VPP) with "
                      f"m={m} micro-batches"))
        if lay.vpp:
            terms.append(("vpp_p2p", wt("vpp_p2p_per_chunk") * (lay.vpp - 1),
                          "more VPP chunks, more P2P transfers"))
        if lay.pp_split == "layout":
            terms.append(("custom_layout", wt("custom_layout"),
                          "uneven split needs --pipeline-model-parallel-layout"))
    if lay.tp > 1:
        terms.append(("tensor_parallel", wt("tensor_parallel_per_doubling") * math.log2(lay.tp),
                      f"TP{lay.tp}: per-layer TP collectives; high TP makes MoE host-bound "
                      "(MoE README: size TP by active params)"))
    if lay.cp > 1:
        terms += _cp_terms(lay.cp, w.seq_length, wt)
    group = lay.ep * lay.etp
    if req.model.num_experts and group > topo.nvlink_domain:
        # share of each token's dispatch that leaves the NVLink domain: 1 − domain/(EP·ETP)
        off = 1 - topo.nvlink_domain / group
        terms.append(("ep_cross_node", wt("ep_cross_node") * off,
                      f"EP{lay.ep}×ETP{lay.etp} spans {group // topo.nvlink_domain} NVLink domains: "
                      f"{off:.0%} of dispatch crosses the network (MoE README, parallel mapping, priority 2)"))
    if lay.etp > 1:
        terms.append(("expert_tensor_parallel",
                      wt("expert_tensor_parallel_per_doubling") * math.log2(lay.etp),
                      f"ETP{lay.etp}: prefer EP over TP for experts (MoE README, parallel mapping, priority 4)"))
    cap = req.gpu_memory_gib * GIB
    headroom = 1 - est.peak_bytes / cap
    wanted = req.config.headroom_wanted
    if headroom < wanted:
        terms.append(("low_headroom", round(wt("low_headroom") * (wanted - headroom) / wanted, 6),
                      f"{headroom:.0%} headroom < {wanted:.0%}: early routing imbalance "
                      "or fragmentation may OOM (PyTorch CUDA semantics: expandable_segments)"))
    return terms


@dataclass(frozen=True, slots=True)
class Outcome:
    request: Request
    plans: tuple[Plan, ...]  # ranked, best first
    legal: int
    candidates: int
    binding: tuple[str, ...]  # constraint ids (or "memory", "topology") when nothing fits
    explanation: str | None
    current_rank: int | None  # 1-based rank of the contract's own layout among plans


def plan_fit(req: Request) -> Outcome:
    """All fitting plans ranked, or the binding constraint(s) when there is none."""
    problem = topology_problem(req.topo)
    if problem:
        return Outcome(req, (), 0, 0, ("topology",), f"no legal layout: topology: {problem}", None)
    enum = enumerate_layouts(req.model, req.work, req.topo, ep_overlap=req.ep_overlap,
                             max_vpp=req.config.max_vpp)
    plans = _fit_all(req, enum)
    if not plans:
        binding, text = _explain(req, enum)
        return Outcome(req, (), len(enum.layouts), enum.candidates, binding, text, None)
    current = None
    if req.current:
        for i, p in enumerate(plans, 1):
            lay = p.layout
            if (lay.tp, lay.cp, lay.pp, lay.vpp, lay.ep, lay.etp) == req.current:
                current = i
                break
    return Outcome(req, tuple(plans), len(enum.layouts), enum.candidates, (), None, current)


TIE_BREAK = ("more data parallelism (DP) first, then the lower predicted peak memory, then the "
             "smaller TP, CP, DP, PP, VPP")


def ties(scores: list[float]) -> str | None:
    """What ranks plans of equal score, said where the shown plans have any (`fit`'s `ties`)."""
    groups: dict[float, list[int]] = {}
    for i, sc in enumerate(scores, 1):
        groups.setdefault(round(sc, 4), []).append(i)
    tied = [(sc, ix) for sc, ix in groups.items() if len(ix) > 1]
    if not tied:
        return None
    said = "; ".join(f"#{ix[0]}–#{ix[-1]} share cost {sc:.3f}"
                     + (" (no penalty: none needs model parallelism or a fit option)"
                        if sc == 0 else "") for sc, ix in tied)
    return f"ties: {said}; equal scores are ranked by {TIE_BREAK}"


def _fit_all(req: Request, enum: Enumeration) -> list[Plan]:
    ladder = fit_ladder(req.model, distributed_optimizer=req.distributed_optimizer,
                        cfg=req.config)
    plans = []
    for lay in enum.layouts:
        hit = fit_layout(req, lay, ladder)
        if hit is None:
            continue
        rung, est = hit
        terms = score_terms(req, lay, rung, est)
        plans.append(Plan(lay, rung, est, round(sum(t[1] for t in terms), 6), tuple(terms)))
    # ties (TIE_BREAK): more DP, then less memory, then the smaller layout tuple (deterministic)
    plans.sort(key=lambda p: (p.score, -p.layout.dp, p.memory.peak_bytes,
                              (*p.layout.key()[:4], p.layout.vpp or 0)))
    return plans


def _explain(req: Request, enum: Enumeration) -> tuple[tuple[str, ...], str]:
    """Name the constraint(s) whose relaxation alone would let some layout fit."""
    if not enum.layouts:
        # structural: which single relaxation yields any legal layout
        binding = [cid for cid in sorted(set(enum.rejected) - {"layers_cover_stages"})
                   if enumerate_layouts(req.model, req.work, req.topo, ep_overlap=req.ep_overlap,
                                        max_vpp=req.config.max_vpp,
                                        relax=frozenset({cid})).layouts]
        names = binding or sorted(enum.rejected, key=enum.rejected.__getitem__, reverse=True)
        rules = "; ".join(f"{c}: {CONSTRAINTS[c]}" for c in names)
        return tuple(names), f"no legal layout for {req.topo.gpus} GPUs: binding {rules}"
    binding = []
    for cid in sorted(set(enum.rejected) - {"layers_cover_stages"}):
        relaxed = enumerate_layouts(req.model, req.work, req.topo, ep_overlap=req.ep_overlap,
                                    max_vpp=req.config.max_vpp, relax=frozenset({cid}))
        fits = _fit_all(req, relaxed)
        if fits:
            lay = fits[0].layout
            binding.append((cid, f"{cid}: {CONSTRAINTS[cid]} — without it "
                                 f"{mesh_attention(lay)} / {mesh_moe(lay)} would fit at "
                                 f"{fits[0].memory.peak_gib:.1f} GiB"))
    if binding:
        return tuple(b[0] for b in binding), (
            f"no legal layout fits {req.gpu_memory_gib:g} GiB per GPU: binding "
            + "; ".join(b[1] for b in binding))
    ladder = fit_ladder(req.model, distributed_optimizer=req.distributed_optimizer,
                        cfg=req.config)
    best = _smallest(req, enum, ladder[-1])
    est, lay = best
    total = total_params(req.model, cfg=req.config)["total"]
    return ("memory",), (
        f"no legal layout fits: memory binds. Even with every fit option ({ladder[-1].name}) the "
        f"smallest predicted peak is {est.peak_gib:.1f} GiB ({mesh_attention(lay)} / "
        f"{mesh_moe(lay)}) > {req.gpu_memory_gib:g} GiB per GPU; the model has "
        f"{total / 1e9:.1f} B parameters for {req.topo.gpus} GPUs")


def _smallest(req: Request, enum: Enumeration, rung: Rung) -> tuple[MemoryEstimate, Layout]:
    best: tuple[MemoryEstimate, Layout] | None = None
    for lay in enum.layouts:
        est = estimate_memory(req.model, lay, req.work, rung.options, cfg=req.config)
        if best is None or est.peak_bytes < best[0].peak_bytes:
            best = (est, lay)
    assert best is not None
    return best


# --------------------------------------------------------------------------------------------
# rendering helpers shared by the CLI and the JSON document


def fit_summary(o: FitOptions) -> str:
    parts = ["expandable segments"] if o.expandable_segments else []
    if o.distributed_optimizer:
        parts.append("distributed optimizer")
    if o.recompute == "selective":
        parts.append("selective recompute " + " ".join(o.recompute_modules))
    elif o.recompute == "full":
        parts.append("full recompute")
    if o.precision_aware_optimizer:
        parts.append("bf16 optimizer moments")
    if o.optimizer_offload_fraction:
        parts.append(f"optimizer offload {o.optimizer_offload_fraction:.0%}")
    return " + ".join(parts)


def mesh_attention(lay: Layout) -> str:
    return f"TP{lay.tp}×CP{lay.cp}×DP{lay.dp}×PP{lay.pp}"


def mesh_moe(lay: Layout) -> str:
    return f"ETP{lay.etp}×EP{lay.ep}×EDP{lay.edp}×PP{lay.pp}"


def plan_args(plan: Plan) -> list[tuple[str, Any]]:
    """(Megatron argument, value) pairs a plan sets, underscore form as in `megatron_args`."""
    lay, o = plan.layout, plan.rung.options
    args: list[tuple[str, Any]] = [
        ("tensor_model_parallel_size", lay.tp), ("pipeline_model_parallel_size", lay.pp),
        ("context_parallel_size", lay.cp), ("expert_model_parallel_size", lay.ep),
        ("expert_tensor_parallel_size", lay.etp)]
    if lay.pp_split == "layout":
        args.append(("pipeline_model_parallel_layout", lay.pp_layout))
    else:
        if lay.vpp:
            args.append(("virtual_pipeline_model_parallel_size", lay.vpp))
        if lay.pp_split == "account_for_embedding_and_loss":
            args += [("account_for_embedding_in_pipeline_split", True),
                     ("account_for_loss_in_pipeline_split", True)]
    if lay.sequence_parallel:
        args.append(("sequence_parallel", True))
    if o.distributed_optimizer:
        args.append(("use_distributed_optimizer", True))
    if o.recompute == "selective":
        args += [("recompute_granularity", "selective"), ("recompute_modules", o.recompute_modules)]
    elif o.recompute == "full":
        args += [("recompute_granularity", "full"), ("recompute_method", "uniform"),
                 ("recompute_num_layers", 1)]
    if o.precision_aware_optimizer:
        args += [("use_precision_aware_optimizer", True), ("exp_avg_dtype", "bf16"),
                 ("exp_avg_sq_dtype", "bf16")]
    if o.optimizer_offload_fraction:
        args += [("optimizer_cpu_offload", True),
                 ("optimizer_offload_fraction", o.optimizer_offload_fraction),
                 ("overlap_cpu_optimizer_d2h_h2d", True)]
    return args


def megatron_flags(plan: Plan) -> list[str]:
    """Current Megatron-LM flags for the plan, one string per argument (moetune.knobs spells and
    quotes them: the catalog's flag, else `--foo-bar`)."""
    return [render_flag(a, v) for a, v in plan_args(plan)]


def plan_env(req: Request, plan: Plan) -> dict[str, str]:
    env = {"PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True"}
    lay = plan.layout
    if req.ep_overlap:
        env["CUDA_DEVICE_MAX_CONNECTIONS"] = "32"  # EP overlap wants many (Megatron-LM PR #2719)
    elif lay.tp > 1 or lay.cp > 1:
        env["CUDA_DEVICE_MAX_CONNECTIONS"] = "1"  # Hopper: asserted with TP/CP > 1 (Megatron-LM arguments.py validate_args)
    return env


def check_command(req: Request, plan: Plan) -> tuple[str, list[str]]:
    """One-GPU build check with a fake process group, and its caveats."""
    lay = plan.layout
    flags = " ".join(megatron_flags(plan))
    read = ("read 'max allocated' in the memory report of the first iterations, or add "
            "--record-memory-history --memory-snapshot-path")
    notes = [
        (f"run twice, RANK=0 (first stage) and RANK={req.topo.gpus - 1} (last stage): the peak "
         f"is predicted on pipeline rank {plan.memory.rank}; {read}") if lay.pp > 1 else
        f"run once, RANK=0: at PP 1 every rank holds the same layers; {read}",
        "the code flag is --fake-process-group; MLM README and Bridge docs say "
        "--fake-init-process-group. Megatron-Bridge does not support it (MLM PR #2280, PyTorch ≥2.3)",
        "it skips communication and disables NaN checks: it proves the layout builds and "
        "shows memory, not speed",
    ]
    dispatcher = ""
    if req.dispatcher == "flex":
        dispatcher = " " + render_flag("moe_token_dispatcher_type", "alltoall")
        notes.append("the flex dispatcher (DeepEP/HybridEP) is incompatible with "
                     "--fake-process-group (Megatron-LM arguments.py): the check uses alltoall, so its dispatch "
                     "buffers differ from the real run")
    env = " ".join(f"{k}={v}" for k, v in plan_env(req, plan).items())
    cmd = (f"{env} WORLD_SIZE={lay.world} RANK=0 python pretrain_gpt.py <model, data and "
           f"training args from the contract> {flags}{dispatcher} "
           f"{render_flag('fake_process_group', True)} --train-iters 3 --log-interval 1")
    return cmd, notes


def _verdict(p: Plan, cap: float, req: Request) -> dict[str, str]:
    """The memory verdict of a plan, the model alone (verdict.py: the rule `recommend` uses)."""
    from moetune.analyzer.planner.verdict import of_estimate

    b = p.memory.breakdown
    dynamic = sum(b.get(k, 0.0) for k in ("activations", "logits", "transient", "optimizer_step"))
    v = of_estimate(sum(x for k, x in b.items() if k != "overhead"), dynamic,
                    expandable_segments=p.rung.options.expandable_segments, capacity_gib=cap,
                    cfg=req.config)
    return {"verdict": v.verdict, "why": v.why}


def to_document(out: Outcome, *, top: int, contract: str | None) -> dict[str, Any]:
    """The `moetune fit --json` document (schemas/fit.schema.json)."""
    req = out.request
    totals = total_params(req.model, cfg=req.config)
    plans = []
    for i, p in enumerate(out.plans[:top], 1):
        lay, o = p.layout, p.rung.options
        cap = req.gpu_memory_gib
        cmd, notes = check_command(req, p)
        plans.append({
            "rank": i,
            "score": round(p.score, 4),
            "attention": {"tp": lay.tp, "cp": lay.cp, "dp": lay.dp, "pp": lay.pp, "vpp": lay.vpp,
                          "mesh": mesh_attention(lay)},
            "moe": {"etp": lay.etp, "ep": lay.ep, "edp": lay.edp, "pp": lay.pp,
                    "mesh": mesh_moe(lay)},
            "sequence_parallel": lay.sequence_parallel,
            "pipeline_split": lay.pp_split,
            "pipeline_layout": lay.pp_layout,
            "fit": {
                "rung": p.rung.name,
                "summary": fit_summary(o),
                "expandable_segments": o.expandable_segments,
                "distributed_optimizer": o.distributed_optimizer,
                "recompute": o.recompute,
                "recompute_modules": list(o.recompute_modules),
                "precision_aware_optimizer": o.precision_aware_optimizer,
                "optimizer_offload_fraction": o.optimizer_offload_fraction,
            },
            "memory": {
                "verdict": _verdict(p, cap, req),
                "peak_gib": round(p.memory.peak_gib, 3),
                "capacity_gib": cap,
                "headroom_gib": round(cap - p.memory.peak_gib, 3),
                "headroom_fraction": round(1 - p.memory.peak_gib / cap, 4),
                "pipeline_rank": p.memory.rank,
                "breakdown_gib": {k: round(v / GIB, 3) for k, v in p.memory.breakdown.items()},
            },
            "reasons": [{"term": t, "penalty": round(v, 4), "why": why} for t, v, why in p.reasons],
            "flags": megatron_flags(p),
            "env": plan_env(req, p),
            "check": {"command": cmd, "notes": notes},
        })
    return {
        "schema": SCHEMA_ID,
        "contract": contract,
        "model": {"name": req.model.name, "params_b": round(totals["total"] / 1e9, 3),
                  "active_params_b": round(totals["active"] / 1e9, 3),
                  "expert_params_b": round(totals["expert"] / 1e9, 3)},
        "world": {"gpus": req.topo.gpus, "gpus_per_node": req.topo.gpus_per_node,
                  "nvlink_domain_size": req.topo.nvlink_domain,
                  "gpu_memory_gib": req.gpu_memory_gib},
        "workload": {"seq_length": req.work.seq_length,
                     "micro_batch_size": req.work.micro_batch_size,
                     "global_batch_size": req.work.global_batch_size,
                     "fp8": req.work.fp8, "moe_imbalance": req.work.moe_imbalance,
                     "ep_overlap": req.work.ep_overlap},
        "counts": {"candidates": out.candidates, "legal": out.legal, "fit": len(out.plans)},
        "current_layout_rank": out.current_rank,
        "plans": plans,
        "ties": ties([p["score"] for p in plans]),
        "no_layout": (None if out.plans else
                      {"binding": list(out.binding), "explanation": out.explanation}),
    }
