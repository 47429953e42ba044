#!/usr/bin/env bash
# One node, GPUS_PER_NODE processes (default: every visible GPU, or 2 CPU processes without GPUs).
# scripts/launch.py is torchrun ending with the job's own exit status (2 for a bad input, 0 after a
# signal-triggered save) and without torchrun's traceback. Extra arguments go to pretrain_gpt.py unchanged, e.g.
#   scripts/launch_single_node.sh --config gpt2-124m --tensor-model-parallel-size 2 --data-path ...
# The caller's working directory is kept, so relative paths in the arguments mean what they say.
set -euo pipefail
REPO=$(cd "$(dirname "$0")/.." && pwd)

if [[ -z "${GPUS_PER_NODE:-}" ]]; then
  GPUS_PER_NODE=$(python -c "import torch; print(torch.cuda.device_count() or 2)")
fi
command=(python "$REPO/scripts/launch.py" --standalone --nnodes 1 --nproc_per_node "$GPUS_PER_NODE"
         "$REPO/pretrain_gpt.py" "$@")
echo "+ ${command[*]}"
exec "${command[@]}"
