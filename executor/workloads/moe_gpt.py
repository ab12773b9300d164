"""MoE GPT trainer that accepts Megatron-LM flags and prints Megatron-LM's log lines.

    python -m moetune.executor.workloads.moe_gpt --num-layers 2 --hidden-size 64 ... [--profile ...]
    torchrun --nproc-per-node 2 -m moetune.executor.workloads.moe_gpt --expert-model-parallel-size 2 ...

On a GPU with megatron-core installed it trains Megatron-Core's `GPTModel` (MoE layers, Megatron's
DDP, optimizer and schedule). Elsewhere (CPU tests) it trains a pure-PyTorch MoE GPT of the same
shape and flags; the log names the implementation that ran. Data are random tokens drawn once from
a fixed seed (a small pool cycled, so the loss falls). Unknown flags exit 2 via argparse.
"""

from __future__ import annotations

import argparse
import contextlib
import math
import os
import resource
import socket
import sys
import time
from collections.abc import Iterator, Sequence
from datetime import datetime
from typing import Any

from moetune.executor.workloads import megatron_log as mlog

IMPL_MARK = "moetune workload: implementation ="


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="moe_gpt", description=__doc__.splitlines()[0])
    a = p.add_argument
    a("--num-layers", type=int, default=2)
    a("--hidden-size", type=int, default=64)
    a("--ffn-hidden-size", type=int, default=None)
    a("--num-attention-heads", type=int, default=4)
    a("--num-experts", type=int, default=4)
    a("--moe-router-topk", type=int, default=2)
    a("--moe-ffn-hidden-size", type=int, default=None)
    a("--moe-aux-loss-coeff", type=float, default=1e-2)
    a("--seq-length", type=int, default=32)
    a("--position-embedding-type", choices=["rope"], default="rope",
      help="positions as the model is built here (rope); in the argument dump for the audit")
    a("--vocab-size", type=int, default=256)
    a("--micro-batch-size", type=int, default=2)
    a("--global-batch-size", type=int, default=None)
    a("--train-iters", type=int, default=10)
    a("--lr", type=float, default=1e-3)
    a("--moe-token-dispatcher-type", choices=["allgather", "alltoall"], default="allgather")
    a("--moe-grouped-gemm", action="store_true")
    a("--moe-expert-capacity-factor", type=float, default=None,
      help="Megatron-Core path: token dropping at this capacity per expert (default: dropless)")
    a("--moe-pad-expert-input-to-capacity", action="store_true",
      help="with --moe-expert-capacity-factor: pad every expert's input to its capacity "
           "(drop-and-pad: static shapes, what local CUDA graphs of whole MoE layers need)")
    a("--recompute-granularity", choices=["full", "selective"], default=None)
    a("--recompute-modules", nargs="*", default=None)
    a("--cuda-graph-impl", choices=["none", "local"], default="none")
    a("--cuda-graph-modules", nargs="*", default=None)
    a("--fp8-format", choices=["e4m3", "hybrid"], default=None)
    a("--overlap-grad-reduce", action="store_true",
      help="Megatron DDP: reduce gradient buckets during backward (needs DP > 1 to matter)")
    a("--ddp-bucket-size", type=int, default=None,
      help="Megatron DDP bucket size in elements (default: Megatron's, max(40M, 1M x DP))")
    a("--use-distributed-optimizer", action="store_true",
      help="Megatron DDP + optimizer: shard optimizer states over DP (reduce-scatter/all-gather)")
    a("--expert-model-parallel-size", type=int, default=1)
    a("--tensor-model-parallel-size", type=int, default=1)
    a("--log-interval", type=int, default=1)
    a("--log-throughput", action="store_true", help="accepted for Megatron compatibility: always on")
    a("--seed", type=int, default=1234)
    a("--data-pool", type=int, default=0,
      help="repeat a pool of N random sequences (0: every sample new, the default for A/B runs)")
    a("--profile", action="store_true")
    a("--profile-step-start", type=int, default=3)
    a("--profile-step-end", type=int, default=6)
    a("--profile-dir", default="profile")
    a("--profile-ranks", type=int, nargs="*", default=None)
    a("--nvtx-ranges", action="store_true")
    a("--moe-router-force-load-balancing", action="store_true")
    a("--bf16", action="store_true")
    a("--manual-gc", action="store_true", help="Python GC off, collected every interval")
    a("--manual-gc-interval", type=int, default=0)
    a("--workload-impl", choices=["auto", "megatron", "torch"], default="auto",
      help="auto: Megatron-Core on CUDA when it imports, else pure PyTorch")
    a("--workload-optimizer", choices=["megatron", "torch"], default="megatron",
      help="Megatron-Core path: Megatron DDP + optimizer (default) or fused torch AdamW")
    a("--debug-nan-at", type=int, default=None, help="test hook: make this iteration's loss NaN")
    return p


