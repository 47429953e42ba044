"""The replay corpus, round 6 of real launches (issue 81): public 2024-2026 GPT pretraining launches on Megatron-LM
and its forks. See launch.py for what an entry holds and how the lists were taken.

Ant Group's Ling 2.0 (inclusionAI/Ling-V2, examples/pretrain/run_pretrain_{4k,8k,32k}.sh) runs Megatron-LM core_v0.13.0
with inclusionAI's patch (training/megatron/bailing_moe_v2.patch), which adds three flags: `--tokenizer-type
BailingTokenizer` (its GLM tokenizer class over the Hugging Face folder the script names), `--optimizer adamw-bnb-8bit`
(bitsandbytes' paged AdamW8bit) and `--bias-zero-mean-update` (the expert-bias step minus its mean). As written the
launches are refused for the first of them. `with_upstream_flags` makes the same launch with only those replaced by
what upstream Megatron-LM has: HuggingFaceTokenizer over the same folder, `--optimizer adam` (Megatron's AdamW; 8-bit
moments have no upstream flag) and no `--bias-zero-mean-update` (upstream steps the bias by the sign alone); those
must train, their blockwise FP8 (`--fp8-recipe blockwise --fp8-param-gather`, `--moe-router-padding-for-fp8`)
included."""

from __future__ import annotations

import dataclasses

from tests.replay_corpus.launch import Launch, Source

# {patch flag: (its upstream replacement, or None to drop it)}; a flag with a value is replaced with its value.
LING_PATCH_FLAGS = {
    ("--tokenizer-type", "BailingTokenizer"): ("--tokenizer-type", "HuggingFaceTokenizer"),
    ("--optimizer", "adamw-bnb-8bit"): ("--optimizer", "adam"),
    ("--bias-zero-mean-update",): None,
}


def with_upstream_flags(launch: Launch, replaced: dict) -> Launch:
    """`launch` with each patch-only flag of `replaced` swapped for its upstream replacement (or dropped), every
    other token as written, named `<name>-upstream-flags`: the run its authors would get on upstream Megatron-LM."""
    argv, index = [], 0
    while index < len(launch.argv):
        match = next((flag for flag in replaced if tuple(launch.argv[index:index + len(flag)]) == flag), None)
        if match is None:
            argv.append(launch.argv[index])
            index += 1
            continue
        argv.extend(replaced[match] or ())
        index += len(match)
    said = "; ".join(f"{' '.join(flag)} -> {' '.join(new) if new else 'dropped'}" for flag, new in replaced.items())
    return dataclasses.replace(launch, name=f"{launch.name}-upstream-flags", argv=tuple(argv), outcome="trains",
                               expanded=f"{launch.expanded}; then its patch-only flags replaced by upstream's: {said}")


_LING_REFUSAL = "refused: invalid choice: 'BailingTokenizer'"
_LING_EXPANDED = ("run with bash from examples/pretrain at the commit named, nvidia-smi stubbed to one node of 8 GPUs "
                  "(GPUS_PER_NODE 8, WORLD_SIZE unset: 1 node), the torchrun stub recording what follows "
                  "Megatron-LM-core_v0.13.0/pretrain_gpt.py; MODEL_PATH empty as written; the tokenizer folder "
                  "`dirname $(readlink -f ${BASH_SOURCE[0]})`/../../resource/tokenizer/config_pretrain is the "
                  "script's folder in the repository")

