#!/bin/bash
# Expert parallelism 2 on two H200s (library `device`, kind nvidia-h200-x2), one call (~9 min):
#
#   bash bench/gpu/run_ep2.sh        # carry: [".whl"] (as run_executor_demo.sh); outputs under $OUT
#
# The bundled workload (Megatron-Core local spec, torch._grouped_mm experts) at EP 2 x DP 2 under
# torchrun, 4 M-element DDP buckets so that an overlapped gradient reduce has buckets to start:
# 1. the audit's EP 2 fixtures: both ranks' Kineto traces (3 profiled steps) of alltoall with and
#    without overlap_grad_reduce and of allgather, truth.json (true by construction) beside each;
# 2. executor A/Bs, one knob each, in one resumable tune session: overlap_grad_reduce and the
#    allgather dispatcher as --try candidates, then the rules' own.
W=${W:-/tmp/ep2}; source bench/gpu/env.sh
python3 -c 'import torch; print("cuda devices", torch.cuda.device_count())' | tee -a "$S"
BASE="python3 -m moetune.executor.workloads.moe_gpt --num-layers 4 --hidden-size 1024 --num-attention-heads 8 --ffn-hidden-size 4096 --num-experts 8 --moe-router-topk 2 --moe-ffn-hidden-size 2048 --seq-length 1024 --micro-batch-size 2 --global-batch-size 8 --moe-token-dispatcher-type alltoall --expert-model-parallel-size 2 --moe-grouped-gemm --ddp-bucket-size 4000000 --bf16"
TR="torchrun --standalone --nproc-per-node 2 -m moetune.executor.workloads.moe_gpt"
ARGS=${BASE#python3 -m moetune.executor.workloads.moe_gpt }

if [ "${EP2_TRACES:-1}" = 1 ]; then
  PROF="--train-iters 8 --profile --profile-step-start 4 --profile-step-end 7 --nvtx-ranges"
  for case in alltoall_nooverlap alltoall_overlap allgather; do
    D="$W/traces/gpu_ep2_$case"; mkdir -p "$D"
    disp=alltoall; ogr=false; extra=""
    [ $case = allgather ] && disp=allgather
    [ $case = alltoall_overlap ] && { ogr=true; extra="--overlap-grad-reduce"; }
    timeout 120 $TR ${ARGS/--moe-token-dispatcher-type alltoall/--moe-token-dispatcher-type $disp} \
      $extra $PROF --profile-dir "$D" > "$W/ep2_$case.log" 2>&1
    rc=$?; say "ep2 $case rc=$rc at +$(( $(date +%s) - T0 ))s: $(ls "$D" | tr '\n' ' ')"
    if [ $rc != 0 ]; then
      grep -v -i warn "$W/ep2_$case.log" | grep -A30 -m1 Traceback | tee -a "$S"
      [ $case = alltoall_nooverlap ] && { say "the plain EP 2 run fails: stopping"; exit 3; }
    fi
    [ $disp = alltoall ] && backend=nccl_alltoall || backend=nccl_allgather
    cat > "$D/truth.json" <<JSON
{"case": "ep2_$case", "dispatcher_backend": "$backend", "overlap_grad_reduce": $ogr,
 "grouped_gemm": true,
 "claimed": {"moe_token_dispatcher_type": "$disp", "expert_model_parallel_size": 2,
             "overlap_grad_reduce": $ogr, "moe_grouped_gemm": true},
 "setting": "bench/gpu/run_ep2.sh: Megatron-Core 0.19.2 local spec (no TE), torch._grouped_mm experts, 4 layers, hidden 1024, 8 experts top-2, EP 2 / DP 2, seq 1024, MBS 2 / GBS 8, bf16, Megatron DDP (bucket 4M elements), 2 x H200"}
JSON
    cp "$W/ep2_$case.log" "$D/train.log"
  done
  tar cf "$OUT/ep2_traces.tar" -C "$W/traces" . 2>/dev/null
fi
[ "${EP2_TUNE:-1}" = 1 ] || exit 0

TRIES=${TRIES-overlap_grad_reduce=true moe_token_dispatcher_type=allgather} BUDGET=${BUDGET:-3}
tune_and_collect ep2_ --launcher torchrun --nproc-per-node 2 --run-iters ${SCREEN_ITERS:-8}
ls -la "$OUT" | tee -a "$S"
say "total +$(( $(date +%s) - T0 ))s"
