#!/bin/bash
# The executor on one H200: Megatron-Core fixture traces, then the whole `moetune tune` loop from a
# deliberately mis-tuned start. Run from the repo root on the device machine (one call, ~6-8 min):
#
#   bash bench/gpu/run_executor_demo.sh          # carry: [".whl"]; outputs under $OUT (≤ 8 files)
#   TRIES="micro_batch_size=8 moe_grouped_gemm=true" bash bench/gpu/run_executor_demo.sh
#
# Without TRIES every candidate comes from the rules (diagnosis of each round's profile trace and
# the contract the profile run's own log gives). With two GPUs the fixture traces are made on the
# second one while the loop runs on the first.
#
# .whl/ must hold megatron_core and nvtx==0.2.11 (workload), and for the tune loop what the image
# lacks: polars + polars-runtime-32 (54 MB), msgspec, jsonschema, jsonschema-specifications,
# referencing, rpds-py (the image has torch 2.11, numpy, pyyaml, networkx, rich, attrs).
# Without them steps 0-1 still run and step 2 says what is missing.
W=/tmp/demo; source bench/gpu/env.sh
python3 - <<'PY' 2>&1 | tee -a "$S"
import importlib
need = {"torch": "workload", "megatron.core": "workload", "nvtx": "workload",
        "polars": "tune", "msgspec": "tune", "yaml": "tune", "jsonschema": "tune",
        "networkx": "tune"}
missing = []
for m, part in need.items():
    try:
        mod = importlib.import_module(m)
        print(m, getattr(mod, "__version__", "?"))
    except Exception as exc:
        missing.append(m)
        print(f"MISSING {m} (needed by the {part}; carry its wheel in .whl/): {exc}")
open("/tmp/demo/missing", "w").write(" ".join(missing))
PY
MISSING=$(cat "$W/missing")
case " $MISSING " in *" torch "*|*" megatron.core "*) say "cannot run the workload"; exit 3;; esac

WL="python3 -m moetune.executor.workloads.moe_gpt"
# 0. smoke: Megatron-Core path with Megatron's DDP + optimizer; fall back to fused AdamW, then to
#    the pure-PyTorch model, so the loop below always has a workload (the log names what ran).
OPT=""
SMOKE="--num-layers 2 --hidden-size 256 --num-attention-heads 4 --num-experts 8 --seq-length 256 --bf16 --train-iters 3"
if ! timeout 150 $WL $SMOKE --moe-grouped-gemm > "$W/smoke.log" 2>&1; then
  say "smoke with Megatron optimizer failed: $(grep -m1 -E 'Error|error' "$W/smoke.log")"
  OPT="--workload-optimizer torch"
  if ! timeout 150 $WL $SMOKE $OPT --moe-grouped-gemm > "$W/smoke2.log" 2>&1; then
    say "smoke with torch optimizer failed: $(grep -m1 -E 'Error|error' "$W/smoke2.log")"
    OPT="--workload-impl torch"
  fi
fi
grep -h "implementation =" "$W"/smoke*.log | tee -a "$S"
say "smoke done at +$(( $(date +%s) - T0 ))s, workload options: ${OPT:-default}"

# 1. fixture traces through the workload (Megatron log + Kineto trace of 3 steady steps each, with
#    allocator events and cuda_sync events)
HOST="--num-layers 4 --hidden-size 256 --num-attention-heads 4 --ffn-hidden-size 1024 --num-experts 32 --moe-router-topk 4 --moe-ffn-hidden-size 256 --seq-length 512 --micro-batch-size 1 --global-batch-size 1 --moe-token-dispatcher-type alltoall"
COMP="--num-layers 2 --hidden-size 2048 --num-attention-heads 16 --ffn-hidden-size 8192 --num-experts 4 --moe-router-topk 2 --moe-ffn-hidden-size 8192 --seq-length 2048 --micro-batch-size 4 --global-batch-size 4 --moe-token-dispatcher-type alltoall --moe-grouped-gemm"
PROF="--bf16 --train-iters 8 --profile --profile-step-start 4 --profile-step-end 7 --nvtx-ranges"
fixtures() {
  for case in ${FIXTURE_CASES-hostbound computebound}; do
    [ $case = hostbound ] && ARGS=$HOST || ARGS=$COMP
    timeout 180 $WL $ARGS $PROF $OPT --profile-dir "$W/fx_$case" > "$W/fx_$case.log" 2>&1
    say "fixture $case rc=$? $(grep -c ' iteration ' "$W/fx_$case.log") iteration lines"
    ls -la "$W/fx_$case/rank0.pt.trace.json.gz" 2>&1 | tee -a "$S"
  done
  (cd "$W" && tar cf "$OUT/fixtures.tar" $(ls -d fx_* smoke*.log 2>/dev/null))
}
NGPU=$(nvidia-smi -L | wc -l)
if [ "$NGPU" -ge 2 ]; then
  (export CUDA_VISIBLE_DEVICES=1; fixtures) & FXPID=$!
  export CUDA_VISIBLE_DEVICES=0
else
  fixtures; FXPID=
fi

# 2. the closed loop from a mis-tuned start: MBS 1 under GBS 8 (8 micro-batches), per-expert
#    GEMMs (no --moe-grouped-gemm), eager (no CUDA graphs). Our --try candidates first, then the rules' ones.
BASE="$WL --num-layers 2 --hidden-size 512 --num-attention-heads 8 --ffn-hidden-size 2048 --num-experts 16 --moe-router-topk 2 --moe-ffn-hidden-size 512 --seq-length 1024 --micro-batch-size 1 --global-batch-size 8 --moe-token-dispatcher-type alltoall --bf16 $OPT"
if [ -n "$MISSING" ] && [ "$MISSING" != "nvtx" ]; then
  say "tune SKIPPED: missing $MISSING (carry polars, polars-runtime-32, msgspec, jsonschema, jsonschema-specifications, referencing, rpds-py)"
  [ -n "$FXPID" ] && wait $FXPID; ls -la "$OUT" | tee -a "$S"; exit 0
fi
tune_and_collect "" --run-iters ${SCREEN_ITERS:-10}
[ -n "$FXPID" ] && wait $FXPID
ls -la "$OUT" | tee -a "$S"
say "total +$(( $(date +%s) - T0 ))s"
