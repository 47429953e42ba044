"""The replay corpus: THUDM slime's MoE flag sets (issue 81), the Megatron-LM flags its RL run scripts hand to its
train.py, which trains through Megatron-LM. Each entry is a scripts/run-<model>*.sh at one commit, run under bash
with stub launchers (`ray job submit` records what follows `--`), its scripts/models/<model>.sh's MODEL_ARGS and its
PERF_ARGS, OPTIMIZER_ARGS (the hybrid CPU optimizer: --optimizer-cpu-offload --overlap-cpu-optimizer-d2h-h2d
--use-precision-aware-optimizer) and the rest, as written. slime's own flags (its rollout, sglang, GRPO and cluster
flags, --hf-checkpoint, --ref-load: the ones slime/utils/arguments.py adds) are left out, each entry's `expanded`
names them; Megatron-LM flags slime re-defaults (--load, --save, --global-batch-size, --eval-interval) stay.
What slime sets on Megatron's arguments itself whatever the script gives (the distributed optimizer, bf16, micro
batch 1, a placeholder --seq-length 4096, the Hugging Face tokenizer of --hf-checkpoint, --rope-type; --train-iters
and a global batch from its rollout sizes) follows as the flags that set those values. The scripts at 478b8070 (the
last commit with GLM-4.5's run script, renamed GLM-4.7 by the next) ran with the stubs launch.py describes;
BASE_DIR, BASE_FOLDER and MASTER_ADDR stay as written. The program is train.py and the world size
--actor-num-nodes x --actor-num-gpus-per-node, as the scripts say. See launch.py for what an entry holds."""

from tests.replay_corpus.launch import Launch, Source

