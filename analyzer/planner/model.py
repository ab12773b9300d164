"""The model a contract describes, as the memory model sees it: dimensions (Megatron argument
names, `ModelSpec`, from a contract's `model` section) and parameter counts per layer and in all
[TMU] (Megatron-LM `megatron/training/theoretical_memory_usage.py`: incl. MLA and MTP)."""

from __future__ import annotations

import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

from moetune.analyzer.planner.config import PlannerConfig, builtin

from moetune.errors import UserError

# --------------------------------------------------------------------------------------------
# model


@dataclass(frozen=True, kw_only=True, slots=True)
class ModelSpec:
    """Dimensions of an MoE GPT, Megatron argument names; `moe_pattern[i]` is 1 for an MoE layer."""

    name: str | None
    num_layers: int
    hidden_size: int
    ffn_hidden_size: int
    num_attention_heads: int
    num_query_groups: int
    kv_channels: int
    num_experts: int  # 0 for a dense model
    moe_router_topk: int
    moe_ffn_hidden_size: int
    moe_shared_expert_intermediate_size: int
    moe_pattern: tuple[int, ...]
    vocab_size: int
    mtp_num_layers: int
    multi_latent_attention: bool
    q_lora_rank: int | None
    kv_lora_rank: int
    qk_head_dim: int
    qk_pos_emb_head_dim: int
    v_head_dim: int
    swiglu: bool
    untie_embeddings_and_output_weights: bool
    norm_params: int  # per normalized element: 1 RMSNorm, 2 LayerNorm
    qk_layernorm: bool


def parse_moe_layer_freq(value: Any, num_layers: int, *, path: str | None = None) -> tuple[int, ...]:
    """Megatron `--moe-layer-freq`: int N (layer i is MoE when i % N == 0), a 0/1 list, or a
    pattern string such as "([0]*3+[1]*58)" (parsed, never evaluated)."""
    if isinstance(value, bool):
        raise UserError(f"model.moe_layer_freq: expected int, list or pattern, got {value}", path=path)
    if isinstance(value, int):
        if value < 1:
            raise UserError(f"model.moe_layer_freq must be ≥ 1, got {value}", path=path)
        return tuple(1 if i % value == 0 else 0 for i in range(num_layers))
    if isinstance(value, str):
        pattern = _parse_pattern(value.replace(" ", ""), path=path)
    elif isinstance(value, Sequence):
        pattern = [int(v) for v in value]
    else:
        raise UserError(f"model.moe_layer_freq: cannot read {value!r}", path=path)
    if len(pattern) != num_layers or any(v not in (0, 1) for v in pattern):
        raise UserError(
            f"model.moe_layer_freq: pattern has {len(pattern)} entries of 0/1 expected "
            f"{num_layers} (num_layers)", path=path)
    return tuple(pattern)


_TERM = re.compile(r"^\[([01](?:,[01])*)\](?:\*(\d+))?$")


def _parse_pattern(text: str, *, path: str | None) -> list[int]:
    """Grammar: expr := term ('+' term)*; term := '[' 0/1 list ']' ('*' int)? | '(' expr ')' ('*' int)?"""
    def expr(s: str) -> list[int]:
        out: list[int] = []
        depth, start = 0, 0
        for i, ch in enumerate(s + "+"):
            depth += (ch == "(") - (ch == ")")
            if ch == "+" and depth == 0:
                out += term(s[start:i])
                start = i + 1
        return out

    def term(s: str) -> list[int]:
        m = re.match(r"^\((.*)\)(?:\*(\d+))?$", s)
        if m:
            return expr(m.group(1)) * int(m.group(2) or 1)
        m = _TERM.match(s)
        if not m:
            raise UserError(f"model.moe_layer_freq: cannot parse pattern {text!r}", path=path)
        return [int(v) for v in m.group(1).split(",")] * int(m.group(2) or 1)

    return expr(text)


