"""Per-GPU memory model of Megatron-Core MoE GPT training (pure arithmetic, bytes). The model's
dimensions and parameter counts are in model.py, the unfused attention's bytes per score in
attention.py; this module is the layout, the activations and the estimate.

Sources, cited where each term is computed:
- [TMU] Megatron-LM `megatron/training/theoretical_memory_usage.py` (parameter counts incl. MLA and
  MTP; 18 bytes/param, or 6 + 12/DP with the distributed optimizer; the interleaved in-flight factor).
- [KOR] Korthikanti et al. 2022, "Reducing Activation Recomputation in Large Transformer Models"
  (arXiv 2205.05198) Table 2: per-layer activations 34·sbh + 5·as²b bytes; SP shards the 10·sbh
  norm/dropout part by TP, selective recompute removes the 5·as²b attention part.
- [SCHED] megatron-core 0.16 `pipeline_parallel/schedules.py` `get_pp_rank_microbatches`: warmup
  micro-batches (PP−r−1) for 1F1B; (PP−r−1)·2 + (VPP−1)·PP for interleaved, +1 with EP overlap.
- [OPT] megatron-core 0.16 `optimizer/__init__.py`: dense optimizer state is sharded over the
  DP×CP group (`intra_dp_cp_group`), expert state over the expert-DP group (EDP).
- [EXP] megatron-core 0.16 `transformer/moe/experts.py`: router probs are applied inside the
  activation (`activation_func_with_probs`), so the expert FC2 output is not kept for unpermute.

The numbers these formulas assume (allocator overhead, bytes per element of each state and of
saved activations whose dtype is an assumption) live in `planner.yaml` (config.py); every function
takes them as `cfg`, the built-in file when None.

Deliberate simplifications (docs/planner.md lists them): fused (flash) attention, so only Q, K, V,
the output and the softmax statistics are saved and `core_attn` recompute saves ~nothing
(Megatron-Bridge's activation-recompute skill measured −0.01 %); no dropout; fused SwiGLU;
bias-free linears.

Priced when a configuration says so (predict.py reads them from a contract, as given): unfused
attention (`Workload.fused_attention` False: no Transformer Engine, the local spec) with its saved
scores, its softmax-backward peak and its persistent score buffer (`UNFUSED_SCORE_*`, megatron-core
0.19 `transformer/dot_product_attention.py` and `fusions/fused_softmax.py`; an H200 run's allocator
history); full recompute by `recompute_method`/`recompute_num_layers` (`_full_recompute`, megatron-core
`transformer/transformer_block.py`); fine-grained activation offload (`OFFLOAD_MODULES`).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Literal

from moetune.analyzer.planner.attention import (
    DROPOUT_MASK_BYTES as DROPOUT_MASK_BYTES,
)
from moetune.analyzer.planner.attention import (
    UNFUSED_SCORE_BUFFER,
    peak_per_score,
    saved_per_score,
)
from moetune.analyzer.planner.attention import (
    UNFUSED_SCORE_PEAK as UNFUSED_SCORE_PEAK,
)
from moetune.analyzer.planner.config import GIB, PlannerConfig, builtin
from moetune.analyzer.planner.model import (
    LayerParams as LayerParams,
)
from moetune.analyzer.planner.model import (
    ModelSpec,
    layer_params,
    padded_vocab,
)
from moetune.analyzer.planner.model import (
    attention_params as attention_params,
)
from moetune.analyzer.planner.model import (
    model_spec as model_spec,
)
from moetune.analyzer.planner.model import (
    parse_moe_layer_freq as parse_moe_layer_freq,
)
from moetune.analyzer.planner.model import (
    total_params as total_params,
)

RECOMPUTE_MODULES = ("core_attn", "moe_act", "layernorm", "mla_up_proj", "mlp", "moe",
                     "shared_experts")


# --------------------------------------------------------------------------------------------
# layout and options as the memory model sees them


@dataclass(frozen=True, kw_only=True, slots=True)
class Layout:
    """One Parallel Folding layout: attention TP×CP×DP×PP, MoE ETP×EP×EDP×PP (PP shared).

    `stages[v]` lists the decoder-layer indices of virtual stage v (v = chunk·PP + pp_rank);
    `pp_layout` is the `--pipeline-model-parallel-layout` string when the split is uneven."""

    tp: int
    cp: int
    dp: int
    pp: int
    vpp: int | None
    ep: int
    etp: int
    edp: int
    stages: tuple[tuple[int, ...], ...]
    pp_layout: str | None = None
    pp_split: Literal["even", "account_for_embedding_and_loss", "layout"] = "even"

    @property
    def sequence_parallel(self) -> bool:
        return self.tp > 1  # Megatron requires SP with TP>1 under EP; always worth it with TP

    @property
    def world(self) -> int:
        return self.tp * self.cp * self.dp * self.pp

    @property
    def chunks(self) -> int:
        return self.vpp or 1

    def rank_layers(self, rank: int) -> list[int]:
        return [i for c in range(self.chunks) for i in self.stages[c * self.pp + rank]]

    def key(self) -> tuple[int, int, int, int, int | None, int, int]:
        return (self.tp, self.cp, self.dp, self.pp, self.vpp, self.ep, self.etp)


Recompute = Literal["none", "selective", "full"]


@dataclass(frozen=True, kw_only=True, slots=True)
class FitOptions:
    """Memory-saving settings the planner may turn on (the fit ladder, plan.py)."""

    expandable_segments: bool = True
    distributed_optimizer: bool = True
    recompute: Recompute = "none"
    recompute_modules: tuple[str, ...] = ()
    precision_aware_optimizer: bool = False  # --exp-avg-dtype bf16 --exp-avg-sq-dtype bf16
    optimizer_offload_fraction: float = 0.0
    # as a contract gives them (the ladder keeps the defaults: uniform, one layer per checkpoint)
    recompute_method: Literal["uniform", "block"] = "uniform"
    recompute_num_layers: int = 1
    offload_modules: tuple[str, ...] = ()  # --fine-grained-activation-offloading --offload-modules
    activation_offload_fraction: float = 1.0


@dataclass(frozen=True, kw_only=True, slots=True)
class Workload:
    """What the contract fixes: shapes, precision and routing."""

    seq_length: int
    micro_batch_size: int = 1
    global_batch_size: int | None = None
    fp8: bool = False
    # bf16 params and fp32 main grads (Megatron's default for bf16 training) [TMU]; bytes from
    # planner.yaml `bytes_per_element`
    param_bytes: int = field(default_factory=lambda: builtin().param_bytes_for("bf16"))
    main_grad_bytes: int = field(default_factory=lambda: builtin().main_grad_bytes_for("fp32"))
    moe_imbalance: float = 1.0  # max/mean tokens per expert rank (capacity factor when dropping)
    ep_overlap: bool = False  # one extra warmup micro-batch [SCHED]
    fused_attention: bool = True  # False: local/unfused attention keeps the s×s scores
    attention_dropout: float = 0.0  # unfused attention also keeps a dropout mask when > 0
    softmax_fp32: bool = True  # unfused attention's softmax dtype (attention.py): megatron-core's
    #   default; Megatron-LM runs it in bf16 unless --attention-softmax-in-fp32
    # unfused attention's persistent bf16 score buffer (UNFUSED_SCORE_BUFFER) counts in the peak:
    # True for a training run (predict.py, fit); False where it is held before the measured window
    # (fixtures/planner/measured.json ran its configs in one process: its baseline holds the
    # buffer of the earlier configs, tests/test_memory_prediction.py corrects for it)
    score_buffer: bool = False
    cross_entropy_fusion: bool = False  # Megatron default: unfused vocab-parallel cross entropy
    # torch's Adam(W) as the optimizer (Megatron's fallback without Transformer Engine and Apex):
    # its step's fp32 temporary can set the peak (planner.yaml `torch_adam_step_temporary`)
    torch_adam: bool = False

    def microbatches(self, dp: int) -> int | None:
        if self.global_batch_size is None:
            return None
        return self.global_batch_size // (self.micro_batch_size * dp)


# --------------------------------------------------------------------------------------------
# activations [KOR], bytes per token of the micro-batch sequence (s·b tokens)


def layer_activation_per_token(m: ModelSpec, lay: Layout, w: Workload, opts: FitOptions,
                               is_moe: bool, *, cfg: PlannerConfig | None = None
                               ) -> dict[str, float]:
    """Saved activations of one layer on one GPU, bytes per token of the s·b sequence, by part
    (what stays on the GPU: inputs moved to the CPU by fine-grained offloading are left out)."""
    return _layer_activations(m, lay, w, opts, is_moe, cfg or builtin())[0]


# Fine-grained activation offloading (megatron-core 0.19 `transformer_config.py`
# `offload_modules`): the input each module saves goes to the CPU after its forward and comes back
# before its backward; `_layer_activations` takes each module's input out of the part it is in.
OFFLOAD_MODULES = ("attn_norm", "qkv_linear", "core_attn", "attn_proj", "mlp_norm", "expert_fc1",
                   "moe_act", "fused_group_mlp")


def unfused_attention_saved_per_score(w: Workload, cfg: PlannerConfig) -> float:
    """Bytes per score one layer's unfused attention keeps for backward (0 when fused):
    attention.py, by the softmax's dtype and dropout."""
    return saved_per_score(w, cfg)


