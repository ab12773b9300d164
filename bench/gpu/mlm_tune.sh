#!/bin/bash
# `moetune tune` driving NVIDIA Megatron-LM's pretrain_gpt.py on the device (kind nvidia-h200), from
# a grid point of bench/mlm_spec.py (default: the shape's mis-tuned start), no wrapper scripts: the
# loop adds Megatron's own profiler flags and reads the traces where Megatron writes them.
# Carry [".mlm", ".whl"] (Megatron-LM's archive, bench/gpu/mlm_grid.sh; the wheels of
# docs/executor.md) and leave fixtures/traces out of the tree (the call's 64 MiB).
# Usage: SHAPE=host [POINT=mbs1_seq_rcfull_a2a_eager] MAX_RUN_TIME=400 TUNE_CAP=470 \
#          [CHECK="END host:POINT@rep ..." CHECK_S=150] bash bench/gpu/mlm_tune.sh [tune arguments]
# Outputs under $OUT: summary.txt, ledger.sqlite, runs.tar.gz (logs, tune.json), run_traces.tar;
# with CHECK also grid.jsonl and logs.tar.gz (bench/mlm_grid.py).
W=${W:-/tmp/t}; source bench/gpu/env.sh
M=${M:-/tmp/mlm}; mkdir -p "$M"
tar xzf .mlm/megatron-lm-d98e8a6.tar.gz -C "$M" || { echo "no Megatron-LM archive" | tee -a "$S"; exit 1; }
make -s -C "$M/megatron/core/datasets" >>"$S" 2>&1 || echo "helpers build failed" | tee -a "$S"
# PYTHONSAFEPATH (env.sh) keeps a script's own folder off sys.path: Megatron's imports need it
export PYTHONPATH=$M:$PYTHONPATH CUDA_DEVICE_MAX_CONNECTIONS=1
BASE=$(python3 bench/mlm_spec.py "${SHAPE:-host}" "$M" ${POINT:-})
say "setup +$(( $(date +%s) - T0 ))s"
tune_and_collect "" "$@"
# CHECK: grid jobs run after the loop in the same call (bench/mlm_grid.py; END stands for the
# loop's final command), e.g. CHECK="END host:mbs8_seq_rcselective_a2a_local@rep END ..." to
# measure the end point interleaved with the grid's best; CHECK_S seconds for them
if [ -n "${CHECK:-}" ]; then
  say "check jobs at +$(( $(date +%s) - T0 ))s: $CHECK"
  python3 bench/mlm_grid.py run ${CHECK//END/end:${SHAPE:-host}:$W/tune.json} --megatron "$M" \
    --work "$W/check" --out "$OUT" --deadline-s "${CHECK_S:-150}" 2>&1 | tee -a "$S"
fi
ls -la "$OUT" | tee -a "$S"
say "total +$(( $(date +%s) - T0 ))s"
