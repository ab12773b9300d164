"""Model FLOPs per training step, Megatron-LM's own formula, so TFLOP/s/GPU compare with its logs.

The one definition in moetune (the executor's workload and its validation import it from here).
Transcribed from NVIDIA/Megatron-LM `megatron/training/training.py` →
`num_floating_point_operations(args, batch_size)` → `transformer_flops()` (BSHD layout: every
sample `seq_length` tokens, full causal mask): standard attention with GQA and the optional output
gate, multi-latent attention, dense and MoE MLPs (routed experts, shared experts, latent MoE),
MTP layers and the logits. Hybrid (Mamba / linear-attention) models take another branch there
and are not modelled: `model_flops` says so instead of returning a wrong count.

Every GEMM counts 3 times (forward, backward wgrad and dgrad) and 2 FLOPs per multiply-add;
activation recompute is not counted (Megatron's figure is model FLOPs, not hardware FLOPs).
`flops_by_part` splits the same sum by the part of the model each term is for, so a phase of the
step (analyzer/phases.py) can be given its own achieved rate.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

# Parts of the model the terms belong to; keys of `flops_by_part`, named like the phases
# (analyzer/phases.yaml) whose GEMMs they count.
PARTS: tuple[str, ...] = ("attention", "dense_mlp", "experts", "shared_experts", "loss", "mtp")

# Megatron arguments that put a model on the hybrid branch of num_floating_point_operations
_HYBRID_ARGS = ("hybrid_layer_pattern", "hybrid_override_pattern", "experimental_attention_variant")


class UnsupportedModel(ValueError):
    """The arguments describe a model this transcription does not cover."""


def _get(args: Mapping[str, Any], key: str, default: Any = None) -> Any:
    value = args.get(key, default)
    return default if value is None else value


def moe_layer_pattern(num_layers: int, moe_layer_freq: Any) -> list[int]:
    """1 for each MoE layer; Megatron's `--moe-layer-freq` is an int (every k-th) or a list."""
    if isinstance(moe_layer_freq, int):
        return [1 if i % moe_layer_freq == 0 else 0 for i in range(num_layers)]
    if isinstance(moe_layer_freq, list | tuple) and len(moe_layer_freq) == num_layers:
        return [int(bool(x)) for x in moe_layer_freq]
    raise ValueError(f"moe_layer_freq {moe_layer_freq!r} does not describe {num_layers} layers")


def flops_by_part(args: Mapping[str, Any], batch_size: int) -> dict[str, float]:
    """FLOPs of one optimizer step over `batch_size` sequences (the global batch), forward +
    backward, by part of the model (`PARTS`); their sum is Megatron's `num_floating_point_operations`.

    `args` uses Megatron argument names (underscore form): num_layers, hidden_size,
    ffn_hidden_size, num_attention_heads, seq_length, padded_vocab_size (or vocab_size), and where
    set: num_experts, moe_router_topk, moe_ffn_hidden_size, moe_shared_expert_intermediate_size,
    moe_layer_freq, moe_latent_size, swiglu, group_query_attention / num_query_groups,
    kv_channels, attention_output_gate, multi_latent_attention (q_lora_rank, kv_lora_rank,
    qk_head_dim, qk_pos_emb_head_dim, v_head_dim), mtp_num_layers.
    """
    if any(args.get(k) for k in _HYBRID_ARGS):
        raise UnsupportedModel("hybrid / linear-attention models take Megatron's hybrid FLOPs "
                               "branch, which is not transcribed here")
    L = int(args["num_layers"])
    h = int(args["hidden_size"])
    s = int(args["seq_length"])
    heads = int(args["num_attention_heads"])
    ffn = int(_get(args, "ffn_hidden_size", 4 * h))
    vocab = int(_get(args, "padded_vocab_size", _get(args, "vocab_size", 0)))
    kv_channels = int(_get(args, "kv_channels", h // heads))
    groups = int(_get(args, "num_query_groups", heads)) if args.get("group_query_attention") else heads
    ffn_factor = 3 if args.get("swiglu") else 2  # SwiGLU stacks h->2·ffn and ffn->h

    if not args.get("num_experts"):
        n_dense, n_moe, topk, last_is_moe = L, 0, 0, 0
    else:
        pattern = moe_layer_pattern(L, _get(args, "moe_layer_freq", 1))
        n_moe = sum(pattern)
        n_dense = L - n_moe
        topk = int(_get(args, "moe_router_topk", 2))
        last_is_moe = pattern[-1]
    mtp = int(_get(args, "mtp_num_layers", 0))
    n_moe += last_is_moe * mtp
    n_dense += (1 - last_is_moe) * mtp
    layers = L + mtp
    moe_ffn = int(_get(args, "moe_ffn_hidden_size", ffn))
    shared = int(_get(args, "moe_shared_expert_intermediate_size", 0))
    latent = args.get("moe_latent_size")

    fb, fma = 3, 2  # forward + wgrad + dgrad; multiply-add
    if args.get("multi_latent_attention"):
        qk, qk_pos, v = (int(args["qk_head_dim"]), int(args["qk_pos_emb_head_dim"]),
                         int(args["v_head_dim"]))
        q_lora, kv_lora = args.get("q_lora_rank"), int(args["kv_lora_rank"])
        q_term = (h * heads * (qk + qk_pos) if q_lora is None
                  else int(q_lora) * (h + heads * (qk + qk_pos) + 1))
        attn_linear = fb * fma * (q_term + kv_lora * (h + heads * (qk + v) + 1) + h * qk_pos
                                  + heads * v * h)
        attn_core = fb * fma * (heads * (qk + qk_pos) / 2 + heads * v / 2)
    else:
        q_proj = kv_channels * heads
        kv_proj = kv_channels * groups
        gate = q_proj if args.get("attention_output_gate") else 0
        attn_linear = fb * fma * (h * (q_proj + 2 * kv_proj + gate) + q_proj * h)
        attn_core = fb * fma * q_proj / 2 * 2  # causal half of QKᵀ and of ·V
    tokens = batch_size * s
    if latent is None:
        routed = moe_ffn * topk * ffn_factor
    else:  # routed experts run in the latent size, plus the down and up projections
        routed = moe_ffn * topk * ffn_factor * int(latent) / h + 2 * int(latent)
    mlp = fb * fma * h
    return {
        "attention": tokens * attn_linear * layers + batch_size * s * s * attn_core * layers,
        "dense_mlp": tokens * mlp * ffn * ffn_factor * n_dense,
        "experts": tokens * mlp * routed * n_moe,
        "shared_experts": tokens * mlp * shared * ffn_factor * n_moe,
        "loss": tokens * fb * fma * h * vocab * (mtp + 1),
        "mtp": tokens * fb * fma * mtp * (3 * h + 2 * h * h),
    }


def num_floating_point_operations(args: Mapping[str, Any], batch_size: int) -> float:
    """FLOPs of one optimizer step over `batch_size` sequences (global batch), forward + backward:
    Megatron's `num_floating_point_operations(args, batch_size)`."""
    return float(sum(flops_by_part(args, batch_size).values()))


def tflops_per_gpu(args: Mapping[str, Any], batch_size: int, step_time_s: float, world: int) -> float:
    """Megatron's `throughput per GPU (TFLOP/s/GPU)`: flops / (elapsed · 1e12 · world size)."""
    if step_time_s <= 0 or world <= 0:
        return float("nan")
    return num_floating_point_operations(args, batch_size) / (step_time_s * 1e12 * world)
