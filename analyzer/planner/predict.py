"""Peak GPU memory of a configuration as given, and of a changed one (issue #16 item 2).

`config_peak` prices what a contract describes, with Megatron arguments changed when asked, through
memory.py's formulas and nothing re-planned: the recompute granularity, method, layer count and
modules, the micro-batch, fine-grained activation offload, the optimizer settings and the
TP/CP/PP/EP/ETP layout are taken as given, and so is the attention that really runs. Without
Transformer Engine (or with the local spec, or `--attention-backend unfused|local`) Megatron-Core
runs `DotProductAttention`, which materialises the b·a·s² attention scores and keeps them for
backward [KOR Table 2; memory.py `UNFUSED_SCORE_*`]; with TE's flash/fused attention only the
softmax statistics are kept (memory.py's default).

`predict_peak` anchors the model on evidence: with a measured peak (Megatron's `max allocated`,
the diagnosis' `memory.peak_allocated_gib`) the prediction is the measured peak plus the model's
delta between the changed and the current configuration, so the model's absolute error cancels
and only its error on the difference remains; without one it is the model alone. Whether it fits
is judged against the GPU's memory less planner.yaml's allocator overhead (CUDA context +
fragmentation of the dynamic memory): the measured `max allocated` counts neither.

Peaks here are *allocated* bytes (tensors alive, as `torch.cuda.max_memory_allocated`); memory.py's
`overhead` term is what the caching allocator and the CUDA context add on top.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from moetune.analyzer.contract import effective_args, thaw, with_args
from moetune.analyzer.planner.config import GIB, PlannerConfig, builtin
from moetune.analyzer.planner.layouts import pipeline_split
from moetune.analyzer.planner.memory import (
    OFFLOAD_MODULES,
    RECOMPUTE_MODULES,
    FitOptions,
    Layout,
    ModelSpec,
    Workload,
    estimate_memory,
    model_spec,
)

from moetune.errors import UserError

# `--attention-backend` values (megatron-core `transformer/enums.py` AttnBackend) that run the
# s² scores through memory: `local` is DotProductAttention, `unfused` TE's UnfusedDotProductAttention
UNFUSED_BACKENDS = frozenset({"unfused", "local"})
_NONE = (None, "", "none", "None", "null", False)


# --------------------------------------------------------------------------------------------
# reading a contract as given


def _get(doc: Mapping[str, Any], path: str, arg: str | None = None) -> Any:
    """A section field (`shape.micro_batch_size`), else the Megatron argument it mirrors."""
    section, field = path.split(".")
    value = (doc.get(section) or {}).get(field)
    if value is None and arg:
        value = (doc.get("megatron_args") or {}).get(arg)
    return value


def attention_path(doc: Mapping[str, Any]) -> tuple[bool, str]:
    """(fused, why): whether the run's core attention is fused (flash/cuDNN: no s² tensors kept).

    Unfused when `--attention-backend` is unfused/local, when `--transformer-impl local` (the local
    spec builds DotProductAttention), or when the contract says Transformer Engine is not installed
    (`versions.transformer_engine: null`: Megatron-Core can then only build the local spec). A
    contract that says nothing is assumed fused, memory.py's documented default."""
    args = effective_args(doc)
    backend = str(args.get("attention_backend") or "").lower().removeprefix("attnbackend.")
    impl = args.get("transformer_impl")
    versions = doc.get("versions") or {}
    if backend in UNFUSED_BACKENDS:
        return False, f"unfused: attention_backend {backend}"
    if impl == "local":
        return False, "unfused: transformer_impl local (DotProductAttention)"
    if "transformer_engine" in versions and versions["transformer_engine"] in _NONE:
        return False, ("unfused: no Transformer Engine (versions.transformer_engine null), so the "
                       "local spec's DotProductAttention")
    if versions.get("transformer_engine") or impl == "transformer_engine" or backend:
        return True, (f"fused: Transformer Engine attention (attention_backend {backend or 'auto'})")
    return True, ("fused assumed: the contract names neither versions.transformer_engine nor "
                  "transformer_impl")