def parse(argv: Sequence[str] | None) -> argparse.Namespace:
    p = build_parser()
    args = p.parse_args(argv)
    args.ffn_hidden_size = args.ffn_hidden_size or 4 * args.hidden_size
    args.moe_ffn_hidden_size = args.moe_ffn_hidden_size or args.ffn_hidden_size
    world = int(os.environ.get("WORLD_SIZE", "1"))
    tp, ep = args.tensor_model_parallel_size, args.expert_model_parallel_size
    if world % tp or world % ep:
        p.error(f"world size {world} is not divisible by TP {tp} and EP {ep}")
    if args.num_experts % ep:
        p.error(f"--num-experts {args.num_experts} is not divisible by EP {ep}")
    dp = world // tp
    args.global_batch_size = args.global_batch_size or args.micro_batch_size * dp
    if args.global_batch_size % (args.micro_batch_size * dp):
        p.error(f"--global-batch-size {args.global_batch_size} is not a multiple of "
                f"micro-batch-size × DP = {args.micro_batch_size * dp}")
    if args.profile and args.profile_step_end <= args.profile_step_start:
        p.error("--profile-step-end must be greater than --profile-step-start")
    if args.moe_router_topk > args.num_experts:
        p.error("--moe-router-topk exceeds --num-experts")
    if args.moe_pad_expert_input_to_capacity and args.moe_expert_capacity_factor is None:
        p.error("--moe-pad-expert-input-to-capacity needs --moe-expert-capacity-factor")
    refusal = cuda_graph_refusal(args)
    if refusal:
        print(f"moe_gpt: error: {refusal}", file=sys.stderr)
        raise SystemExit(2)
    args.world_size, args.data_parallel_size = world, dp
    return args


def cuda_graph_refusal(args: argparse.Namespace) -> str | None:
    """Why megatron-core's local CUDA graphs cannot run this configuration (one line), or None.
    Checked before anything starts, whichever implementation would run, so the refusal is the same
    on every machine: megatron-core asserts the first (TransformerConfig) mid-setup."""
    if args.cuda_graph_impl != "local":
        return None
    if args.recompute_granularity == "full":
        return ("--cuda-graph-impl local does not run with --recompute-granularity full "
                "(megatron-core allows full recompute only with full-iteration graphs); "
                "use selective or no recompute")
    modules = {m for m in (args.cuda_graph_modules or []) if m != "full"}
    drop_pad = args.moe_expert_capacity_factor is not None and \
        args.moe_pad_expert_input_to_capacity
    whole = not modules or "moe" in modules  # the MoE layer captured whole
    if whole and not drop_pad:
        return ("--cuda-graph-impl local captures whole MoE layers here, and a dropless MoE layer "
                "waits on the host for its token counts mid-layer, which no graph capture holds "
                "(H200, megatron-core 0.19.2: cudaErrorStreamCaptureInvalidated); add "
                "--cuda-graph-modules moe_router moe_preprocess (router graphs, experts eager) or "
                "drop-and-pad (--moe-expert-capacity-factor F --moe-pad-expert-input-to-capacity)")
    if not whole and not modules & {"moe_router", "moe_preprocess"}:
        return (f"--cuda-graph-modules {' '.join(sorted(modules))} builds no CUDA graph in MoE "
                "layers (megatron-core 0.19.2's MoETransformerLayer graphs the whole layer or "
                "moe_router/moe_preprocess); the run would be eager")
    return None


def choose_impl(args: argparse.Namespace) -> str:
    import torch

    if args.workload_impl != "auto":
        return args.workload_impl
    if not torch.cuda.is_available():
        return "torch"
    try:
        import megatron.core  # noqa: F401
    except Exception:
        return "torch"
    return "megatron"