LING = (
    Launch(
        name='ling-2.0-mini-pretrain-4k',
        script=Source('inclusionAI/Ling-V2', 'examples/pretrain/run_pretrain_4k.sh', 'af8837e677a1aa36895845da084f9c91acf4fed2'),
        program='pretrain_gpt.py', world_size=8,
        expanded=_LING_EXPANDED,
        argv=(
            '--moe-enable-deepep', '--expert-model-parallel-size', '8', '--expert-tensor-parallel-size', '1',
            '--moe-grouped-gemm', '--moe-token-dispatcher-type', 'flex', '--moe-router-dtype', 'fp32',
            '--num-experts', '256', '--moe-ffn-hidden-size', '512', '--moe-shared-expert-intermediate-size', '512',
            '--moe-router-score-function', 'sigmoid', '--moe-router-topk', '8', '--moe-router-enable-expert-bias',
            '--moe-router-topk-scaling-factor', '2.5', '--moe-router-num-groups', '8', '--moe-router-group-topk', '4',
            '--moe-z-loss-coeff', '0.0000035', '--moe-router-bias-update-rate', '1e-3', '--moe-layer-freq',
            '[0,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1]', '--bias-zero-mean-update', '--num-layers', '20',
            '--hidden-size', '2048', '--ffn-hidden-size', '5120', '--num-attention-heads', '16', '--num-query-groups',
            '4', '--group-query-attention', '--qk-layernorm', '--use-flash-attn', '--max-position-embeddings', '4096',
            '--vocab-size', '157184', '--make-vocab-size-divisible-by', '128', '--position-embedding-type', 'rope',
            '--rotary-base', '10000', '--rotary-percent', '0.5', '--rotary-scaling-factor', '40', '--swiglu',
            '--untie-embeddings-and-output-weights', '--normalization', 'RMSNorm', '--norm-epsilon', '1e-06',
            '--disable-bias-linear', '--transformer-impl', 'transformer_engine', '--attention-dropout', '0',
            '--hidden-dropout', '0', '--micro-batch-size', '1', '--global-batch-size', '128', '--seq-length', '4096',
            '--train-iters', '2000', '--weight-decay', '0.1', '--adam-beta1', '0.9', '--adam-beta2', '0.95',
            '--init-method-std', '0.02', '--clip-grad', '1.0', '--bf16', '--fp8-param-gather', '--fp8-recipe',
            'blockwise', '--fp8-format', 'e4m3', '--optimizer', 'adamw-bnb-8bit', '--lr', '3.0e-5',
            '--lr-decay-style', 'cosine', '--min-lr', '3.0e-6', '--lr-warmup-iters', '0', '--seed', '42',
            '--manual-gc', '--manual-gc-interval', '200', '--pipeline-model-parallel-size', '1',
            '--tensor-model-parallel-size', '1', '--sequence-parallel', '--use-distributed-optimizer',
            '--recompute-granularity', 'selective', '--recompute-modules', 'moe', '--overlap-param-gather',
            '--overlap-grad-reduce', '--data-path', 'processed_data_text_document', '--tokenizer-type',
            'BailingTokenizer', '--tokenizer-model', 'examples/pretrain/../../resource/tokenizer/config_pretrain',
            '--split', '999,1,0', '--dataloader-type', 'single', '--no-create-attention-mask-in-dataloader',
            '--eod-mask-loss', '--save-interval', '1000', '--eval-interval', '1000', '--save', 'pretrain_4k',
            '--load', 'pretrain_4k', '--finetune', '--ckpt-format', 'torch_dist', '--async-save', '--eval-iters',
            '10', '--log-interval', '1', '--log-throughput', '--tensorboard-dir', 'pretrain_4k/runs',
            '--log-timers-to-tensorboard', '--log-memory-to-tensorboard', '--log-world-size-to-tensorboard',
            '--log-validation-ppl-to-tensorboard', '--attention-backend', 'auto', '--no-masked-softmax-fusion',
            '--attention-softmax-in-fp32', '--cross-entropy-loss-fusion', '--mtp-num-layers', '1',
            '--mtp-loss-scaling-factor', '0.1',
        ),
        outcome=_LING_REFUSAL,
    ),
    Launch(
        name='ling-2.0-mini-pretrain-8k',
        script=Source('inclusionAI/Ling-V2', 'examples/pretrain/run_pretrain_8k.sh', 'af8837e677a1aa36895845da084f9c91acf4fed2'),
        program='pretrain_gpt.py', world_size=8,
        expanded=_LING_EXPANDED,
        argv=(
            '--moe-enable-deepep', '--expert-model-parallel-size', '8', '--expert-tensor-parallel-size', '1',
            '--moe-grouped-gemm', '--moe-token-dispatcher-type', 'flex', '--moe-router-dtype', 'fp32',
            '--num-experts', '256', '--moe-ffn-hidden-size', '512', '--moe-shared-expert-intermediate-size', '512',
            '--moe-router-score-function', 'sigmoid', '--moe-router-topk', '8', '--moe-router-enable-expert-bias',
            '--moe-router-topk-scaling-factor', '2.5', '--moe-router-num-groups', '8', '--moe-router-group-topk', '4',
            '--moe-z-loss-coeff', '0.0000035', '--moe-router-bias-update-rate', '1e-3', '--moe-layer-freq',
            '[0,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1]', '--bias-zero-mean-update', '--num-layers', '20',
            '--hidden-size', '2048', '--ffn-hidden-size', '5120', '--num-attention-heads', '16', '--num-query-groups',
            '4', '--group-query-attention', '--qk-layernorm', '--use-flash-attn', '--max-position-embeddings', '8192',
            '--vocab-size', '157184', '--make-vocab-size-divisible-by', '128', '--position-embedding-type', 'rope',
            '--rotary-base', '600000', '--rotary-percent', '0.5', '--rotary-scaling-factor', '40', '--swiglu',
            '--untie-embeddings-and-output-weights', '--normalization', 'RMSNorm', '--norm-epsilon', '1e-06',
            '--disable-bias-linear', '--transformer-impl', 'transformer_engine', '--attention-dropout', '0',
            '--hidden-dropout', '0', '--micro-batch-size', '2', '--global-batch-size', '128', '--seq-length', '8192',
            '--train-iters', '2000', '--weight-decay', '0.1', '--adam-beta1', '0.9', '--adam-beta2', '0.95',
            '--init-method-std', '0.02', '--clip-grad', '1.0', '--bf16', '--fp8-param-gather', '--fp8-recipe',
            'blockwise', '--fp8-format', 'e4m3', '--optimizer', 'adamw-bnb-8bit', '--lr', '3.0e-5',
            '--lr-decay-style', 'cosine', '--min-lr', '3.0e-6', '--lr-warmup-iters', '0', '--seed', '42',
            '--manual-gc', '--manual-gc-interval', '200', '--pipeline-model-parallel-size', '1',
            '--tensor-model-parallel-size', '1', '--sequence-parallel', '--use-distributed-optimizer',
            '--recompute-granularity', 'full', '--recompute-method', 'uniform', '--recompute-num-layers', '1',
            '--moe-router-padding-for-fp8', '--overlap-param-gather', '--overlap-grad-reduce', '--data-path',
            'processed_data_text_document', '--tokenizer-type', 'BailingTokenizer', '--tokenizer-model',
            'examples/pretrain/../../resource/tokenizer/config_pretrain', '--split', '999,1,0', '--dataloader-type',
            'single', '--no-create-attention-mask-in-dataloader', '--eod-mask-loss', '--save-interval', '1000',
            '--eval-interval', '1000', '--save', 'pretrain_8k', '--load', 'pretrain_8k', '--finetune',
            '--ckpt-format', 'torch_dist', '--async-save', '--eval-iters', '10', '--log-interval', '1',
            '--log-throughput', '--tensorboard-dir', 'pretrain_8k/runs', '--log-timers-to-tensorboard',
            '--log-memory-to-tensorboard', '--log-world-size-to-tensorboard', '--log-validation-ppl-to-tensorboard',
            '--attention-backend', 'auto', '--no-masked-softmax-fusion', '--attention-softmax-in-fp32',
            '--cross-entropy-loss-fusion', '--mtp-num-layers', '1', '--mtp-loss-scaling-factor', '0.1',
        ),
        outcome=_LING_REFUSAL,
    ),
    Launch(
        name='ling-2.0-mini-pretrain-32k',
        script=Source('inclusionAI/Ling-V2', 'examples/pretrain/run_pretrain_32k.sh', 'af8837e677a1aa36895845da084f9c91acf4fed2'),
        program='pretrain_gpt.py', world_size=16,
        expanded=_LING_EXPANDED.replace("(GPUS_PER_NODE 8, WORLD_SIZE unset: 1 node)", "(GPUS_PER_NODE 8, WORLD_SIZE 2 nodes: TP 2 x PP 4 x EP 4 needs 16 ranks; the README names 8, 16 and 32 GPUs)"),
        argv=(
            '--moe-enable-deepep', '--expert-model-parallel-size', '4', '--expert-tensor-parallel-size', '1',
            '--moe-grouped-gemm', '--moe-token-dispatcher-type', 'flex', '--moe-router-dtype', 'fp32',
            '--num-experts', '256', '--moe-ffn-hidden-size', '512', '--moe-shared-expert-intermediate-size', '512',
            '--moe-router-score-function', 'sigmoid', '--moe-router-topk', '8', '--moe-router-enable-expert-bias',
            '--moe-router-topk-scaling-factor', '2.5', '--moe-router-num-groups', '8', '--moe-router-group-topk', '4',
            '--moe-z-loss-coeff', '0.0000035', '--moe-router-bias-update-rate', '1e-3', '--moe-layer-freq',
            '[0,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1]', '--bias-zero-mean-update', '--num-layers', '20',
            '--hidden-size', '2048', '--ffn-hidden-size', '5120', '--num-attention-heads', '16', '--num-query-groups',
            '4', '--group-query-attention', '--qk-layernorm', '--use-flash-attn', '--max-position-embeddings',
            '32768', '--vocab-size', '157184', '--make-vocab-size-divisible-by', '128', '--position-embedding-type',
            'rope', '--rotary-base', '600000', '--rotary-percent', '0.5', '--rotary-scaling-factor', '40', '--swiglu',
            '--untie-embeddings-and-output-weights', '--normalization', 'RMSNorm', '--norm-epsilon', '1e-06',
            '--disable-bias-linear', '--transformer-impl', 'transformer_engine', '--attention-dropout', '0',
            '--hidden-dropout', '0', '--micro-batch-size', '1', '--global-batch-size', '128', '--seq-length', '32768',
            '--train-iters', '2000', '--weight-decay', '0.1', '--adam-beta1', '0.9', '--adam-beta2', '0.95',
            '--init-method-std', '0.02', '--clip-grad', '1.0', '--bf16', '--fp8-param-gather', '--fp8-recipe',
            'blockwise', '--fp8-format', 'e4m3', '--optimizer', 'adamw-bnb-8bit', '--lr', '3.0e-5',
            '--lr-decay-style', 'cosine', '--min-lr', '3.0e-6', '--lr-warmup-iters', '0', '--seed', '42',
            '--manual-gc', '--manual-gc-interval', '200', '--pipeline-model-parallel-size', '4',
            '--tensor-model-parallel-size', '2', '--sequence-parallel', '--use-distributed-optimizer',
            '--recompute-granularity', 'selective', '--recompute-modules', 'moe', '--overlap-param-gather',
            '--overlap-grad-reduce', '--data-path', 'processed_data_text_document', '--tokenizer-type',
            'BailingTokenizer', '--tokenizer-model', 'examples/pretrain/../../resource/tokenizer/config_pretrain',
            '--split', '999,1,0', '--dataloader-type', 'single', '--no-create-attention-mask-in-dataloader',
            '--eod-mask-loss', '--save-interval', '1000', '--eval-interval', '1000', '--save', 'pretrain_32k',
            '--load', 'pretrain_32k', '--finetune', '--ckpt-format', 'torch_dist', '--async-save', '--eval-iters',
            '10', '--log-interval', '1', '--log-throughput', '--tensorboard-dir', 'pretrain_32k/runs',
            '--log-timers-to-tensorboard', '--log-memory-to-tensorboard', '--log-world-size-to-tensorboard',
            '--log-validation-ppl-to-tensorboard', '--attention-backend', 'auto', '--no-masked-softmax-fusion',
            '--attention-softmax-in-fp32', '--cross-entropy-loss-fusion', '--mtp-num-layers', '1',
            '--mtp-loss-scaling-factor', '0.1',
        ),
        outcome=_LING_REFUSAL,
    ),
)

