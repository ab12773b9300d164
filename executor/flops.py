"""Model FLOPs per training step, Megatron-LM's own formula, so TFLOP/s/GPU compare with its logs.

Transcribed from NVIDIA/Megatron-LM `megatron/training/training.py` →
`num_floating_point_operations(args, batch_size)` (`_transformer_flops`, standard attention branch;
MLA and hybrid/Mamba layers are not modelled here). Terms per token, ×3 for forward + two backward
GEMMs (wgrad, dgrad), ×2 for the two GEMMs of each block, ×2 for multiply-add:

- attention: 12·L·h²·(1 + g/a + s/(2h))·(q_proj/h)   (QKV+proj; causal half of QKᵀ and ·V)
- MLP: 12·L·h·(ffn·γ·dense_frac + moe_ffn·topk·γ·moe_frac + shared·γ·moe_frac), γ = 3/2 for SwiGLU
- logits: 6·h·V·(mtp + 1); MTP norms/projections: 6·mtp·(3h + 2h²)
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any


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


def num_floating_point_operations(args: Mapping[str, Any], batch_size: int) -> float:
    """FLOPs of one optimizer step over `batch_size` sequences (global batch), forward + backward.

    `args` uses Megatron argument names (underscore form): num_layers, hidden_size,
    ffn_hidden_size, num_attention_heads, seq_length, padded_vocab_size (or vocab_size), and for
    MoE num_experts, moe_router_topk, moe_ffn_hidden_size, moe_shared_expert_intermediate_size,
    moe_layer_freq, swiglu, num_query_groups / group_query_attention, kv_channels, mtp_num_layers.
    """
    L = int(args["num_layers"])
    h = int(args["hidden_size"])
    s = int(args["seq_length"])
    heads = int(args["num_attention_heads"])
    ffn = int(_get(args, "ffn_hidden_size", 4 * h))
    vocab = int(_get(args, "padded_vocab_size", _get(args, "vocab_size", 0)))
    kv_channels = int(_get(args, "kv_channels", h // heads))
    groups = int(_get(args, "num_query_groups", heads)) if args.get("group_query_attention") else heads
    swiglu = 1.5 if args.get("swiglu") else 1.0

    num_experts = args.get("num_experts")
    if not num_experts:
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

    expansion = 3 * 2 * 2
    q_ratio = kv_channels * heads / h
    attn = expansion * layers * h * h * ((1 + groups / heads + s / h / 2) * q_ratio)
    mlp = (
        expansion
        * layers
        * h
        * (
            ffn * swiglu * (n_dense / layers)
            + moe_ffn * topk * swiglu * (n_moe / layers)
            + shared * swiglu * (n_moe / layers)
        )
    )
    mtp_proj = 3 * 2 * mtp * (3 * h + 2 * h * h)
    logits = 3 * 2 * h * vocab * (mtp + 1)
    return float(batch_size * s * (mlp + attn + mtp_proj + logits))


def tflops_per_gpu(args: Mapping[str, Any], batch_size: int, step_time_s: float, world: int) -> float:
    """Megatron's `throughput per GPU (TFLOP/s/GPU)`: flops / (elapsed · 1e12 · world size)."""
    if step_time_s <= 0 or world <= 0:
        return float("nan")
    return num_floating_point_operations(args, batch_size) / (step_time_s * 1e12 * world)