def init_distributed(cuda: bool) -> tuple[int, int]:
    import torch
    import torch.distributed as dist

    if "RANK" not in os.environ:  # plain `python -m`: a one-rank group so the code path is the same
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        os.environ.update(RANK="0", WORLD_SIZE="1", LOCAL_RANK="0",
                          MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    if cuda:
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
    dist.init_process_group("nccl" if cuda else "gloo")
    return dist.get_rank(), dist.get_world_size()


def log(line: str) -> None:
    print(line, flush=True)


def nvtx_range(name: str, enabled: bool):
    """NVTX range (nsys) + record_function (Kineto) when asked; a no-op otherwise."""
    if not enabled:
        return contextlib.nullcontext()
    import torch

    stack = contextlib.ExitStack()
    try:
        import nvtx

        stack.enter_context(nvtx.annotate(name))
    except Exception:
        if torch.cuda.is_available():
            torch.cuda.nvtx.range_push(name)
            stack.callback(torch.cuda.nvtx.range_pop)
    stack.enter_context(torch.profiler.record_function(name))
    return stack


def make_profiler(args: argparse.Namespace, rank: int, cuda: bool):
    """Megatron's `--use-pytorch-profiler` schedule; one gzip'd Kineto trace per rank."""
    import torch

    if not args.profile or (args.profile_ranks is not None and rank not in args.profile_ranks):
        return None
    os.makedirs(args.profile_dir, exist_ok=True)
    out = os.path.join(args.profile_dir, f"rank{rank}.pt.trace.json.gz")

    def on_ready(prof) -> None:
        prof.export_chrome_trace(out)
        log(f"moetune workload: wrote profiler trace {out}")

    acts = [torch.profiler.ProfilerActivity.CPU]
    if cuda:
        acts.append(torch.profiler.ProfilerActivity.CUDA)
    sched = torch.profiler.schedule(
        wait=max(args.profile_step_start - 1, 0),
        warmup=1 if args.profile_step_start > 0 else 0,
        active=args.profile_step_end - args.profile_step_start,
        repeat=1,
    )
    try:  # host-blocking syncs as `cuda_sync` events (torch 2.11 writes none without this)
        exp = torch.profiler._ExperimentalConfig(enable_cuda_sync_events=True) if cuda else None
    except (AttributeError, TypeError):
        exp = None
    # profile_memory: allocator events give the diagnosis its `memory` section (peak reserved)
    return torch.profiler.profile(activities=acts, schedule=sched, on_trace_ready=on_ready,
                                  record_shapes=False, with_stack=False, profile_memory=True,
                                  experimental_config=exp)


def memory_mb(cuda: bool) -> tuple[float, float, float, float]:
    if cuda:
        import torch

        mb = 1024 * 1024
        return (torch.cuda.memory_allocated() / mb, torch.cuda.max_memory_allocated() / mb,
                torch.cuda.memory_reserved() / mb, torch.cuda.max_memory_reserved() / mb)
    with open("/proc/self/statm") as fh:
        rss = int(fh.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20
    peak = max(rss, resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024)
    return rss, peak, rss, peak


def dump_args(args: argparse.Namespace) -> dict[str, Any]:
    skip = {"workload_impl", "debug_nan_at", "workload_optimizer"}
    out = {k: v for k, v in vars(args).items() if k not in skip}
    out["params_dtype"] = "torch.bfloat16" if args.bf16 else "torch.float32"
    out["num_query_groups"] = args.num_attention_heads
    out["padded_vocab_size"] = args.vocab_size
    out["moe_layer_freq"] = 1
    out["swiglu"] = False
    out["mock_data"] = True  # random tokens: benchmark-only by Megatron's own flag
    return out


def torch_setup(args: argparse.Namespace, rank: int, world: int, cuda: bool):
    import torch
    import torch.distributed as dist
    from moetune.executor.workloads.torch_moe import MoEGPT

    if args.tensor_model_parallel_size != 1:
        raise SystemExit("moe_gpt: the pure-PyTorch implementation supports "
                         "--tensor-model-parallel-size 1 only")
    ep = args.expert_model_parallel_size
    ep_groups, edp_groups = [], []
    for k in range(world // ep):
        ep_groups.append(dist.new_group(list(range(k * ep, (k + 1) * ep))))
    for r in range(ep):
        edp_groups.append(dist.new_group(list(range(r, world, ep))))
    ep_rank = rank % ep
    torch.manual_seed(args.seed)  # same dense init on every rank
    recompute = set()
    if args.recompute_granularity == "full":
        recompute = {"full"}
    elif args.recompute_granularity == "selective":
        recompute = set(args.recompute_modules or ["core_attn"])
    model = MoEGPT(vocab=args.vocab_size, seq=args.seq_length, layers=args.num_layers,
                   hidden=args.hidden_size, heads=args.num_attention_heads,
                   ffn=args.moe_ffn_hidden_size, num_experts=args.num_experts,
                   topk=args.moe_router_topk, grouped=args.moe_grouped_gemm,
                   dispatcher=args.moe_token_dispatcher_type,
                   ep_group=ep_groups[rank // ep], ep_size=ep, ep_rank=ep_rank,
                   force_balance=args.moe_router_force_load_balancing, recompute=recompute)
    # experts differ per EP rank: re-draw them from a per-EP-rank seed
    gen = torch.Generator().manual_seed(args.seed + 1000 + ep_rank)
    with torch.no_grad():
        for m in model.modules():
            if hasattr(m, "w1") and hasattr(m, "w2"):
                m.w1.copy_(torch.randn(m.w1.shape, generator=gen) / math.sqrt(m.w1.shape[1]))
                m.w2.copy_(torch.randn(m.w2.shape, generator=gen) / math.sqrt(m.w2.shape[1]))
    device = torch.device("cuda" if cuda else "cpu")
    model.to(device)
    opt = torch.optim.Adam(model.parameters(), lr=args.lr)
    return model, opt, edp_groups[ep_rank], device


def torch_step(args, model, opt, edp_group, batches: Iterator, num_micro: int, world: int,
               nvtx_on: bool, force_nan: bool) -> dict[str, Any]:
    import torch
    import torch.distributed as dist

    opt.zero_grad(set_to_none=True)
    lm_sum = aux_sum = 0.0
    amp = (torch.autocast("cuda", dtype=torch.bfloat16) if args.bf16 and next(
        model.parameters()).is_cuda else contextlib.nullcontext())
    for _ in range(num_micro):
        tokens, labels = next(batches)
        with nvtx_range("forward", nvtx_on), amp:
            lm, aux = model(tokens, labels)
            if force_nan:
                lm = lm * float("nan")
            loss = (lm + args.moe_aux_loss_coeff * aux) / num_micro
        with nvtx_range("backward", nvtx_on):
            loss.backward()
        lm_sum += lm.item() / num_micro
        aux_sum += aux.item() / num_micro
    if world > 1:
        for prm in model.parameters():
            if prm.grad is None:
                continue
            if getattr(prm, "expert_parallel", False):
                dist.all_reduce(prm.grad, group=edp_group)
                prm.grad /= world
            else:
                dist.all_reduce(prm.grad)
                prm.grad /= world
    grad_norm = float(torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0))
    skipped = not (math.isfinite(lm_sum) and math.isfinite(grad_norm))
    if not skipped:
        opt.step()
    return {"lm": lm_sum, "aux": aux_sum, "grad_norm": None if skipped else grad_norm,
            "skipped": skipped, "loss_scale": 1.0}


def sample_stream(args: argparse.Namespace, dp_rank: int, device, pool_size: int = 0
                  ) -> Iterator:
    """Micro-batches of random sequences: sample k of the run is drawn from its own generator
    seeded by (`--seed`, k), whatever the micro-batch size or DP layout, so two configurations see
    the same data in the same global batches (matched A/B screens).

    No sample repeats (`pool_size` > 0 restores a repeating pool): on a repeating pool the model
    memorizes and the loss collapses chaotically, so the loss-health check compared trajectories,
    not numerics (H200 tune run: +333 % MBS 8 rejected for a 43 % loss gap at steps 41-50)."""
    import torch

    gbs, mbs, dp = args.global_batch_size, args.micro_batch_size, args.data_parallel_size
    per_rank = gbs // dp

    def sample(k: int) -> torch.Tensor:
        key = k % pool_size if pool_size else k
        gen = torch.Generator().manual_seed(args.seed * 1_000_003 + key)
        return torch.randint(0, args.vocab_size, (args.seq_length + 1,), generator=gen)

    it = 0
    while True:
        base = it * gbs + dp_rank * per_rank
        for m in range(per_rank // mbs):
            seq = torch.stack([sample(k) for k in range(base + m * mbs, base + (m + 1) * mbs)])
            seq = seq.to(device)
            yield seq[:, :-1].contiguous(), seq[:, 1:].contiguous()
        it += 1


def main(argv: Sequence[str] | None = None) -> int:
    args = parse(argv)
    impl = choose_impl(args)
    cuda = impl == "megatron" or (impl == "torch" and _cuda_ok())
    if args.fp8_format and impl != "megatron":
        print("moe_gpt: error: --fp8-format needs Megatron-Core with Transformer Engine",
              file=sys.stderr)
        return 2
    if args.moe_expert_capacity_factor is not None and impl != "megatron":
        print("moe_gpt: error: --moe-expert-capacity-factor needs the Megatron-Core "
              "implementation (CUDA); the pure-PyTorch fallback is dropless", file=sys.stderr)
        return 2
    import torch

    if not cuda and "OMP_NUM_THREADS" not in os.environ:
        torch.set_num_threads(1)  # ranks share few cores: oversubscribed threads only add noise
    rank, world = init_distributed(cuda)
    last = rank == world - 1
    nvtx_on = args.nvtx_ranges
    if rank == 0:
        log(mlog.world_line(world, args.data_parallel_size, 1, args.tensor_model_parallel_size, 1))
        for line in mlog.args_dump(dump_args(args)):
            log(line)
    num_micro = args.global_batch_size // (args.micro_batch_size * args.data_parallel_size)

    if impl == "megatron":
        from moetune.executor.workloads import mcore_model

        if args.fp8_format and not mcore_model.have_te():
            print("moe_gpt: error: --fp8-format needs Transformer Engine, which is not "
                  "installed", file=sys.stderr)
            return 2
        mcore_model.init_parallel(args)
        ddp, opt, config, desc = mcore_model.build(args)
        batches = mcore_model.micro_batches(
            args, sample_stream(args, mcore_model.dp_rank(), "cuda", args.data_pool))

        def step(i: int) -> dict[str, Any]:
            return mcore_model.train_step(ddp, opt, config, args, batches, num_micro)
    else:
        model, opt, edp_group, device = torch_setup(args, rank, world, cuda)
        desc = ("pure-PyTorch MoE GPT (fallback: Megatron-Core's MoE forward needs CUDA), "
                f"experts={'grouped (batched GEMM)' if args.moe_grouped_gemm else 'sequential'}, "
                f"dispatcher={args.moe_token_dispatcher_type}, device={device.type}")

        tb = sample_stream(args, rank, device, args.data_pool)  # TP = 1 here: DP rank = rank

        def step(i: int) -> dict[str, Any]:
            return torch_step(args, model, opt, edp_group, tb, num_micro, world, nvtx_on,
                              args.debug_nan_at == i)

    if rank == 0:
        log(f"{IMPL_MARK} {desc}")
        if not cuda:
            log("moetune workload: memory lines on CPU report process RSS (MB)")
    log(f"[after megatron is initialized] datetime: {datetime.now():%Y-%m-%d %H:%M:%S.%f} ")

    from moetune.analyzer.flops import num_floating_point_operations

    flops = num_floating_point_operations(dump_args(args), args.global_batch_size)
    prof = make_profiler(args, rank, cuda)
    if prof is not None:
        prof.start()
    if args.manual_gc:  # Megatron's --manual-gc: no collector pauses inside steps
        import gc

        gc.disable()
        gc.collect()
    acc: dict[str, float] = {}
    acc_n = skipped = nans = 0
    interval_t = 0.0
    interval_iters = 0
    memory_reported = False
    for it in range(1, args.train_iters + 1):
        t0 = time.perf_counter()
        with nvtx_range(f"iteration {it}", nvtx_on):
            res = step(it)
        if cuda:
            torch.cuda.synchronize()
        interval_t += time.perf_counter() - t0
        interval_iters += 1
        if args.manual_gc and args.manual_gc_interval and it % args.manual_gc_interval == 0:
            import gc

            gc.collect()
        if prof is not None:
            prof.step()
        if res["skipped"]:
            skipped += 1
            nans += 0 if math.isfinite(res["lm"]) else 1
        else:
            acc_n += 1
            acc["lm loss"] = acc.get("lm loss", 0.0) + res["lm"]
            if res["aux"] is not None:
                acc["load_balancing_loss"] = acc.get("load_balancing_loss", 0.0) + res["aux"]
        first = it == 1
        if it % args.log_interval == 0 or first:
            elapsed = interval_t / interval_iters
            if last:
                losses = {k: v / acc_n for k, v in acc.items()} if acc_n else {}
                log(mlog.iteration_line(
                    iteration=it, train_iters=args.train_iters,
                    consumed_samples=it * args.global_batch_size, elapsed_ms=elapsed * 1e3,
                    tflops=flops / (elapsed * 1e12 * world), lr=args.lr,
                    global_batch_size=args.global_batch_size, losses=losses,
                    loss_scale=res["loss_scale"], grad_norm=res["grad_norm"],
                    skipped=skipped, nan=nans))
            if not (first and args.log_interval != 1):  # Megatron keeps iteration 1 in the next mean
                acc, acc_n, skipped, nans, interval_t, interval_iters = {}, 0, 0, 0, 0.0, 0
            if rank == 0 and (not memory_reported or it == args.train_iters):
                log(mlog.memory_line(rank, it, *memory_mb(cuda)))
                memory_reported = True
    if prof is not None:
        prof.stop()
    log(f"[after training is done] datetime: {datetime.now():%Y-%m-%d %H:%M:%S.%f} ")
    import torch.distributed as dist

    dist.barrier()
    dist.destroy_process_group()
    return 0


def _cuda_ok() -> bool:
    import torch

    return torch.cuda.is_available()


if __name__ == "__main__":
    raise SystemExit(main())
