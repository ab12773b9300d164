#!/bin/bash
# `moetune tune` driving NVIDIA Megatron-LM's pretrain_gpt.py on the device (kind nvidia-h200), from
# a grid point of bench/mlm_spec.py (default: the shape's mis-tuned start), no wrapper scripts: the
# loop adds Megatron's own profiler flags and reads the traces where Megatron writes them.
# Carry [".mlm", ".whl"] (Megatron-LM's archive, bench/gpu/mlm_grid.sh; the wheels of
# docs/executor.md) and leave fixtures/traces out of the tree (the call's 64 MiB).
# Usage: SHAPE=host [POINT=mbs1_seq_rcfull_a2a_eager] MAX_RUN_TIME=400 TUNE_CAP=470 \
#          bash bench/gpu/mlm_tune.sh [more tune arguments]
# Outputs under $OUT: summary.txt, ledger.sqlite, runs.tar.gz (logs, tune.json), run_traces.tar.
W=${W:-/tmp/t}; source bench/gpu/env.sh
M=${M:-/tmp/mlm}; mkdir -p "$M"
tar xzf .mlm/megatron-lm-d98e8a6.tar.gz -C "$M" || { echo "no Megatron-LM archive" | tee -a "$S"; exit 1; }
make -s -C "$M/megatron/core/datasets" >>"$S" 2>&1 || echo "helpers build failed" | tee -a "$S"
# PYTHONSAFEPATH (env.sh) keeps a script's own folder off sys.path: Megatron's imports need it
export PYTHONPATH=$M:$PYTHONPATH CUDA_DEVICE_MAX_CONNECTIONS=1
BASE=$(python3 bench/mlm_spec.py "${SHAPE:-host}" "$M" ${POINT:-})
say "setup +$(( $(date +%s) - T0 ))s"
tune_and_collect "" "$@"
ls -la "$OUT" | tee -a "$S"
say "total +$(( $(date +%s) - T0 ))s"