# AWS's distributed-training test cases (aws-samples/awsome-distributed-training 3.test_cases/megatron/megatron-lm/slurm):
# `sbatch` as their READMEs say, on 2 nodes of 8 GPUs (#SBATCH --nodes=2), srun stubbed to record what follows
# /workspace/Megatron-LM/pretrain_gpt.py; every user variable at the script's default.
AWS = (
    Launch(
        name='aws-megatron-lm-gpt3-39b',
        script=Source('aws-samples/awsome-distributed-training',
                      '3.test_cases/megatron/megatron-lm/slurm/gpt3/2.distributed-training.sbatch',
                      '3fa4eafe4a4fe8d302b75be32e13ce12dcf5253c'),
        program='pretrain_gpt.py', world_size=16,
        expanded=('2 nodes x 8 GPUs; TENSOR_PARALLEL, PIPELINE_PARALLEL, the 39B model and GLOBAL_BATCH_SIZE at their '
                  'defaults; DATA_PATH /fsx; not /opt/sagemaker_cluster, so no --auto-resume (an srun option). The '
                  'next commit (e58dcdbc) sets those defaults only under `[ $NODES -le 4 ]`, a variable neither slurm '
                  'nor the README sets, and then passes --tensor-model-parallel-size with no value'),
        argv=(
            '--tensor-model-parallel-size', '4', '--pipeline-model-parallel-size', '2', '--num-layers', '36',
            '--hidden-size', '4096', '--num-attention-heads', '32', '--seq-length', '2048',
            '--max-position-embeddings', '2048', '--micro-batch-size', '1', '--global-batch-size', '288',
            '--train-samples', '146484375', '--lr-decay-samples', '126953125', '--lr-warmup-samples', '183105',
            '--lr', '6.0e-5', '--min-lr', '6.0e-6', '--lr-decay-style', 'cosine', '--log-interval', '1',
            '--eval-iters', '40', '--eval-interval', '1000', '--data-path', '/fsx/gpt2/my-gpt2_text_document',
            '--vocab-file', '/fsx/gpt2/gpt2-vocab.json', '--merge-file', '/fsx/gpt2/gpt2-merges.txt', '--split',
            '98,2,0', '--clip-grad', '1.0', '--weight-decay', '0.1', '--adam-beta1', '0.9', '--adam-beta2', '0.95',
            '--init-method-std', '0.006', '--fp16', '--recompute-activations',
        ),
        outcome='trains',
    ),
    Launch(
        name='aws-megatron-lm-llama2-70b',
        script=Source('aws-samples/awsome-distributed-training',
                      '3.test_cases/megatron/megatron-lm/slurm/llama2/pretrain-llama2.sbatch',
                      '3fa4eafe4a4fe8d302b75be32e13ce12dcf5253c'),
        program='pretrain_gpt.py', world_size=16,
        expanded=('2 nodes x 8 GPUs; the llama2-70b-hf preset the script leaves uncommented, SEQ_LENGTH, '
                  'MAX_POSITION_EMBEDDINGS, MICRO_BATCH_SIZE and GLOBAL_BATCH_SIZE at their defaults; DATA_PATH /fsx'),
        argv=(
            '--num-layers', '80', '--hidden-size', '8192', '--num-attention-heads', '64', '--group-query-attention',
            '--num-query-groups', '8', '--tensor-model-parallel-size', '4', '--pipeline-model-parallel-size', '4',
            '--sequence-parallel', '--use-distributed-optimizer', '--overlap-grad-reduce', '--overlap-param-gather',
            '--untie-embeddings-and-output-weights', '--position-embedding-type', 'rope', '--no-position-embedding',
            '--normalization', 'RMSNorm', '--swiglu', '--no-masked-softmax-fusion', '--no-rope-fusion',
            '--use-flash-attn', '--transformer-impl', 'transformer_engine', '--seq-length', '4096',
            '--max-position-embeddings', '4096', '--micro-batch-size', '1', '--global-batch-size', '2048',
            '--train-iters', '5', '--split', '100,0,0', '--use-mcore-models', '--log-throughput', '--lr', '6.0e-5',
            '--min-lr', '6.0e-6', '--lr-decay-style', 'cosine', '--log-interval', '1', '--eval-iters', '0',
            '--data-path', '/fsx/llama2/my-llama2_text_document', '--tokenizer-type', 'Llama2Tokenizer',
            '--tokenizer-model', '/fsx/llama2/tokenizer.model', '--clip-grad', '1.0', '--weight-decay', '0.1',
            '--adam-beta1', '0.9', '--adam-beta2', '0.95', '--wandb-exp-name', 'llama2-megatron-lm',
            '--wandb-project', 'megatron-lm', '--init-method-std', '0.006', '--fp16',
        ),
        outcome='trains',
    ),
)