def model_spec(section: Mapping[str, Any], *, path: str | None = None) -> ModelSpec:
    """Typed model from a contract's `model` section; missing dimensions → one UserError naming all."""
    m = dict(section or {})
    missing = [k for k in ("num_layers", "hidden_size", "num_attention_heads") if m.get(k) is None]
    if m.get("vocab_size") is None and m.get("padded_vocab_size") is None:
        missing.append("vocab_size")
    if "num_experts" not in m:
        missing.append("num_experts")
    experts = int(m.get("num_experts") or 0)
    if experts:
        if m.get("moe_router_topk") is None:
            missing.append("moe_router_topk")
        if m.get("moe_ffn_hidden_size") is None and m.get("ffn_hidden_size") is None:
            missing.append("moe_ffn_hidden_size")
    mla = bool(m.get("multi_latent_attention"))
    if mla:
        missing += [k for k in ("kv_lora_rank", "qk_head_dim", "qk_pos_emb_head_dim", "v_head_dim")
                    if m.get(k) is None]
    if missing:
        raise UserError(f"model section lacks {', '.join('model.' + k for k in missing)} "
                        "(needed by the memory model)", path=path)
    layers = int(m["num_layers"])
    pattern = (parse_moe_layer_freq(m.get("moe_layer_freq", 1), layers, path=path) if experts
               else (0,) * layers)
    if sum(pattern) < layers and m.get("ffn_hidden_size") is None:
        raise UserError("model section lacks model.ffn_hidden_size (dense layers need it)", path=path)
    h, heads = int(m["hidden_size"]), int(m["num_attention_heads"])
    kv_channels = int(m.get("kv_channels") or h // heads)
    groups = int(m.get("num_query_groups") or heads)
    ffn = int(m.get("ffn_hidden_size") or 0)
    vocab = int(m.get("vocab_size") or m.get("padded_vocab_size"))
    norm = str(m.get("normalization") or "RMSNorm")
    return ModelSpec(
        name=m.get("name"),
        num_layers=layers,
        hidden_size=h,
        ffn_hidden_size=ffn,
        num_attention_heads=heads,
        num_query_groups=groups,
        kv_channels=kv_channels,
        num_experts=experts,
        moe_router_topk=int(m.get("moe_router_topk") or 0),
        moe_ffn_hidden_size=int(m.get("moe_ffn_hidden_size") or ffn),
        moe_shared_expert_intermediate_size=int(m.get("moe_shared_expert_intermediate_size") or 0),
        moe_pattern=pattern,
        vocab_size=vocab,
        mtp_num_layers=int(m.get("mtp_num_layers") or 0),
        multi_latent_attention=mla,
        q_lora_rank=m.get("q_lora_rank"),
        kv_lora_rank=int(m.get("kv_lora_rank") or 0),
        qk_head_dim=int(m.get("qk_head_dim") or 0),
        qk_pos_emb_head_dim=int(m.get("qk_pos_emb_head_dim") or 0),
        v_head_dim=int(m.get("v_head_dim") or 0),
        swiglu=bool(m.get("swiglu", True)),
        untie_embeddings_and_output_weights=bool(m.get("untie_embeddings_and_output_weights", True)),
        norm_params=1 if norm.lower() == "rmsnorm" else 2,
        qk_layernorm=bool(m.get("qk_layernorm", False)),
    )


# --------------------------------------------------------------------------------------------
# parameters [TMU]


@dataclass(frozen=True, slots=True)
class LayerParams:
    """Parameters of one transformer layer: TP-sharded dense, TP-replicated, and expert weights."""

    dense: float  # sharded by TP (attention, dense MLP, shared expert)
    replicated: float  # norms, router: full copy on every TP rank
    expert: float  # sharded by ETP·EP


def attention_params(m: ModelSpec) -> tuple[float, float]:
    """(TP-sharded, replicated) attention parameters of one layer [TMU self_attn_term]."""
    h, n = m.hidden_size, m.num_attention_heads
    if m.multi_latent_attention:
        qk, rope, v = m.qk_head_dim, m.qk_pos_emb_head_dim, m.v_head_dim
        if m.q_lora_rank:
            q = m.q_lora_rank * (h + n * (qk + rope))
            q_norm = m.q_lora_rank * m.norm_params
        else:
            q, q_norm = h * n * (qk + rope), 0
        kv = m.kv_lora_rank * (h + n * (qk + v)) + h * rope
        o = n * v * h
        return float(q + kv + o), float(q_norm + m.kv_lora_rank * m.norm_params)
    qd = n * m.kv_channels
    kvd = m.num_query_groups * m.kv_channels
    qk_norm = 2 * m.kv_channels * m.norm_params if m.qk_layernorm else 0
    return float(h * (qd + 2 * kvd) + qd * h), float(qk_norm)


@lru_cache(maxsize=64)
def layer_params(m: ModelSpec, is_moe: bool) -> LayerParams:
    h = m.hidden_size
    gate = 3 if m.swiglu else 2  # SwiGLU FC1 is 2·F wide
    attn, attn_rep = attention_params(m)
    norms = 2 * h * m.norm_params
    if not is_moe:
        return LayerParams(attn + gate * h * m.ffn_hidden_size, attn_rep + norms, 0.0)
    shared = gate * h * m.moe_shared_expert_intermediate_size
    router = h * m.num_experts
    expert = m.num_experts * gate * h * m.moe_ffn_hidden_size
    return LayerParams(attn + shared, attn_rep + norms + router, float(expert))


def padded_vocab(m: ModelSpec, tp: int, *, cfg: PlannerConfig | None = None) -> int:
    mult = (cfg or builtin()).vocab_divisible_by * tp
    return int(math.ceil(m.vocab_size / mult) * mult)


def total_params(m: ModelSpec, *, cfg: PlannerConfig | None = None) -> dict[str, float]:
    """Whole-model parameter count by kind (TP=1 padding), for reports and sanity tests."""
    dense = rep = expert = 0.0
    mtp_moe = m.moe_pattern[-1]
    for is_moe in (*m.moe_pattern, *([mtp_moe] * m.mtp_num_layers)):
        p = layer_params(m, bool(is_moe))
        dense, rep, expert = dense + p.dense, rep + p.replicated, expert + p.expert
    v = padded_vocab(m, 1, cfg=cfg) * m.hidden_size
    emb = v * (2 if m.untie_embeddings_and_output_weights else 1)
    mtp_extra = m.mtp_num_layers * (2 * m.hidden_size * m.hidden_size)
    total = dense + rep + expert + emb + mtp_extra
    active = total - expert + (expert * m.moe_router_topk / m.num_experts if m.num_experts else 0)
    return {"total": total, "expert": expert, "dense": total - expert, "active": active}
