#!/usr/bin/env bash
# One short GPU lease, one call (issue 88): the cuda tier, then the speed table's most telling rows, each under its
# own wall budget so that the call ends inside the lease and keeps what it measured.
#
#   OUT=/tmp/out bash scripts/gpu_lease.sh          # results: $OUT/cuda-tier.log, $OUT/side-by-side.json, $OUT/table.log
#
# TIER_S (default 200) caps the tier; TABLE_BUDGET_S (default 250) is the wall time after which the table starts no
# run; RUNS overrides the table's runs (shape/variant, in order). The Megatron-LM rows need the kit in .gpu/
# (scripts/gpu_side_by_side.py's docstring); without it they are recorded as skipped.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
export WANDB_MODE=disabled PYTHONUNBUFFERED=1
python=${PYTHON:-python3}
{ date -u; nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.sm,clocks.max.sm --format=csv,noheader
  "$python" -c "import torch, triton, sys; print('torch', torch.__version__, 'triton', triton.__version__, 'python', sys.version.split()[0])"
  uptime; git rev-parse --short HEAD 2>/dev/null; } 2>&1 | tee "$OUT/environment.txt"

timeout "${TIER_S:-200}" "$python" -m pytest -m cuda tests/cuda -n 0 -p no:cacheprovider -q -rA --timeout 120 \
    -o addopts="" -s 2>&1 | tee "$OUT/cuda-tier-full.log" | grep -E "^(PASSED|FAILED|ERROR|SKIPPED)|passed|failed|worst relative|memory after iteration|Error" \
    | cut -c1-400 | tee "$OUT/cuda-tier.log"
echo "cuda tier exit ${PIPESTATUS[0]}" | tee -a "$OUT/cuda-tier.log"
tail -c 2000000 "$OUT/cuda-tier-full.log" > "$OUT/cuda-tier-tail.log" && rm "$OUT/cuda-tier-full.log"

RUNS=${RUNS:-llama-1.2b/eager,llama-1.2b/fp8-tensorwise,gpt2-124m-mbs1/eager,gpt2-124m-mbs1/cuda-graphs,llama-1.2b/megatron,gpt2-124m-mbs1/megatron,llama-1.2b/compile,llama-1.2b/fp8-tensorwise-compile,gpt2-1.5b/compile}
"$python" scripts/gpu_side_by_side.py --runs "$RUNS" --iterations 10 --skip 4 --timeout-s 120 \
    --budget-s "${TABLE_BUDGET_S:-250}" --output "$OUT/side-by-side.json" 2>&1 | tee "$OUT/table.log" | cut -c1-700