# OpenGPT-X's Teuken 7B (OpenGPTX/Megatron-LM, its fork of Megatron-LM): the sbatch example of its third training part
# on JUWELS Booster, 128 nodes x 4 GPUs, srun stubbed to run its `bash -c` with SLURM_PROCID 0 and python stubbed to
# record what follows ./pretrain_gpt.py; SETUP_SCRIPTS_DIR's setupworkenv.sh (not in the repository) only sets
# INSTALLATION_DIR, the folder the script cds into; LOAD_CHECKPOINTS and DATA_OUTPUT_PATH at their defaults.
OPENGPTX = (
    Launch(
        name='opengptx-teuken-7b-part3',
        script=Source('OpenGPTX/Megatron-LM', 'examples/7B_EU24_juwels_part_3_fw_after3T.sbatch',
                      'f8d245d0f23216b722d02aa1853686e6ba5e3cc8'),
        program='pretrain_gpt.py', world_size=512,
        expanded=('128 nodes x 4 GPUs (GPUS_PER_NODE 4, SLURM_JOB_NUM_NODES 128 as #SBATCH --nodes says); '
                  'TRAIN_SAMPLES and LR_DECAY_SAMPLES passed as written, 732_421_875 (Python reads the underscores)'),
        argv=(
            '--tensor-model-parallel-size', '2', '--pipeline-model-parallel-size', '2', '--num-layers', '32',
            '--t5-swiglu', '--hidden-size', '4096', '--hidden-dropout', '0.0', '--attention-dropout', '0.0',
            '--ffn-hidden-size', '13440', '--group-query-attention', '--num-query-groups', '2',
            '--num-attention-heads', '32', '--normalization', 'RMSNorm', '--disable-bias-linear', '--seq-length',
            '4096', '--max-position-embeddings', '4096', '--micro-batch-size', '1', '--global-batch-size', '1024',
            '--train-samples', '732_421_875', '--tokenizer-type', 'OpenGPTX-SPTokenizer', '--position-embedding-type',
            'rope', '--tokenizer-model',
            '/p/scratch/opengptx-elm/data/trainings/7B_EU24/tokenizer/unigram_tokenizer.model', '--bf16', '--seed',
            '42', '--recompute-activations', '--use-flash-attn', '--sequence-parallel', '--init-method-std', '0.0158',
            '--data-cache-path', '/p/scratch/opengptx-elm/data/trainings/7B_EU24/part_3_fw/index-cache',
            '--optimizer', 'adam', '--adam-beta1', '0.9', '--adam-beta2', '0.95', '--adam-eps', '1e-8', '--lr',
            '3.0e-5', '--min-lr', '1.5e-5', '--lr-decay-style', 'cosine', '--lr-decay-samples', '732_421_875',
            '--clip-grad', '1.0', '--weight-decay', '1e-1', '--use-distributed-optimizer', '--log-interval', '10',
            '--save-interval', '225', '--eval-interval', '450', '--eval-iters', '5', '--tensorboard-dir',
            '/p/scratch/opengptx-elm/fromm1/output/7B_fw_decay/tensorboard', '--tensorboard-queue-size', '5',
            '--log-timers-to-tensorboard', '--log-batch-size-to-tensorboard', '--log-validation-ppl-to-tensorboard',
            '--log-world-size-to-tensorboard', '--log-memory-to-tensorboard', '--log-num-zeros-in-grad',
            '--exit-signal-handler', '--save', '/p/scratch/opengptx-elm/fromm1/output/7B_fw_decay/checkpoints',
            '--data-path', '/p/scratch/opengptx-elm/data/trainings/7B_EU24/phase_4/train', '--data-impl', 'mmap',
            '--split', '990,5,5', '--distributed-backend', 'nccl', '--num-workers', '11', '--load',
            '/p/scratch/opengptx-elm/fromm1/output/7B_fw_decay/checkpoints',
        ),
        outcome="refused: invalid choice: 'OpenGPTX-SPTokenizer'",
    ),
)