def _layer_activations(m: ModelSpec, lay: Layout, w: Workload, opts: FitOptions, is_moe: bool,
                       c: PlannerConfig) -> tuple[dict[str, float], float]:
    """(saved bytes per token by part, bytes per token moved to the CPU by activation offload)."""
    h = m.hidden_size
    tp_div = lay.tp * lay.cp  # head/FFN-sharded tensors
    sp_div = lay.cp * (lay.tp if lay.sequence_parallel else 1)  # norm/residual tensors
    lin = c.linear_input_fp8 if w.fp8 else c.linear_input_bf16  # saved linear inputs
    mods = set(opts.recompute_modules) if opts.recompute == "selective" else set()
    if opts.recompute == "full":
        return {"layer_input": 2 * h / sp_div}, 0.0  # full recompute keeps the layer's input
    off = set(opts.offload_modules)
    moved: dict[str, float] = {}  # module -> bytes per token it sends to the CPU
    out: dict[str, float] = {"norm_inputs": 2 * (2 * h) / sp_div}
    moved["attn_norm"] = moved["mlp_norm"] = 2 * h / sp_div
    if "layernorm" not in mods:  # LN outputs feeding QKV and FC1/router
        out["norm_outputs"] = 2 * lin * h / sp_div
        moved["qkv_linear"] = lin * h / sp_div
    n = m.num_attention_heads
    if m.multi_latent_attention:
        qk, rope, v = m.qk_head_dim, m.qk_pos_emb_head_dim, m.v_head_dim
        latent = (m.q_lora_rank or 0) + m.kv_lora_rank
        out["mla_latents"] = (2 + lin) * latent / sp_div  # latent norm input + up-proj input
        if "mla_up_proj" not in mods:
            out["qkv"] = 2 * n * (2 * (qk + rope) + v) / tp_div
            moved["core_attn"] = out["qkv"]
        out["attn_out"] = (2 * n * v + c.softmax_stats_per_head * n) / tp_div  # O + stats
        moved["attn_proj"] = 2 * n * v / tp_div
    else:
        qd, kvd = n * m.kv_channels, m.num_query_groups * m.kv_channels
        out["qkv"] = 2 * (qd + 2 * kvd) / tp_div
        moved["core_attn"] = out["qkv"]
        out["attn_out"] = (2 * qd + c.softmax_stats_per_head * n) / tp_div
        moved["attn_proj"] = 2 * qd / tp_div
    if not w.fused_attention and "core_attn" not in mods:
        # unfused DotProductAttention (megatron-core `dot_product_attention.py`, torch softmax
        # fallback with attention_softmax_in_fp32=True): the fp32 softmax output (4·a·s²·b) and
        # the bf16 probabilities fed to the V bmm (2·a·s²·b) are saved [KOR's 5as²b has dropout]
        # queries split by TP heads, CP
        out["attn_scores"] = unfused_attention_saved_per_score(w, c) * n * w.seq_length / tp_div
    gate = 2 if m.swiglu else 1
    if not is_moe:
        if "mlp" not in mods:
            f = m.ffn_hidden_size
            out["mlp"] = (2 * gate * f + lin * f) / tp_div
    elif "moe" not in mods:  # the MoE checkpoint keeps only its input (the LN output above)
        e, k, f = m.num_experts, m.moe_router_topk, m.moe_ffn_hidden_size
        out["router"] = c.router_per_expert * e / sp_div  # fp32 logits + probs
        # Per GPU the experts see s·b·k·imb·ETP/(TP·CP) token copies (ETP ranks share tokens,
        # split F): FC1 input (h), FC1 output (gate·F/ETP), activation output = FC2 input (F/ETP)
        # [EXP].
        copies = k * w.moe_imbalance / tp_div
        expert = copies * (lin * h * lay.etp + 2 * gate * f)
        moved["expert_fc1"] = copies * lin * h * lay.etp
        moved["moe_act"] = copies * 2 * gate * f
        if "moe_act" not in mods:
            expert += copies * lin * f
        out["experts"] = expert
        moved["fused_group_mlp"] = expert
        s = m.moe_shared_expert_intermediate_size
        if s and "shared_experts" not in mods:
            out["shared_expert"] = (2 * gate * s + lin * s) / tp_div
    if not off:
        return out, 0.0
    # what each offloaded module's input is part of (its saved bytes leave the GPU)
    home = {"attn_norm": "norm_inputs", "mlp_norm": "norm_inputs", "qkv_linear": "norm_outputs",
            "core_attn": "qkv", "attn_proj": "attn_out", "expert_fc1": "experts",
            "moe_act": "experts", "fused_group_mlp": "experts"}
    total = 0.0
    for mod in sorted(off):
        part = home.get(mod)
        if part not in out or mod not in moved:
            continue
        b = min(moved[mod] * opts.activation_offload_fraction, out[part])
        out[part] -= b
        total += b
    return out, total


