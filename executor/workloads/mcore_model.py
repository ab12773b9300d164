"""Megatron-Core GPT MoE model, DDP wrapper, optimizer and one training step (GPU only).

Uses Megatron's own pieces so what runs is what a Megatron-LM user runs: `GPTModel` with the
local spec (TE spec when `transformer_engine` imports), `Float16Module` (bf16),
`DistributedDataParallel`, `get_megatron_optimizer` (Adam, fp32 main params, clip 1.0) and the
no-pipelining `forward_backward_func` schedule, which also creates local CUDA graphs.
"""

from __future__ import annotations

import functools
from argparse import Namespace
from collections.abc import Iterator
from typing import Any

import torch


def have_te() -> bool:
    try:
        import transformer_engine  # noqa: F401
    except Exception:
        return False
    return True


def init_parallel(a: Namespace) -> None:
    from megatron.core import parallel_state
    from megatron.core.tensor_parallel.random import model_parallel_cuda_manual_seed

    parallel_state.initialize_model_parallel(
        tensor_model_parallel_size=a.tensor_model_parallel_size,
        pipeline_model_parallel_size=1,
        expert_model_parallel_size=a.expert_model_parallel_size,
    )
    # Megatron-Core's local CUDA graphs assert on the default tracker ("RNG tracker does not
    # support cudagraphs!"); without TE the graph-safe one is CudaRNGStatesTracker with
    # use_cudagraphable_rng (torch.Generator.graphsafe_{get,set}_state)
    model_parallel_cuda_manual_seed(a.seed,
                                    use_cudagraphable_rng=a.cuda_graph_impl == "local")


def dp_size() -> int:
    from megatron.core import parallel_state

    return parallel_state.get_data_parallel_world_size()