def options_from_contract(doc: Mapping[str, Any], *, notes: list[str] | None = None
                          ) -> FitOptions:
    """The memory-relevant settings the contract gives, as memory.py's `FitOptions`."""
    args = effective_args(doc)
    notes = notes if notes is not None else []
    gran = args.get("recompute_granularity")
    gran = None if gran in _NONE else str(gran)
    modules = args.get("recompute_modules") or []
    modules = modules.split() if isinstance(modules, str) else list(modules)
    if args.get("moe_layer_recompute"):  # deprecated switch = selective `moe`
        gran = gran or "selective"
        modules.append("moe")
    recompute: Any = "none"
    method, num = "uniform", 1
    if gran == "full":
        recompute = "full"
        method = str(args.get("recompute_method") or "uniform")
        num = args.get("recompute_num_layers")
        num = 1 if num is None else int(num)
        if method not in ("uniform", "block"):
            raise UserError(f"recompute_method {method!r}: expected uniform or block")
        modules = []
    elif gran == "selective":
        recompute = "selective"
        modules = modules or ["core_attn"]  # megatron-core's default module
        unknown = sorted(set(modules) - set(RECOMPUTE_MODULES))
        if unknown:
            notes.append(f"recompute module(s) {', '.join(unknown)} not modelled (priced as kept)")
        modules = [m for m in dict.fromkeys(modules) if m in RECOMPUTE_MODULES]
    elif gran is not None:
        raise UserError(f"recompute_granularity {gran!r}: expected full, selective or null")
    offload: tuple[str, ...] = ()
    if args.get("fine_grained_activation_offloading"):
        named = args.get("offload_modules") or []
        named = named.split() if isinstance(named, str) else named
        offload = tuple(m for m in named if m in OFFLOAD_MODULES)
        notes.append("fine-grained activation offload of " + (", ".join(offload) or "nothing")
                     + ": offloaded inputs leave the GPU but one layer's come back in backward "
                     "(tensors under min_offloaded_tensor_size are not told apart)")
    bf16 = ("bf16", "torch.bfloat16", "bfloat16")
    precision_aware = bool(args.get("use_precision_aware_optimizer")) and (
        args.get("exp_avg_dtype") in bf16 or args.get("exp_avg_sq_dtype") in bf16)
    fraction = 0.0
    if args.get("optimizer_cpu_offload"):
        fraction = _fraction(args.get("optimizer_offload_fraction"))
    alloc = str((doc.get("env") or {}).get("PYTORCH_CUDA_ALLOC_CONF") or "")
    return FitOptions(
        expandable_segments="expandable_segments:true" in alloc.replace(" ", "").lower(),
        distributed_optimizer=bool(args.get("use_distributed_optimizer")),
        recompute=recompute,
        recompute_modules=tuple(modules),
        precision_aware_optimizer=precision_aware,
        optimizer_offload_fraction=fraction,
        recompute_method=method,  # type: ignore[arg-type]
        recompute_num_layers=num,
        offload_modules=offload,
        activation_offload_fraction=_fraction(args.get("activation_offload_fraction")),
    )


def _fraction(value: Any) -> float:
    """An offload fraction argument; Megatron's default (None) is 1.0."""
    return 1.0 if value is None else float(value)


def stated_options(doc: Mapping[str, Any]) -> FitOptions | None:
    """The contract's recompute/offload settings when it states any (a `recompute_granularity`
    key, null included, or an offload switch), else None: `fit` prices the contract's own layout
    with them as given (plan.fit_layout)."""
    training = doc.get("training") or {}
    margs = doc.get("megatron_args") or {}
    keys = ("recompute_granularity", "moe_layer_recompute", "fine_grained_activation_offloading",
            "optimizer_cpu_offload", "use_precision_aware_optimizer")
    if not any(k in training or k in margs for k in keys):
        return None
    return options_from_contract(doc)


# selective recompute modules that act on one kind of layer only (megatron-core
# `transformer_config.py` `recompute_modules`): their ladder cost is for a model of that kind alone
_DENSE_ONLY = frozenset({"mlp"})
_MOE_ONLY = frozenset({"moe", "moe_act", "shared_experts"})


def options_cost(opts: FitOptions, cfg: PlannerConfig | None = None, *,
                 model: ModelSpec | None = None) -> float:
    """Step-time cost of the options in effect, from planner.yaml's ladder entries: selective
    modules add up (modules without an entry, such as core_attn, cost 0; with `model`, a module
    of dense or MoE layers only costs its entry × the share of such layers), full recompute, bf16
    moments, and the offload entry of the same or the next larger fraction."""
    c = cfg or builtin()
    cost = 0.0
    offloads = []
    moe_share = 1.0
    if model is not None:
        moe_share = sum(model.moe_pattern) / max(1, len(model.moe_pattern))
    for spec in c.ladder:
        if spec.recompute_module:
            mod = spec.recompute_module
            if opts.recompute == "selective" and mod in opts.recompute_modules:
                share = (1 - moe_share if mod in _DENSE_ONLY else
                         moe_share if mod in _MOE_ONLY else 1.0)
                cost += spec.cost * (share if model is not None else 1.0)
            continue
        [(key, val)] = spec.set
        if (key == "recompute" and opts.recompute == val) or \
                (key == "precision_aware_optimizer" and opts.precision_aware_optimizer):
            cost += spec.cost
        elif key == "optimizer_offload_fraction":
            offloads.append((float(val), spec.cost))
    if opts.optimizer_offload_fraction:
        above = [k for f, k in sorted(offloads) if f >= opts.optimizer_offload_fraction - 1e-9]
        cost += above[0] if above else max((k for _, k in offloads), default=0.0)
    return cost


