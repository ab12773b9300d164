#!/bin/bash
# Expert parallelism 2 on two H200s (library `device`, kind nvidia-h200-x2), one call (~9 min):
#
#   bash bench/gpu/run_ep2.sh        # carry: [".whl"] (as run_executor_demo.sh); outputs under $OUT
#
# 1. the audit's EP 2 fixtures: every rank's Kineto trace of fixtures/gpu/ep2_traces.py
#    (alltoall with and without overlap_grad_reduce, allgather), truth.json beside each;
# 2. executor A/Bs on the bundled workload at EP 2 × DP 2 under torchrun: overlap_grad_reduce and
#    the allgather dispatcher as --try candidates, then the rules' own, in one resumable session.
W=${W:-/tmp/ep2}; source bench/gpu/env.sh
python3 -c 'import torch; print("cuda devices", torch.cuda.device_count())' | tee -a "$S"

if [ "${EP2_TRACES:-1}" = 1 ]; then
timeout ${TRACE_CAP:-240} torchrun --standalone --nproc-per-node 2 fixtures/gpu/ep2_traces.py \
  --out "$W/traces" > "$W/ep2_traces.log" 2>&1
say "ep2 traces rc=$? at +$(( $(date +%s) - T0 ))s"
grep -v Warning "$W/ep2_traces.log" | tail -n 15 | tee -a "$S"
tar cf "$OUT/ep2_traces.tar" -C "$W/traces" . 2>/dev/null
fi
[ "${EP2_TUNE:-1}" = 1 ] || exit 0

BASE="python3 -m executor.workloads.moe_gpt --num-layers 4 --hidden-size 1024 --num-attention-heads 8 --ffn-hidden-size 4096 --num-experts 8 --moe-router-topk 2 --moe-ffn-hidden-size 2048 --seq-length 1024 --micro-batch-size 2 --global-batch-size 8 --moe-token-dispatcher-type alltoall --expert-model-parallel-size 2 --moe-grouped-gemm --bf16"
TRY_ARGS=""; for t in ${TRIES-overlap_grad_reduce=true moe_token_dispatcher_type=allgather}; do
  TRY_ARGS="$TRY_ARGS --try $t"; done
say "tune start at +$(( $(date +%s) - T0 ))s: $BASE"
timeout ${TUNE_CAP:-420} python3 -m moetune tune --cmd "$BASE" --launcher torchrun \
  --nproc-per-node 2 --budget ${BUDGET:-3} $TRY_ARGS --screen-iters ${SCREEN_ITERS:-8} \
  --confirm-iters 50 --window 41-50 --repeats 3 --timeout 150 \
  --ledger "$W/ledger.sqlite" --workdir "$W/runs" --json > "$W/tune.json" 2> "$W/tune.err"
say "tune rc=$? at +$(( $(date +%s) - T0 ))s (124 = stopped by the time cap; rerunning resumes)"
tail -n 40 "$W/tune.err" | tee -a "$S"
python3 -m moetune ledger --ledger "$W/ledger.sqlite" 2>&1 | tee -a "$S"
cp "$W/ledger.sqlite" "$OUT/ep2_ledger.sqlite" 2>/dev/null
(cd "$W" && tar czf "$OUT/ep2_runs.tar.gz" --exclude='*.json.gz' runs tune.err tune.json)
(cd "$W" && tar cf "$OUT/ep2_run_traces.tar" $(find runs -name '*.json.gz'))
ls -la "$OUT" | tee -a "$S"
say "total +$(( $(date +%s) - T0 ))s"