# OpenEuroLLM's Megatron-LM port (OpenEuroLLM/NVIDIA-Megatron-LM, on LUMI): the Qwen3-30B-A3B script its scaling
# sweep (slurm_scripts/sweep.sh) submits, at its parallel defaults, as `sbatch` on its 4 nodes x 8 GPUs, and its
# Qwen3-235B-A22B script on 64 nodes. The commit is not in the repository's published branches (the stored copies of
# the files are), so the lists were expanded by hand from the scripts' arrays in their COMMAND's order; srun runs
# slurm_scripts/launcher.sh, which runs `python3 -u` on them.
OPENEUROLLM = (
    Launch(
        name='openeurollm-qwen3-30b-a3b',
        script=Source('OpenEuroLLM/NVIDIA-Megatron-LM', 'slurm_scripts/qwen3_30B_A3B.slurm',
                      '1a9917ed7b7916d33be8095be3b38c22a15aa487'),
        program='pretrain_gpt.py', world_size=32,
        expanded=('4 nodes x 8 GPUs; TP_SIZE 1, PP_SIZE 2, CP_SIZE 1, EP_SIZE 8, EXPERT_TP_SIZE 1 (the defaults, which '
                  'its validate_parallel_combo accepts), RECOMPUTATION 1, PROFILE 0, CHECKPOINT_ARGS empty (all '
                  'commented out); SLURM_SUBMIT_DIR, SLURM_JOBID and USER left as written'),
        argv=(
            '--use-mcore-models', '--disable-bias-linear', '--max-position-embeddings', '32768', '--num-layers', '48',
            '--hidden-size', '2048', '--ffn-hidden-size', '6144', '--num-attention-heads', '32', '--init-method-std',
            '0.01', '--attention-dropout', '0.0', '--hidden-dropout', '0.0', '--qk-layernorm', '--normalization',
            'RMSNorm', '--norm-epsilon', '1e-06', '--position-embedding-type', 'rope', '--swiglu',
            '--untie-embeddings-and-output-weights', '--group-query-attention', '--num-query-groups', '4',
            '--no-masked-softmax-fusion', '--no-position-embedding', '--rotary-base', '1000000', '--micro-batch-size',
            '1', '--global-batch-size', '2048', '--bf16', '--kv-channels', '128', '--rerun-mode', 'disabled',
            '--disable-gloo-process-groups', '--use-flash-attn', '--attention-softmax-in-fp32', '--seq-length',
            '4096', '--train-iters', '5', '--eval-iters', '1', '--no-gradient-accumulation-fusion',
            '--no-bias-dropout-fusion', '--no-rope-fusion', '--distributed-timeout-minutes', '30',
            '--overlap-grad-reduce', '--overlap-param-gather', '--recompute-activations', '--recompute-granularity',
            'selective', '--optimizer', 'adam', '--adam-beta1', '0.9', '--adam-beta2', '0.95', '--adam-eps', '1e-8',
            '--lr', '3e-4', '--min-lr', '3e-5', '--lr-decay-style', 'cosine', '--clip-grad', '1.0', '--weight-decay',
            '1e-1', '--pipeline-model-parallel-size', '2', '--expert-model-parallel-size', '8',
            '--expert-tensor-parallel-size', '1', '--use-distributed-optimizer', '--context-parallel-size', '1',
            '--tensor-model-parallel-size', '1', '--tensorboard-dir',
            '${SLURM_SUBMIT_DIR}/output/tensorboard/test_meglm-qwen3-30B_A3B-${SLURM_JOBID}',
            '--tensorboard-queue-size', '5', '--log-throughput', '--log-progress', '--log-interval', '1',
            '--log-memory-to-tensorboard', '--log-world-size-to-tensorboard', '--data-cache-path',
            '/flash/project_462000963/users/${USER}/megatron_cache/', '--tokenizer-type', 'HuggingFaceTokenizer',
            '--tokenizer-model', 'openeurollm/tokenizer-256k', '--data-path',
            '/scratch/project_462000963/users/vitiugin/data_tok/oellm/hplt/fin_Latn/fin_Latn', '--num-workers', '4',
            '--vocab-size', '256000', '--moe-ffn-hidden-size', '768', '--moe-router-load-balancing-type', 'aux_loss',
            '--moe-aux-loss-coeff', '0.001', '--moe-grouped-gemm', '--moe-token-dispatcher-type', 'allgather',
            '--moe-router-force-load-balancing', '--num-experts', '128', '--moe-router-topk', '8',
            '--moe-router-dtype', 'fp64',
        ),
        outcome='trains',
    ),
    Launch(
        name='openeurollm-qwen3-235b-a22b',
        script=Source('OpenEuroLLM/NVIDIA-Megatron-LM', 'slurm_scripts/qwen3_235B_A22B.slurm',
                      '1a9917ed7b7916d33be8095be3b38c22a15aa487'),
        program='pretrain_gpt.py', world_size=512,
        expanded=('64 nodes x 8 GPUs (WORLD_SIZE is SLURM_NTASKS); PP 16 with 5 layers on the first and last stages, '
                  'EP 8, RECOMPUTATION 1, PROFILE 0, CHECKPOINT_ARGS empty (all commented out); SLURM_SUBMIT_DIR, '
                  'SLURM_JOBID and USER left as written'),
        argv=(
            '--use-mcore-models', '--disable-bias-linear', '--max-position-embeddings', '32768', '--num-layers', '94',
            '--hidden-size', '4096', '--ffn-hidden-size', '12288', '--moe-ffn-hidden-size', '1536',
            '--num-attention-heads', '64', '--init-method-std', '0.02', '--attention-dropout', '0.0',
            '--hidden-dropout', '0.0', '--qk-layernorm', '--normalization', 'RMSNorm', '--position-embedding-type',
            'rope', '--swiglu', '--untie-embeddings-and-output-weights', '--group-query-attention',
            '--num-query-groups', '4', '--no-masked-softmax-fusion', '--no-position-embedding', '--rotary-base',
            '1000000', '--micro-batch-size', '1', '--global-batch-size', '2048', '--bf16', '--num-experts', '64',
            '--moe-router-topk', '8', '--moe-router-dtype', 'fp64', '--kv-channels', '128', '--rerun-mode',
            'disabled', '--use-flash-attn', '--attention-softmax-in-fp32', '--seq-length', '4096', '--train-iters',
            '50', '--no-gradient-accumulation-fusion', '--no-bias-dropout-fusion', '--no-rope-fusion',
            '--distributed-timeout-minutes', '30', '--overlap-grad-reduce', '--overlap-param-gather',
            '--recompute-activations', '--recompute-granularity', 'selective', '--optimizer', 'adam', '--adam-beta1',
            '0.9', '--adam-beta2', '0.95', '--adam-eps', '1e-8', '--lr', '3e-4', '--min-lr', '3e-5',
            '--lr-decay-style', 'cosine', '--clip-grad', '1.0', '--weight-decay', '1e-1',
            '--pipeline-model-parallel-size', '16', '--expert-model-parallel-size', '8',
            '--decoder-first-pipeline-num-layers', '5', '--decoder-last-pipeline-num-layers', '5',
            '--use-distributed-optimizer', '--sequence-parallel', '--context-parallel-size', '1',
            '--tensor-model-parallel-size', '1', '--tensorboard-dir',
            '${SLURM_SUBMIT_DIR}/output/tensorboard/meglm-qwen3-dev-235B-${SLURM_JOBID}', '--tensorboard-queue-size',
            '5', '--log-throughput', '--log-progress', '--log-interval', '1', '--log-memory-to-tensorboard',
            '--log-world-size-to-tensorboard', '--data-cache-path',
            '/flash/project_462000963/users/${USER}/megatron_cache/', '--tokenizer-type', 'HuggingFaceTokenizer',
            '--tokenizer-model', 'openeurollm/tokenizer-256k', '--data-path',
            '/scratch/project_462000963/users/vitiugin/data_tok/oellm/hplt/fin_Latn/fin_Latn', '--num-workers', '4',
            '--vocab-size', '256000', '--moe-router-load-balancing-type', 'aux_loss', '--moe-aux-loss-coeff', '0.001',
            '--moe-grouped-gemm', '--moe-token-dispatcher-type', 'allgather', '--moe-router-force-load-balancing',
            '--disable-gloo-process-groups',
        ),
        outcome='trains',
    ),
)

