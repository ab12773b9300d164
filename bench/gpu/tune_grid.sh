#!/bin/bash
# `moetune tune` from the H200 grid's worst start (bench/grid: shape `host`, point
# mbs1_seq_rcfull_a2a_eager), every candidate from the rules, judged against the grid: how close
# the loop gets to the grid's best point and what GPU time it spends (docs/advisor.md). One call:
#
#   bash bench/gpu/tune_grid.sh        # carry: [".whl"] (workload + tune wheels, env.sh says which)
#
# Confirm runs of 30 iterations (window 21-30): the grid's cost is counted at that length too.
W=/tmp/tgrid; source bench/gpu/env.sh
BASE="python3 -m moetune.executor.workloads.moe_gpt --num-layers 3 --hidden-size 512 --num-attention-heads 8 --ffn-hidden-size 2048 --num-experts 48 --moe-router-topk 6 --moe-ffn-hidden-size 512 --seq-length 1024 --global-batch-size 8 --vocab-size 32000 --micro-batch-size 1 --moe-token-dispatcher-type alltoall --recompute-granularity full --bf16"
# --max-run-time: the loop's own machine-time budget (a quarter of the full-factorial grid's
# estimated time, docs/advisor.md); TUNE_CAP only guards the device call.
CONFIRM_ITERS=30 WINDOW=21-30 BUDGET=${BUDGET:-9} TUNE_CAP=${TUNE_CAP:-580} tune_and_collect grid_ \
  --max-run-time "${MAX_RUN_TIME:-560}"
cp "$W/tune.json" "$OUT/grid_tune.json" 2>/dev/null
say "done at +$(( $(date +%s) - T0 ))s"