LAUNCHES = (
    Launch(
        name='slime-qwen3-30b-a3b',
        script=Source("THUDM/slime", 'scripts/run-qwen3-30B-A3B.sh', '478b807093608fe4ec82d3933e9f258d079865f2'),
        program="train.py", world_size=8,
        expanded=("scripts/models/qwen3-30B-A3B.sh's MODEL_ARGS (its 48-entry --moe-layer-freq list as the script "
                  "prints it) and the run script's CKPT_ARGS, ROLLOUT_ARGS, OPTIMIZER_ARGS, PERF_ARGS, EVAL_ARGS and "
                  "MISC_ARGS, in the order its ray job hands them to train.py (1 node x 8 GPUs, --colocate); slime's "
                  "own flags left out (slime/utils/arguments.py and sglang's: --actor-num-nodes, "
                  '--actor-num-gpus-per-node, --colocate, --hf-checkpoint, --ref-load, --prompt-data, --input-key, '
                  '--label-key, --apply-chat-template, --rollout-shuffle, --rm-type, --num-rollout, '
                  '--rollout-batch-size, --n-samples-per-prompt, --rollout-max-response-len, --rollout-temperature, '
                  '--balance-data, --advantage-estimator, --use-kl-loss, --kl-loss-coef, --kl-loss-type, '
                  '--entropy-coef, --eps-clip, --eps-clip-high, --use-dynamic-batch-size, --max-tokens-per-gpu, '
                  '--eval-prompt-data, --n-samples-per-eval-prompt, --eval-max-response-len, --eval-top-p, '
                  '--rollout-num-gpus-per-engine, --sglang-mem-fraction-static, --sglang-cuda-graph-bs); then what '
                  "slime's megatron_parse_args sets on Megatron-LM's arguments whatever the script gives "
                  "(slime/utils/arguments.py's default --micro-batch-size 1, which --use-dynamic-batch-size packs to "
                  "--max-tokens-per-gpu; slime/backends/megatron_utils/arguments.py's _set_default_megatron_args; "
                  "slime/backends/megatron_utils/model.py's --train-iters, num-rollout x rollout-batch-size x "
                  'n-samples-per-prompt / global batch), written as the flags that set them: --micro-batch-size 1 '
                  '--use-distributed-optimizer --bf16 --seq-length 4096 --max-position-embeddings 4096 '
                  '--tokenizer-type HuggingFaceTokenizer --tokenizer-model /root/Qwen3-30B-A3B --train-iters 3000 '
                  '--rope-type rope'),
        argv=(
            '--disable-bias-linear', '--qk-layernorm', '--group-query-attention', '--num-attention-heads', '32',
            '--num-query-groups', '4', '--kv-channels', '128', '--num-layers', '48', '--hidden-size', '2048',
            '--ffn-hidden-size', '6144', '--normalization', 'RMSNorm', '--position-embedding-type', 'rope',
            '--norm-epsilon', '1e-6', '--rotary-percent', '1.0', '--swiglu', '--untie-embeddings-and-output-weights',
            '--vocab-size', '151936', '--rotary-base', '1000000', '--moe-ffn-hidden-size', '768',
            '--moe-router-score-function', 'softmax', '--moe-token-dispatcher-type', 'alltoall', '--moe-router-topk',
            '8', '--moe-layer-freq',
            '[1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1]',
            '--num-experts', '128', '--moe-grouped-gemm', '--moe-token-drop-policy', 'probs', '--moe-router-dtype',
            'fp32', '--moe-permute-fusion', '--moe-aux-loss-coeff', '0', '--load', '/root/Qwen3-30B-A3B_slime/',
            '--save', '/root/Qwen3-30B-A3B_slime/', '--save-interval', '20', '--global-batch-size', '256',
            '--optimizer', 'adam', '--lr', '1e-6', '--lr-decay-style', 'constant', '--weight-decay', '0.1',
            '--adam-beta1', '0.9', '--adam-beta2', '0.98', '--optimizer-cpu-offload',
            '--overlap-cpu-optimizer-d2h-h2d', '--use-precision-aware-optimizer', '--tensor-model-parallel-size', '4',
            '--sequence-parallel', '--pipeline-model-parallel-size', '1', '--context-parallel-size', '1',
            '--expert-model-parallel-size', '8', '--expert-tensor-parallel-size', '1', '--recompute-granularity',
            'full', '--recompute-method', 'uniform', '--recompute-num-layers', '1', '--eval-interval', '20',
            '--attention-dropout', '0.0', '--hidden-dropout', '0.0', '--accumulate-allreduce-grads-in-fp32',
            '--attention-softmax-in-fp32', '--attention-backend', 'flash', '--micro-batch-size', '1',
            '--use-distributed-optimizer', '--bf16', '--seq-length', '4096', '--max-position-embeddings', '4096',
            '--tokenizer-type', 'HuggingFaceTokenizer', '--tokenizer-model', '/root/Qwen3-30B-A3B', '--train-iters',
            '3000', '--rope-type', 'rope',
        ),
        outcome='trains',
    ),

    Launch(
        name='slime-qwen3-235b-a22b',
        script=Source("THUDM/slime", 'scripts/run-qwen3-235B-A22B.sh', '478b807093608fe4ec82d3933e9f258d079865f2'),
        program="train.py", world_size=64,
        expanded=("scripts/models/qwen3-235B-A22B.sh's MODEL_ARGS (a 94-entry --moe-layer-freq list) and the run "
                  "script's arrays in its ray job's order (8 nodes x 8 GPUs); BASE_FOLDER and MASTER_ADDR left as "
                  "written ($BASE_FOLDER); slime's own flags left out (slime/utils/arguments.py and sglang's: "
                  '--actor-num-nodes, --actor-num-gpus-per-node, --rollout-num-gpus, --update-weight-buffer-size, '
                  '--hf-checkpoint, --ref-load, --prompt-data, --input-key, --label-key, --apply-chat-template, '
                  '--rollout-shuffle, --rm-type, --num-rollout, --rollout-batch-size, --n-samples-per-prompt, '
                  '--rollout-max-response-len, --rollout-temperature, --balance-data, --advantage-estimator, '
                  '--kl-loss-coef, --kl-loss-type, --entropy-coef, --eps-clip, --use-dynamic-batch-size, '
                  '--max-tokens-per-gpu, --eval-prompt-data, --n-samples-per-eval-prompt, --eval-max-response-len, '
                  '--eval-top-p, --rollout-num-gpus-per-engine, --sglang-mem-fraction-static, '
                  '--sglang-enable-dp-attention, --sglang-dp-size, --sglang-ep-size, --sglang-enable-dp-lm-head, '
                  "--sglang-cuda-graph-bs, --sglang-moe-a2a-backend, --sglang-deepep-mode); then what slime's "
                  "megatron_parse_args sets on Megatron-LM's arguments whatever the script gives "
                  "(slime/utils/arguments.py's default --micro-batch-size 1, which --use-dynamic-batch-size packs to "
                  "--max-tokens-per-gpu; slime/backends/megatron_utils/arguments.py's _set_default_megatron_args; "
                  "slime/backends/megatron_utils/model.py's --train-iters, num-rollout x rollout-batch-size x "
                  'n-samples-per-prompt / global batch), written as the flags that set them: --micro-batch-size 1 '
                  '--use-distributed-optimizer --bf16 --seq-length 4096 --max-position-embeddings 4096 '
                  '--tokenizer-type HuggingFaceTokenizer --tokenizer-model $BASE_FOLDER/Qwen3-235B-A22B-FP8 '
                  '--train-iters 3000 --rope-type rope'),
        argv=(
            '--disable-bias-linear', '--qk-layernorm', '--group-query-attention', '--num-attention-heads', '64',
            '--num-query-groups', '4', '--kv-channels', '128', '--num-layers', '94', '--hidden-size', '4096',
            '--ffn-hidden-size', '12288', '--normalization', 'RMSNorm', '--position-embedding-type', 'rope',
            '--norm-epsilon', '1e-6', '--rotary-percent', '1.0', '--swiglu', '--untie-embeddings-and-output-weights',
            '--vocab-size', '151936', '--rotary-base', '1000000', '--moe-ffn-hidden-size', '1536',
            '--moe-router-score-function', 'softmax', '--moe-token-dispatcher-type', 'alltoall', '--moe-router-topk',
            '8', '--moe-layer-freq',
            '[1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1]',
            '--num-experts', '128', '--moe-grouped-gemm', '--moe-token-drop-policy', 'probs', '--moe-router-dtype',
            'fp32', '--moe-permute-fusion', '--moe-aux-loss-coeff', '0', '--load',
            '$BASE_FOLDER/Qwen3-235B-A22B_slime/', '--save', '$BASE_FOLDER/Qwen3-235B-A22B_slime/', '--save-interval',
            '20', '--global-batch-size', '64', '--optimizer', 'adam', '--lr', '1e-6', '--lr-decay-style', 'constant',
            '--weight-decay', '0.1', '--adam-beta1', '0.9', '--adam-beta2', '0.98', '--optimizer-cpu-offload',
            '--overlap-cpu-optimizer-d2h-h2d', '--use-precision-aware-optimizer', '--tensor-model-parallel-size', '4',
            '--sequence-parallel', '--pipeline-model-parallel-size', '4', '--context-parallel-size', '2',
            '--expert-model-parallel-size', '16', '--expert-tensor-parallel-size', '1',
            '--decoder-last-pipeline-num-layers', '22', '--recompute-granularity', 'full', '--recompute-method',
            'uniform', '--recompute-num-layers', '1', '--attention-dropout', '0.0', '--hidden-dropout', '0.0',
            '--accumulate-allreduce-grads-in-fp32', '--attention-softmax-in-fp32', '--attention-backend', 'flash',
            '--micro-batch-size', '1', '--use-distributed-optimizer', '--bf16', '--seq-length', '4096',
            '--max-position-embeddings', '4096', '--tokenizer-type', 'HuggingFaceTokenizer', '--tokenizer-model',
            '$BASE_FOLDER/Qwen3-235B-A22B-FP8', '--train-iters', '3000', '--rope-type', 'rope',
        ),
        outcome='trains',
    ),

    Launch(
        name='slime-glm4.5-106b-a12b',
        script=Source("THUDM/slime", 'scripts/models/glm4.5-106B-A12B.sh', '478b807093608fe4ec82d3933e9f258d079865f2'),
        program="train.py", world_size=64,
        expanded=('GLM-4.5-Air: slime has no run script for it, only this MODEL_ARGS file; the run flags are those '
                  "of GLM-4.5's one run script, scripts/run-glm4.5-355B-A32B.sh, with its `source` line naming this "
                  "file instead of glm4.5-355B-A32B.sh (8 nodes x 8 GPUs; BASE_DIR as written); slime's own flags "
                  "left out (slime/utils/arguments.py and sglang's: --actor-num-nodes, --actor-num-gpus-per-node, "
                  '--colocate, --save-debug-rollout-data, --hf-checkpoint, --ref-load, --prompt-data, --input-key, '
                  '--label-key, --apply-chat-template, --rollout-shuffle, --rm-type, --num-rollout, '
                  '--rollout-batch-size, --n-samples-per-prompt, --rollout-max-response-len, --rollout-temperature, '
                  '--over-sampling-batch-size, --dynamic-sampling-filter-path, --num-steps-per-rollout, '
                  '--balance-data, --rollout-stop-token-ids, --advantage-estimator, --kl-loss-coef, --kl-loss-type, '
                  '--kl-coef, --entropy-coef, --eps-clip, --eps-clip-high, --use-tis, --use-dynamic-batch-size, '
                  '--max-tokens-per-gpu, --eval-prompt-data, --n-samples-per-eval-prompt, --eval-max-response-len, '
                  '--eval-top-p, --rollout-num-gpus-per-engine, --sglang-mem-fraction-static, '
                  '--sglang-enable-dp-attention, --sglang-dp-size, --sglang-ep-size, --sglang-enable-dp-lm-head, '
                  '--sglang-moe-dense-tp-size, --sglang-speculative-algorithm, --sglang-speculative-num-steps, '
                  "--sglang-speculative-eagle-topk, --sglang-speculative-num-draft-tokens); then what slime's "
                  "megatron_parse_args sets on Megatron-LM's arguments whatever the script gives "
                  "(slime/utils/arguments.py's default --micro-batch-size 1, which --use-dynamic-batch-size packs to "
                  "--max-tokens-per-gpu; slime/backends/megatron_utils/arguments.py's _set_default_megatron_args; "
                  "slime_validate_args' --global-batch-size, rollout-batch-size x n-samples-per-prompt / "
                  "num-steps-per-rollout; slime/backends/megatron_utils/model.py's --train-iters, num-rollout x "
                  'rollout-batch-size x n-samples-per-prompt / global batch), written as the flags that set them: '
                  '--micro-batch-size 1 --use-distributed-optimizer --bf16 --seq-length 4096 '
                  '--max-position-embeddings 4096 --tokenizer-type HuggingFaceTokenizer --tokenizer-model '
                  '$BASE_DIR/GLM-4.5-355B-A32B --global-batch-size 256 --train-iters 12000 --rope-type rope'),
        argv=(
            '--disable-bias-linear', '--group-query-attention', '--num-attention-heads', '96', '--num-query-groups',
            '8', '--kv-channels', '128', '--num-layers', '46', '--hidden-size', '4096', '--ffn-hidden-size', '10944',
            '--add-qkv-bias', '--normalization', 'RMSNorm', '--position-embedding-type', 'rope', '--rotary-percent',
            '0.5', '--swiglu', '--untie-embeddings-and-output-weights', '--vocab-size', '151552', '--rotary-base',
            '1000000', '--moe-ffn-hidden-size', '1408', '--moe-shared-expert-intermediate-size', '1408',
            '--moe-router-pre-softmax', '--moe-router-score-function', 'sigmoid', '--moe-router-enable-expert-bias',
            '--moe-router-bias-update-rate', '0', '--moe-router-load-balancing-type', 'seq_aux_loss',
            '--moe-token-dispatcher-type', 'alltoall', '--moe-router-topk', '8', '--moe-layer-freq', '[0]*1+[1]*45',
            '--num-experts', '128', '--moe-grouped-gemm', '--moe-router-dtype', 'fp32', '--moe-permute-fusion',
            '--moe-aux-loss-coeff', '0', '--optimizer', 'adam', '--lr', '1e-6', '--lr-decay-style', 'constant',
            '--weight-decay', '0.1', '--adam-beta1', '0.9', '--adam-beta2', '0.98', '--optimizer-cpu-offload',
            '--overlap-cpu-optimizer-d2h-h2d', '--use-precision-aware-optimizer', '--tensor-model-parallel-size', '8',
            '--sequence-parallel', '--pipeline-model-parallel-size', '4', '--context-parallel-size', '2',
            '--expert-model-parallel-size', '16', '--expert-tensor-parallel-size', '1', '--recompute-granularity',
            'full', '--recompute-method', 'uniform', '--recompute-num-layers', '1', '--eval-interval', '20',
            '--attention-dropout', '0.0', '--hidden-dropout', '0.0', '--accumulate-allreduce-grads-in-fp32',
            '--attention-softmax-in-fp32', '--attention-backend', 'flash', '--moe-token-dispatcher-type', 'flex',
            '--moe-enable-deepep', '--micro-batch-size', '1', '--use-distributed-optimizer', '--bf16', '--seq-length',
            '4096', '--max-position-embeddings', '4096', '--tokenizer-type', 'HuggingFaceTokenizer',
            '--tokenizer-model', '$BASE_DIR/GLM-4.5-355B-A32B', '--global-batch-size', '256', '--train-iters',
            '12000', '--rope-type', 'rope',
        ),
        outcome='trains',
    ),

    Launch(
        name='slime-glm4.5-355b-a32b',
        script=Source("THUDM/slime", 'scripts/run-glm4.5-355B-A32B.sh', '478b807093608fe4ec82d3933e9f258d079865f2'),
        program="train.py", world_size=64,
        expanded=("scripts/models/glm4.5-355B-A32B.sh's MODEL_ARGS and the run script's arrays in its ray job's "
                  "order (8 nodes x 8 GPUs; MISC_ARGS' --moe-token-dispatcher-type flex comes after MODEL_ARGS' "
                  "alltoall, the last one wins; BASE_DIR as written); slime's own flags left out "
                  "(slime/utils/arguments.py and sglang's: --actor-num-nodes, --actor-num-gpus-per-node, --colocate, "
                  '--save-debug-rollout-data, --hf-checkpoint, --ref-load, --prompt-data, --input-key, --label-key, '
                  '--apply-chat-template, --rollout-shuffle, --rm-type, --num-rollout, --rollout-batch-size, '
                  '--n-samples-per-prompt, --rollout-max-response-len, --rollout-temperature, '
                  '--over-sampling-batch-size, --dynamic-sampling-filter-path, --num-steps-per-rollout, '
                  '--balance-data, --rollout-stop-token-ids, --advantage-estimator, --kl-loss-coef, --kl-loss-type, '
                  '--kl-coef, --entropy-coef, --eps-clip, --eps-clip-high, --use-tis, --use-dynamic-batch-size, '
                  '--max-tokens-per-gpu, --eval-prompt-data, --n-samples-per-eval-prompt, --eval-max-response-len, '
                  '--eval-top-p, --rollout-num-gpus-per-engine, --sglang-mem-fraction-static, '
                  '--sglang-enable-dp-attention, --sglang-dp-size, --sglang-ep-size, --sglang-enable-dp-lm-head, '
                  '--sglang-moe-dense-tp-size, --sglang-speculative-algorithm, --sglang-speculative-num-steps, '
                  "--sglang-speculative-eagle-topk, --sglang-speculative-num-draft-tokens); then what slime's "
                  "megatron_parse_args sets on Megatron-LM's arguments whatever the script gives "
                  "(slime/utils/arguments.py's default --micro-batch-size 1, which --use-dynamic-batch-size packs to "
                  "--max-tokens-per-gpu; slime/backends/megatron_utils/arguments.py's _set_default_megatron_args; "
                  "slime_validate_args' --global-batch-size, rollout-batch-size x n-samples-per-prompt / "
                  "num-steps-per-rollout; slime/backends/megatron_utils/model.py's --train-iters, num-rollout x "
                  'rollout-batch-size x n-samples-per-prompt / global batch), written as the flags that set them: '
                  '--micro-batch-size 1 --use-distributed-optimizer --bf16 --seq-length 4096 '
                  '--max-position-embeddings 4096 --tokenizer-type HuggingFaceTokenizer --tokenizer-model '
                  '$BASE_DIR/GLM-4.5-355B-A32B --global-batch-size 256 --train-iters 12000 --rope-type rope'),
        argv=(
            '--disable-bias-linear', '--qk-layernorm', '--group-query-attention', '--num-attention-heads', '96',
            '--num-query-groups', '8', '--kv-channels', '128', '--num-layers', '92', '--hidden-size', '5120',
            '--ffn-hidden-size', '12288', '--add-qkv-bias', '--normalization', 'RMSNorm', '--position-embedding-type',
            'rope', '--rotary-percent', '0.5', '--swiglu', '--untie-embeddings-and-output-weights', '--vocab-size',
            '151552', '--rotary-base', '1000000', '--moe-ffn-hidden-size', '1536',
            '--moe-shared-expert-intermediate-size', '1536', '--moe-router-pre-softmax',
            '--moe-router-score-function', 'sigmoid', '--moe-router-enable-expert-bias',
            '--moe-router-bias-update-rate', '0', '--moe-router-load-balancing-type', 'seq_aux_loss',
            '--moe-token-dispatcher-type', 'alltoall', '--moe-router-topk', '8', '--moe-router-topk-scaling-factor',
            '2.5', '--moe-layer-freq', '[0]*3+[1]*89', '--num-experts', '160', '--moe-grouped-gemm',
            '--moe-router-dtype', 'fp32', '--moe-permute-fusion', '--moe-aux-loss-coeff', '0', '--optimizer', 'adam',
            '--lr', '1e-6', '--lr-decay-style', 'constant', '--weight-decay', '0.1', '--adam-beta1', '0.9',
            '--adam-beta2', '0.98', '--optimizer-cpu-offload', '--overlap-cpu-optimizer-d2h-h2d',
            '--use-precision-aware-optimizer', '--tensor-model-parallel-size', '8', '--sequence-parallel',
            '--pipeline-model-parallel-size', '4', '--context-parallel-size', '2', '--expert-model-parallel-size',
            '16', '--expert-tensor-parallel-size', '1', '--recompute-granularity', 'full', '--recompute-method',
            'uniform', '--recompute-num-layers', '1', '--eval-interval', '20', '--attention-dropout', '0.0',
            '--hidden-dropout', '0.0', '--accumulate-allreduce-grads-in-fp32', '--attention-softmax-in-fp32',
            '--attention-backend', 'flash', '--moe-token-dispatcher-type', 'flex', '--moe-enable-deepep',
            '--micro-batch-size', '1', '--use-distributed-optimizer', '--bf16', '--seq-length', '4096',
            '--max-position-embeddings', '4096', '--tokenizer-type', 'HuggingFaceTokenizer', '--tokenizer-model',
            '$BASE_DIR/GLM-4.5-355B-A32B', '--global-batch-size', '256', '--train-iters', '12000', '--rope-type',
            'rope',
        ),
        outcome='trains',
    ),

    Launch(
        name='slime-deepseek-v3',
        script=Source("THUDM/slime", 'scripts/run-deepseek-r1.sh', '478b807093608fe4ec82d3933e9f258d079865f2'),
        program="train.py", world_size=128,
        expanded=("DeepSeek-V3's architecture: the run script (DeepSeek-R1's weights) sources "
                  'scripts/models/deepseek-v3.sh (MODEL_ARGS_NUM_LAYERS unset: 61 layers, the first 3 dense); its '
                  "arrays in the ray job's order (16 nodes x 8 GPUs; BASE_DIR as written); slime's own flags left "
                  "out (slime/utils/arguments.py and sglang's: --actor-num-nodes, --actor-num-gpus-per-node, "
                  '--colocate, --hf-checkpoint, --ref-load, --prompt-data, --input-key, --label-key, '
                  '--apply-chat-template, --rollout-shuffle, --rm-type, --num-rollout, --rollout-batch-size, '
                  '--n-samples-per-prompt, --rollout-max-response-len, --rollout-temperature, '
                  '--over-sampling-batch-size, --dynamic-sampling-filter-path, --num-steps-per-rollout, '
                  '--balance-data, --advantage-estimator, --use-kl-loss, --kl-loss-coef, --kl-loss-type, '
                  '--entropy-coef, --eps-clip, --eps-clip-high, --use-dynamic-batch-size, --max-tokens-per-gpu, '
                  '--eval-prompt-data, --n-samples-per-eval-prompt, --eval-max-response-len, --eval-top-p, '
                  '--rollout-num-gpus-per-engine, --sglang-mem-fraction-static, --sglang-ep-size, '
                  '--sglang-enable-dp-attention, --sglang-dp-size, --sglang-moe-dense-tp-size, '
                  '--sglang-enable-dp-lm-head, --sglang-moe-a2a-backend, --sglang-deepep-mode, '
                  "--sglang-server-concurrency); then what slime's megatron_parse_args sets on Megatron-LM's "
                  "arguments whatever the script gives (slime/utils/arguments.py's default --micro-batch-size 1, "
                  'which --use-dynamic-batch-size packs to --max-tokens-per-gpu; '
                  "slime/backends/megatron_utils/arguments.py's _set_default_megatron_args; slime_validate_args' "
                  '--global-batch-size, rollout-batch-size x n-samples-per-prompt / num-steps-per-rollout; '
                  "slime/backends/megatron_utils/model.py's --train-iters, num-rollout x rollout-batch-size x "
                  'n-samples-per-prompt / global batch), written as the flags that set them: --micro-batch-size 1 '
                  '--use-distributed-optimizer --bf16 --seq-length 4096 --max-position-embeddings 4096 '
                  '--tokenizer-type HuggingFaceTokenizer --tokenizer-model $BASE_DIR/DeepSeek-R1/ '
                  '--global-batch-size 256 --train-iters 12000 --rope-type yarn'),
        argv=(
            '--disable-bias-linear', '--num-layers', '61', '--hidden-size', '7168', '--ffn-hidden-size', '18432',
            '--num-attention-heads', '128', '--kv-channels', '128', '--normalization', 'RMSNorm',
            '--position-embedding-type', 'rope', '--norm-epsilon', '1e-6', '--swiglu',
            '--untie-embeddings-and-output-weights', '--vocab-size', '129280', '--multi-latent-attention',
            '--q-lora-rank', '1536', '--kv-lora-rank', '512', '--qk-head-dim', '128', '--qk-pos-emb-head-dim', '64',
            '--v-head-dim', '128', '--qk-layernorm', '--rotary-scaling-factor', '40', '--rotary-base', '10000',
            '--mscale', '1.0', '--mscale-all-dim', '1.0', '--attention-softmax-in-fp32', '--no-rope-fusion',
            '--num-experts', '256', '--moe-layer-freq',
            '[0,0,0,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1]',
            '--moe-ffn-hidden-size', '2048', '--moe-router-topk', '8', '--moe-shared-expert-intermediate-size',
            '2048', '--moe-router-pre-softmax', '--moe-router-score-function', 'sigmoid',
            '--moe-router-enable-expert-bias', '--moe-router-load-balancing-type', 'seq_aux_loss',
            '--moe-token-dispatcher-type', 'alltoall', '--moe-aux-loss-coeff', '0', '--moe-router-bias-update-rate',
            '0', '--moe-router-group-topk', '4', '--moe-router-num-groups', '8', '--moe-grouped-gemm',
            '--moe-router-topk-scaling-factor', '2.5', '--moe-router-dtype', 'fp32', '--moe-permute-fusion', '--load',
            '$BASE_DIR/DeepSeek-R1_slime/', '--save', '$BASE_DIR/DeepSeek-R1_slime/', '--save-interval', '20',
            '--optimizer', 'adam', '--lr', '1e-6', '--lr-decay-style', 'constant', '--weight-decay', '0.1',
            '--adam-beta1', '0.9', '--adam-beta2', '0.98', '--optimizer-cpu-offload',
            '--overlap-cpu-optimizer-d2h-h2d', '--use-precision-aware-optimizer', '--tensor-model-parallel-size', '8',
            '--sequence-parallel', '--pipeline-model-parallel-size', '4', '--context-parallel-size', '4',
            '--expert-model-parallel-size', '32', '--expert-tensor-parallel-size', '1',
            '--decoder-last-pipeline-num-layers', '13', '--recompute-granularity', 'full', '--recompute-method',
            'uniform', '--recompute-num-layers', '1', '--eval-interval', '20', '--attention-dropout', '0.0',
            '--hidden-dropout', '0.0', '--accumulate-allreduce-grads-in-fp32', '--attention-softmax-in-fp32',
            '--attention-backend', 'flash', '--moe-enable-deepep', '--moe-token-dispatcher-type', 'flex',
            '--micro-batch-size', '1', '--use-distributed-optimizer', '--bf16', '--seq-length', '4096',
            '--max-position-embeddings', '4096', '--tokenizer-type', 'HuggingFaceTokenizer', '--tokenizer-model',
            '$BASE_DIR/DeepSeek-R1/', '--global-batch-size', '256', '--train-iters', '12000', '--rope-type', 'yarn',
        ),
        outcome='trains',
    ),

    Launch(
        name='slime-kimi-k2',
        script=Source("THUDM/slime", 'scripts/run-kimi-k2-Thinking.sh', '478b807093608fe4ec82d3933e9f258d079865f2'),
        program="train.py", world_size=256,
        expanded=("Kimi-K2's architecture through scripts/run-kimi-k2-Thinking.sh, which sources "
                  'scripts/models/kimi-k2-thinking.sh (kimi-k2.sh but --norm-epsilon 1e-5 and '
                  '--rotary-scaling-factor 64.0): run-kimi-k2-Instruct.sh at this commit ends its train.py command '
                  'after --update-weight-buffer-size (no trailing backslash), so it hands train.py none of '
                  'MODEL_ARGS and the other arrays (bash then fails on `--disable-bias-linear: command not found`); '
                  "32 nodes x 8 GPUs, BASE_DIR as written; slime's own flags left out (slime/utils/arguments.py and "
                  "sglang's: --actor-num-nodes, --actor-num-gpus-per-node, --colocate, --update-weight-buffer-size, "
                  '--hf-checkpoint, --ref-load, --prompt-data, --input-key, --label-key, --apply-chat-template, '
                  '--rollout-shuffle, --rm-type, --num-rollout, --rollout-batch-size, --n-samples-per-prompt, '
                  '--rollout-max-response-len, --rollout-temperature, --over-sampling-batch-size, '
                  '--dynamic-sampling-filter-path, --num-steps-per-rollout, --balance-data, --advantage-estimator, '
                  '--use-kl-loss, --kl-loss-coef, --kl-loss-type, --entropy-coef, --eps-clip, --eps-clip-high, '
                  '--use-tis, --use-dynamic-batch-size, --max-tokens-per-gpu, --eval-prompt-data, '
                  '--n-samples-per-eval-prompt, --eval-max-response-len, --eval-top-p, '
                  '--rollout-num-gpus-per-engine, --sglang-mem-fraction-static, --sglang-enable-dp-attention, '
                  '--sglang-dp-size, --sglang-moe-dense-tp-size, --sglang-enable-dp-lm-head, --sglang-ep-size, '
                  "--sglang-server-concurrency); then what slime's megatron_parse_args sets on Megatron-LM's "
                  "arguments whatever the script gives (slime/utils/arguments.py's default --micro-batch-size 1, "
                  'which --use-dynamic-batch-size packs to --max-tokens-per-gpu; '
                  "slime/backends/megatron_utils/arguments.py's _set_default_megatron_args; slime_validate_args' "
                  '--global-batch-size, rollout-batch-size x n-samples-per-prompt / num-steps-per-rollout; '
                  "slime/backends/megatron_utils/model.py's --train-iters, num-rollout x rollout-batch-size x "
                  'n-samples-per-prompt / global batch), written as the flags that set them: --micro-batch-size 1 '
                  '--use-distributed-optimizer --bf16 --seq-length 4096 --max-position-embeddings 4096 '
                  '--tokenizer-type HuggingFaceTokenizer --tokenizer-model $BASE_DIR/Kimi-K2-Thinking-fp8/ '
                  '--global-batch-size 256 --train-iters 400 --rope-type yarn'),
        argv=(
            '--disable-bias-linear', '--num-layers', '61', '--hidden-size', '7168', '--ffn-hidden-size', '18432',
            '--num-attention-heads', '64', '--kv-channels', '64', '--normalization', 'RMSNorm',
            '--position-embedding-type', 'rope', '--norm-epsilon', '1e-5', '--swiglu',
            '--untie-embeddings-and-output-weights', '--vocab-size', '163840', '--multi-latent-attention',
            '--q-lora-rank', '1536', '--kv-lora-rank', '512', '--qk-head-dim', '128', '--qk-pos-emb-head-dim', '64',
            '--v-head-dim', '128', '--qk-layernorm', '--rotary-scaling-factor', '64.0', '--rotary-base', '50000',
            '--mscale', '1.0', '--mscale-all-dim', '1.0', '--attention-softmax-in-fp32', '--no-rope-fusion',
            '--num-experts', '384', '--moe-layer-freq',
            '[0,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1]',
            '--moe-ffn-hidden-size', '2048', '--moe-router-topk', '8', '--moe-shared-expert-intermediate-size',
            '2048', '--moe-router-pre-softmax', '--moe-router-score-function', 'sigmoid',
            '--moe-router-enable-expert-bias', '--moe-router-load-balancing-type', 'seq_aux_loss',
            '--moe-token-dispatcher-type', 'alltoall', '--moe-aux-loss-coeff', '0', '--moe-router-bias-update-rate',
            '0', '--moe-router-group-topk', '1', '--moe-router-num-groups', '1', '--moe-grouped-gemm',
            '--moe-router-topk-scaling-factor', '2.827', '--moe-router-dtype', 'fp32', '--moe-permute-fusion',
            '--load', '$BASE_DIR/Kimi-K2-Thinking_slime/', '--save', '$BASE_DIR/Kimi-K2-Thinking_slime/',
            '--save-interval', '20', '--optimizer', 'adam', '--lr', '1e-6', '--lr-decay-style', 'constant',
            '--weight-decay', '0.1', '--adam-beta1', '0.9', '--adam-beta2', '0.98', '--optimizer-cpu-offload',
            '--overlap-cpu-optimizer-d2h-h2d', '--use-precision-aware-optimizer', '--tensor-model-parallel-size', '8',
            '--sequence-parallel', '--pipeline-model-parallel-size', '8', '--context-parallel-size', '4',
            '--expert-model-parallel-size', '32', '--expert-tensor-parallel-size', '1',
            '--decoder-last-pipeline-num-layers', '5', '--recompute-granularity', 'full', '--recompute-method',
            'uniform', '--recompute-num-layers', '1', '--eval-interval', '20', '--attention-dropout', '0.0',
            '--hidden-dropout', '0.0', '--accumulate-allreduce-grads-in-fp32', '--attention-softmax-in-fp32',
            '--attention-backend', 'flash', '--micro-batch-size', '1', '--use-distributed-optimizer', '--bf16',
            '--seq-length', '4096', '--max-position-embeddings', '4096', '--tokenizer-type', 'HuggingFaceTokenizer',
            '--tokenizer-model', '$BASE_DIR/Kimi-K2-Thinking-fp8/', '--global-batch-size', '256', '--train-iters',
            '400', '--rope-type', 'yarn',
        ),
        outcome='trains',
    ),

    Launch(
        name='slime-moonlight-16b-a3b',
        script=Source("THUDM/slime", 'scripts/run-moonlight-16B-A3B.sh', '478b807093608fe4ec82d3933e9f258d079865f2'),
        program="train.py", world_size=8,
        expanded=("scripts/models/moonlight.sh's MODEL_ARGS and the run script's arrays in its ray job's order (1 "
                  "node x 8 GPUs; MISC_ARGS' --moe-token-dispatcher-type flex after MODEL_ARGS' alltoall); slime's "
                  "own flags left out (slime/utils/arguments.py and sglang's: --actor-num-nodes, "
                  '--actor-num-gpus-per-node, --colocate, --hf-checkpoint, --ref-load, --prompt-data, --input-key, '
                  '--label-key, --apply-chat-template, --rollout-shuffle, --rm-type, --num-rollout, '
                  '--rollout-batch-size, --n-samples-per-prompt, --rollout-max-response-len, --rollout-temperature, '
                  '--over-sampling-batch-size, --dynamic-sampling-filter-path, --num-steps-per-rollout, '
                  '--balance-data, --advantage-estimator, --use-kl-loss, --kl-loss-coef, --kl-loss-type, '
                  '--entropy-coef, --eps-clip, --eps-clip-high, --use-dynamic-batch-size, --max-tokens-per-gpu, '
                  '--eval-prompt-data, --n-samples-per-eval-prompt, --eval-max-response-len, --eval-top-p, '
                  '--rollout-num-gpus-per-engine, --sglang-mem-fraction-static, --sglang-cuda-graph-bs); then what '
                  "slime's megatron_parse_args sets on Megatron-LM's arguments whatever the script gives "
                  "(slime/utils/arguments.py's default --micro-batch-size 1, which --use-dynamic-batch-size packs to "
                  "--max-tokens-per-gpu; slime/backends/megatron_utils/arguments.py's _set_default_megatron_args; "
                  "slime_validate_args' --global-batch-size, rollout-batch-size x n-samples-per-prompt / "
                  "num-steps-per-rollout; slime/backends/megatron_utils/model.py's --train-iters, num-rollout x "
                  'rollout-batch-size x n-samples-per-prompt / global batch), written as the flags that set them: '
                  '--micro-batch-size 1 --use-distributed-optimizer --bf16 --seq-length 4096 '
                  '--max-position-embeddings 4096 --tokenizer-type HuggingFaceTokenizer --tokenizer-model '
                  '/root/Moonlight-16B-A3B --global-batch-size 256 --train-iters 12000 --rope-type yarn'),
        argv=(
            '--disable-bias-linear', '--num-layers', '27', '--hidden-size', '2048', '--ffn-hidden-size', '11264',
            '--num-attention-heads', '16', '--kv-channels', '128', '--normalization', 'RMSNorm',
            '--position-embedding-type', 'rope', '--norm-epsilon', '1e-5', '--rotary-percent', '1.0', '--swiglu',
            '--untie-embeddings-and-output-weights', '--no-masked-softmax-fusion', '--vocab-size', '163840',
            '--multi-latent-attention', '--kv-lora-rank', '512', '--qk-head-dim', '128', '--qk-pos-emb-head-dim',
            '64', '--v-head-dim', '128', '--qk-layernorm', '--rotary-scaling-factor', '1', '--rotary-base', '50000',
            '--mscale', '1.0', '--mscale-all-dim', '1.0', '--attention-softmax-in-fp32', '--no-rope-fusion',
            '--num-experts', '64', '--moe-layer-freq', '[0,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1]',
            '--moe-ffn-hidden-size', '1408', '--moe-router-topk', '6', '--moe-shared-expert-intermediate-size',
            '2816', '--moe-router-pre-softmax', '--moe-router-score-function', 'sigmoid',
            '--moe-router-enable-expert-bias', '--moe-router-load-balancing-type', 'seq_aux_loss',
            '--moe-token-dispatcher-type', 'alltoall', '--moe-aux-loss-coeff', '0', '--moe-router-bias-update-rate',
            '0', '--moe-router-group-topk', '1', '--moe-router-num-groups', '1', '--moe-grouped-gemm',
            '--moe-router-topk-scaling-factor', '2.446', '--moe-token-drop-policy', 'probs', '--moe-router-dtype',
            'fp32', '--moe-permute-fusion', '--load', '/root/Moonlight-16B-A3B_slime/', '--save',
            '/root/Moonlight-16B-A3B_slime/', '--save-interval', '20', '--optimizer', 'adam', '--lr', '1e-6',
            '--lr-decay-style', 'constant', '--weight-decay', '0.1', '--adam-beta1', '0.9', '--adam-beta2', '0.98',
            '--optimizer-cpu-offload', '--overlap-cpu-optimizer-d2h-h2d', '--use-precision-aware-optimizer',
            '--tensor-model-parallel-size', '4', '--sequence-parallel', '--pipeline-model-parallel-size', '1',
            '--context-parallel-size', '1', '--expert-model-parallel-size', '8', '--expert-tensor-parallel-size', '1',
            '--recompute-granularity', 'full', '--recompute-method', 'uniform', '--recompute-num-layers', '1',
            '--eval-interval', '20', '--attention-dropout', '0.0', '--hidden-dropout', '0.0',
            '--accumulate-allreduce-grads-in-fp32', '--attention-softmax-in-fp32', '--moe-enable-deepep',
            '--moe-token-dispatcher-type', 'flex', '--micro-batch-size', '1', '--use-distributed-optimizer', '--bf16',
            '--seq-length', '4096', '--max-position-embeddings', '4096', '--tokenizer-type', 'HuggingFaceTokenizer',
            '--tokenizer-model', '/root/Moonlight-16B-A3B', '--global-batch-size', '256', '--train-iters', '12000',
            '--rope-type', 'yarn',
        ),
        outcome='trains',
    ),
)