def workload_from_contract(doc: Mapping[str, Any], cfg: PlannerConfig | None = None, *,
                           source: str | None = None) -> Workload:
    """Shapes, precision, routing and the attention that runs (memory.py `Workload`)."""
    c = cfg or builtin()
    margs = doc.get("megatron_args") or {}
    routing = doc.get("routing") or {}
    precision = doc.get("precision") or {}
    seq = _get(doc, "shape.seq_length", "seq_length") or (doc.get("model") or {}).get("seq_length")
    if seq is None:
        raise UserError("contract lacks shape.seq_length (needed by the memory model)",
                        path=source)
    if routing.get("capacity_factor"):
        imbalance = float(routing["capacity_factor"])
    else:
        imbalance = 1.0 if routing.get("force_balancing") else c.moe_imbalance_natural
    fused, _ = attention_path(doc)
    args = effective_args(doc)
    dropout = args.get("attention_dropout")
    return Workload(
        seq_length=int(seq),
        micro_batch_size=int(_get(doc, "shape.micro_batch_size", "micro_batch_size") or 1),
        global_batch_size=_get(doc, "shape.global_batch_size", "global_batch_size"),
        fp8=bool(precision.get("fp8_format") or margs.get("fp8")),
        param_bytes=c.param_bytes_for(str(precision.get("params") or "bf16")),
        main_grad_bytes=c.main_grad_bytes_for(margs.get("main_grads_dtype")),
        moe_imbalance=imbalance,
        ep_overlap=bool(margs.get("overlap_moe_expert_parallel_comm")),
        cross_entropy_fusion=bool(margs.get("cross_entropy_loss_fusion")),
        fused_attention=fused,
        # Megatron-LM's default is 0.1 and its argument dump prints it; a contract without it
        # (the workloads here run 0) is priced without the mask
        attention_dropout=float(dropout or 0.0),
        softmax_fp32=softmax_in_fp32(args),
        score_buffer=True,
        torch_adam=torch_adam(doc),
    )


def torch_adam(doc: Mapping[str, Any]) -> bool:
    """Whether Megatron steps with torch's Adam: it falls back to it when neither Transformer
    Engine nor Apex is installed (megatron-core optimizer/__init__.py), which a contract says as
    `versions.transformer_engine: null` (`contract from-log` reads Megatron's warning "Transformer
    Engine and Apex are not installed. Falling back to Torch optimizers")."""
    versions = doc.get("versions") or {}
    return "transformer_engine" in versions and versions["transformer_engine"] in _NONE \
        and not versions.get("apex")


def softmax_in_fp32(args: Mapping[str, Any]) -> bool:
    """The unfused attention's softmax dtype (attention.py): bf16 only where the run says
    `attention_softmax_in_fp32` False (a Megatron-LM argument dump without the flag) and not
    `apply_query_key_layer_scaling` (which forces fp32); megatron-core's own default otherwise."""
    if args.get("apply_query_key_layer_scaling"):
        return True
    return args.get("attention_softmax_in_fp32") is not False


def world_size(doc: Mapping[str, Any]) -> int:
    """GPUs of the run: parallelism.world_size, else DP·TP·CP·PP, else nodes × GPUs per node."""
    world = _get(doc, "parallelism.world_size", "world_size")
    if world:
        return int(world)
    dp = _get(doc, "parallelism.dp", "data_parallel_size")
    if dp:
        return int(dp) * _size(doc, "tp") * _size(doc, "cp") * _size(doc, "pp")
    hw = doc.get("hardware") or {}
    if hw.get("nodes") and hw.get("gpus_per_node"):
        return int(hw["nodes"]) * int(hw["gpus_per_node"])
    return _size(doc, "tp") * _size(doc, "cp") * _size(doc, "pp")


_PAR = {"tp": "tensor_model_parallel_size", "cp": "context_parallel_size",
        "pp": "pipeline_model_parallel_size", "ep": "expert_model_parallel_size",
        "etp": "expert_tensor_parallel_size", "vpp": "virtual_pipeline_model_parallel_size"}


