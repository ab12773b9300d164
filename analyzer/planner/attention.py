"""Unfused core attention's memory, in bytes per attention score (b·a/TP·s² scores per layer).

Megatron-Core runs `DotProductAttention` (megatron-core `transformer/dot_product_attention.py`) when
attention is not fused: no Transformer Engine, the local spec, or `--attention-backend
unfused|local`; its softmax is `fusions/fused_softmax.py` `forward_torch_softmax` whenever
`masked_softmax_fusion` is off or apex's kernels are absent. Dtype sizes and tensor lifetimes, not
tunable assumptions, so they live here rather than in planner.yaml (whose
`unfused_attention_per_score` is the fp32-softmax path's saved part, measured).

The softmax's dtype decides the sizes. `attention_softmax_in_fp32` is True in megatron-core's
`TransformerConfig`, but Megatron-LM's `--attention-softmax-in-fp32` is a store_true flag
(megatron/training/arguments.py) copied into the config as given
(megatron/training/argument_utils.py `core_transformer_config_from_args`), so a Megatron-LM run
without the flag (or `--apply-query-key-layer-scaling`) runs the softmax in bf16.

- fp32 softmax (`input.float()`): the fp32 softmax output (4) and the bf16 probabilities fed to the
  V bmm (2) are saved: 6 per score, planner.yaml's measured `unfused_attention_per_score`. At one
  layer's softmax backward 16 are alive (the saved fp32 softmax, the fp32 score gradient cast from
  bf16, `_softmax_backward_data`'s fp32 output and an fp32 temporary): seen in the allocator
  history of an H200 run (fixtures/memory/h200_mem_mbs4_rcfull_snapshot.pickle: four 6 GiB
  tensors at MBS 4 × 24 heads × 4096²).
- bf16 softmax: one bf16 softmax output is saved, for the softmax's backward and the V bmm alike:
  2 per score ([KOR] Table 2's 5 = 2 + 1 + 2 with dropout). The softmax backward holds the same
  four tensors in bf16: 8. Derived from the fp32 path's tensors, not measured.
- dropout (`attention_dropout` > 0, Megatron-LM's default 0.1): `native_dropout` saves a bool
  mask (1) and its bf16 output replaces the probabilities as the V bmm's saved input (+2 when the
  softmax is bf16, whose output the softmax backward still needs; +0 with the fp32 path, whose
  bf16 cast it replaces): 5 per score in bf16 [KOR], 7 in fp32.
- the persistent score buffer: `parallel_state.get_global_memory_buffer().get_tensor(..., "mpu")`,
  the bf16 b·a/TP·s² input of `torch.baddbmm` (beta 0), allocated at the first forward and kept: 2.
"""

from __future__ import annotations

from typing import Any

UNFUSED_SCORE_PEAK = 16  # fp32 softmax: alive while one layer's softmax backward runs
UNFUSED_SCORE_PEAK_BF16 = 8  # the same four tensors in bf16 (derived, not measured)
UNFUSED_SCORE_BUFFER = 2  # the persistent bf16 baddbmm input buffer
DROPOUT_MASK_BYTES = 1  # `native_dropout`'s bool mask
BF16 = 2  # bytes of a bf16 score


def saved_per_score(w: Any, cfg: Any) -> float:
    """Bytes per score one layer's unfused attention keeps for backward (0 when fused)."""
    if w.fused_attention:
        return 0.0
    dropout = w.attention_dropout > 0
    if getattr(w, "softmax_fp32", True):
        return cfg.unfused_attention_per_score + (DROPOUT_MASK_BYTES if dropout else 0)
    return BF16 + ((DROPOUT_MASK_BYTES + BF16) if dropout else 0)


def peak_per_score(w: Any) -> float:
    """Bytes per score alive while one layer's softmax backward runs (0 when fused)."""
    if w.fused_attention:
        return 0.0
    return UNFUSED_SCORE_PEAK if getattr(w, "softmax_fp32", True) else UNFUSED_SCORE_PEAK_BF16
