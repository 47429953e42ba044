"""The replay corpus: a GPU vendor's Megatron-LM fork's launch scripts (ROCm/Megatron-LM, AMD's; issue 93 item 5),
kept in rocm_megatron_lm.json beside this file.

Each entry is one script of the fork's examples/ run once with its defaults: MODEL_SIZE and the parallel sizes as
the script sets them when nothing is exported, mock data where the script defaults to it, on one node of 8 GPUs.
The lists were taken by scripts/tools/harvest_rocm_megatron_lm.py, running each script under bash from the root of a
scratch tree (/tmp/ROCm-Megatron-LM, the script at its path) with stand-ins for what a launch node would answer:
`torchrun` records its arguments, `date` answers the Unix epoch (the time stamp in the scripts' log and TensorBoard
folders), `rdma` lists no links, `wget` downloads nothing (llama's tokenizer download), and `import torch;
print(torch.cuda.device_count())` answers 8. `argv` is what follows pretrain_gpt.py in torchrun's arguments, token for
token; `world_size` is --nproc_per_node x --nnodes. Each entry names the commit of the version harvested: the
stored copy of the fork this was taken from holds each file at its own commit, so the scripts' commits differ.

Only the launches Megatron-LM core_v0.16.1 accepts are here (its parse_args and validate_args, the device queries
answered as an MI300X/MI355X, compute capability 9): 4 of the 6. The other 2, left out:
- examples/qwen3/train_qwen3.sh (0874a334, MODEL_SIZE=30B_A3B): 'unrecognized arguments: --max-padding-length 4096
  --log-batch-size-to-tensorboard --train-mode pretrain' (the fork's own flags, and one core_v0.16.1 does not have);
- examples/deepseek_v3/train_deepseekv3.sh (015290ee, MODEL_SIZE=16B): "argument --tokenizer-type: invalid choice:
  'DeepSeekV3Tokenizer'", the fork's tokenizer, before its other flags of the fork (--attention-sink-k,
  --enable-shared-expert, --num-shared-experts, --extra-vocab-size, --dataset, --max-padding-length, --train-mode).
Not run: the fork's MI355X proxy files (examples/qwen3/proxy_mi355x_qwen3_235B_A22B.sh, examples/deepseek_v3/
proxy_mi355x_deepseekv3_671B.sh, 09115513), which export variables to be sourced before train_qwen3.sh /
train_deepseekv3.sh at their own commit (MoRI dispatch, --moe-enable-mori, the fork's; CUDA-graph scopes); no 567B MoE
script was found in the stored copy.

Each launch's target is "trains". Run here, shrunk, by tests/scripts/test_replay_corpus.py with TRAINED_HERE
holding all 4 (2026-11-28, on the 2 cores): rocm-mixtral-8x7b trains; rocm-llama3-70b and rocm-llama2-70b, which pass
`--dataloader-type cyclic` (Megatron-LM's MegatronPretrainingRandomSampler, data/sampler.py CyclicSampler), train;
and rocm-qwen2-1.5b, which passes it too and --num-query-groups 2 at TP 8 (1 at TP 2, shrunk), fewer key/value groups
than TP ranks, run as Megatron-Core's attention.py:289 runs them (gpt/qkv_projection.py QKVLayout;
tests/gpt/test_kv_groups_below_tp.py), trains (once, all four in TRAINED_HERE, after the merge of both: 8.9, 19.5, 7.4 and 3.4 s at load
4-5, the CI run beside them). The qwen2 launch also found a shrink bug (--ffn-hidden-size
8960 of 1536 became an odd 187 at TP 2), fixed in shrink.py. The suite trains TRAINED_HERE only; every launch goes
through the shrink's and --print-config's checks.
"""

import json
from pathlib import Path

from tests.replay_corpus.launch import Launch, Source

_EXPANDED = ("run with bash from a scratch tree's root, its defaults (nothing exported), one node of 8 GPUs, "
             "`date` at the Unix epoch")


def _launches() -> tuple[Launch, ...]:
    data = json.loads(Path(__file__).with_name("rocm_megatron_lm.json").read_text(encoding="utf-8"))
    return tuple(
        Launch(name=entry["name"], script=Source(data["repo"], entry["path"], entry["commit"]),
               program="pretrain_gpt.py", world_size=entry["world_size"], expanded=_EXPANDED,
               argv=tuple(entry["argv"]), outcome=entry["outcome"])
        for entry in data["launches"])


LAUNCHES = _launches()

# The launches the suite trains (the rest: parsed, shrunk and printed only).
# One: Mixtral 8x7B as AMD ships it (TP 8 and EP 8 shrunk to 2, the legacy grouped GEMM, alltoall dispatch, the
# distributed optimizer with overlapped gradient reduce and parameter gather, `--eval-iters -1` after `--split`).
TRAINED_HERE = frozenset({"rocm-mixtral-8x7b"})