def dispatch_buffer_per_token(m: ModelSpec, lay: Layout, w: Workload) -> float:
    """Transient all-to-all send+receive buffers of one MoE layer (hidden states × top-k)."""
    if not m.num_experts:
        return 0.0
    k = m.moe_router_topk
    return 2 * m.hidden_size * k * (1 + w.moe_imbalance * lay.etp) / (lay.tp * lay.cp)


def inflight_layer_microbatches(lay: Layout, rank: int, n_micro: int | None,
                                ep_overlap: bool) -> float:
    """Micro-batch copies of this rank's layers held at the backward peak [SCHED].

    1F1B: PP−r (warmup PP−r−1 plus the first steady forward). Interleaved: warmup chunks
    (PP−r−1)·2 + (VPP−1)·PP, +1, each chunk 1/VPP of the rank's layers; for rank 0 this is
    PP·(1 + (PP−1)/(PP·VPP)), Megatron's interleaved penalty [TMU]."""
    pp = lay.pp
    if pp == 1:
        return 1.0
    if lay.vpp is None:
        n = pp - rank + (1 if ep_overlap else 0)
        return float(min(n, n_micro) if n_micro else n)
    chunks = (pp - rank - 1) * 2 + (lay.vpp - 1) * pp + 1 + (1 if ep_overlap else 0)
    if n_micro:
        chunks = min(chunks, n_micro * lay.vpp)
    return chunks / lay.vpp