def build(a: Namespace) -> tuple[Any, Any, Any, str]:
    """Model (DDP-wrapped), optimizer, config and a description of the implementation."""
    from megatron.core.distributed import (
        DistributedDataParallel,
        DistributedDataParallelConfig,
        finalize_model_grads,
    )
    from megatron.core.models.gpt import GPTModel
    from megatron.core.models.gpt import gpt_layer_specs as specs
    from megatron.core.optimizer import OptimizerConfig, get_megatron_optimizer
    from megatron.core.transformer.module import Float16Module
    from megatron.core.transformer.transformer_config import TransformerConfig

    te = have_te()
    recompute: dict[str, Any] = {}
    if a.recompute_granularity == "full":
        recompute = {"recompute_granularity": "full", "recompute_method": "uniform",
                     "recompute_num_layers": 1}
    elif a.recompute_granularity == "selective":
        recompute = {"recompute_granularity": "selective",
                     "recompute_modules": a.recompute_modules or ["core_attn"]}
    graphs: dict[str, Any] = {"cuda_graph_impl": a.cuda_graph_impl}
    if a.cuda_graph_impl != "none" and a.cuda_graph_modules:
        graphs["cuda_graph_modules"] = a.cuda_graph_modules
    drop: dict[str, Any] = {}
    if a.moe_expert_capacity_factor is not None:  # token dropping (drop-and-pad with the pad flag)
        drop = {"moe_expert_capacity_factor": a.moe_expert_capacity_factor,
                "moe_pad_expert_input_to_capacity": a.moe_pad_expert_input_to_capacity}
    fp8: dict[str, Any] = {}
    if a.fp8_format:
        fp8 = {"fp8": a.fp8_format, "fp8_recipe": "delayed"}
    config = TransformerConfig(
        num_layers=a.num_layers,
        hidden_size=a.hidden_size,
        ffn_hidden_size=a.ffn_hidden_size,
        num_attention_heads=a.num_attention_heads,
        num_moe_experts=a.num_experts,
        moe_router_topk=a.moe_router_topk,
        moe_ffn_hidden_size=a.moe_ffn_hidden_size,
        moe_token_dispatcher_type=a.moe_token_dispatcher_type,
        moe_grouped_gemm=a.moe_grouped_gemm,
        moe_router_load_balancing_type="aux_loss",
        moe_aux_loss_coeff=a.moe_aux_loss_coeff,
        moe_router_force_load_balancing=a.moe_router_force_load_balancing,
        tensor_model_parallel_size=a.tensor_model_parallel_size,
        expert_model_parallel_size=a.expert_model_parallel_size,
        sequence_parallel=a.tensor_model_parallel_size > 1,
        add_bias_linear=False,
        hidden_dropout=0.0,
        attention_dropout=0.0,
        bf16=a.bf16,
        params_dtype=torch.bfloat16 if a.bf16 else torch.float32,
        pipeline_dtype=torch.bfloat16 if a.bf16 else torch.float32,
        **recompute,
        **graphs,
        **drop,
        **fp8,
    )
    if te:
        spec = specs.get_gpt_layer_with_transformer_engine_spec(
            num_experts=a.num_experts, moe_grouped_gemm=a.moe_grouped_gemm)
        experts = "TEGroupedMLP" if a.moe_grouped_gemm else "SequentialMLP(TE linears)"
    else:
        spec = specs.get_gpt_layer_local_spec(
            num_experts=a.num_experts, moe_grouped_gemm=a.moe_grouped_gemm)
        experts = "SequentialMLP"
        if hasattr(torch, "_grouped_mm") and a.tensor_model_parallel_size == 1:
            # what the environment offers, whether or not this run uses it (`contract from-log`
            # records it as versions.grouped_gemm: the grouped-GEMM change is then legal)
            print("moetune workload: grouped GEMM backend = torch._grouped_mm", flush=True)
        if a.moe_grouped_gemm and hasattr(torch, "_grouped_mm") and \
                a.tensor_model_parallel_size == 1:
            # the local spec would silently keep SequentialMLP; put real grouped GEMMs in
            from moetune.executor.workloads.grouped_mlp import TorchGroupedMLP

            mlp = spec.submodules.mlp
            moe_subs = mlp.keywords["submodules"] if hasattr(mlp, "keywords") else mlp.submodules
            moe_subs.experts = TorchGroupedMLP
            experts = "TorchGroupedMLP(torch._grouped_mm)"
    if a.cuda_graph_impl == "local":
        # GPT's layer specs build plain TransformerLayers, which graph a MoE layer whole or not at
        # all; megatron-core's partial MoE graphs (router + preprocess, postprocess; the experts
        # eager in between: cuda_graph_modules moe_router / moe_preprocess) live in
        # MoETransformerLayer, which its hybrid specs use. Same parameters, same eager forward.
        from megatron.core.transformer.transformer_layer import MoETransformerLayer

        spec.module = MoETransformerLayer
        experts += ", layers=MoETransformerLayer"
    model = GPTModel(
        config=config,
        transformer_layer_spec=spec,
        vocab_size=a.vocab_size,
        max_sequence_length=a.seq_length,
        pre_process=True,
        post_process=True,
        parallel_output=True,
        share_embeddings_and_output_weights=False,
        position_embedding_type="rope",
    ).cuda()
    if a.workload_optimizer == "torch":
        # the shape make_traces.py ran on the H200: weights cast to bf16, fused AdamW, no DDP
        model = model.to(dtype=torch.bfloat16 if a.bf16 else torch.float32)
        opt = torch.optim.AdamW(model.parameters(), lr=a.lr, weight_decay=0.0, fused=True)
        ddp = model
        optim_desc = "torch AdamW(fused)"
    else:
        if a.bf16:
            model = Float16Module(config, model)
        ddp = DistributedDataParallel(
            config=config,
            ddp_config=DistributedDataParallelConfig(
                grad_reduce_in_fp32=True, overlap_grad_reduce=a.overlap_grad_reduce,
                use_distributed_optimizer=a.use_distributed_optimizer,
                bucket_size=a.ddp_bucket_size),
            module=model,
        )
        config.finalize_model_grads_func = finalize_model_grads
        config.no_sync_func = ddp.no_sync
        opt = get_megatron_optimizer(
            OptimizerConfig(optimizer="adam", lr=a.lr, min_lr=a.lr, weight_decay=0.0,
                            bf16=a.bf16, params_dtype=torch.bfloat16 if a.bf16 else torch.float32,
                            clip_grad=1.0, use_distributed_optimizer=a.use_distributed_optimizer),
            [ddp],
        )
        optim_desc = "Megatron DDP + get_megatron_optimizer(adam)"
    impl = (f"megatron-core {_mcore_version()} GPTModel, spec="
            f"{'transformer_engine' if te else 'local'}, experts={experts}, "
            f"optimizer={optim_desc}")
    return ddp, opt, config, impl


def _mcore_version() -> str:
    try:
        from megatron.core import package_info

        return package_info.__version__
    except Exception:
        return "?"