# Paderborn University's LOLA (dice-group/LOLA, its Megatron-DeepSpeed fork): `bash run-gpt3-moe-pretrain.sh --slurm`,
# the README's default run on noctua2 (24 nodes x 4 GPUs, the 1.3B model, 16 experts, micro batch 8), and the same
# with `--static_gate`, run from lola_ws/gpt with sbatch stubbed to run gpt3-moe-pretrain.sh (LIB_DIR ../../) and
# srun to run its `bash -c`; the JSON is the sed-filled lola_ws/cfg/ds_config_gpt_Zero2_TEMPLATE.json. The static
# gate's `--lola-enable-static-moe-gate` is LOLA's own (one DeepSpeed-MoE TopKGate shared by every MoE layer, a
# router this program does not have).
_LOLA_JSON = """\
{
  "train_batch_size" : 768,
  "train_micro_batch_size_per_gpu": 8,
  "steps_per_print": 5,

  "zero_optimization": {
    "stage": 2
  },

  "gradient_clipping": 1.0,
  "prescale_gradients": false,

  "fp16": {
    "enabled": true,
    "loss_scale": 0,
    "loss_scale_window": 500,
    "hysteresis": 2,
    "min_loss_scale": 1,
    "initial_scale_power": 11
  },

  "bf16": {
    "enabled": false
  },
  "curriculum_learning": {
    "enabled": false,
    "curriculum_type": "seqlen",
    "min_difficulty": 80,
    "max_difficulty": 2048,
    "schedule_type": "fixed_linear",
    "schedule_config": {
      "total_curriculum_step": 73425,
      "difficulty_step": 8
    }
  },

  "wall_clock_breakdown" : true,
  "flops_profiler": {
    "enabled": true,
    "profile_step": 750,
    "module_depth": -1,
    "top_modules": 1,
    "detailed": true,
    "output_file": "flops_profile.out"
  },
  "wandb": {
    "enabled": true,
    "project": "LOLA"
  }
}
"""
_LOLA_EXPANDED = ("run-gpt3-moe-pretrain.sh --slurm: NNODES 24, GPUS_PER_NODE 4, MODEL_SIZE 1.3, MICRO_BATCH_SIZE 8, "
                  "TRAIN_TOKENS 1T, EP_SIZE 16, GLOBAL_BATCH_SIZE 24 x 4 x 8; its VOCAB_PATH, MERGE_PATH and "
                  "DATA_BLEND; gpt3-moe-pretrain.sh's OUTPUT_BASEPATH under the script's folder")
