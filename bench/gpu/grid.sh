#!/bin/bash
# The H200 grid benchmark (issue #16 item 5): real Megatron-Core MoE training runs of the bundled
# workload over one-knob changes from a mis-tuned start, two shapes (bench/grid_spec.py), one GPU.
# Run from the repo root on the device machine (library `device`, kind nvidia-h200), carry [".whl"]
# (megatron_core-0.19.2 and nvtx-0.2.11 wheels; bench/gpu/env.sh installs them). The two calls
# that made bench/grid/grid_h200.json (2026-12-01), exactly:
#
#   PROBE=1 SHARE="host=240" DEADLINE_S=520 bash bench/gpu/grid.sh host mem
#   POINTS="host:mbs8_grp_rcfull_a2a_eager host:mbs8_grp_rcnone_a2a_eager mem:mbs4_seq_rcnone_a2a_eager host:mbs8_grp_rcnone_a2a_local host:mbs1_seq_rcfull_a2a_eager@trace mem:mbs1_seq_rcfull_a2a_eager@trace host:mbs8_grp_rcnone_a2a_local_droppad mem:mbs1_seq_rcnone_a2a_eager host:mbs8_seq_rcnone_a2a_eager" DEADLINE_S=160 bash bench/gpu/grid.sh
#
# The first searches (start, its neighbours, greedy path, grid_spec.EXTRA) until its deadline; the
# second runs the listed points in order (`@trace`: a 5-iteration re-run for a trace that did not
# come back). To go on with the search where it stopped, carry the earlier grid.jsonl:
#   RESUME=bench/out/grid/call3/grid.jsonl ... bash bench/gpu/grid.sh host mem  (+ call2's file)
#
# PROBE=1 first runs tiny local-CUDA-graph variants (which one runs and replays) and picks the
# grid's graph flags from them (grid_spec.GRAPH_FLAGS, else whole layers with drop-and-pad);
# GRAPH_FLAGS="..." sets them instead. Outputs under $OUT (≤ 8 files): summary.txt, grid.jsonl
# (one line per point, written as it ends), grid_summary.json, grid_logs.tar.gz (every run's log),
# grid_tracesN.tar (Kineto traces of the 2 profiled steps; trimmed to one step on the device only
# where the untrimmed ones would not all come back). Here:
#   python bench/grid_run.py report DIR...   # -> bench/grid/grid_h200.json, README table, fixtures
W=${W:-/tmp/grid}; source bench/gpu/env.sh
python3 -c "import torch, megatron.core as m; print('torch', torch.__version__, 'megatron-core', m.__version__)" | tee -a "$S"
[ $# -ge 1 ] || [ -n "${POINTS:-}" ] || { echo "usage: bash bench/gpu/grid.sh SHAPE..." >&2; exit 2; }
ARGS=(--work "$W" --out "$OUT" --deadline-s "${DEADLINE_S:-520}")
[ "${PROBE:-0}" = 1 ] && ARGS+=(--graph-probe)
[ -n "${SHARE:-}" ] && ARGS+=(--share $SHARE)
[ -n "${RESUME:-}" ] && ARGS+=(--resume $RESUME)
[ -n "${GRAPH_FLAGS:-}" ] && ARGS+=(--graph-flags "$GRAPH_FLAGS")
[ -n "${POINTS:-}" ] && ARGS+=(--points $POINTS)
python3 bench/grid_run.py run "$@" "${ARGS[@]}" 2>&1 | tee -a "$S"
ls -la "$OUT" | tee -a "$S"
say "total +$(( $(date +%s) - T0 ))s"
