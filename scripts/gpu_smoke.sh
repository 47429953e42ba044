#!/usr/bin/env bash
# Smoke-test the training loop on one CUDA GPU: every path that differs from the CPU one (bf16/fp16
# on the device, fused AdamW, ZeRO stages on one rank, ZeRO-R checkpointing with host offload,
# checkpoint save and exact resume with CUDA RNG states), each a short real run of pretrain_gpt.py.
#
#   scripts/gpu_smoke.sh [LOG_DIR]        # logs per run in LOG_DIR (default: a temporary directory)
#
# Prints PASS/FAIL per run and the last lines of each failing log; exits non-zero if any run failed.
# Runs use a temporary data cache and never touch ~/.cache or runs/.
set -uo pipefail
cd "$(dirname "$0")/.."
export WANDB_MODE=disabled PYTHONUNBUFFERED=1
logs=${1:-$(mktemp -d)}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
mkdir -p "$logs"
python=${PYTHON:-python3}
device=${DEVICE:-cuda}  # DEVICE=cpu runs the same checks on the CPU
failed=0

run() {
    local name=$1
    shift
    local began=$SECONDS
    if "$python" pretrain_gpt.py --device "$device" --data-cache-dir "$work/cache" --metrics-file "$work/$name/metrics.jsonl" \
        "$@" >"$logs/$name.log" 2>&1; then
        echo "PASS $name ($((SECONDS - began)) s): $(grep -E '^ *iteration|^ *total' "$logs/$name.log" | tail -1 | cut -c1-260)"
        grep -E "memory after iteration" "$logs/$name.log" | head -1
    else
        echo "FAIL $name (exit $?, $((SECONDS - began)) s): pretrain_gpt.py $*"
        tail -25 "$logs/$name.log"
        failed=1
    fi
}

tiny=(--train-iters 20 --log-interval 10 --eval-interval 10 --eval-iters 2 --hidden-dropout 0.1)
run fp32 "${tiny[@]}"
run bf16_memory "${tiny[@]}" --bf16 --report-memory
run fp16_dynamic "${tiny[@]}" --fp16
for stage in 1 2 3; do
    run "bf16_stage$stage" "${tiny[@]}" --bf16 --zero-stage "$stage" --report-memory
done
run checkpointing_cpu "${tiny[@]}" --bf16 --checkpoint-activations --partition-activations --cpu-checkpointing \
    --contiguous-checkpointing --report-memory
run compiled_stage3 "${tiny[@]}" --bf16 --zero-stage 3 --compile --checkpoint-activations
run dry_run --bf16 --zero-stage 3 --dry-run
# Megatron-LM's flags on the device: the flash kernel (16-bit only), the distributed optimizer, full
# recompute, a batch ramp and TensorBoard events.
run megatron_flags "${tiny[@]}" --bf16 --attention-backend flash --use-distributed-optimizer \
    --recompute-granularity full --recompute-method uniform --recompute-num-layers 1 \
    --global-batch-size 32 --rampup-batch-size 16 16 64 --tensorboard-dir "$work/tb"
run overlap_param_gather "${tiny[@]}" --bf16 --zero-stage 2 --overlap-param-gather

# Exact resume on the device: 20 iterations straight against 10, exit, resume, 10 more.
run resume_full "${tiny[@]}" --bf16 --save "$work/full_ckpt"
run resume_first "${tiny[@]}" --bf16 --save "$work/ckpt" --exit-interval 10
run resume_second "${tiny[@]}" --bf16 --save "$work/ckpt" --load "$work/ckpt" --metrics-file "$work/resume_first/metrics.jsonl"
if ! "$python" - "$work/resume_full/metrics.jsonl" "$work/resume_first/metrics.jsonl" <<'EOF'
import json, sys
def losses(path):
    return {r["iteration"]: r["loss"] for r in map(json.loads, open(path)) if "split" not in r and "loss" in r}
full, resumed = losses(sys.argv[1]), losses(sys.argv[2])
print(f"resume: iteration 20 loss straight {full[20]!r}, resumed {resumed[20]!r}")
sys.exit(0 if full[20] == resumed[20] else 1)
EOF
then
    echo "FAIL resume: the resumed run's loss differs from the straight run's"
    failed=1
fi

# The real GPT-2 124M shape on the embedded corpus (4096-token BPE), for a throughput line.
run gpt2_124m --config gpt2-124m --micro-batch-size 8 --global-batch-size 32 --train-iters 20 --log-interval 5 \
    --eval-iters 0 --lr-warmup-iters 2

echo "logs in $logs"
exit $failed
