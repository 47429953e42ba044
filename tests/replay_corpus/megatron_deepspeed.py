"""The replay corpus: microsoft/Megatron-DeepSpeed's examples_deepspeed/. See launch.py for what an entry
holds."""

from tests.replay_corpus.launch import SIMPLE_LAUNCH, Launch, Source

LAUNCHES = (
    Launch(
        name="megatron-deepspeed-rebase-gpt-1.3b",
        script=Source("microsoft/Megatron-DeepSpeed", "examples_deepspeed/rebase/ds_pretrain_gpt_1.3B.sh",
                      "f4157bea69f3df8c6cb66f2ebcda66ba03d1288e"),
        program="pretrain_gpt.py", world_size=8,
        expanded=("the 'GPT-3 XL 1.3B' block; mp_size=2, pp_size=1, no_pp=true, zero_stage=0, batch_size=2, "
                  "log_interval=10; num_gpus=8 (one node of 8, from `ds_ssh nvidia-smi`); "
                  "activation_checkpoint=true, log_optimizer_state=true; the JSON is the sed-filled "
                  "ds_config_gpt_TEMPLATE.json (GBSIZE=512, MBSIZE=2, LOG_INTERVAL=10, ZERO_STAGE=0, "
                  "PRESCALE_GRAD=true)"),
        argv=(
            "--override-opt_param-scheduler", "--adam-beta1", "0.9", "--adam-beta2", "0.95",
            "--tensor-model-parallel-size", "2", "--init-method-std", "0.013", "--lr-decay-tokens", "300000000000",
            "--lr-warmup-tokens", "3000000000", "--micro-batch-size", "2", "--exit-duration-in-mins", "30000000",
            "--global-batch-size", "512", "--num-layers", "24", "--hidden-size", "2048",
            "--num-attention-heads", "16", "--seq-length", "2048", "--max-position-embeddings", "2048",
            "--train-tokens", "300000000000", "--train-samples", "292968750", "--lr", "2.0e-4", "--min-lr", "1.0e-6",
            "--lr-decay-style", "cosine", "--split", "949,50,1", "--log-interval", "10", "--eval-interval", "100",
            "--eval-iters", "10", "--save-interval", "100", "--weight-decay", "0.1", "--clip-grad", "1.0",
            "--hysteresis", "2", "--num-workers", "0", "--fp16", "--seed", "1234",
            "--load", "/blob/users/USER/project/data_efficient_gpt/checkpoint/gpt_1.3B_tok300B_lr2.0e-4_min1.0e-6_w3000M_d300B_cosine_gbs512_mbs2_g8_mp2_seed1234_rebase",
            "--save", "/blob/users/USER/project/data_efficient_gpt/checkpoint/gpt_1.3B_tok300B_lr2.0e-4_min1.0e-6_w3000M_d300B_cosine_gbs512_mbs2_g8_mp2_seed1234_rebase",
            "--no-async-tensor-model-parallel-allreduce", "--tensorboard-queue-size", "1",
            "--log-timers-to-tensorboard", "--log-batch-size-to-tensorboard", "--log-validation-ppl-to-tensorboard",
            "--tensorboard-dir", "/vc_data/users/USER/project/data_efficient_gpt/tensorboard/gpt_1.3B_tok300B_lr2.0e-4_min1.0e-6_w3000M_d300B_cosine_gbs512_mbs2_g8_mp2_seed1234_rebase_HOSTNAME_DATE",
            "--checkpoint-activations", "--log-optimizer-states-to-tensorboard", "--vocab-file", "gpt2-vocab.json",
            "--merge-file", "gpt2-merges.txt",
            "--data-path", "/vc_data_blob/users/conglli/the_pile_public_merged_nopreprocessing/pile_text_document",
            "--data-impl", "mmap", "--deepspeed", "--deepspeed_config", "ds_config_gbs512_mbs2_log10_zero0.json",
            "--zero-stage", "0", "--pipeline-model-parallel-size", "1", "--no-pipeline-parallel",
            "--deepspeed-activation-checkpointing",
        ),
        json=Source("microsoft/Megatron-DeepSpeed", "examples_deepspeed/rebase/ds_config_gpt_TEMPLATE.json",
                    "f4157bea69f3df8c6cb66f2ebcda66ba03d1288e"),
        json_generated=True,
        json_text="""\
{
  "train_batch_size": 512,
  "train_micro_batch_size_per_gpu": 2,
  "steps_per_print": 10,

  "zero_optimization": {
    "stage": 0
  },

  "gradient_clipping": 1.0,
  "prescale_gradients": true,

  "fp16": {
    "enabled": true,
    "loss_scale": 0,
    "loss_scale_window": 500,
    "hysteresis": 2,
    "min_loss_scale": 1,
    "initial_scale_power": 11
  },

  "wall_clock_breakdown" : false
}
""",
        outcome="trains",
    ),

    Launch(
        name="megatron-deepspeed-rebase-gpt-1.3b-rope",
        script=Source("microsoft/Megatron-DeepSpeed", "examples_deepspeed/rebase/ds_pretrain_gpt_1.3B_rope.sh",
                      "f4157bea69f3df8c6cb66f2ebcda66ba03d1288e"),
        program="pretrain_gpt.py", world_size=8,
        expanded=("as ds_pretrain_gpt_1.3B.sh with mp_size=4, pp_size=8, no_pp=false, zero_stage=1 and "
                  "--use-rotary-position-embeddings --rotary-percent 0.25; the JSON is the sed-filled "
                  "template"),
        argv=(
            "--override-opt_param-scheduler", "--adam-beta1", "0.9", "--adam-beta2", "0.95",
            "--tensor-model-parallel-size", "4", "--init-method-std", "0.013", "--lr-decay-tokens", "300000000000",
            "--lr-warmup-tokens", "3000000000", "--micro-batch-size", "2", "--exit-duration-in-mins", "30000000",
            "--global-batch-size", "512", "--num-layers", "24", "--hidden-size", "2048",
            "--num-attention-heads", "16", "--seq-length", "2048", "--max-position-embeddings", "2048",
            "--train-tokens", "300000000000", "--train-samples", "292968750", "--lr", "2.0e-4", "--min-lr", "1.0e-6",
            "--lr-decay-style", "cosine", "--split", "949,50,1", "--log-interval", "10", "--eval-interval", "100",
            "--eval-iters", "10", "--save-interval", "100", "--weight-decay", "0.1", "--clip-grad", "1.0",
            "--hysteresis", "2", "--num-workers", "0", "--fp16", "--seed", "1234",
            "--load", "/blob/users/USER/project/data_efficient_gpt/checkpoint/gpt_1.3B_tok300B_lr2.0e-4_min1.0e-6_w3000M_d300B_cosine_gbs512_mbs2_g8_z1_mp4_pp8_seed1234_rebase_rope0.25",
            "--save", "/blob/users/USER/project/data_efficient_gpt/checkpoint/gpt_1.3B_tok300B_lr2.0e-4_min1.0e-6_w3000M_d300B_cosine_gbs512_mbs2_g8_z1_mp4_pp8_seed1234_rebase_rope0.25",
            "--no-async-tensor-model-parallel-allreduce", "--use-rotary-position-embeddings",
            "--rotary-percent", "0.25", "--tensorboard-queue-size", "1", "--log-timers-to-tensorboard",
            "--log-batch-size-to-tensorboard", "--log-validation-ppl-to-tensorboard",
            "--tensorboard-dir", "/vc_data/users/USER/project/data_efficient_gpt/tensorboard/gpt_1.3B_tok300B_lr2.0e-4_min1.0e-6_w3000M_d300B_cosine_gbs512_mbs2_g8_z1_mp4_pp8_seed1234_rebase_rope0.25_HOSTNAME_DATE",
            "--checkpoint-activations", "--log-optimizer-states-to-tensorboard", "--vocab-file", "gpt2-vocab.json",
            "--merge-file", "gpt2-merges.txt",
            "--data-path", "/vc_data_blob/users/conglli/the_pile_public_merged_nopreprocessing/pile_text_document",
            "--data-impl", "mmap", "--deepspeed", "--deepspeed_config", "ds_config_gbs512_mbs2_log10_zero1.json",
            "--zero-stage", "1", "--pipeline-model-parallel-size", "8", "--deepspeed-activation-checkpointing",
        ),
        json=Source("microsoft/Megatron-DeepSpeed", "examples_deepspeed/rebase/ds_config_gpt_TEMPLATE.json",
                    "f4157bea69f3df8c6cb66f2ebcda66ba03d1288e"),
        json_generated=True,
        json_text="""\
{
  "train_batch_size": 512,
  "train_micro_batch_size_per_gpu": 2,
  "steps_per_print": 10,

  "zero_optimization": {
    "stage": 1
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

  "wall_clock_breakdown" : false
}
""",
        outcome="trains",
    ),

    Launch(
        name="megatron-deepspeed-moe-gpt-350m-dense",
        script=Source("microsoft/Megatron-DeepSpeed", "examples_deepspeed/MoE/ds_pretrain_gpt_350M_dense.sh",
                      "f4157bea69f3df8c6cb66f2ebcda66ba03d1288e"),
        program="pretrain_gpt.py", world_size=64,
        expanded=("the 'GPT-3 Medium 350M' block; EP_SIZE=1 (dense: --num-experts 1), MP_SIZE=1, PP_SIZE=1, "
                  "NUM_GPUS=64, BATCH_SIZE=4, LOG_INTERVAL=10, CL_ENABLED=false, USE_INTERNAL_DATA=false; "
                  "DIR=`pwd` is the script's folder; the JSON is the sed-filled ds_config_gpt_TEMPLATE.json"),
        argv=(
            "--override-opt_param-scheduler", "--adam-beta1", "0.9", "--adam-beta2", "0.95",
            "--tensor-model-parallel-size", "1", "--moe-expert-parallel-size", "1", "--num-experts", "1",
            "--moe-loss-coeff", "0.01", "--moe-train-capacity-factor", "1.0", "--moe-eval-capacity-factor", "1.0",
            "--moe-min-capacity", "4", "--init-method-std", "0.014", "--lr-decay-tokens", "260000000000",
            "--lr-warmup-tokens", "375000000", "--micro-batch-size", "4", "--exit-duration-in-mins", "30000000",
            "--global-batch-size", "256", "--num-layers", "24", "--hidden-size", "1024",
            "--num-attention-heads", "16", "--seq-length", "2048", "--max-position-embeddings", "2048",
            "--train-tokens", "300000000000", "--train-samples", "439453125", "--lr", "3.0e-4", "--min-lr", "3.0e-5",
            "--lr-decay-style", "cosine", "--split", "98,2,0", "--log-interval", "10", "--eval-interval", "100",
            "--eval-iters", "10", "--save-interval", "1000", "--weight-decay", "0.1", "--clip-grad", "1.0",
            "--hysteresis", "2", "--num-workers", "0", "--fp16",
            "--load", "examples_deepspeed/MoE/output/checkpoint/gpt-0.35B-lr-3.0e-4-minlr-3.0e-5-bs-256-gpus-64-mp-1-pp-1",
            "--save", "examples_deepspeed/MoE/output/checkpoint/gpt-0.35B-lr-3.0e-4-minlr-3.0e-5-bs-256-gpus-64-mp-1-pp-1",
            "--tensorboard-queue-size", "1", "--log-timers-to-tensorboard", "--log-batch-size-to-tensorboard",
            "--log-validation-ppl-to-tensorboard",
            "--tensorboard-dir", "examples_deepspeed/MoE/output/tensorboard/gpt-0.35B-lr-3.0e-4-minlr-3.0e-5-bs-256-gpus-64-mp-1-pp-1_HOSTNAME_DATE",
            "--checkpoint-activations",
            "--vocab-file", "/data/the_pile_public_merged_nopreprocessing/gpt2-vocab.json",
            "--merge-file", "/data/the_pile_public_merged_nopreprocessing/gpt2-merges.txt",
            "--data-path", "/data/the_pile_public_merged_nopreprocessing/pile_text_document", "--data-impl", "mmap",
            "--deepspeed",
            "--deepspeed_config", "ds_config_gpt_gpt-0.35B-lr-3.0e-4-minlr-3.0e-5-bs-256-gpus-64-mp-1-pp-1.json",
            "--pipeline-model-parallel-size", "1", "--deepspeed-activation-checkpointing",
        ),
        json=Source("microsoft/Megatron-DeepSpeed", "examples_deepspeed/MoE/ds_config_gpt_TEMPLATE.json",
                    "f4157bea69f3df8c6cb66f2ebcda66ba03d1288e"),
        json_generated=True,
        json_text="""\
{
  "train_batch_size" : 256,
  "train_micro_batch_size_per_gpu": 4,
  "steps_per_print": 10,

  "zero_optimization": {
    "stage": 0
  },

  "gradient_clipping": 1.0,
  "prescale_gradients": true,

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
      "total_curriculum_step": 220277,
      "difficulty_step": 8
    }
  },

  "wall_clock_breakdown" : false
}
""",
        outcome="trains",
    ),

    Launch(
        name="megatron-deepspeed-moe-gpt-125m-moe64",
        script=Source("microsoft/Megatron-DeepSpeed", "examples_deepspeed/MoE/ds_pretrain_gpt_125M_MoE64.sh",
                      "f4157bea69f3df8c6cb66f2ebcda66ba03d1288e"),
        program="pretrain_gpt.py", world_size=8,
        expanded=("the 'GPT-3 Small 125M' block; EP_SIZE=64, EP_PARALLEL_SIZE=8 (the script's NUM_GPUS from "
                  "`ds_ssh nvidia-smi`: one node of 8), MP_SIZE=1, PP_SIZE=1; the JSON is the sed-filled "
                  "template"),
        argv=(
            "--override-opt_param-scheduler", "--adam-beta1", "0.9", "--adam-beta2", "0.95",
            "--tensor-model-parallel-size", "1", "--moe-expert-parallel-size", "8", "--num-experts", "64",
            "--moe-loss-coeff", "0.01", "--moe-train-capacity-factor", "1.0", "--moe-eval-capacity-factor", "1.0",
            "--moe-min-capacity", "4", "--init-method-std", "0.014", "--lr-decay-tokens", "300000000000",
            "--lr-warmup-tokens", "375000000", "--micro-batch-size", "4", "--exit-duration-in-mins", "30000000",
            "--global-batch-size", "256", "--num-layers", "12", "--hidden-size", "768",
            "--num-attention-heads", "12", "--seq-length", "2048", "--max-position-embeddings", "2048",
            "--train-tokens", "300000000000", "--train-iters", "1716613", "--lr", "4.5e-4", "--min-lr", "4.5e-06",
            "--lr-decay-style", "cosine", "--split", "98,2,0", "--log-interval", "10", "--eval-interval", "100",
            "--eval-iters", "10", "--save-interval", "10000", "--weight-decay", "0.1", "--clip-grad", "1.0",
            "--hysteresis", "2", "--num-workers", "0", "--fp16",
            "--load", "examples_deepspeed/MoE/output/checkpoint/gpt-0.125B-lr-4.5e-4-minlr-4.5e-06-bs-256-gpus-8-mp-1-pp-1-ep-64-mlc-0.01-cap-1.0-drop-true",
            "--save", "examples_deepspeed/MoE/output/checkpoint/gpt-0.125B-lr-4.5e-4-minlr-4.5e-06-bs-256-gpus-8-mp-1-pp-1-ep-64-mlc-0.01-cap-1.0-drop-true",
            "--tensorboard-queue-size", "1", "--log-timers-to-tensorboard", "--log-batch-size-to-tensorboard",
            "--log-validation-ppl-to-tensorboard",
            "--tensorboard-dir", "examples_deepspeed/MoE/output/tensorboard/gpt-0.125B-lr-4.5e-4-minlr-4.5e-06-bs-256-gpus-8-mp-1-pp-1-ep-64-mlc-0.01-cap-1.0-drop-true_HOSTNAME_DATE",
            "--checkpoint-activations", "--create-moe-param-group",
            "--vocab-file", "/data/the_pile_public_merged_nopreprocessing/gpt2-vocab.json",
            "--merge-file", "/data/the_pile_public_merged_nopreprocessing/gpt2-merges.txt",
            "--data-path", "/vc_data_blob/users/conglli/the_pile_public_merged_nopreprocessing/pile_text_document",
            "--data-impl", "mmap", "--deepspeed",
            "--deepspeed_config", "ds_config_gpt_gpt-0.125B-lr-4.5e-4-minlr-4.5e-06-bs-256-gpus-8-mp-1-pp-1-ep-64-mlc-0.01-cap-1.0-drop-true.json",
            "--pipeline-model-parallel-size", "1", "--no-pipeline-parallel", "--deepspeed-activation-checkpointing",
        ),
        json=Source("microsoft/Megatron-DeepSpeed", "examples_deepspeed/MoE/ds_config_gpt_TEMPLATE.json",
                    "f4157bea69f3df8c6cb66f2ebcda66ba03d1288e"),
        json_generated=True,
        json_text="""\
{
  "train_batch_size" : 256,
  "train_micro_batch_size_per_gpu": 4,
  "steps_per_print": 10,

  "zero_optimization": {
    "stage": 0
  },

  "gradient_clipping": 1.0,
  "prescale_gradients": true,

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
      "total_curriculum_step": 220277,
      "difficulty_step": 8
    }
  },

  "wall_clock_breakdown" : false
}
""",
        outcome="trains",
    ),

    Launch(
        name="megatron-deepspeed-offload-pp-gpt-350m",
        script=Source("microsoft/Megatron-DeepSpeed", "examples_deepspeed/offload_pp/ds_pretrain_gpt_350M.sh",
                      "f4157bea69f3df8c6cb66f2ebcda66ba03d1288e"),
        program="pretrain_gpt.py", world_size=16,
        expanded=("NUM_GPUS=16, MP_SIZE=1, PP_SIZE=1, EP_SIZE=1, BATCH_SIZE=2, LOG_INTERVAL=1; the JSON is "
                  "its sed-filled ds_config_gpt_TEMPLATE.json (ZeRO stage 3 with offload_optimizer to the "
                  "CPU, bf16)"),
        argv=(
            "--override-opt_param-scheduler", "--adam-beta1", "0.9", "--adam-beta2", "0.95",
            "--tensor-model-parallel-size", "1", "--moe-expert-parallel-size", "1", "--num-experts", "1",
            "--moe-loss-coeff", "0.01", "--moe-train-capacity-factor", "1.0", "--moe-eval-capacity-factor", "1.0",
            "--moe-min-capacity", "4", "--init-method-std", "0.014", "--lr-decay-tokens", "260000000000",
            "--lr-warmup-tokens", "375000000", "--micro-batch-size", "2", "--exit-duration-in-mins", "30000000",
            "--rampup-batch-size", "32", "32", "1953125", "--global-batch-size", "256", "--num-layers", "24",
            "--hidden-size", "1024", "--num-attention-heads", "16", "--seq-length", "2048",
            "--max-position-embeddings", "2048", "--train-tokens", "300000000000", "--train-samples", "439453125",
            "--lr", "3.0e-4", "--min-lr", "3.0e-5", "--lr-decay-style", "cosine", "--split", "98,2,0",
            "--log-interval", "1", "--eval-interval", "100", "--eval-iters", "10", "--save-interval", "1000",
            "--weight-decay", "0.1", "--clip-grad", "1.0", "--hysteresis", "2", "--num-workers", "0", "--fp16",
            "--load", "examples_deepspeed/offload_pp/output/checkpoint/gpt-0.35B-lr-3.0e-4-minlr-3.0e-5-bs-256-gpus-16-mp-1-pp-1",
            "--save", "examples_deepspeed/offload_pp/output/checkpoint/gpt-0.35B-lr-3.0e-4-minlr-3.0e-5-bs-256-gpus-16-mp-1-pp-1",
            "--tensorboard-queue-size", "1", "--log-timers-to-tensorboard", "--timing-log-level", "1",
            "--no-pipeline-parallel", "--cpu-optimizer", "--log-batch-size-to-tensorboard",
            "--log-validation-ppl-to-tensorboard",
            "--tensorboard-dir", "examples_deepspeed/offload_pp/output/tensorboard/gpt-0.35B-lr-3.0e-4-minlr-3.0e-5-bs-256-gpus-16-mp-1-pp-1_HOSTNAME_DATE",
            "--checkpoint-activations",
            "--vocab-file", "/data/users/guanhua/Megatron-DeepSpeed/dataset/gpt2-vocab.json",
            "--merge-file", "/data/users/guanhua/Megatron-DeepSpeed/dataset/gpt2-merges.txt",
            "--data-path", "/data/users/guanhua/Megatron-DeepSpeed/dataset/BookCorpusDataset_text_document",
            "--data-impl", "mmap", "--deepspeed",
            "--deepspeed_config", "ds_config_gpt_gpt-0.35B-lr-3.0e-4-minlr-3.0e-5-bs-256-gpus-16-mp-1-pp-1.json",
            "--pipeline-model-parallel-size", "1", "--deepspeed-activation-checkpointing",
        ),
        json=Source("microsoft/Megatron-DeepSpeed", "examples_deepspeed/offload_pp/ds_config_gpt_TEMPLATE.json",
                    "f4157bea69f3df8c6cb66f2ebcda66ba03d1288e"),
        json_generated=True,
        json_text="""\
{
  "train_batch_size" : 256,
  "train_micro_batch_size_per_gpu": 2,
  "steps_per_print": 1,

  "zero_optimization": {
    "stage": 3,
    "offload_optimizer": {
      "device": "cpu",
      "pin_memory": true,
      "ratio": 0.3
    }
  },

  "gradient_clipping": 1.0,
  "prescale_gradients":false,

  "fp16": {
    "enabled": false,
    "loss_scale": 0,
    "loss_scale_window": 500,
    "hysteresis": 2,
    "min_loss_scale": 1,
    "initial_scale_power": 11
  },

  "bf16": {
    "enabled": true
  },

  "wall_clock_breakdown" : false
}
""",
        outcome="refused: partial offload (ratio < 1)",
    ),

    Launch(
        name="megatron-deepspeed-pretrain-llama2-distributed",
        script=Source("microsoft/Megatron-DeepSpeed", "examples_deepspeed/pretrain_llama2_distributed.sh",
                      "f4157bea69f3df8c6cb66f2ebcda66ba03d1288e"),
        program="pretrain_gpt.py", world_size=8,
        expanded=("TP=2, PP=2, ZERO_STAGE=0, GPUS_PER_NODE=8 x NNODES=1, activation_checkpoint=false, "
                  "LOG_TO_WANDB=0; the JSON is the script's heredoc into $DS_CONFIG"),
        argv=(
            "--tensor-model-parallel-size", "2", "--pipeline-model-parallel-size", "2", "--num-layers", "24",
            "--hidden-size", "2048", "--ffn-hidden-size", "5504", "--num-attention-heads", "16",
            "--micro-batch-size", "4", "--global-batch-size", "32", "--seq-length", "2048",
            "--max-position-embeddings", "2048", "--train-iters", "250000", "--save", "./tmp", "--load", "./tmp",
            "--data-path", "1", "./tmp/data/bookcorpus_train_1m_text_sentence", "--data-impl", "mmap",
            "--tokenizer-type", "GPTSentencePieceTokenizer", "--tokenizer-model", "./tmp/tokenizer.model",
            "--split", "949,50,1", "--distributed-backend", "nccl", "--lr", "3e-4", "--lr-decay-style", "cosine",
            "--min-lr", "3e-5", "--weight-decay", "0.1", "--clip-grad", "1", "--lr-warmup-iters", "2000",
            "--optimizer", "adam", "--adam-beta1", "0.9", "--adam-beta2", "0.95", "--log-interval", "1",
            "--save-interval", "10000", "--eval-interval", "1000", "--eval-iters", "10", "--bf16",
            "--no-query-key-layer-scaling", "--attention-dropout", "0", "--hidden-dropout", "0",
            "--use-rotary-position-embeddings", "--untie-embeddings-and-output-weights", "--swiglu",
            "--normalization", "rmsnorm", "--disable-bias-linear", "--num-key-value-heads", "4", "--zero-stage=0",
            "--deepspeed_config=./tmp/deepspeed.json", "--deepspeed",
        ),
        json=Source("microsoft/Megatron-DeepSpeed", "examples_deepspeed/pretrain_llama2_distributed.sh",
                    "f4157bea69f3df8c6cb66f2ebcda66ba03d1288e"),
        json_generated=True,
        json_text="""\
{
  "train_batch_size" : 32,
  "train_micro_batch_size_per_gpu": 4,
  "steps_per_print": 1,
  "zero_optimization": {
    "stage": 0
  },
  "bf16": {
    "enabled": true
  }
}
""",
        outcome="trains",
    ),

    Launch(
        name="megatron-deepspeed-universal-checkpointing-json",
        script=None, program="pretrain_gpt.py", world_size=1,
        expanded="a standalone JSON, launched with SIMPLE_LAUNCH",
        argv=SIMPLE_LAUNCH,
        json=Source("microsoft/Megatron-DeepSpeed", "examples_deepspeed/universal_checkpointing/ds_config.json",
                    "f4157bea69f3df8c6cb66f2ebcda66ba03d1288e"),
        json_text="""\
{
  "train_batch_size" : 16,
  "train_micro_batch_size_per_gpu": 16,
  "steps_per_print": 1,

  "zero_optimization": {
    "stage": 1
  },

  "bf16": {
    "enabled": true
  },

  "data_types": {
        "grad_accum_dtype": "fp32" 
  },

  "wall_clock_breakdown" : false
}
""",
        outcome="trains",
    ),

    Launch(
        name="megatron-deepspeed-deepspeed4science-gpt-1.3b-seq-parallel",
        script=Source("microsoft/Megatron-DeepSpeed",
                      "examples_deepspeed/deepspeed4science/megatron_long_seq_support/pretrain_gpt_1.3B_seq_parallel.sh",
                      "4822c87ee6adfa4e480614cbe3f1d8ae00bd3db7"),
        program="pretrain_gpt.py", world_size=8,
        expanded=("the 'GPT-3 XL 1.3B' block (seq_len 2048, global_batch_size=2); mp_size=8, "
                  "enable_sequence_parallel=1 (Megatron's --sequence-parallel, first), pp_size=1, no_pp=true, "
                  "zero_stage=0, batch_size=1, log_interval=10; num_gpus=8 (one node of 8, from `ds_ssh "
                  "nvidia-smi`, as for the rebase scripts); activation_checkpoint=true, log_optimizer_state=true; "
                  "dir=`pwd`: the script's folder; the JSON is the sed-filled ds_config_gpt_TEMPLATE.json of its "
                  "folder (GBSIZE=2, MBSIZE=1, LOG_INTERVAL=10, ZERO_STAGE=0, PRESCALE_GRAD=true)"),
        argv=(
            "--sequence-parallel", "--override-opt_param-scheduler", "--adam-beta1", "0.9", "--adam-beta2", "0.95",
            "--tensor-model-parallel-size", "8", "--pipeline-model-parallel-size", "1", "--init-method-std", "0.013",
            "--lr-decay-tokens", "300000000000", "--lr-warmup-tokens", "3000000000", "--micro-batch-size", "1",
            "--exit-duration-in-mins", "30000000", "--global-batch-size", "2", "--num-layers", "24", "--hidden-size",
            "2048", "--num-attention-heads", "16", "--seq-length", "2048", "--max-position-embeddings", "2048",
            "--train-tokens", "300000000000", "--train-samples", "292968750", "--lr", "2.0e-4", "--min-lr", "1.0e-6",
            "--lr-decay-style", "cosine", "--split", "949,50,1", "--log-interval", "10", "--eval-interval", "100",
            "--eval-iters", "10", "--save-interval", "100", "--weight-decay", "0.1", "--clip-grad", "1.0",
            "--hysteresis", "2", "--num-workers", "0", "--fp16", "--seed", "1234", "--load",
            "output/checkpoint/gpt_1.3B_tok300B_lr2.0e-4_min1.0e-6_w3000M_d300B_cosine_gbs2_mbs1_g8_mp8_seed1234_rebase",
            "--save",
            "output/checkpoint/gpt_1.3B_tok300B_lr2.0e-4_min1.0e-6_w3000M_d300B_cosine_gbs2_mbs1_g8_mp8_seed1234_rebase",
            "--no-async-tensor-model-parallel-allreduce", "--use-flash-attn-triton", "--tensorboard-queue-size", "1",
            "--log-timers-to-tensorboard", "--log-batch-size-to-tensorboard", "--log-validation-ppl-to-tensorboard",
            "--tensorboard-dir",
            "output/tensorboard/gpt_1.3B_tok300B_lr2.0e-4_min1.0e-6_w3000M_d300B_cosine_gbs2_mbs1_g8_mp8_seed1234_rebase_HOSTNAME_DATE",
            "--checkpoint-activations", "--log-optimizer-states-to-tensorboard", "--vocab-file", "gpt2-vocab.json",
            "--merge-file", "gpt2-merges.txt", "--data-path", "BookCorpusDataset_text_document", "--data-impl",
            "mmap", "--deepspeed", "--deepspeed_config", "ds_config_gbs2_mbs1_log10_zero0.json", "--zero-stage", "0",
            "--pipeline-model-parallel-size", "1", "--no-pipeline-parallel", "--deepspeed-activation-checkpointing",
        ),
        json=Source("microsoft/Megatron-DeepSpeed",
                    "examples_deepspeed/deepspeed4science/megatron_long_seq_support/ds_config_gpt_TEMPLATE.json",
                    "4822c87ee6adfa4e480614cbe3f1d8ae00bd3db7"),
        json_generated=True,
        json_text="""\
{
  "train_batch_size": 2,
  "train_micro_batch_size_per_gpu": 1,
  "steps_per_print": 10,

  "zero_optimization": {
    "stage": 0
  },

  "gradient_clipping": 1.0,
  "prescale_gradients": true,

  "fp16": {
    "enabled": true,
    "loss_scale": 0,
    "loss_scale_window": 500,
    "hysteresis": 2,
    "min_loss_scale": 1,
    "initial_scale_power": 11
  },

  "flops_profiler": {
    "enabled": true,
    "profile_step": 1,
    "module_depth": -1,
    "top_modules": 3,
    "detailed": true,
    "output_file": null
  },

  "wall_clock_breakdown" : false
}
""",
        outcome="trains",
    ),

    Launch(
        name="megatron-deepspeed-ulysses-gpt-1.3b-32k",
        script=Source("microsoft/Megatron-DeepSpeed",
                      "examples_deepspeed/sequence_parallel/ds_pretrain_gpt_1.3B_seq_parallel_32k.sh",
                      "f4157bea69f3df8c6cb66f2ebcda66ba03d1288e"),
        program="pretrain_gpt.py", world_size=8,
        expanded=("DeepSpeed-Ulysses (--ds-sequence-parallel-size): the 'GPT-3 XL 1.3B' block (seq_len=32768, "
                  "global_batch_size=2); mp_size=1, sp_size=4, pp_size=1, no_pp=true, zero_stage=1, batch_size=1, "
                  "log_interval=10; num_gpus=8 (one node of 8, from `ds_ssh nvidia-smi`, as for the rebase scripts): "
                  "data-parallel 2; train_samples=$(( 300 * 1000000000 * 2 / 32768 )) = 18310546; "
                  "activation_checkpoint=true, log_optimizer_state=true; prescale_grad=false (zero_stage > 0); "
                  "output_home=output; the JSON is the sed-filled ds_config_gpt_TEMPLATE.json of its folder "
                  "(GBSIZE=2, MBSIZE=1, LOG_INTERVAL=10, ZERO_STAGE=1, PRESCALE_GRAD=false)"),
        argv=(
            "--override-opt_param-scheduler", "--adam-beta1", "0.9", "--adam-beta2", "0.95",
            "--tensor-model-parallel-size", "1", "--ds-sequence-parallel-size", "4", "--init-method-std", "0.013",
            "--lr-decay-tokens", "300000000000", "--lr-warmup-tokens", "3000000000", "--micro-batch-size", "1",
            "--exit-duration-in-mins", "30000000", "--global-batch-size", "2", "--num-layers", "24",
            "--hidden-size", "2048", "--num-attention-heads", "16", "--seq-length", "32768",
            "--max-position-embeddings", "32768", "--train-tokens", "300000000000", "--train-samples", "18310546",
            "--lr", "2.0e-4", "--min-lr", "1.0e-6", "--lr-decay-style", "cosine", "--split", "949,50,1",
            "--log-interval", "10", "--eval-interval", "100", "--eval-iters", "10", "--save-interval", "100",
            "--weight-decay", "0.1", "--clip-grad", "1.0", "--hysteresis", "2", "--num-workers", "0", "--fp16",
            "--seed", "1234",
            "--load", "output/checkpoint/gpt_1.3B_tok300B_lr2.0e-4_min1.0e-6_w3000M_d300B_cosine_gbs2_mbs1_g8_z1_sp4_seed1234_rebase",
            "--save", "output/checkpoint/gpt_1.3B_tok300B_lr2.0e-4_min1.0e-6_w3000M_d300B_cosine_gbs2_mbs1_g8_z1_sp4_seed1234_rebase",
            "--no-async-tensor-model-parallel-allreduce", "--use-flash-attn-triton", "--tensorboard-queue-size", "1",
            "--log-timers-to-tensorboard", "--log-batch-size-to-tensorboard", "--log-validation-ppl-to-tensorboard",
            "--tensorboard-dir",
            "output/tensorboard/gpt_1.3B_tok300B_lr2.0e-4_min1.0e-6_w3000M_d300B_cosine_gbs2_mbs1_g8_z1_sp4_seed1234_rebase_HOSTNAME_DATE",
            "--checkpoint-activations", "--log-optimizer-states-to-tensorboard", "--vocab-file", "gpt2-vocab.json",
            "--merge-file", "gpt2-merges.txt", "--data-path", "BookCorpusDataset_text_document", "--data-impl",
            "mmap", "--deepspeed", "--deepspeed_config", "ds_config_gbs2_mbs1_log10_zero1.json", "--zero-stage",
            "1", "--pipeline-model-parallel-size", "1", "--no-pipeline-parallel",
            "--deepspeed-activation-checkpointing",
        ),
        json=Source("microsoft/Megatron-DeepSpeed", "examples_deepspeed/sequence_parallel/ds_config_gpt_TEMPLATE.json",
                    "f4157bea69f3df8c6cb66f2ebcda66ba03d1288e"),
        json_generated=True,
        json_text="""\
{
  "train_batch_size": 2,
  "train_micro_batch_size_per_gpu": 1,
  "steps_per_print": 10,

  "zero_optimization": {
    "stage": 1
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

  "wall_clock_breakdown" : false
}
""",
        outcome="trains",
    ),

    Launch(
        name="megatron-deepspeed-ulysses-gpt-30b-32k",
        script=Source("microsoft/Megatron-DeepSpeed",
                      "examples_deepspeed/sequence_parallel/ds_pretrain_gpt_30B_seq_parallel_32k.sh",
                      "f4157bea69f3df8c6cb66f2ebcda66ba03d1288e"),
        program="pretrain_gpt.py", world_size=8,
        expanded=("DeepSpeed-Ulysses (--ds-sequence-parallel-size): the 'GPT-3 30B' block (seq_len=32768, "
                  "global_batch_size=2); mp_size=1, sp_size=4, pp_size=1, no_pp=true, zero_stage=3, batch_size=1, "
                  "log_interval=10; num_gpus=8 (one node of 8, from `ds_ssh nvidia-smi`, as for the rebase scripts): "
                  "data-parallel 2; train_samples=$(( 300 * 1000000000 * 2 / 32768 )) = 18310546; "
                  "activation_checkpoint=true, log_optimizer_state=true; prescale_grad=false (zero_stage > 0); "
                  "output_home=output; the JSON is the sed-filled ds_config_gpt_TEMPLATE.json of its folder "
                  "(GBSIZE=2, MBSIZE=1, LOG_INTERVAL=10, ZERO_STAGE=3, PRESCALE_GRAD=false)"),
        argv=(
            "--override-opt_param-scheduler", "--adam-beta1", "0.9", "--adam-beta2", "0.95",
            "--tensor-model-parallel-size", "1", "--ds-sequence-parallel-size", "4", "--init-method-std", "0.008",
            "--lr-decay-tokens", "300000000000", "--lr-warmup-tokens", "3000000000", "--micro-batch-size", "1",
            "--exit-duration-in-mins", "30000000", "--global-batch-size", "2", "--num-layers", "64",
            "--hidden-size", "6144", "--num-attention-heads", "64", "--seq-length", "32768",
            "--max-position-embeddings", "32768", "--train-tokens", "300000000000", "--train-samples", "18310546",
            "--lr", "1.0e-4", "--min-lr", "1.0e-6", "--lr-decay-style", "cosine", "--split", "949,50,1",
            "--log-interval", "10", "--eval-interval", "100", "--eval-iters", "10", "--save-interval", "100",
            "--weight-decay", "0.1", "--clip-grad", "1.0", "--hysteresis", "2", "--num-workers", "0", "--fp16",
            "--seed", "1234",
            "--load", "output/checkpoint/gpt_30B_tok300B_lr1.0e-4_min1.0e-6_w3000M_d300B_cosine_gbs2_mbs1_g8_z3_sp4_seed1234_rebase",
            "--save", "output/checkpoint/gpt_30B_tok300B_lr1.0e-4_min1.0e-6_w3000M_d300B_cosine_gbs2_mbs1_g8_z3_sp4_seed1234_rebase",
            "--no-async-tensor-model-parallel-allreduce", "--use-flash-attn-triton", "--tensorboard-queue-size", "1",
            "--log-timers-to-tensorboard", "--log-batch-size-to-tensorboard", "--log-validation-ppl-to-tensorboard",
            "--tensorboard-dir",
            "output/tensorboard/gpt_30B_tok300B_lr1.0e-4_min1.0e-6_w3000M_d300B_cosine_gbs2_mbs1_g8_z3_sp4_seed1234_rebase_HOSTNAME_DATE",
            "--checkpoint-activations", "--log-optimizer-states-to-tensorboard", "--vocab-file", "gpt2-vocab.json",
            "--merge-file", "gpt2-merges.txt", "--data-path", "BookCorpusDataset_text_document", "--data-impl",
            "mmap", "--deepspeed", "--deepspeed_config", "ds_config_gbs2_mbs1_log10_zero3.json", "--zero-stage",
            "3", "--pipeline-model-parallel-size", "1", "--no-pipeline-parallel",
            "--deepspeed-activation-checkpointing",
        ),
        json=Source("microsoft/Megatron-DeepSpeed", "examples_deepspeed/sequence_parallel/ds_config_gpt_TEMPLATE.json",
                    "f4157bea69f3df8c6cb66f2ebcda66ba03d1288e"),
        json_generated=True,
        json_text="""\
{
  "train_batch_size": 2,
  "train_micro_batch_size_per_gpu": 1,
  "steps_per_print": 10,

  "zero_optimization": {
    "stage": 3
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

  "wall_clock_breakdown" : false
}
""",
        outcome="trains",
    ),

    Launch(
        name="megatron-deepspeed-ulysses-fpdt-gpt-6.7b",
        script=Source("microsoft/Megatron-DeepSpeed",
                      "examples_deepspeed/sequence_parallel/ds_pretrain_gpt_6.7B_fpdt_32k.sh",
                      "f4157bea69f3df8c6cb66f2ebcda66ba03d1288e"),
        program="pretrain_gpt.py", world_size=8,
        expanded=("DeepSpeed-Ulysses with FPDT (--ds-sequence-parallel-fpdt: Ulysses in chunks, offloaded): the "
                  "'GPT-3 6.7B' block (seq_len=262144 despite the name, global_batch_size=1024); mp_size=1, "
                  "sp_size=4, pp_size=1, no_pp=true, zero_stage=3, batch_size=2, log_interval=10; num_gpus=8 (one "
                  "node of 8, from `ds_ssh nvidia-smi`, as for the rebase scripts): data-parallel 2; "
                  "train_samples=$(( 300 * 1000000000 * 2 / 262144 )) = 2288818; activation_checkpoint=true "
                  "(with --checkpoint-in-cpu), log_optimizer_state=false; prescale_grad=false (zero_stage > 0); "
                  "output_home=output; the JSON is the sed-filled ds_config_gpt_TEMPLATE.json of its folder "
                  "(GBSIZE=1024, MBSIZE=2, LOG_INTERVAL=10, ZERO_STAGE=3, PRESCALE_GRAD=false)"),
        argv=(
            "--override-opt_param-scheduler", "--adam-beta1", "0.9", "--adam-beta2", "0.95",
            "--tensor-model-parallel-size", "1", "--ds-sequence-parallel-fpdt", "--ds-sequence-parallel-fpdt-chunk-size",
            "65536", "--ds-sequence-parallel-fpdt-offloading", "--ds-sequence-parallel-size", "4",
            "--init-method-std", "0.009", "--lr-decay-tokens", "300000000000", "--lr-warmup-tokens", "3000000000",
            "--micro-batch-size", "2", "--exit-duration-in-mins", "30000000", "--global-batch-size", "1024",
            "--num-layers", "32", "--hidden-size", "4096", "--num-attention-heads", "32", "--seq-length", "262144",
            "--max-position-embeddings", "262144", "--train-tokens", "300000000000", "--train-samples", "2288818",
            "--lr", "1.2e-4", "--min-lr", "1.0e-6", "--lr-decay-style", "cosine", "--split", "949,50,1",
            "--log-interval", "10", "--eval-interval", "100", "--eval-iters", "10", "--save-interval", "100",
            "--weight-decay", "0.1", "--attention-dropout", "0.0", "--hidden-dropout", "0.0", "--clip-grad", "1.0",
            "--hysteresis", "2", "--num-workers", "0", "--fp16", "--seed", "1234",
            "--load", "output/checkpoint/gpt_6.7B_tok300B_lr1.2e-4_min1.0e-6_w3000M_d300B_cosine_gbs1024_mbs2_g8_z3_sp4_seed1234_rebase",
            "--save", "output/checkpoint/gpt_6.7B_tok300B_lr1.2e-4_min1.0e-6_w3000M_d300B_cosine_gbs1024_mbs2_g8_z3_sp4_seed1234_rebase",
            "--no-async-tensor-model-parallel-allreduce", "--use-flash-attn-v2", "--tensorboard-queue-size", "1",
            "--use-rotary-position-embeddings", "--rotary-percent", "0.25", "--rotary-position-embeddings-theta",
            "100000000", "--log-timers-to-tensorboard", "--log-batch-size-to-tensorboard",
            "--log-validation-ppl-to-tensorboard", "--tensorboard-dir",
            "output/tensorboard/gpt_6.7B_tok300B_lr1.2e-4_min1.0e-6_w3000M_d300B_cosine_gbs1024_mbs2_g8_z3_sp4_seed1234_rebase_HOSTNAME_DATE",
            "--checkpoint-activations", "--vocab-file", "gpt2-vocab.json", "--merge-file", "gpt2-merges.txt",
            "--data-path", "BookCorpusDataset_text_document", "--data-impl", "mmap", "--deepspeed",
            "--deepspeed_config", "ds_config_gbs1024_mbs2_log10_zero3.json", "--zero-stage", "3",
            "--pipeline-model-parallel-size", "1", "--no-pipeline-parallel", "--deepspeed-activation-checkpointing",
            "--checkpoint-in-cpu",
        ),
        json=Source("microsoft/Megatron-DeepSpeed", "examples_deepspeed/sequence_parallel/ds_config_gpt_TEMPLATE.json",
                    "f4157bea69f3df8c6cb66f2ebcda66ba03d1288e"),
        json_generated=True,
        json_text="""\
{
  "train_batch_size": 1024,
  "train_micro_batch_size_per_gpu": 2,
  "steps_per_print": 10,

  "zero_optimization": {
    "stage": 3
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

  "wall_clock_breakdown" : false
}
""",
        outcome="trains",
    ),
)
