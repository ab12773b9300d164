"""Pure-PyTorch MoE GPT with the same shape and flags as the Megatron-Core model.

Megatron-Core's MoE forward needs CUDA, so the CPU tests train this instead: token embedding +
learned positions, pre-LN blocks of causal attention and a top-k routed MoE (switch-style aux
loss, per-expert MLPs or one stacked "grouped" weight), tied nothing, GELU. With expert
parallelism the experts are sharded over the EP group and tokens are dispatched with
differentiable collectives (all-gather or all-to-all), which gloo supports on the CPU.
"""

from __future__ import annotations

import math

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from torch.distributed.nn import functional as dfn
from torch.utils.checkpoint import checkpoint


class Attention(nn.Module):
    def __init__(self, hidden: int, heads: int) -> None:
        super().__init__()
        self.heads = heads
        self.qkv = nn.Linear(hidden, 3 * hidden, bias=False)
        self.proj = nn.Linear(hidden, hidden, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, s, h = x.shape
        q, k, v = self.qkv(x).view(b, s, 3, self.heads, h // self.heads).unbind(2)
        y = F.scaled_dot_product_attention(
            q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), is_causal=True
        )
        return self.proj(y.transpose(1, 2).reshape(b, s, h))


class Experts(nn.Module):
    """The local experts of one MoE layer: weights stacked (E_local, h, f) for both modes, so the
    grouped mode is one batched GEMM over capacity-free segments and the sequential mode a loop."""

    def __init__(self, n_local: int, hidden: int, ffn: int, grouped: bool) -> None:
        super().__init__()
        self.grouped = grouped
        self.w1 = nn.Parameter(torch.randn(n_local, hidden, ffn) / math.sqrt(hidden))
        self.w2 = nn.Parameter(torch.randn(n_local, ffn, hidden) / math.sqrt(ffn))

    def forward(self, x: torch.Tensor, local_expert: torch.Tensor) -> torch.Tensor:
        """x: (n, h) tokens already routed here; local_expert: (n,) index into the local experts."""
        out = torch.zeros_like(x)
        if self.grouped:
            # One gather of each token's expert weights, then batched GEMMs: a single kernel per
            # projection instead of one per expert (the shape of a grouped GEMM).
            h1 = F.gelu(torch.bmm(x.unsqueeze(1), self.w1[local_expert]))
            return torch.bmm(h1, self.w2[local_expert]).squeeze(1)
        for e in range(self.w1.shape[0]):
            idx = (local_expert == e).nonzero(as_tuple=True)[0]
            if idx.numel():
                out = out.index_add(0, idx, F.gelu(x[idx] @ self.w1[e]) @ self.w2[e])
        return out


class MoE(nn.Module):
    def __init__(self, hidden: int, ffn: int, num_experts: int, topk: int, *, grouped: bool,
                 dispatcher: str, ep_group: dist.ProcessGroup | None, ep_size: int,
                 ep_rank: int, force_balance: bool) -> None:
        super().__init__()
        self.num_experts, self.topk = num_experts, topk
        self.ep_group, self.ep_size, self.ep_rank = ep_group, ep_size, ep_rank
        self.n_local = num_experts // ep_size
        self.dispatcher = dispatcher
        self.force_balance = force_balance
        self.router = nn.Linear(hidden, num_experts, bias=False)
        self.experts = Experts(self.n_local, hidden, ffn, grouped)
        for p in self.experts.parameters():
            p.expert_parallel = True  # grads reduced over the expert-data-parallel group only

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        b, s, h = x.shape
        tokens = x.reshape(-1, h)
        logits = self.router(tokens)
        if self.force_balance:  # benchmark-only: round-robin routing, like Megatron's flag
            n = tokens.shape[0]
            base = torch.arange(n, device=x.device).unsqueeze(1) * self.topk
            idx = (base + torch.arange(self.topk, device=x.device)) % self.num_experts
            probs = torch.softmax(logits, -1).gather(1, idx)
        else:
            probs, idx = torch.topk(torch.softmax(logits, -1), self.topk, dim=-1)
        probs = probs / probs.sum(-1, keepdim=True)
        # Switch-transformer aux loss: E · Σ_e f_e · P_e (f = routed fraction, P = mean prob).
        frac = F.one_hot(idx, self.num_experts).float().sum((0, 1)) / idx.numel()
        aux = self.num_experts * (frac * torch.softmax(logits, -1).mean(0)).sum()
        flat_tok = tokens.repeat_interleave(self.topk, 0)
        flat_exp = idx.reshape(-1)
        out = self._dispatch(flat_tok, flat_exp)
        out = (out * probs.reshape(-1, 1)).view(-1, self.topk, h).sum(1)
        return out.view(b, s, h), aux

    def _dispatch(self, tok: torch.Tensor, exp: torch.Tensor) -> torch.Tensor:
        if self.ep_size == 1:
            return self.experts(tok, exp)
        if self.dispatcher == "alltoall":
            return self._alltoall(tok, exp)
        # allgather: every EP rank sees every token, computes its experts' share, sums back.
        all_tok = torch.cat(dfn.all_gather(tok, group=self.ep_group), 0)
        all_exp = torch.cat([t for t in _gather_plain(exp, self.ep_group)], 0)
        mine = (all_exp // self.n_local) == self.ep_rank
        part = torch.zeros_like(all_tok)
        sel = mine.nonzero(as_tuple=True)[0]
        if sel.numel():
            part = part.index_add(0, sel, self.experts(all_tok[sel], all_exp[sel] % self.n_local))
        # sum of the expert outputs, then keep this rank's rows
        full = dfn.all_reduce(part, group=self.ep_group)
        n = tok.shape[0]
        return full[self.ep_rank * n:(self.ep_rank + 1) * n]

    def _alltoall(self, tok: torch.Tensor, exp: torch.Tensor) -> torch.Tensor:
        dest = exp // self.n_local
        order = torch.argsort(dest, stable=True)
        send_counts = torch.bincount(dest, minlength=self.ep_size)
        recv_counts = torch.empty_like(send_counts)
        dist.all_to_all_single(recv_counts, send_counts, group=self.ep_group)
        s_split, r_split = send_counts.tolist(), recv_counts.tolist()
        recv_tok = dfn.all_to_all_single(
            torch.empty(sum(r_split), tok.shape[1], dtype=tok.dtype),
            tok[order], r_split, s_split, group=self.ep_group,
        )
        recv_exp = torch.empty(sum(r_split), dtype=exp.dtype)
        dist.all_to_all_single(recv_exp, exp[order].contiguous(), r_split, s_split,
                               group=self.ep_group)
        y = self.experts(recv_tok, recv_exp % self.n_local)
        back = dfn.all_to_all_single(
            torch.empty(tok.shape[0], tok.shape[1], dtype=tok.dtype), y, s_split, r_split,
            group=self.ep_group,
        )
        return torch.empty_like(back).index_copy(0, order, back)


def _gather_plain(t: torch.Tensor, group: dist.ProcessGroup | None) -> list[torch.Tensor]:
    out = [torch.empty_like(t) for _ in range(dist.get_world_size(group))]
    dist.all_gather(out, t.contiguous(), group=group)
    return out


class Block(nn.Module):
    def __init__(self, hidden: int, heads: int, moe: MoE, recompute: set[str]) -> None:
        super().__init__()
        self.ln1, self.ln2 = nn.LayerNorm(hidden), nn.LayerNorm(hidden)
        self.attn, self.moe = Attention(hidden, heads), moe
        self.recompute = recompute

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        if "core_attn" in self.recompute or "full" in self.recompute:
            x = x + checkpoint(self.attn, self.ln1(x), use_reentrant=False)
        else:
            x = x + self.attn(self.ln1(x))
        if "moe" in self.recompute or "full" in self.recompute:
            y, aux = checkpoint(self.moe, self.ln2(x), use_reentrant=False)
        else:
            y, aux = self.moe(self.ln2(x))
        return x + y, aux


class MoEGPT(nn.Module):
    def __init__(self, *, vocab: int, seq: int, layers: int, hidden: int, heads: int, ffn: int,
                 num_experts: int, topk: int, grouped: bool, dispatcher: str,
                 ep_group: dist.ProcessGroup | None, ep_size: int, ep_rank: int,
                 force_balance: bool, recompute: set[str]) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocab, hidden)
        self.pos = nn.Embedding(seq, hidden)
        self.blocks = nn.ModuleList(
            Block(hidden, heads, MoE(hidden, ffn, num_experts, topk, grouped=grouped,
                                     dispatcher=dispatcher, ep_group=ep_group, ep_size=ep_size,
                                     ep_rank=ep_rank, force_balance=force_balance), recompute)
            for _ in range(layers)
        )
        self.ln_f = nn.LayerNorm(hidden)
        self.head = nn.Linear(hidden, vocab, bias=False)

    def forward(self, tokens: torch.Tensor, labels: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Mean LM loss and the mean load-balancing loss over layers."""
        pos = torch.arange(tokens.shape[1], device=tokens.device)
        x = self.embed(tokens) + self.pos(pos)
        auxes = []
        for blk in self.blocks:
            x, aux = blk(x)
            auxes.append(aux)
        logits = self.head(self.ln_f(x)).float()
        loss = F.cross_entropy(logits.view(-1, logits.shape[-1]), labels.reshape(-1))
        return loss, torch.stack(auxes).mean()
