#!/bin/bash
# Run-to-run noise of host-bound grid points, and whether binding the process to the GPU's CPU cores
# (the CPU/NUMA-binding knob) changes it: POINTS are run in turn, unbound and bound, REPS times,
# ITERS iterations each, unprofiled. One call (carry [".whl"]):
#
#   REPS=3 ITERS=30 bash bench/gpu/noise.sh
#
# Outputs under $OUT: summary.txt (host facts: CPUs, the GPU's CPU affinity, cgroup quota and
# throttling), noise_logs.tar.gz (every run's log). Here: python bench/noise_report.py
# noise_logs.tar.gz
W=${W:-/tmp/noise}; source bench/gpu/env.sh
H="--num-layers 3 --hidden-size 512 --num-attention-heads 8 --ffn-hidden-size 2048 --num-experts 48 --moe-router-topk 6 --moe-ffn-hidden-size 512 --seq-length 1024 --global-batch-size 8 --vocab-size 32000 --moe-token-dispatcher-type alltoall --bf16"
declare -A P=(
  [mbs8_seq_rcnone]="--micro-batch-size 8"
  [mbs8_grp_rcnone]="--micro-batch-size 8 --moe-grouped-gemm"
  [mbs4_seq_rcfull]="--micro-batch-size 4 --recompute-granularity full"
)
POINTS=${POINTS:-"mbs8_seq_rcnone mbs8_grp_rcnone mbs4_seq_rcfull"}
{ echo "nproc $(nproc)"; lscpu | grep -E "Model name|^CPU\(s\)|NUMA|Thread|MHz" ;
  nvidia-smi topo -m; cat /sys/fs/cgroup/cpu.max 2>/dev/null; cat /sys/fs/cgroup/cpu.stat 2>/dev/null;
  cat /proc/loadavg; } 2>&1 | tee -a "$S"
# the GPU's CPU affinity as nvidia-smi reports it (e.g. 0-15), else every CPU
AFF=$(nvidia-smi topo -m 2>/dev/null | awk '/^GPU0/{for(i=1;i<=NF;i++) if($i ~ /^[0-9]+(-[0-9]+)?(,[0-9]+(-[0-9]+)?)*$/ && $i ~ /-|,/) {print $i; exit}}')
AFF=${AFF:-0-$(( $(nproc) - 1 ))}
# bound: the first 4 CPUs of that list (the launching thread and torch's helpers)
FIRST=$(echo "$AFF" | cut -d, -f1 | cut -d- -f1); BIND="$FIRST-$(( FIRST + 3 ))"
say "GPU0 CPU affinity: $AFF; bound runs: taskset -c $BIND"
mkdir -p "$W/logs"
for r in $(seq 1 ${REPS:-3}); do
  for p in $POINTS; do
    for mode in free bound; do
      pre=""; [ $mode = bound ] && pre="taskset -c $BIND"
      t=$(date +%s)
      timeout 300 $pre python3 -m moetune.executor.workloads.moe_gpt $H ${P[$p]} \
        --train-iters ${ITERS:-30} > "$W/logs/${p}__${mode}__$r.log" 2>&1
      say "$p $mode rep $r rc=$? $(( $(date +%s) - t ))s"
      [ $(( $(date +%s) - T0 )) -gt ${DEADLINE_S:-480} ] && break 3
    done
  done
done
cat /sys/fs/cgroup/cpu.stat 2>/dev/null | tee -a "$S"; cat /proc/loadavg | tee -a "$S"
(cd "$W" && tar czf "$OUT/noise_logs.tar.gz" logs)
say "total +$(( $(date +%s) - T0 ))s"
