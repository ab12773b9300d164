# Sourced by the device scripts (W = their work folder): wheels from the carried .whl/ (when a call
# carries them: moetune's own analysis needs them, Megatron-LM's runs do not), the environment every
# launched process needs, $OUT/summary.txt and `say`.
set -uo pipefail
OUT=${OUT:-/tmp/out}; [ "${KEEP_W:-0}" = 1 ] || rm -rf "$W"; mkdir -p "$OUT" "$W"  # KEEP_W=1: resume
# RESUME=DIR (a carried, git-ignored folder holding a previous call's ledger.sqlite, runs.tar.gz and
# run_traces.tar, W unchanged): the tune session goes on across device calls, its runs reused
if [ -n "${RESUME:-}" ]; then
  { cp "$RESUME/ledger.sqlite" "$W/" && tar xzf "$RESUME/runs.tar.gz" -C "$W" \
      && tar xf "$RESUME/run_traces.tar" -C "$W"; } \
    || { echo "RESUME=$RESUME: no ledger.sqlite, runs.tar.gz and run_traces.tar to resume" \
           | tee "$OUT/summary.txt"; exit 1; }
fi
if compgen -G ".whl/*.whl" >/dev/null; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target /tmp/site .whl/*.whl || { echo "wheel install failed" | tee "$OUT/summary.txt"; exit 1; }
fi
# moetune is not installed on the device: its folders are mapped into the `moetune` package only by
# installation (pyproject package-dir), so build that package as links under /tmp/mt
rm -rf /tmp/mt && mkdir -p /tmp/mt/moetune
for f in "$PWD"/moetune/*; do ln -s "$f" /tmp/mt/moetune/; done
for d in analyzer rules executor schemas; do ln -sfn "$PWD/$d" /tmp/mt/moetune/$d; done
# PYTHONSAFEPATH: `python3 -m`/`-c` must not put the working directory first on sys.path, where the
# repo's own moetune/ folder (without the mapped folders) would shadow /tmp/mt/moetune
export PYTHONPATH=/tmp/site:/tmp/mt:$PWD PYTHONSAFEPATH=1 PYTHONUNBUFFERED=1
python3 -c "import moetune.executor.workloads.moe_gpt" \
  || { echo "moetune namespace under /tmp/mt does not import" | tee "$OUT/summary.txt"; exit 1; }
# NVLink multicast off in every process (KINDS.md: it can take the host's GPUs out of service)
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
S="$OUT/summary.txt"
say() { echo "== $*" | tee -a "$S"; }
T0=$(date +%s)
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader | tee -a "$S"

# `moetune tune --cmd "$BASE"` with the protocol the scripts use (TRIES first, then the rules;
# BUDGET candidates; RUN_ITERS measured iterations a run; MAX_RUN_TIME machine seconds for the
# loop's runs; TUNE_CAP seconds of wall time, after which a re-run with KEEP_W=1 resumes), then
# its records under $OUT with file-name prefix $1: ledger, run logs, run traces. More tune
# arguments follow $1.
tune_and_collect() {
  local pre=$1 tries="" t; shift
  for t in ${TRIES-}; do tries="$tries --try $t"; done
  say "tune start at +$(( $(date +%s) - T0 ))s: $BASE"
  timeout ${TUNE_CAP:-420} python3 -m moetune tune --cmd "$BASE" --budget ${BUDGET:-4} $tries "$@" \
    --run-iters ${RUN_ITERS:-12} ${MAX_RUN_TIME:+--max-run-time $MAX_RUN_TIME} --timeout 300 \
    --ledger "$W/ledger.sqlite" --workdir "$W/runs" --json > "$W/tune.json" 2> "$W/tune.err"
  say "tune rc=$? at +$(( $(date +%s) - T0 ))s (124 = stopped by the time cap; rerunning resumes)"
  tail -n 40 "$W/tune.err" | tee -a "$S"
  python3 -m moetune ledger --ledger "$W/ledger.sqlite" 2>&1 | tee -a "$S"
  # SQLite's online backup: a plain copy of a WAL-mode database killed by the cap loses the WAL
  python3 -c "import sqlite3,sys; sqlite3.connect(sys.argv[1]).backup(sqlite3.connect(sys.argv[2]))" \
    "$W/ledger.sqlite" "$OUT/${pre}ledger.sqlite" 2>/dev/null
  # logs of every run; traces of each round's profile and of each candidate's first run
  (cd "$W" && tar czf "$OUT/${pre}runs.tar.gz" --exclude='*.json.gz' runs tune.err tune.json)
  (cd "$W" && tar cf "$OUT/${pre}run_traces.tar" $(find runs -name '*.json.gz'))
}
