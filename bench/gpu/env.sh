# Sourced by the device scripts (W = their work folder): wheels from the carried .whl/, the
# environment every launched process needs, $OUT/summary.txt and `say`.
set -uo pipefail
OUT=${OUT:-/tmp/out}; [ "${KEEP_W:-0}" = 1 ] || rm -rf "$W"; mkdir -p "$OUT" "$W"  # KEEP_W=1: resume
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
  --target /tmp/site .whl/*.whl || { echo "wheel install failed" | tee "$OUT/summary.txt"; exit 1; }
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
# NVLink multicast off in every process (KINDS.md: it can take the host's GPUs out of service)
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
S="$OUT/summary.txt"
say() { echo "== $*" | tee -a "$S"; }
T0=$(date +%s)
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader | tee -a "$S"
