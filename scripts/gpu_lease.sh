#!/usr/bin/env bash
# One short GPU lease, one call (issue 88): the cuda tier, the profiles, then the speed table's most telling rows,
# each under its own wall budget so that the call ends inside the lease and keeps what it measured.
#
#   OUT=/tmp/out bash scripts/gpu_lease.sh
#
# Results in $OUT: environment.txt, cuda-tier.log (its summary; cuda-tier-tail.log the end of its output),
# profiles.jsonl (scripts/bench/gpu_profile_step.py), side-by-side.json and table.log
# (scripts/bench/gpu_side_by_side.py).
#   TIER_S (default 200) caps the tier; TIER_K selects its tests (pytest -k; default all); TIER_S=0 skips it.
#   PROFILES: ';'-separated "label|table run|extra flags" (default: bf16 and FP8 tensorwise eager, guard off and
#   compiled, the Llama shape at 4 layers), each profiled for 2 iterations; PROFILES= runs none.
#   RUNS: the table's runs (shape/variant, in order); TABLE_BUDGET_S (default 250): the wall time after which the
#   table starts no run; RUNS=none skips it. The Megatron-LM rows need the kit in .gpu/ (gpu_side_by_side.py).
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
export WANDB_MODE=disabled PYTHONUNBUFFERED=1
python=${PYTHON:-python3}
{ date -u; nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.sm,clocks.max.sm --format=csv,noheader
  "$python" -c "import torch, triton, sys; print('torch', torch.__version__, 'triton', triton.__version__, 'python', sys.version.split()[0])"
  uptime; } 2>&1 | tee "$OUT/environment.txt"

if [ "${TIER_S:-200}" != 0 ]; then
  timeout "${TIER_S:-200}" "$python" -m pytest -m cuda tests/training/test_cuda_paths.py -n 0 -p no:cacheprovider -q -rA --timeout 120 \
      -o addopts="" -s ${TIER_K:+-k "$TIER_K"} 2>&1 | tee "$OUT/cuda-tier-full.log" \
      | grep -E "^(PASSED|FAILED|ERROR|SKIPPED)|passed|failed|worst relative|memory after iteration|Error" \
      | cut -c1-400 | tee "$OUT/cuda-tier.log"
  echo "cuda tier exit ${PIPESTATUS[0]}" | tee -a "$OUT/cuda-tier.log"
  tail -c 2000000 "$OUT/cuda-tier-full.log" > "$OUT/cuda-tier-tail.log" && rm "$OUT/cuda-tier-full.log"
fi

# the second 2026-11-27 lease's profiles (docs/performance.md): the Llama shape at 4 layers, bf16 against FP8
FOUR="--num-layers 4 --global-batch-size 4"
PROFILES=${PROFILES-"bf16|llama-1.2b/eager|$FOUR;fp8|llama-1.2b/fp8-tensorwise|$FOUR;fp8-noguard|llama-1.2b/fp8-tensorwise|$FOUR --no-fp8-guard;fp8-compile|llama-1.2b/fp8-tensorwise-compile|$FOUR"}
IFS=';' read -ra profiles <<< "${PROFILES}"
for entry in "${profiles[@]}"; do
  IFS='|' read -r label run extra <<< "$entry"
  # shellcheck disable=SC2086  # the extra flags are words
  timeout 150 "$python" scripts/bench/gpu_profile_step.py --label "$label" --table-run "$run" \
      --output "$OUT/profiles.jsonl" \
      -- $extra 2>&1 | grep -E "^PROFILE|Error|error:|FP8 guard:" | awk '/FP8 guard:/ && ++guard > 8 {next} {print}' | cut -c1-1500
done

if [ "${RUNS:-}" != none ]; then
  RUNS=${RUNS:-llama-1.2b/eager,llama-1.2b/fp8-tensorwise,gpt2-124m-mbs1/eager,gpt2-124m-mbs1/cuda-graphs,llama-1.2b/megatron,gpt2-124m-mbs1/megatron,llama-1.2b/compile,llama-1.2b/fp8-tensorwise-compile,gpt2-1.5b/compile}
  "$python" scripts/bench/gpu_side_by_side.py --runs "$RUNS" --iterations 10 --skip 4 --timeout-s 120 \
      --budget-s "${TABLE_BUDGET_S:-250}" --output "$OUT/side-by-side.json" 2>&1 | tee "$OUT/table.log" | cut -c1-700
fi
