#!/usr/bin/env bash
# Several nodes with torchrun's static rendezvous. Run the same command on every node with
#   NNODES       number of nodes
#   NODE_RANK    this node's index, 0 .. NNODES-1
#   MASTER_ADDR  address of node 0 (reachable from every node)
#   MASTER_PORT  a free port on node 0 (default 29500)
#   GPUS_PER_NODE processes per node (default: every visible GPU)
# Keep --tensor-model-parallel-size <= GPUS_PER_NODE: tensor parallelism across nodes is slow.
# scripts/launch.py is torchrun ending with the job's own exit status (2 for a bad input, 0 after a
# signal-triggered save) and without torchrun's traceback. Extra arguments go to pretrain_gpt.py unchanged.
# The caller's working directory is kept, so relative paths in the arguments mean what they say.
set -euo pipefail
REPO=$(cd "$(dirname "$0")/.." && pwd)

: "${NNODES:?set NNODES}" "${NODE_RANK:?set NODE_RANK}" "${MASTER_ADDR:?set MASTER_ADDR}"
MASTER_PORT=${MASTER_PORT:-29500}
if [[ -z "${GPUS_PER_NODE:-}" ]]; then
  GPUS_PER_NODE=$(python -c "import torch; print(torch.cuda.device_count() or 1)")
fi
command=(python "$REPO/scripts/launch.py" --nnodes "$NNODES" --node_rank "$NODE_RANK" --nproc_per_node "$GPUS_PER_NODE"
         --master_addr "$MASTER_ADDR" --master_port "$MASTER_PORT" "$REPO/pretrain_gpt.py" "$@")
echo "+ ${command[*]}"
exec "${command[@]}"