LOLA = (
    Launch(
        name='lola-gpt3-moe-1.3b-16e',
        script=Source('dice-group/LOLA', 'lola_ws/gpt/gpt3-moe-pretrain.sh', '7e8605c197a762c67f84777aedb50856e9a6ad55'),
        program='pretrain_gpt.py', world_size=96,
        expanded=_LOLA_EXPANDED,
        argv=(
            '--override-opt_param-scheduler', '--adam-beta1', '0.9', '--adam-beta2', '0.95',
            '--tensor-model-parallel-size', '1', '--moe-expert-parallel-size', '16', '--num-experts', '16',
            '--moe-loss-coeff', '0.01', '--moe-train-capacity-factor', '1.0', '--moe-eval-capacity-factor', '1.0',
            '--moe-min-capacity', '4', '--init-method-std', '0.01', '--lr-decay-tokens', '800000000000',
            '--lr-warmup-tokens', '100000000000', '--micro-batch-size', '8', '--exit-duration-in-mins', '6000000000',
            '--global-batch-size', '768', '--num-layers', '24', '--hidden-size', '2048', '--num-attention-heads',
            '16', '--seq-length', '2048', '--max-position-embeddings', '2048', '--train-tokens', '1000000000000',
            '--train-iters', '1907348', '--lr', '2.0e-4', '--min-lr', '2.0e-5', '--lr-decay-style', 'cosine',
            '--split', '98,2,0', '--log-interval', '5', '--eval-interval', '500', '--eval-iters', '200',
            '--save-interval', '500', '--weight-decay', '0.1', '--clip-grad', '1.0', '--hysteresis', '2',
            '--num-workers', '128', '--fp16', '--load',
            'lola_ws/gpt/gpt-normal-16moe-output/checkpoint/noctua2-gpt-normal-16moe_ms-1.3B_bs-768_gpus-96_lr-2.0e-4_minlr-2.0e-5_ep-16_mlc-0.01_cap-1.0_drop-true',
            '--save',
            'lola_ws/gpt/gpt-normal-16moe-output/checkpoint/noctua2-gpt-normal-16moe_ms-1.3B_bs-768_gpus-96_lr-2.0e-4_minlr-2.0e-5_ep-16_mlc-0.01_cap-1.0_drop-true',
            '--tensorboard-queue-size', '1', '--log-timers-to-tensorboard', '--log-batch-size-to-tensorboard',
            '--log-validation-ppl-to-tensorboard', '--tensorboard-dir',
            'lola_ws/gpt/gpt-normal-16moe-output/tensorboard/noctua2-gpt-normal-16moe_ms-1.3B_bs-768_gpus-96_lr-2.0e-4_minlr-2.0e-5_ep-16_mlc-0.01_cap-1.0_drop-true',
            '--checkpoint-activations', '--create-moe-param-group', '--vocab-file',
            '/scratch/hpc-prf-lola/data/misc/mgpt/mgpt_vocab.json', '--merge-file',
            '/scratch/hpc-prf-lola/data/misc/mgpt/mgpt_merges.txt', '--data-path',
            '/scratch/hpc-prf-lola/data/culturaX/merged/mgpt-tokenized/meg-culturax', '--data-impl', 'mmap',
            '--deepspeed', '--deepspeed_config',
            'lola_ws/gpt/gpt-normal-16moe-output/ds_config_gpt_noctua2-gpt-normal-16moe_ms-1.3B_bs-768_gpus-96_lr-2.0e-4_minlr-2.0e-5_ep-16_mlc-0.01_cap-1.0_drop-true.json',
            '--zero-stage', '2', '--pipeline-model-parallel-size', '1', '--no-pipeline-parallel',
            '--deepspeed-activation-checkpointing',
        ),
        outcome='trains',
        json=Source('dice-group/LOLA', 'lola_ws/cfg/ds_config_gpt_Zero2_TEMPLATE.json', '7e8605c197a762c67f84777aedb50856e9a6ad55'),
        json_generated=True,
        json_text=_LOLA_JSON,
    ),
    Launch(
        name='lola-gpt3-moe-1.3b-16e-static-gate',
        script=Source('dice-group/LOLA', 'lola_ws/gpt/gpt3-moe-pretrain.sh', '7e8605c197a762c67f84777aedb50856e9a6ad55'),
        program='pretrain_gpt.py', world_size=96,
        expanded=f"{_LOLA_EXPANDED}; with --static_gate (STATIC_GATE true, NAME_ID gpt-staticgate-moe)",
        argv=(
            '--override-opt_param-scheduler', '--adam-beta1', '0.9', '--adam-beta2', '0.95',
            '--tensor-model-parallel-size', '1', '--moe-expert-parallel-size', '16', '--num-experts', '16',
            '--moe-loss-coeff', '0.01', '--moe-train-capacity-factor', '1.0', '--moe-eval-capacity-factor', '1.0',
            '--moe-min-capacity', '4', '--init-method-std', '0.01', '--lr-decay-tokens', '800000000000',
            '--lr-warmup-tokens', '100000000000', '--micro-batch-size', '8', '--exit-duration-in-mins', '6000000000',
            '--global-batch-size', '768', '--num-layers', '24', '--hidden-size', '2048', '--num-attention-heads',
            '16', '--seq-length', '2048', '--max-position-embeddings', '2048', '--train-tokens', '1000000000000',
            '--train-iters', '1907348', '--lr', '2.0e-4', '--min-lr', '2.0e-5', '--lr-decay-style', 'cosine',
            '--split', '98,2,0', '--log-interval', '5', '--eval-interval', '500', '--eval-iters', '200',
            '--save-interval', '500', '--weight-decay', '0.1', '--clip-grad', '1.0', '--hysteresis', '2',
            '--num-workers', '128', '--fp16', '--load',
            'lola_ws/gpt/gpt-staticgate-moe-output/checkpoint/noctua2-gpt-staticgate-moe_ms-1.3B_bs-768_gpus-96_lr-2.0e-4_minlr-2.0e-5_ep-16_mlc-0.01_cap-1.0_drop-true',
            '--save',
            'lola_ws/gpt/gpt-staticgate-moe-output/checkpoint/noctua2-gpt-staticgate-moe_ms-1.3B_bs-768_gpus-96_lr-2.0e-4_minlr-2.0e-5_ep-16_mlc-0.01_cap-1.0_drop-true',
            '--tensorboard-queue-size', '1', '--log-timers-to-tensorboard', '--log-batch-size-to-tensorboard',
            '--log-validation-ppl-to-tensorboard', '--tensorboard-dir',
            'lola_ws/gpt/gpt-staticgate-moe-output/tensorboard/noctua2-gpt-staticgate-moe_ms-1.3B_bs-768_gpus-96_lr-2.0e-4_minlr-2.0e-5_ep-16_mlc-0.01_cap-1.0_drop-true',
            '--lola-enable-static-moe-gate', '--checkpoint-activations', '--create-moe-param-group', '--vocab-file',
            '/scratch/hpc-prf-lola/data/misc/mgpt/mgpt_vocab.json', '--merge-file',
            '/scratch/hpc-prf-lola/data/misc/mgpt/mgpt_merges.txt', '--data-path',
            '/scratch/hpc-prf-lola/data/culturaX/merged/mgpt-tokenized/meg-culturax', '--data-impl', 'mmap',
            '--deepspeed', '--deepspeed_config',
            'lola_ws/gpt/gpt-staticgate-moe-output/ds_config_gpt_noctua2-gpt-staticgate-moe_ms-1.3B_bs-768_gpus-96_lr-2.0e-4_minlr-2.0e-5_ep-16_mlc-0.01_cap-1.0_drop-true.json',
            '--zero-stage', '2', '--pipeline-model-parallel-size', '1', '--no-pipeline-parallel',
            '--deepspeed-activation-checkpointing',
        ),
        outcome='refused: --lola-enable-static-moe-gate',
        json=Source('dice-group/LOLA', 'lola_ws/cfg/ds_config_gpt_Zero2_TEMPLATE.json', '7e8605c197a762c67f84777aedb50856e9a6ad55'),
        json_generated=True,
        json_text=_LOLA_JSON,
    ),
)

# SURF's Megatron-LM on Snellius (SURF-ML/Megatron-LM-Snellius 3_train/train-gpt.job): `sbatch` on its 4 nodes x 4 H100s
# (SLURM_NTASKS 16), srun stubbed to record what follows launch.sh; USER, SLURM_JOBID and PROJECT_SPACE left as
# written. Its variables are meant to be redefined in the script; FSDP=1, its own switch, takes Megatron-LM's
# --use-torch-fsdp2 path instead of TP/PP/CP and the distributed optimizer, beside its tied embeddings
# (TIE_WORD_EMBEDDINGS=1), which Megatron-LM refuses (validate_args: "--use-torch-fsdp2 requires
# --untie-embeddings-and-output-weights"), and so does this program; Megatron asserts its --ckpt-format torch_dist or
# torch_dcp just before that, which the script's --ckpt-format torch also fails.
_SURF_EXPANDED = ("the 1.7B FineWeb model at the script's values (TRAIN_TOKENS 350_000_000 / SEQ_LENGTH 4096 = "
                  "85449 samples, LR_WARMUP_ITERS 500 x GLOBAL_BATCH_SIZE 64 warmup samples)")
