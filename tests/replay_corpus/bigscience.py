"""The replay corpus: BigScience: the SLURM scripts of bigscience-workshop/bigscience's train/, and
bigscience-workshop/Megatron-DeepSpeed's examples and test JSONs. See launch.py for what an entry holds."""

from tests.replay_corpus.launch import SIMPLE_LAUNCH, Launch, Source

LAUNCHES = (
    Launch(
        name="bigscience-tr1-13b",
        script=Source("bigscience-workshop/bigscience", "train/tr1-13B-base/tr1-13B-round1.slurm",
                      "699b2af918511deeb3d10e2756738f62447a4f1b"),
        program="pretrain_gpt.py", world_size=512,
        expanded=("#SBATCH --nodes=128 x GPUS_PER_NODE=4; TP_SIZE=2, PP_SIZE=4, MICRO_BATCH_SIZE=1, "
                  "GLOBAL_BATCH_SIZE=1024, NLAYERS=40, NHIDDEN=5120, NHEADS=32, FFN_HIDDEN_SIZE=20480, "
                  "SEQ_LEN=2048, SAVE_INTERVAL=1500, ZERO_STAGE=1; $six_ALL_CCFRWORK, $six_ALL_CCFRSCRATCH "
                  "and $SLURM_JOBID kept as written; $CMD as `bash -c` runs it under srun; the JSON is the "
                  "script's heredoc"),
        argv=(
            "--tensor-model-parallel-size", "2", "--pipeline-model-parallel-size", "4", "--num-layers", "40",
            "--hidden-size", "5120", "--ffn-hidden-size", "20480", "--num-attention-heads", "32",
            "--seq-length", "2048", "--max-position-embeddings", "2048", "--micro-batch-size", "1",
            "--rampup-batch-size", "16", "16", "5_000_000", "--global-batch-size", "1024",
            "--train-samples", "300_000_000",
            "--vocab-file", "$six_ALL_CCFRWORK/code/tr1-13B/Megatron-DeepSpeed-tr1-13B//data/gpt2-vocab.json",
            "--merge-file", "$six_ALL_CCFRWORK/code/tr1-13B/Megatron-DeepSpeed-tr1-13B//data/gpt2-merges.txt",
            "--loss-scale", "12", "--clip-grad", "1.0", "--fp16", "--checkpoint-activations", "--seed", "42",
            "--optimizer", "adam", "--adam-beta1", "0.9", "--adam-beta2", "0.999", "--adam-eps", "1e-8",
            "--lr", "1e-4", "--min-lr", "1e-5", "--lr-decay-style", "cosine", "--lr-decay-samples", "126_953_125",
            "--lr-warmup-samples", "216_320", "--clip-grad", "1.0", "--weight-decay", "1e-1",
            "--exit-duration-in-mins", "1190", "--log-interval", "10", "--save-interval", "1500",
            "--eval-interval", "1000", "--eval-iters", "5",
            "--codecarbon-dir", "$six_ALL_CCFRSCRATCH/checkpoints/tr1-13B/codecarbon",
            "--tensorboard-dir", "$six_ALL_CCFRSCRATCH/checkpoints/tr1-13B/tensorboard",
            "--tensorboard-queue-size", "5", "--log-timers-to-tensorboard", "--log-batch-size-to-tensorboard",
            "--log-validation-ppl-to-tensorboard", "--save", "$six_ALL_CCFRSCRATCH/checkpoints/tr1-13B/checkpoints",
            "--load", "$six_ALL_CCFRSCRATCH/checkpoints/tr1-13B/checkpoints",
            "--data-path", "$six_ALL_CCFRWORK/datasets-custom/oscar-en/meg-gpt2_text_document",
            "--data-impl", "mmap", "--split", "949,50,1", "--distributed-backend", "nccl", "--deepspeed",
            "--deepspeed_config", "./ds_config.$SLURM_JOBID.json", "--zero-stage", "1",
            "--deepspeed-activation-checkpointing",
        ),
        json=Source("bigscience-workshop/bigscience", "train/tr1-13B-base/tr1-13B-round1.slurm",
                    "699b2af918511deeb3d10e2756738f62447a4f1b"),
        json_generated=True,
        json_text="""\
{
  "train_micro_batch_size_per_gpu": 1,
  "train_batch_size": 1024,
  "gradient_clipping": 1.0,
  "zero_optimization": {
    "stage": 1
  },
  "fp16": {
    "enabled": true,
    "loss_scale": 0,
    "loss_scale_window": 500,
    "hysteresis": 2,
    "min_loss_scale": 1,
    "initial_scale_power": 12
  },
  "steps_per_print": 2000,
  "wall_clock_breakdown": false
}
""",
        outcome="trains",
    ),

    Launch(
        name="bigscience-tr11-176b-ml",
        script=Source("bigscience-workshop/bigscience", "train/tr11-176B-ml/tr11-176B-ml.slurm",
                      "dc8d99ff23653ebef7cc6900c901833162ca19c9"),
        program="pretrain_gpt.py", world_size=384,
        expanded=("SLURM_NNODES=48 x GPUS_PER_NODE=8; TP_SIZE=4, PP_SIZE=12, MICRO_BATCH_SIZE=2, "
                  "GLOBAL_BATCH_SIZE=2048, NHIDDEN=14336, NLAYERS=70, NHEADS=112, SEQ_LEN=2048, "
                  "SAVE_INTERVAL=100, ZERO_STAGE=0; TRAIN_SAMPLES=220_000_000, "
                  "LR_DECAY_SAMPLES=200_000_000, LR_WARMUP_SAMPLES=183_105; $six_ALL_CCFRWORK, "
                  "$six_ALL_CCFRSCRATCH, $SLURM_JOB_ID kept as written; the JSON is the script's heredoc"),
        argv=(
            "--tensor-model-parallel-size", "4", "--pipeline-model-parallel-size", "12",
            "--pp-partition-method", "type:transformer|embedding", "--num-layers", "70", "--hidden-size", "14336",
            "--num-attention-heads", "112", "--seq-length", "2048", "--max-position-embeddings", "2048",
            "--micro-batch-size", "2", "--rampup-batch-size", "192", "16", "9_765_625",
            "--global-batch-size", "2048", "--train-samples", "220_000_000", "--tokenizer-type", "PretrainedFromHF",
            "--tokenizer-name-or-path", "bigscience-catalogue-data-dev/byte-level-bpe-tokenizer-no-norm-250k-whitespace-and-eos-regex-alpha-v3-dedup-lines-articles",
            "--init-method-std", "0.0048", "--embed-layernorm", "--sync-tp-duplicated-parameters", "--bf16",
            "--seed", "42", "--position-embedding-type", "alibi", "--checkpoint-activations",
            "--abort-on-unmet-fused-kernel-constraints",
            "--kill-switch-path", "$six_ALL_CCFRWORK/code/tr11-176B-ml/Megatron-DeepSpeed/kill-switch-tr11-176B-exp1",
            "--pad-vocab-size-to", "250880", "--optimizer", "adam", "--adam-beta1", "0.9", "--adam-beta2", "0.95",
            "--adam-eps", "1e-8", "--lr", "6e-5", "--min-lr", "6e-6", "--lr-decay-style", "cosine",
            "--lr-decay-samples", "200_000_000", "--lr-warmup-samples", "183_105", "--clip-grad", "1.0",
            "--weight-decay", "1e-1", "--exit-duration-in-mins", "5990", "--log-interval", "1",
            "--save-interval", "100", "--eval-interval", "1000", "--eval-iters", "1",
            "--tensorboard-dir", "$six_ALL_CCFRSCRATCH/checkpoints/tr11-176B-ml/tr11-176B-ml-logs/tensorboard/main",
            "--tensorboard-queue-size", "5", "--log-timers-to-tensorboard", "--log-batch-size-to-tensorboard",
            "--log-validation-ppl-to-tensorboard",
            "--save", "$six_ALL_CCFRSCRATCH/checkpoints/tr11-176B-ml/checkpoints/main",
            "--load", "$six_ALL_CCFRSCRATCH/checkpoints/tr11-176B-ml/checkpoints/main",
            "--train-weighted-split-paths-path", "$six_ALL_CCFRWORK/code/tr11-176B-ml/Megatron-DeepSpeed/data/train-splits.txt",
            "--valid-weighted-split-paths-path", "$six_ALL_CCFRWORK/code/tr11-176B-ml/Megatron-DeepSpeed/data/valid-splits.txt",
            "--num-workers", "2", "--valid-num-workers", "0", "--data-impl", "mmap", "--distributed-backend", "nccl",
            "--deepspeed", "--deepspeed_config", "./ds_config.$SLURM_JOB_ID.json", "--zero-stage", "0",
            "--deepspeed-activation-checkpointing",
        ),
        json=Source("bigscience-workshop/bigscience", "train/tr11-176B-ml/tr11-176B-ml.slurm",
                    "dc8d99ff23653ebef7cc6900c901833162ca19c9"),
        json_generated=True,
        json_text="""\
{
  "train_micro_batch_size_per_gpu": 2,
  "train_batch_size": 2048,
  "gradient_clipping": 1.0,
  "zero_optimization": {
    "stage": 0
  },
  "bf16": {
    "enabled": true
  },
  "steps_per_print": 2000,
  "wall_clock_breakdown": false
}
""",
        outcome="refused: --position-embedding-type alibi is not implemented",
    ),

    Launch(
        name="bigscience-tr11e-350m-ml",
        script=Source("bigscience-workshop/bigscience", "train/tr11-176B-ml/smaller_models/tr11e-350M-ml.slurm",
                      "9e64edec2ad1fb9263bf39ba616a84ff64b4d947"),
        program="pretrain_gpt.py", world_size=32,
        expanded=("#SBATCH --nodes=8 x GPUS_PER_NODE=4; PP_SIZE=1, TP_SIZE=1, MICRO_BATCH_SIZE=1, "
                  "GLOBAL_BATCH_SIZE=256, NLAYERS=24, NHIDDEN=1024, NHEADS=16, SEQ_LEN=2048, "
                  "SAVE_INTERVAL=250, ZERO_STAGE=0, variant=main; $six_ALL_CCFRWORK, $six_ALL_CCFRSCRATCH, "
                  "$SLURM_JOBID kept as written; the JSON is the script's heredoc"),
        argv=(
            "--tensor-model-parallel-size", "1", "--pipeline-model-parallel-size", "1",
            "--pp-partition-method", "type:transformer|embedding", "--num-layers", "24", "--hidden-size", "1024",
            "--num-attention-heads", "16", "--seq-length", "2048", "--max-position-embeddings", "2048",
            "--micro-batch-size", "1", "--rampup-batch-size", "192", "32", "9_765_625", "--global-batch-size", "256",
            "--train-samples", "220_000_000", "--tokenizer-type", "PretrainedFromHF",
            "--tokenizer-name-or-path", "bigscience-catalogue-data-dev/byte-level-bpe-tokenizer-no-norm-250k-whitespace-and-eos-regex-alpha-v3-dedup-lines-articles",
            "--init-method-std", "0.0048", "--embed-layernorm", "--fp16", "--seed", "42",
            "--position-embedding-type", "alibi", "--abort-on-unmet-fused-kernel-constraints",
            "--pad-vocab-size-to", "250880", "--optimizer", "adam", "--adam-beta1", "0.9", "--adam-beta2", "0.95",
            "--adam-eps", "1e-8", "--lr", "3.0e-4", "--min-lr", "1e-5", "--lr-decay-style", "cosine",
            "--lr-decay-samples", "200_000_000", "--lr-warmup-samples", "183_105", "--clip-grad", "1.0",
            "--weight-decay", "1e-1", "--exit-duration-in-mins", "5990", "--log-interval", "1",
            "--save-interval", "250", "--eval-interval", "1000", "--eval-iters", "1",
            "--tensorboard-dir", "$six_ALL_CCFRSCRATCH/checkpoints/tr11e-350M-ml/tr11e-350M-ml-logs/tensorboard/main",
            "--tensorboard-queue-size", "5", "--log-timers-to-tensorboard", "--log-batch-size-to-tensorboard",
            "--log-validation-ppl-to-tensorboard",
            "--save", "$six_ALL_CCFRSCRATCH/checkpoints/tr11e-350M-ml/checkpoints/main",
            "--load", "$six_ALL_CCFRSCRATCH/checkpoints/tr11e-350M-ml/checkpoints/main",
            "--train-weighted-split-paths-path", "$six_ALL_CCFRWORK/code/tr11-176B-ml/Megatron-DeepSpeed/data/train-splits-350M.txt",
            "--valid-weighted-split-paths-path", "$six_ALL_CCFRWORK/code/tr11-176B-ml/Megatron-DeepSpeed/data/valid-splits-350M.txt",
            "--data-impl", "mmap", "--distributed-backend", "nccl", "--deepspeed",
            "--deepspeed_config", "./ds_config.$SLURM_JOBID.json", "--zero-stage", "0",
            "--deepspeed-activation-checkpointing",
        ),
        json=Source("bigscience-workshop/bigscience", "train/tr11-176B-ml/smaller_models/tr11e-350M-ml.slurm",
                    "9e64edec2ad1fb9263bf39ba616a84ff64b4d947"),
        json_generated=True,
        json_text="""\
{
  "train_micro_batch_size_per_gpu": 1,
  "train_batch_size": 256,
  "gradient_clipping": 1.0,
  "zero_optimization": {
    "stage": 0
  },
  "fp16": {
    "enabled": true,
    "loss_scale": 0,
    "loss_scale_window": 500,
    "hysteresis": 2,
    "min_loss_scale": 1,
    "initial_scale_power": 12
  },
  "steps_per_print": 2000,
  "wall_clock_breakdown": false
}
""",
        outcome="refused: alibi",
    ),

    Launch(
        name="bigscience-megatron-deepspeed-pretrain-gpt-single-node",
        script=Source("bigscience-workshop/Megatron-DeepSpeed", "examples/pretrain_gpt_single_node.sh",
                      "8387ae17c4704f6579f88a84500b535d19d7fbbf"),
        program="pretrain_gpt.py", world_size=1,
        expanded=("N_GPUS=1 under `deepspeed --num_gpus 1`; GPT_ARGS, OUTPUT_ARGS, DATA_ARGS in that order"),
        argv=(
            "--num-layers", "24", "--hidden-size", "1024", "--num-attention-heads", "16", "--seq-length", "1024",
            "--max-position-embeddings", "1024", "--micro-batch-size", "4", "--global-batch-size", "8",
            "--lr-decay-iters", "320000", "--lr", "0.00015", "--min-lr", "1.0e-5", "--lr-decay-style", "cosine",
            "--train-iters", "5000", "--vocab-file", "data/gpt2-vocab.json", "--merge-file", "data/gpt2-merges.txt",
            "--data-impl", "mmap", "--split", "949,50,1", "--distributed-backend", "nccl", "--weight-decay", "1e-2",
            "--clip-grad", "1.0", "--lr-warmup-fraction", ".01", "--fp16", "--log-interval", "10",
            "--save-interval", "500", "--eval-interval", "100", "--eval-iters", "10", "--checkpoint-activations",
            "--save", "checkpoints/gpt2", "--load", "checkpoints/gpt2", "--data-path", "data/meg-gpt2_text_document",
        ),
        outcome="trains",
    ),

    Launch(
        name="bigscience-megatron-deepspeed-tests-json",
        script=None, program="pretrain_gpt.py", world_size=1,
        expanded="a standalone JSON, launched with SIMPLE_LAUNCH",
        argv=SIMPLE_LAUNCH,
        json=Source("bigscience-workshop/Megatron-DeepSpeed", "tests/ds_config.json",
                    "8387ae17c4704f6579f88a84500b535d19d7fbbf"),
        json_text="""\
{
  "train_micro_batch_size_per_gpu": 1,
  "train_batch_size": 16,
  "gradient_clipping": 1.0,
  "zero_optimization": {
    "stage": 1
  },
  "fp16": {
    "enabled": true,
    "loss_scale": 0,
    "loss_scale_window": 500,
    "hysteresis": 2,
    "min_loss_scale": 1,
    "initial_scale_power": 12
  },
  "zero_allow_untested_optimizer": true,
  "steps_per_print": 2000,
  "wall_clock_breakdown": false
}
""",
        outcome="trains",
    ),

    Launch(
        name="bigscience-megatron-deepspeed-tests-bf16-json",
        script=None, program="pretrain_gpt.py", world_size=1,
        expanded="a standalone JSON, launched with SIMPLE_LAUNCH",
        argv=SIMPLE_LAUNCH,
        json=Source("bigscience-workshop/Megatron-DeepSpeed", "tests/ds_config_bf16.json",
                    "8387ae17c4704f6579f88a84500b535d19d7fbbf"),
        json_text="""\
{
  "train_micro_batch_size_per_gpu": 1,
  "train_batch_size": 16,
  "gradient_clipping": 1.0,
  "zero_optimization": {
    "stage": 0
  },
  "bf16": {
    "enabled": true
  },
  "zero_allow_untested_optimizer": true,
  "steps_per_print": 2000,
  "wall_clock_breakdown": false
}
""",
        outcome="trains",
    ),

    Launch(
        name="bigscience-tr8-104b",
        script=Source("bigscience-workshop/bigscience", "train/tr8-104B-wide/tr8-104B.slurm",
                      "0eda8744c04f229f2fa2b00c81a7a2369e68fafd"),
        program="pretrain_gpt.py", world_size=512,
        expanded=("#SBATCH --nodes=128 x GPUS_PER_NODE=4; TP_SIZE=4, PP_SIZE=32, MICRO_BATCH_SIZE=1, "
                  "GLOBAL_BATCH_SIZE=2048, NLAYERS=64, NHIDDEN=11600, NHEADS=40, SEQ_LEN=2048, "
                  "SAVE_INTERVAL=300, ZERO_STAGE=1; $six_ALL_CCFRWORK, $six_ALL_CCFRSCRATCH and $SLURM_JOBID "
                  "kept as written; $CMD as `bash -c` runs it under srun; the JSON is the script's heredoc"),
        argv=(
            "--tensor-model-parallel-size", "4", "--pipeline-model-parallel-size", "32", "--num-layers", "64",
            "--hidden-size", "11600", "--num-attention-heads", "40", "--seq-length", "2048",
            "--max-position-embeddings", "2048", "--micro-batch-size", "1",
            "--rampup-batch-size", "16", "16", "6_000_000", "--global-batch-size", "2048",
            "--train-samples", "300_000_000",
            "--vocab-file", "$six_ALL_CCFRWORK/code/tr8-104B/Megatron-DeepSpeed-tr8-104B/data/gpt2-vocab.json",
            "--merge-file", "$six_ALL_CCFRWORK/code/tr8-104B/Megatron-DeepSpeed-tr8-104B/data/gpt2-merges.txt",
            "--loss-scale", "12", "--clip-grad", "1.0", "--fp16", "--checkpoint-activations", "--seed", "43",
            "--optimizer", "adam", "--adam-beta1", "0.9", "--adam-beta2", "0.95", "--adam-eps", "1e-8",
            "--lr", "6e-5", "--min-lr", "6e-6", "--lr-decay-style", "cosine", "--lr-decay-samples", "126_953_125",
            "--lr-warmup-samples", "216_320", "--clip-grad", "1.0", "--weight-decay", "1e-1",
            "--exit-duration-in-mins", "1190", "--log-interval", "1", "--save-interval", "300",
            "--eval-interval", "1000", "--eval-iters", "5",
            "--tensorboard-dir", "$six_ALL_CCFRSCRATCH/checkpoints/tr8-104B/tr8-104B-logs/tensorboard",
            "--tensorboard-queue-size", "5", "--log-timers-to-tensorboard", "--log-batch-size-to-tensorboard",
            "--log-validation-ppl-to-tensorboard", "--save", "$six_ALL_CCFRSCRATCH/checkpoints/tr8-104B/checkpoints",
            "--load", "$six_ALL_CCFRSCRATCH/checkpoints/tr8-104B/checkpoints",
            "--data-path", "$six_ALL_CCFRWORK/datasets-custom/oscar-en/meg-gpt2_text_document",
            "--data-impl", "mmap", "--split", "949,50,1", "--distributed-backend", "nccl", "--deepspeed",
            "--deepspeed_config", "./ds_config.$SLURM_JOBID.json", "--zero-stage", "1",
            "--deepspeed-activation-checkpointing",
        ),
        json=Source("bigscience-workshop/bigscience", "train/tr8-104B-wide/tr8-104B.slurm",
                    "0eda8744c04f229f2fa2b00c81a7a2369e68fafd"),
        json_generated=True,
        json_text="""\
{
  "train_micro_batch_size_per_gpu": 1,
  "train_batch_size": 2048,
  "gradient_clipping": 1.0,
  "zero_optimization": {
    "stage": 1
  },
  "fp16": {
    "enabled": true,
    "loss_scale": 0,
    "loss_scale_window": 500,
    "hysteresis": 2,
    "min_loss_scale": 1,
    "initial_scale_power": 12
  },
  "steps_per_print": 2000,
  "wall_clock_breakdown": false
}
""",
        outcome="trains",
    ),
)