def _size(doc: Mapping[str, Any], key: str) -> int:
    value = _get(doc, f"parallelism.{key}", _PAR[key])
    if key == "etp" and value is None:
        return _size(doc, "tp")  # Megatron: expert TP defaults to TP
    return int(value or 1)


def layout_from_contract(doc: Mapping[str, Any], model: ModelSpec, *, world: int | None = None,
                         source: str | None = None) -> Layout:
    """The contract's layout (memory.py `Layout`); DP and EDP follow from the world size."""
    world = world or world_size(doc)
    tp, cp, pp, ep, etp = (_size(doc, k) for k in ("tp", "cp", "pp", "ep", "etp"))
    vpp = _get(doc, "parallelism.vpp", _PAR["vpp"])
    vpp = int(vpp) if vpp and int(vpp) > 1 else None
    if world % (tp * cp * pp) or world % (ep * etp * pp):
        raise UserError(f"{world} GPUs do not divide into TP{tp}×CP{cp}×PP{pp} and "
                        f"ETP{etp}×EP{ep}×PP{pp}", path=source)
    split = pipeline_split(model.num_layers, pp, vpp, model.mtp_num_layers)
    if split is None:
        raise UserError(f"{model.num_layers} layers do not split over PP{pp}"
                        f"{f' VPP{vpp}' if vpp else ''}", path=source)
    stages, how, text = split
    return Layout(tp=tp, cp=cp, dp=world // (tp * cp * pp), pp=pp, vpp=vpp, ep=ep, etp=etp,
                  edp=world // (ep * etp * pp), stages=stages, pp_layout=text, pp_split=how)


# --------------------------------------------------------------------------------------------
# the estimate of one configuration


@dataclass(frozen=True, slots=True)
class Estimate:
    """The model's peak for one configuration, as given."""

    allocated_bytes: float  # tensors alive at the peak (max_memory_allocated, `max allocated`)
    peak_bytes: float  # + CUDA context and fragmentation (planner.yaml `memory`): `fit`'s figure
    rank: int  # pipeline rank of the peak
    breakdown: Mapping[str, float]  # memory.py's terms, bytes
    layout: Layout
    work: Workload
    options: FitOptions
    attention: str  # which attention was priced, and why
    notes: tuple[str, ...]  # what was assumed or left out
    moments_bytes: float = 0.0  # the optimizer's moments: built at its first step (lazily)

    @property
    def allocated_gib(self) -> float:
        return self.allocated_bytes / GIB

    @property
    def dynamic_bytes(self) -> float:
        """Activations, logits, transients and the optimizer step's temporary: what the
        fragmentation fraction applies to."""
        return sum(self.breakdown.get(k, 0.0) for k in ("activations", "logits", "transient",
                                                          "optimizer_step"))


def config_peak(contract_doc: Mapping[str, Any], *, changes: Mapping[str, Any] | None = None,
                cfg: PlannerConfig | None = None, source: str | None = None) -> Estimate:
    """Peak memory of the contract's configuration with `changes` (Megatron argument names →
    new values) applied, priced as given: memory.py's formulas, no fit ladder."""
    c = cfg or builtin()
    doc = with_args(thaw(contract_doc), changes) if changes else contract_doc
    model = model_spec(doc.get("model") or {}, path=source)
    lay = layout_from_contract(doc, model, world=world_size(contract_doc), source=source)
    work = workload_from_contract(doc, c, source=source)
    notes: list[str] = []
    opts = options_from_contract(doc, notes=notes)
    fused, why = attention_path(doc)
    if not fused and work.micro_batch_size:
        per = work.micro_batch_size * model.num_attention_heads * work.seq_length ** 2 / lay.tp
        why += f" ({per / GIB:.2f} Gi scores per layer and micro-batch)"
    if (doc.get("megatron_args") or {}).get("pipeline_model_parallel_layout"):
        notes.append("pipeline_model_parallel_layout priced as the planner's split of the layers")
    est = estimate_memory(model, lay, work, opts, cfg=c)
    allocated = sum(v for k, v in est.breakdown.items() if k != "overhead")
    # the optimizer term holds fp32 main params (built with the optimizer) and Adam's moments,
    # which torch's Adam (Megatron's fallback without TE and Apex) and the fused Adams build at the
    # first step: a peak read before it (Megatron's line after iteration 1) lacks them
    master = c.master_param_bytes if work.param_bytes < c.param_bytes_for("fp32") else 0
    mv = c.adam_moment_bytes_precision_aware if opts.precision_aware_optimizer \
        else c.adam_moment_bytes
    moments = est.breakdown.get("optimizer", 0.0) * mv / (master + mv) if master + mv else 0.0
    if not fused:
        why += f", softmax in {'fp32' if work.softmax_fp32 else 'bf16'}"
    return Estimate(allocated, est.peak_bytes, est.rank, dict(est.breakdown), lay, work, opts,
                    why, tuple(notes), moments)


# --------------------------------------------------------------------------------------------
# the prediction


@dataclass(frozen=True, slots=True)
class Prediction:
    """Predicted allocated peak of the changed configuration and whether it fits."""

    peak_bytes: float  # predicted max allocated of the changed configuration
    basis: str  # "measured peak … + model delta … for …" or "model only"
    fits: bool | None  # None when the GPU's memory is unknown
    headroom_bytes: float | None  # capacity − margin − peak (negative: does not fit)
    capacity_bytes: float | None
    margin_bytes: float  # CUDA context + fragmentation of the changed config's dynamic memory
    delta_bytes: float  # model(changed) − model(current), allocated
    current: Estimate  # the model's own estimate of the configuration as given
    changed: Estimate

    @property
    def peak_gib(self) -> float:
        return self.peak_bytes / GIB


def describe_changes(contract_doc: Mapping[str, Any], changes: Mapping[str, Any]) -> str:
    """`micro_batch_size 1→2, recompute_granularity full→none` (current values as given)."""
    args = effective_args(contract_doc)

    def word(v: Any) -> str:
        if v in (None, ""):
            return "none"
        return " ".join(map(str, v)) if isinstance(v, list | tuple) else str(v)

    return ", ".join(f"{k} {word(args.get(k))}→{word(v)}" for k, v in changes.items())


def safety_margin(est: Estimate, cfg: PlannerConfig | None = None) -> float:
    """What the GPU holds beyond the allocated peak: planner.yaml's CUDA context plus its
    fragmentation fraction (expandable segments or not) of the dynamic memory."""
    c = cfg or builtin()
    return c.cuda_context_bytes + c.fragmentation(est.options.expandable_segments) * \
        est.dynamic_bytes


def predict_peak(contract_doc: Mapping[str, Any], changes: Mapping[str, Any] | None = None, *,
                 measured_peak_bytes: int | float | None,
                 gpu_memory_bytes: int | float | None,
                 cfg: PlannerConfig | None = None, source: str | None = None) -> Prediction:
    """Peak of the configuration with `changes`, anchored on `measured_peak_bytes` (the run's
    max allocated) when given: measured + model(changed) − model(current); else the model alone.
    `gpu_memory_bytes` None: the contract's hardware.gpu_memory_gb (GiB, as `fit` reads it);
    neither: `fits` is None."""
    c = cfg or builtin()
    changes = dict(changes or {})
    current = config_peak(contract_doc, cfg=c, source=source)
    changed = config_peak(contract_doc, changes=changes, cfg=c, source=source) if changes \
        else current
    delta = changed.allocated_bytes - current.allocated_bytes
    what = describe_changes(contract_doc, changes) or "no change"
    if measured_peak_bytes is not None:
        peak = float(measured_peak_bytes) + delta
        basis = (f"measured peak {measured_peak_bytes / GIB:.1f} GiB + model delta "
                 f"{delta / GIB:+.1f} GiB for {what}")
    else:
        peak = changed.allocated_bytes
        basis = f"model only ({what})"
    capacity = gpu_memory_bytes
    if capacity is None:
        gb = (contract_doc.get("hardware") or {}).get("gpu_memory_gb")
        capacity = float(gb) * GIB if gb else None
    margin = safety_margin(changed, c)
    if capacity is None:
        fits, headroom = None, None
    else:
        headroom = float(capacity) - margin - peak
        fits = headroom >= 0
    return Prediction(peak, basis, fits, headroom, None if capacity is None else float(capacity),
                      margin, delta, current, changed)


def measured_from_diagnosis(diagnosis: Mapping[str, Any]) -> tuple[int | None, int | None]:
    """(peak allocated bytes, device bytes) from a diagnosis document's `memory` section
    (analyzer/device_memory.py); None where unknown (no allocator events; nsys gives reserved
    only, which is not what the anchor needs)."""
    mem = diagnosis.get("memory") or {}
    alloc, device = mem.get("peak_allocated_gib"), mem.get("device_gib")
    return (None if alloc is None else round(alloc * GIB),
            None if device is None else round(device * GIB))
