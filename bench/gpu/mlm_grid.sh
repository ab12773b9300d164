#!/bin/bash
# The real-trainer grid on the device (library `device`, kind nvidia-h200): NVIDIA Megatron-LM's
# pretrain_gpt.py at bench/mlm_spec.py's pinned commit, carried as a git archive (carry [".mlm"]):
#   git --git-dir=MEGATRON-LM.git archive d98e8a64 megatron pretrain_gpt.py gpt_builders.py \
#     model_provider.py mamba_builders.py hybrid_builders.py | gzip > .mlm/megatron-lm-d98e8a6.tar.gz
# Usage (from the repo root there): DEADLINE_S=480 bash bench/gpu/mlm_grid.sh JOB...
# JOBs: bench/mlm_grid.py. Outputs under $OUT (≤ 8 files): summary.txt, grid.jsonl, logs.tar.gz,
# traces*.tar. Here: python bench/mlm_grid.py report bench/grid_mlm/calls/call*.jsonl
W=${W:-/tmp/g}; source bench/gpu/env.sh
M=${M:-/tmp/mlm}; mkdir -p "$M"
python3 -c "import torch, sys; print('python', sys.version.split()[0], 'torch', torch.__version__)" | tee -a "$S"
tar xzf .mlm/megatron-lm-d98e8a6.tar.gz -C "$M" || { echo "no Megatron-LM archive" | tee -a "$S"; exit 1; }
# Megatron compiles its dataset helpers at start-up when they are missing: once here, not per run
make -s -C "$M/megatron/core/datasets" >>"$S" 2>&1 || echo "helpers build failed" | tee -a "$S"
echo "setup +$(( $(date +%s) - T0 ))s" | tee -a "$S"
python3 bench/mlm_grid.py run "$@" --megatron "$M" --work "$W" --out "$OUT" \
  --deadline-s "${DEADLINE_S:-480}" 2>&1 | tee -a "$S"
ls -la "$OUT" | tee -a "$S"
echo "total +$(( $(date +%s) - T0 ))s" | tee -a "$S"