def _loss_func(loss_mask: torch.Tensor, output: torch.Tensor):
    losses = output.float().view(-1)
    loss = torch.sum(losses * loss_mask.view(-1)) / loss_mask.sum()
    # clone: Megatron's schedule divides the returned loss in place by num_microbatches, and a
    # detached view shares that storage (seen on an H200: MBS 1 x 8 logged loss/8)
    return loss, {"lm loss": loss.detach().clone()}


def _forward_step(data_iterator: Iterator, model):
    tokens, labels, loss_mask, position_ids, attn_mask = next(data_iterator)
    output = model(tokens, position_ids, attn_mask, labels=labels)
    return output, functools.partial(_loss_func, loss_mask)


def train_step(ddp, opt, config, a: Namespace, batches: Iterator, num_micro: int
               ) -> dict[str, Any]:
    """One optimizer step over `num_micro` micro-batches; returns loss, aux, grad norm, skipped."""
    from megatron.core.pipeline_parallel import get_forward_backward_func

    if a.workload_optimizer == "torch":
        return _torch_opt_step(ddp, opt, a, batches, num_micro)
    ddp.zero_grad_buffer()
    opt.zero_grad()
    fb = get_forward_backward_func()
    losses = fb(
        forward_step_func=_forward_step,
        data_iterator=batches,
        model=[ddp],
        num_microbatches=num_micro,
        seq_length=a.seq_length,
        micro_batch_size=a.micro_batch_size,
        decoder_seq_length=a.seq_length,
        forward_only=False,
    )
    ok, grad_norm, _ = opt.step()
    lm = torch.stack([x["lm loss"] for x in losses]).mean().item()
    try:
        scale = float(opt.get_loss_scale())
    except Exception:  # chained optimizers of some releases: bf16 has no scaling anyway
        scale = 1.0
    return {"lm": lm, "aux": _aux_loss(a, num_micro), "grad_norm": grad_norm,
            "skipped": not ok, "loss_scale": scale}


def _aux_loss(a: Namespace, num_micro: int) -> float | None:
    from megatron.core.transformer.moe.moe_logging import get_moe_metrics_tracker

    tracker = get_moe_metrics_tracker()
    entry = tracker.metrics.get("load_balancing_loss")
    if entry is None:
        return None
    aux = float(entry.values.float().sum().item()) / max(a.num_layers, 1) / num_micro
    tracker.clear()
    return aux


def _torch_opt_step(model, opt, a: Namespace, batches: Iterator, num_micro: int
                    ) -> dict[str, Any]:
    import math

    import torch.distributed as dist
    from megatron.core import parallel_state

    opt.zero_grad(set_to_none=False)
    lm = 0.0
    for _ in range(num_micro):
        tokens, labels, loss_mask, pos, causal = next(batches)
        out = model(tokens, pos, causal, labels=labels)
        loss, _ = _loss_func(loss_mask, out)
        (loss / num_micro).backward()
        lm += loss.item() / num_micro
    if a.cuda_graph_impl == "local":
        from megatron.core.transformer.cuda_graphs import create_cudagraphs

        create_cudagraphs()
    if dist.get_world_size() > 1:  # plain DP averaging; expert params over expert-DP
        for p in model.parameters():
            if p.grad is None:
                continue
            expert = not getattr(p, "allreduce", True)
            group = (parallel_state.get_expert_data_parallel_group() if expert
                     else parallel_state.get_data_parallel_group())
            dist.all_reduce(p.grad, group=group)
            p.grad /= dist.get_world_size(group)
    gn = float(torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0))
    ok = math.isfinite(lm) and math.isfinite(gn)
    if ok:
        opt.step()
    return {"lm": lm, "aux": _aux_loss(a, num_micro), "grad_norm": gn if ok else None,
            "skipped": not ok, "loss_scale": 1.0}


def micro_batches(a: Namespace, samples: Iterator) -> Iterator:
    """Megatron's batch tuple (tokens, labels, loss mask, positions, causal mask) per micro-batch."""
    s = a.seq_length
    pos = torch.arange(s, device="cuda").unsqueeze(0).expand(a.micro_batch_size, s)
    mask = torch.ones(a.micro_batch_size, s, device="cuda")
    causal = torch.triu(torch.ones(s, s, device="cuda", dtype=torch.bool), 1).view(1, 1, s, s)
    for tokens, labels in samples:
        yield tokens, labels, mask, pos, causal


def dp_rank() -> int:
    from megatron.core import parallel_state

    return parallel_state.get_data_parallel_rank()