SURF = (
    Launch(
        name='surf-snellius-train-gpt-1.7b',
        script=Source('SURF-ML/Megatron-LM-Snellius', '3_train/train-gpt.job', '7adecbb9ddad5745c0d9707de4a97ce5bddab568'),
        program='pretrain_gpt.py', world_size=16,
        expanded=f"{_SURF_EXPANDED}; FSDP=0 as written",
        argv=(
            '--num-layers', '24', '--hidden-size', '2048', '--ffn-hidden-size', '8192', '--num-attention-heads', '32',
            '--use-flash-attn', '--attention-softmax-in-fp32', '--max-position-embeddings', '4096', '--seq-length',
            '4096', '--position-embedding-type', 'rope', '--rotary-base', '10000', '--disable-bias-linear',
            '--init-method-std', '0.02', '--attention-dropout', '0.0', '--hidden-dropout', '0.0', '--normalization',
            'RMSNorm', '--micro-batch-size', '4', '--global-batch-size', '64', '--train-samples', '85449', '--bf16',
            '--swiglu', '--no-async-tensor-model-parallel-allreduce', '--no-masked-softmax-fusion',
            '--no-gradient-accumulation-fusion', '--no-bias-dropout-fusion', '--no-rope-fusion',
            '--distributed-timeout-minutes', '30', '--overlap-grad-reduce', '--optimizer', 'adam', '--adam-beta1',
            '0.9', '--adam-beta2', '0.95', '--adam-eps', '1e-8', '--lr', '3e-4', '--min-lr', '3e-5',
            '--lr-decay-style', 'cosine', '--lr-decay-samples', '85449', '--lr-warmup-samples', '32000',
            '--clip-grad', '1.0', '--weight-decay', '1e-1', '--tensor-model-parallel-size', '1',
            '--pipeline-model-parallel-size', '1', '--context-parallel-size', '1', '--sequence-parallel',
            '--use-distributed-optimizer', '--eval-interval', '5000', '--eval-iters', '100', '--tensorboard-dir',
            '/scratch-shared/$USER/Megatron-LM/output/tensorboard/train-gpt-$SLURM_JOBID', '--tensorboard-queue-size',
            '5', '--log-throughput', '--log-progress', '--log-interval', '1', '--ckpt-format', 'torch', '--load',
            '/scratch-shared/$USER/Megatron-LM/output/checkpoints', '--save',
            '/scratch-shared/$USER/Megatron-LM/output/checkpoints', '--save-interval', '500', '--data-path',
            '$PROJECT_SPACE/datasets/FineWeb/fineweb-10BT_text_document', '--data-cache-path',
            '/scratch-shared/$USER/megatron_cache', '--tokenizer-type', 'HuggingFaceTokenizer', '--tokenizer-model',
            'gpt2', '--make-vocab-size-divisible-by', '128', '--dataloader-type', 'single', '--num-workers', '2',
        ),
        outcome='trains',
    ),
    Launch(
        name='surf-snellius-train-gpt-1.7b-fsdp2',
        script=Source('SURF-ML/Megatron-LM-Snellius', '3_train/train-gpt.job', '7adecbb9ddad5745c0d9707de4a97ce5bddab568'),
        program='pretrain_gpt.py', world_size=16,
        expanded=f"{_SURF_EXPANDED}; FSDP=1, the script's switch for Megatron-LM's FSDP2",
        argv=(
            '--num-layers', '24', '--hidden-size', '2048', '--ffn-hidden-size', '8192', '--num-attention-heads', '32',
            '--use-flash-attn', '--attention-softmax-in-fp32', '--max-position-embeddings', '4096', '--seq-length',
            '4096', '--position-embedding-type', 'rope', '--rotary-base', '10000', '--disable-bias-linear',
            '--init-method-std', '0.02', '--attention-dropout', '0.0', '--hidden-dropout', '0.0', '--normalization',
            'RMSNorm', '--micro-batch-size', '4', '--global-batch-size', '64', '--train-samples', '85449', '--bf16',
            '--swiglu', '--no-async-tensor-model-parallel-allreduce', '--no-masked-softmax-fusion',
            '--no-gradient-accumulation-fusion', '--no-bias-dropout-fusion', '--no-rope-fusion',
            '--distributed-timeout-minutes', '30', '--overlap-grad-reduce', '--optimizer', 'adam', '--adam-beta1',
            '0.9', '--adam-beta2', '0.95', '--adam-eps', '1e-8', '--lr', '3e-4', '--min-lr', '3e-5',
            '--lr-decay-style', 'cosine', '--lr-decay-samples', '85449', '--lr-warmup-samples', '32000',
            '--clip-grad', '1.0', '--weight-decay', '1e-1', '--use-torch-fsdp2', '--eval-interval', '5000',
            '--eval-iters', '100', '--tensorboard-dir',
            '/scratch-shared/$USER/Megatron-LM/output/tensorboard/train-gpt-$SLURM_JOBID', '--tensorboard-queue-size',
            '5', '--log-throughput', '--log-progress', '--log-interval', '1', '--ckpt-format', 'torch', '--load',
            '/scratch-shared/$USER/Megatron-LM/output/checkpoints', '--save',
            '/scratch-shared/$USER/Megatron-LM/output/checkpoints', '--save-interval', '500', '--data-path',
            '$PROJECT_SPACE/datasets/FineWeb/fineweb-10BT_text_document', '--data-cache-path',
            '/scratch-shared/$USER/megatron_cache', '--tokenizer-type', 'HuggingFaceTokenizer', '--tokenizer-model',
            'gpt2', '--make-vocab-size-divisible-by', '128', '--dataloader-type', 'single', '--num-workers', '2',
        ),
        outcome='refused: --use-torch-fsdp2 with a tied output layer',
    ),
)

LAUNCHES = (*LING, *(with_upstream_flags(launch, LING_PATCH_FLAGS) for launch in LING), *AWS, *OPENGPTX, *OPENEUROLLM, *LOLA, *SURF)