# --------------------------------------------------------------------------------------------
# the estimate


@dataclass(frozen=True, slots=True)
class MemoryEstimate:
    """Peak bytes on the most loaded GPU (`rank` = its pipeline rank) and its breakdown."""

    peak_bytes: float
    rank: int
    breakdown: Mapping[str, float]  # bytes: weights, gradients, optimizer, activations, ...
    by_rank: tuple[float, ...] = field(default=())

    @property
    def peak_gib(self) -> float:
        return self.peak_bytes / GIB


def rank_memory(m: ModelSpec, lay: Layout, w: Workload, opts: FitOptions,
                rank: int, *, cfg: PlannerConfig | None = None) -> dict[str, float]:
    """Memory of pipeline rank `rank` (any TP/CP/DP/EP coordinate: they are symmetric), bytes."""
    c = cfg or builtin()
    return _rank_memory(m, lay, w, opts, rank, _per_kind(m, lay, w, opts, c), c)


@dataclass(frozen=True, slots=True)
class _Kind:
    """Per-GPU parameters and saved activations (bytes/token) of one dense or MoE layer."""

    dense: float
    expert: float
    saved: float
    rebuilt: float  # recomputed in backward (saved without recompute − saved − offloaded)
    full: float = 0.0  # saved without recompute or offload
    reload: float = 0.0  # offloaded to the CPU, back on the GPU for the layer in backward
    attn_extra: float = 0.0  # unfused attention: scores alive beyond the saved ones while it runs


