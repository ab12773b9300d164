"""Grouped-GEMM experts for Megatron-Core without Transformer Engine (GPU only).

megatron-core 0.19's local spec ignores `moe_grouped_gemm` (LocalSpecProvider.grouped_mlp_modules
always returns SequentialMLP, one GEMM pair per expert); grouped experts there need TE. So that
`--moe-grouped-gemm` changes what runs on a machine without TE, this drop-in for SequentialMLP
computes all local experts with `torch._grouped_mm` (one kernel per projection).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from megatron.core.transformer.module import MegatronModule


class TorchGroupedMLP(MegatronModule):
    """Same constructor and forward contract as megatron.core SequentialMLP (expert TP = 1)."""

    def __init__(self, num_local_experts, config, submodules=None, pg_collection=None, name=None):
        super().__init__(config=config)
        self.num_local_experts = num_local_experts
        h, f = config.hidden_size, config.moe_ffn_hidden_size
        dev = torch.cuda.current_device()
        self.weight1 = torch.nn.Parameter(
            torch.empty(num_local_experts, h, f, device=dev, dtype=config.params_dtype))
        self.weight2 = torch.nn.Parameter(
            torch.empty(num_local_experts, f, h, device=dev, dtype=config.params_dtype))
        std = config.init_method_std
        torch.nn.init.normal_(self.weight1, 0.0, std)
        torch.nn.init.normal_(self.weight2, 0.0, std / (2.0 * config.num_layers) ** 0.5)
        for p in (self.weight1, self.weight2):
            p.allreduce = False  # Megatron's mark for expert params (reduced over expert DP)
        self._offs_key: tuple[int, ...] | None = None
        self._offs: torch.Tensor | None = None

    def _offsets(self, tokens_per_expert: torch.Tensor, device: torch.device) -> torch.Tensor:
        """Cumulative expert offsets on the GPU. Counts on the host (Megatron's dispatchers hand
        them over on the CPU) are copied once per distinct value: under drop-and-pad they never
        change, so a CUDA-graph capture finds the device copy made by the eager pass before it
        (a host-to-device copy from pageable memory cannot be captured)."""
        if tokens_per_expert.is_cuda:
            return torch.cumsum(tokens_per_expert, 0).to(torch.int32)
        key = tuple(tokens_per_expert.tolist())
        if key != self._offs_key:
            self._offs = torch.cumsum(tokens_per_expert, 0).to(torch.int32).to(device)
            self._offs_key = key
        return self._offs

    def forward(self, hidden: torch.Tensor, tokens_per_expert: torch.Tensor,
                probs: torch.Tensor):
        offs = self._offsets(tokens_per_expert, hidden.device)
        w1, w2 = self.weight1.to(hidden.dtype), self.weight2.to(hidden.dtype)
        inter = F.gelu(torch._grouped_mm(hidden, w1, offs=offs))
        inter = (inter * probs.unsqueeze(-1)).to(hidden.dtype)  # as MLP's per_token_scale
        return torch._grouped_mm(inter, w2, offs=offs), None

    def backward_dw(self) -> None:  # called only with delayed-wgrad overlap, which we never set
        return None
