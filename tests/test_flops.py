"""analyzer/flops.py: Megatron-LM's `num_floating_point_operations`, transcribed, by part."""

from __future__ import annotations

import pytest
from moetune.analyzer.flops import (
    PARTS,
    UnsupportedModel,
    flops_by_part,
    num_floating_point_operations,
)

BASE = {"num_layers": 2, "hidden_size": 64, "seq_length": 32, "num_attention_heads": 4,
        "ffn_hidden_size": 256, "padded_vocab_size": 256}


def _megatron_attention(a: dict, b: int) -> float:
    """Megatron's standard-attention terms, written as training.py does (fb·fma·(…))."""
    kv = a.get("kv_channels", a["hidden_size"] // a["num_attention_heads"])
    q = kv * a["num_attention_heads"]
    g = a["num_query_groups"] if a.get("group_query_attention") else a["num_attention_heads"]
    k = kv * g
    gate = q if a.get("attention_output_gate") else 0
    lin = 6 * (a["hidden_size"] * (q + 2 * k + gate) + q * a["hidden_size"])
    core = 6 * q / 2 * 2
    return a["num_layers"] * (b * a["seq_length"] * lin + b * a["seq_length"] ** 2 * core)


def test_parts_sum_to_the_total_and_split_the_model() -> None:
    moe = {**BASE, "num_experts": 8, "moe_router_topk": 2, "moe_ffn_hidden_size": 128,
           "moe_shared_expert_intermediate_size": 64, "moe_layer_freq": [0, 1]}
    parts = flops_by_part(moe, 3)
    assert set(parts) == set(PARTS)
    assert sum(parts.values()) == num_floating_point_operations(moe, 3)
    t = 3 * 32
    assert parts["dense_mlp"] == t * 6 * 64 * 256 * 2 * 1        # one dense layer
    assert parts["experts"] == t * 6 * 64 * 128 * 2 * 2 * 1      # topk 2, one MoE layer
    assert parts["shared_experts"] == t * 6 * 64 * 64 * 2 * 1
    assert parts["loss"] == t * 6 * 64 * 256
    assert parts["attention"] == pytest.approx(_megatron_attention(moe, 3))


def test_gqa_gate_and_swiglu_follow_megatron() -> None:
    gqa = {**BASE, "group_query_attention": True, "num_query_groups": 2,
           "attention_output_gate": True, "swiglu": True}
    parts = flops_by_part(gqa, 2)
    assert parts["attention"] == pytest.approx(_megatron_attention(gqa, 2))
    assert parts["dense_mlp"] == 2 * 32 * 6 * 64 * 256 * 3 * 2  # SwiGLU: factor 3


def test_mla_branch_and_hybrid_refused() -> None:
    mla = {**BASE, "multi_latent_attention": True, "q_lora_rank": None, "kv_lora_rank": 16,
           "qk_head_dim": 16, "qk_pos_emb_head_dim": 8, "v_head_dim": 16}
    q_term = 64 * 4 * (16 + 8)
    lin = 6 * (q_term + 16 * (64 + 4 * (16 + 16) + 1) + 64 * 8 + 4 * 16 * 64)
    core = 6 * (4 * (16 + 8) / 2 + 4 * 16 / 2)
    assert flops_by_part(mla, 1)["attention"] == pytest.approx(2 * (32 * lin + 32 * 32 * core))
    with pytest.raises(UnsupportedModel):
        flops_by_part({**BASE, "hybrid_layer_pattern": "M*M*"}, 1)