def _per_kind(m: ModelSpec, lay: Layout, w: Workload, opts: FitOptions,
              cfg: PlannerConfig) -> dict[bool, _Kind]:
    none = FitOptions(recompute="none")
    out = {}
    attn_extra = 0.0
    if not w.fused_attention:
        # one layer's softmax backward: its peak (attention.py) less what that layer saved (freed
        # by then or counted as saved); with `core_attn` or full recompute the saved part is rebuilt
        attn_extra = (max(0.0, peak_per_score(w) - unfused_attention_saved_per_score(w, cfg))
                      * m.num_attention_heads * w.seq_length / (lay.tp * lay.cp))
    for is_moe in (False, True):
        p = layer_params(m, is_moe)
        parts, moved = _layer_activations(m, lay, w, opts, is_moe, cfg)
        saved = sum(parts.values())
        full = sum(layer_activation_per_token(m, lay, w, none, is_moe, cfg=cfg).values())
        out[is_moe] = _Kind(p.dense / lay.tp + p.replicated, p.expert / (lay.ep * lay.etp),
                            saved, full - saved - moved, full, moved, attn_extra)
    return out


def _full_recompute(lay: Layout, rank: int, pattern: tuple[int, ...], opts: FitOptions,
                    kinds: Mapping[bool, _Kind]) -> tuple[float, float]:
    """(saved, rebuilt) bytes per token of rank `rank` under full recompute as Megatron-Core's
    `TransformerBlock._checkpointed_forward` runs it, per model chunk: `uniform` checkpoints
    groups of `recompute_num_layers` layers (keeps each group's input, rebuilds a whole group in
    its backward); `block` checkpoints the first `recompute_num_layers` layers of the chunk and
    keeps every activation of the others."""
    n = opts.recompute_num_layers  # block: 0 recomputes nothing; uniform: groups of ≥ 1
    saved = rebuilt = 0.0
    for c in range(lay.chunks):
        layers = lay.stages[c * lay.pp + rank]
        kind = [kinds[bool(pattern[i])] for i in layers]
        if opts.recompute_method == "block":
            head, tail = kind[:n], kind[n:]
            saved += sum(k.saved for k in head) + sum(k.full for k in tail)
            rebuilt = max([rebuilt, *(k.rebuilt for k in head)])
        else:
            for g in range(0, len(kind), max(1, n)):
                group = kind[g:g + max(1, n)]
                saved += group[0].saved
                rebuilt = max(rebuilt, sum(k.full for k in group) - group[0].saved)
    return saved, rebuilt


@lru_cache(maxsize=4096)
def _rank_counts(stages: tuple[tuple[int, ...], ...], pp: int, chunks: int,
                 pattern: tuple[int, ...]) -> tuple[tuple[int, int], ...]:
    """(dense, MoE) decoder-layer counts per pipeline rank (cached: layouts share splits)."""
    out = []
    for r in range(pp):
        layers = [i for c in range(chunks) for i in stages[c * pp + r]]
        moe = sum(pattern[i] for i in layers)
        out.append((len(layers) - moe, moe))
    return tuple(out)


