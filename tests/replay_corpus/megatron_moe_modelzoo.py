"""The replay corpus: the Megatron-Core MoE team's best-practice launches (yanring/Megatron-MoE-ModelZoo,
best_practice/*/run_*.sh; issue 93 item 5), kept in megatron_moe_modelzoo.json beside this file.

Each script calls `bash sbatch_benchmarking.sh` once or more with its variables (MODEL, PR, TP, PP, EP, VPP, NNODES,
GBS, SEQ_LEN, A2A_OVERLAP, DISPATCHER, OPTIMIZER_OFFLOAD: `invocation`) and extra flags; sbatch_benchmarking.sh
reads model_configs/benchmarking/${MODEL}.yaml's MODEL_ARGS through envsubst and yq (`true` a bare flag, `false`
left out), runtime_configs/benchmarking/{common,runtime}.conf's per-model defaults, and appends the dispatcher's,
the precision's (PR=fp8: blockwise with --fp8-param-gather and the precision-aware optimizer; PR=mxfp8: with
--reuse-grad-buf-for-mxfp8-param-ag too; PR=bf16: --tp-comm-overlap) and A2A_OVERLAP's flags. The lists were taken
by scripts/tools/harvest_megatron_moe_modelzoo.py, running every script under bash from the repository's root at the
commit named, with DRY_RUN=1 (the script prints the Slurm job and `Full Training Command` instead of calling
sbatch), a yq answering mikefarah yq v4's three queries of the script, the template cluster file
(cluster_configs/benchmarking/template.conf, also as CW.conf, the CLUSTER some scripts name), the tree in
/tmp/Megatron-MoE-ModelZoo, and the two site paths as placeholders (DATA_PATH=<DATA_PATH>, LOAD_PATH=<LOAD_PATH>;
shrink.py replaces paths anyway). `argv` is what follows pretrain_gpt.py once the job's `bash -c ${TRAINING_CMD}`
splits it on blanks (quotes inside a value stay, as bash leaves them); `world_size` is the job's nodes x
--ntasks-per-node (4 a node where GB200_CLUSTER=1, else 8).

Only the launches Megatron-LM core_v0.16.1 accepts are here (its parse_args and validate_args, the CUDA device
queries answered as the script's GPU and a current Transformer Engine assumed): 21 of the 32. The other 11, left out:
- qwen3/run_30b.sh (all 3), run_235b.sh's 2nd to 4th, run_gb200_235b.sh's 1st: PR=bf16 adds --tp-comm-overlap, and
  at TP 1 validate_args turns sequence parallelism off and asserts 'Tensor parallel communication/GEMM overlap can
  happen only when sequence parallelism is enabled' (megatron/training/arguments.py:916);
- deepseek-v3/run_deepseek_v3_gb200.sh: --offload-optimizer-states, and run_gb200_235b.sh's 2nd:
  --delay-offload-until-cuda-graph --use-separate-send-recv-groups, flags of Megatron-LM's dev branch (unrecognized);
- kimi-k2/run_kimi_k2_gb200_128k_G128.sh: Kimi-K2.yaml's --moe-layer-freq "'([0]*1+[1]*60)'" reaches the parser with
  its single quotes (invalid moe_freq_type value), besides dev-branch flags;
- qwen3/run_next_80b.sh: --no-weight-decay-cond-type qwen3_next (not a choice at core_v0.16.1), then
  --linear-attention-type gated_delta_net (a dev-branch flag, unrecognized).

Each launch's target is "trains", and each was trained once, shrunk, by tests/scripts/test_replay_corpus.py with
TRAINED_HERE holding them all (21 passed, 1,071 s at load 7 on 2 cores: the ten DeepSeek-V3 ones 68-150 s each, the
others 3-23 s). The suite trains TRAINED_HERE only; every launch goes through the shrink's and --print-config's
checks, which parse each whole, in about 0.1 s.
"""

import json
from pathlib import Path

from tests.replay_corpus.launch import Launch, Source

_EXPANDED = ("run with bash from the repository root at the commit named, DRY_RUN=1, the template cluster file, "
             "DATA_PATH=<DATA_PATH> LOAD_PATH=<LOAD_PATH>; the script's line: {invocation}")


def _launches() -> tuple[Launch, ...]:
    data = json.loads(Path(__file__).with_name("megatron_moe_modelzoo.json").read_text(encoding="utf-8"))
    return tuple(
        Launch(name=entry["name"], script=Source(data["repo"], entry["path"], data["commit"]),
               program="pretrain_gpt.py", world_size=entry["world_size"],
               expanded=_EXPANDED.format(invocation=entry["invocation"]), argv=tuple(entry["argv"]),
               outcome=entry["outcome"])
        for entry in data["launches"])


LAUNCHES = _launches()

# The launches the suite trains (the rest: parsed, shrunk and printed only).
# One: Qwen3-235B-A22B on GB300 as written but for sizes (MXFP8 with --fp8-param-gather
# --reuse-grad-buf-for-mxfp8-param-ag and the precision-aware optimizer, HybridEP flex dispatch with A2A overlap, EP 64
# shrunk to 2, CUDA-graph scopes): 2.9 s at load 4.7 on the 2 cores, beside 4.1 s for modelzoo-mixtral-8x22b-2 and
# 4.7 s for megatron-lm-2020-pretrain-gpt2 in the same session. DeepSeek-V3's shapes train in slime.py's launches.
TRAINED_HERE = frozenset({"modelzoo-qwen3-gb300-235b"})