def _rank_memory(m: ModelSpec, lay: Layout, w: Workload, opts: FitOptions, rank: int,
                 kinds: Mapping[bool, _Kind], cfg: PlannerConfig) -> dict[str, float]:
    first, last = rank == 0, rank == lay.pp - 1
    n_dense, n_moe = _rank_counts(lay.stages, lay.pp, lay.chunks, m.moe_pattern)[rank]
    present = [kinds[k] for k, n in ((False, n_dense), (True, n_moe)) if n]
    h = m.hidden_size
    vocab = padded_vocab(m, lay.tp, cfg=cfg)
    dense = n_dense * kinds[False].dense + n_moe * kinds[True].dense
    expert = n_moe * kinds[True].expert
    if first:
        dense += vocab * h / lay.tp
    mtp_kind = kinds[bool(m.moe_pattern[-1])]
    if last:
        dense += h * m.norm_params  # final norm
        tied_copy = not m.untie_embeddings_and_output_weights and lay.pp > 1
        if m.untie_embeddings_and_output_weights or tied_copy:
            dense += vocab * h / lay.tp
        if m.mtp_num_layers:
            # MTP block on the last stage [TMU]: a layer + eh_proj + norms; it needs the
            # embedding there too when PP>1
            per = mtp_kind.dense + 2 * h * h / lay.tp + 3 * h * m.norm_params
            dense += m.mtp_num_layers * per + (vocab * h / lay.tp if lay.pp > 1 else 0)
            expert += m.mtp_num_layers * mtp_kind.expert

    # states: bf16 weights, fp32 main grads, fp32 main params + Adam m, v [TMU][OPT]
    master = cfg.master_param_bytes if w.param_bytes < cfg.param_bytes_for("fp32") else 0
    mv = cfg.adam_moment_bytes_precision_aware if opts.precision_aware_optimizer \
        else cfg.adam_moment_bytes
    dense_shard = lay.dp * lay.cp if opts.distributed_optimizer else 1
    expert_shard = lay.edp if opts.distributed_optimizer else 1
    on_gpu = 1.0 - opts.optimizer_offload_fraction
    optimizer = (master + mv) * (dense / dense_shard + expert / expert_shard) * on_gpu

    sb = w.seq_length * w.micro_batch_size
    inflight = inflight_layer_microbatches(lay, rank, w.microbatches(lay.dp), w.ep_overlap)
    rebuilt = max((k.rebuilt for k in present), default=0.0)
    if opts.recompute == "full" and (opts.recompute_method, opts.recompute_num_layers) != \
            ("uniform", 1):
        saved, rebuilt = _full_recompute(lay, rank, m.moe_pattern, opts, kinds)
    else:
        saved = n_dense * kinds[False].saved + n_moe * kinds[True].saved
    activations = sb * inflight * saved
    buffer = 0.0
    if not w.fused_attention and w.score_buffer:
        # the unfused attention's persistent bf16 score buffer, one micro-batch's size
        buffer = sb * UNFUSED_SCORE_BUFFER * m.num_attention_heads * w.seq_length / (
            lay.tp * lay.cp)
        activations += buffer
    if first:
        activations += cfg.token_id * sb * inflight  # token ids of in-flight micro-batches
    logits = 0.0
    if last:
        # final-norm output + logits, vocab split by TP [TMU: 4·sbh + 4·sbV]. Unfused vocab-parallel
        # cross entropy turns its fp32 copy of the logits into the softmax and then the gradient
        # in place, beside the bf16 logits (forward) or the bf16 gradient (backward): 6V. One
        # micro-batch (the last stage runs its backward at once), plus one per MTP depth.
        per_vocab = (cfg.cross_entropy_per_vocab_fused if w.cross_entropy_fusion
                     else cfg.cross_entropy_per_vocab_unfused)
        logits = (sb * (cfg.final_norm_output * h + per_vocab * vocab) / (lay.tp * lay.cp)
                  * (1 + m.mtp_num_layers))
        activations += sb * m.mtp_num_layers * mtp_kind.saved
    # recomputation rebuilds one layer's discarded activations during its backward (a group's
    # with uniform recompute of N layers) and offloaded inputs come back for it; the dispatch
    # buffers (MoE part) and the unfused attention's transient scores are not alive at once
    reload = max((k.reload for k in present), default=0.0)
    attn = max((k.attn_extra for k in present), default=0.0)
    transient = sb * (rebuilt + max(dispatch_buffer_per_token(m, lay, w), attn) + reload)
    # the logit/cross-entropy buffers are freed once the output layer's backward is done, before
    # any decoder layer is recomputed: on the last stage only the excess over them adds
    transient = max(0.0, transient - logits)
    # the optimizer's step runs after backward, the activations freed (the persistent score buffer
    # stays): torch's Adam adds an fp32 temporary per parameter it steps, the peak of a run whose
    # activations are smaller than that (full recompute, small micro-batches)
    step = 0.0
    if w.torch_adam:
        stepped = (dense / dense_shard + expert / expert_shard) * on_gpu
        step = max(0.0, cfg.torch_adam_step_temporary * stepped
                   - (activations - buffer + logits + transient))
    dynamic = activations + logits + transient + step
    return {
        "weights": (dense + expert) * w.param_bytes,
        "gradients": (dense + expert) * w.main_grad_bytes,
        "optimizer": optimizer,
        "activations": activations,
        "logits": logits,
        "transient": transient,
        "optimizer_step": step,
        "overhead": cfg.cuda_context_bytes + cfg.fragmentation(opts.expandable_segments) * dynamic,
    }


def estimate_memory(m: ModelSpec, lay: Layout, w: Workload, opts: FitOptions, *,
                    cfg: PlannerConfig | None = None) -> MemoryEstimate:
    """Peak per-GPU memory: the maximum over pipeline ranks of `rank_memory`."""
    c = cfg or builtin()
    kinds = _per_kind(m, lay, w, opts, c)
    per_rank = [_rank_memory(m, lay, w, opts, r, kinds, c) for r in range(lay.pp)]
    totals = tuple(sum(d.values()) for d in per_rank)
    worst = max(range(lay.pp), key=totals.__getitem__)
    return MemoryEstimate(totals[worst], worst, per_rank[worst], totals)
