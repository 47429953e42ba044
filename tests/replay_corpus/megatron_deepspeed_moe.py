"""The replay corpus: microsoft/Megatron-DeepSpeed's examples_deepspeed/MoE/ pretraining scripts that
megatron_deepspeed.py does not already hold (it has ds_pretrain_gpt_350M_dense.sh and
ds_pretrain_gpt_125M_MoE64.sh): the MoE, PR-MoE (`--mlp-type residual`, pyramid `--num-experts` lists) and
Mixture-of-Students (`--mos`) scripts, and the dense baselines beside them (with and without curriculum
learning). Two are not here: ds_evalharness.sh evaluates a trained checkpoint, it does not pretrain; and
ds_pretrain_gpt_350M_PR-MoE32or64_MoS.sh's `sed` leaves the template's ZERO_STAGE and PRESCALE_GRAD unfilled (its
sed list lacks those two lines, which its 1.3B sibling has), so the JSON it writes is not JSON and DeepSpeed itself
cannot start it.

Taken as launch.py says (each script under bash at the commit named, stub `deepspeed`, `ds_ssh` and
`nvidia-smi`: one node of 8 where the script asks, `hostname`/`date`: HOSTNAME/DATE); the JSON is what the
script's `sed` over its template wrote. See launch.py for what an entry holds."""

from tests.replay_corpus.launch import Launch, Source

_REPO = "microsoft/Megatron-DeepSpeed"
_COMMIT = "f4157bea69f3df8c6cb66f2ebcda66ba03d1288e"

LAUNCHES = (    Launch(
        name="megatron-deepspeed-moe-gpt-125m-dense-cl",
        script=Source(_REPO, "examples_deepspeed/MoE/ds_pretrain_gpt_125M_dense_cl.sh", _COMMIT),
        program="pretrain_gpt.py", world_size=8,
        expanded="the script as written; NUM_GPUS=8, MP_SIZE=1, PP_SIZE=1, CL_ENABLED=true, ZERO_STAGE=0; the JSON is the sed-filled ds_config_gpt_TEMPLATE.json",
        argv=(
            "--override-opt_param-scheduler", "--adam-beta1", "0.9", "--adam-beta2", "0.95",
            "--tensor-model-parallel-size", "1", "--init-method-std", "0.02", "--lr-decay-tokens", "260000000000",
            "--lr-warmup-tokens", "375000000", "--micro-batch-size", "16", "--exit-duration-in-mins", "30000000",
            "--global-batch-size", "2048", "--num-layers", "12", "--hidden-size", "768", "--num-attention-heads",
            "12", "--seq-length", "2048", "--max-position-embeddings", "2048", "--train-tokens", "300000000000",
            "--train-samples", "439453125", "--lr", "2.4e-3", "--min-lr", "6.0e-5", "--lr-decay-style", "cosine",
            "--split", "98,2,0", "--log-interval", "10", "--eval-interval", "100", "--eval-iters", "10",
            "--save-interval", "1000", "--weight-decay", "0.1", "--clip-grad", "1.0", "--hysteresis", "2",
            "--num-workers", "0", "--fp16", "--load",
            "/blob/users/conglli/project/gpt3_with_pile/checkpoint/gpt3-with-pile-0.125B-lr-2.4e-3-minlr-6.0e-5-bs-2048-gpus-8-zero-0-mp-1-pp-1-no_pp-cl-startseqlen-72-step-27638-token-60B",
            "--save",
            "/blob/users/conglli/project/gpt3_with_pile/checkpoint/gpt3-with-pile-0.125B-lr-2.4e-3-minlr-6.0e-5-bs-2048-gpus-8-zero-0-mp-1-pp-1-no_pp-cl-startseqlen-72-step-27638-token-60B",
            "--tensorboard-queue-size", "1", "--log-timers-to-tensorboard", "--log-batch-size-to-tensorboard",
            "--log-validation-ppl-to-tensorboard", "--tensorboard-dir",
            "tensorboard/gpt3-with-pile-0.125B-lr-2.4e-3-minlr-6.0e-5-bs-2048-gpus-8-zero-0-mp-1-pp-1-no_pp-cl-startseqlen-72-step-27638-token-60B_HOSTNAME_DATE",
            "--checkpoint-activations", "--log-optimizer-states-to-tensorboard", "--vocab-file",
            "/data/the_pile_public_merged_nopreprocessing/gpt2-vocab.json", "--merge-file",
            "/data/the_pile_public_merged_nopreprocessing/gpt2-merges.txt", "--data-path",
            "/vc_data_blob/users/conglli/the_pile_public_merged_nopreprocessing/pile_text_document", "--data-impl",
            "mmap", "--deepspeed", "--deepspeed_config",
            "ds_config_gpt3-with-pile-0.125B-lr-2.4e-3-minlr-6.0e-5-bs-2048-gpus-8-zero-0-mp-1-pp-1-no_pp-cl-startseqlen-72-step-27638-token-60B.json",
            "--zero-stage", "0", "--pipeline-model-parallel-size", "1", "--no-pipeline-parallel",
            "--deepspeed-activation-checkpointing",
        ),
        json=Source(_REPO, "examples_deepspeed/MoE/ds_config_gpt_TEMPLATE.json", _COMMIT),
        json_generated=True,
        json_text="""\
{
  "train_batch_size" : 2048,
  "train_micro_batch_size_per_gpu": 16,
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
    "enabled": true,
    "curriculum_type": "seqlen",
    "min_difficulty": 72,
    "max_difficulty": 2048,
    "schedule_type": "fixed_linear",
    "schedule_config": {
      "total_curriculum_step": 27638,
      "difficulty_step": 8
    }
  },

  "wall_clock_breakdown" : false
}
""",
        outcome="refused: curriculum_learning",
    ),
    Launch(
        name="megatron-deepspeed-moe-gpt-350m-moe128",
        script=Source(_REPO, "examples_deepspeed/MoE/ds_pretrain_gpt_350M_MoE128.sh", _COMMIT),
        program="pretrain_gpt.py", world_size=64,
        expanded="the script as written; NUM_GPUS=64, MP_SIZE=1, PP_SIZE=1, EP_SIZE=128, EP_PARALLEL_SIZE=64, CL_ENABLED=false; the JSON is the sed-filled ds_config_gpt_TEMPLATE.json",
        argv=(
            "--override-opt_param-scheduler", "--adam-beta1", "0.9", "--adam-beta2", "0.95",
            "--tensor-model-parallel-size", "1", "--moe-expert-parallel-size", "64", "--num-experts", "128",
            "--moe-loss-coeff", "0.01", "--moe-train-capacity-factor", "1.0", "--moe-eval-capacity-factor", "1.0",
            "--moe-min-capacity", "4", "--init-method-std", "0.014", "--lr-decay-tokens", "300000000000",
            "--lr-warmup-tokens", "375000000", "--micro-batch-size", "4", "--exit-duration-in-mins", "30000000",
            "--global-batch-size", "256", "--num-layers", "24", "--hidden-size", "1024", "--num-attention-heads",
            "16", "--seq-length", "2048", "--max-position-embeddings", "2048", "--train-tokens", "300000000000",
            "--train-iters", "1716613", "--lr", "2.0e-4", "--min-lr", "2e-06", "--lr-decay-style", "cosine",
            "--split", "98,2,0", "--log-interval", "10", "--eval-interval", "100", "--eval-iters", "10",
            "--save-interval", "10000", "--weight-decay", "0.1", "--clip-grad", "1.0", "--hysteresis", "2",
            "--num-workers", "0", "--fp16", "--load",
            "examples_deepspeed/MoE/output/checkpoint/gpt-0.35B-lr-2.0e-4-minlr-2e-06-bs-256-gpus-64-mp-1-pp-1-ep-128-mlc-0.01-cap-1.0-drop-true",
            "--save",
            "examples_deepspeed/MoE/output/checkpoint/gpt-0.35B-lr-2.0e-4-minlr-2e-06-bs-256-gpus-64-mp-1-pp-1-ep-128-mlc-0.01-cap-1.0-drop-true",
            "--tensorboard-queue-size", "1", "--log-timers-to-tensorboard", "--log-batch-size-to-tensorboard",
            "--log-validation-ppl-to-tensorboard", "--tensorboard-dir",
            "examples_deepspeed/MoE/output/tensorboard/gpt-0.35B-lr-2.0e-4-minlr-2e-06-bs-256-gpus-64-mp-1-pp-1-ep-128-mlc-0.01-cap-1.0-drop-true_HOSTNAME_DATE",
            "--checkpoint-activations", "--create-moe-param-group", "--vocab-file",
            "/data/the_pile_public_merged_nopreprocessing/gpt2-vocab.json", "--merge-file",
            "/data/the_pile_public_merged_nopreprocessing/gpt2-merges.txt", "--data-path",
            "/data/the_pile_public_merged_nopreprocessing/pile_text_document", "--data-impl", "mmap", "--deepspeed",
            "--deepspeed_config",
            "ds_config_gpt_gpt-0.35B-lr-2.0e-4-minlr-2e-06-bs-256-gpus-64-mp-1-pp-1-ep-128-mlc-0.01-cap-1.0-drop-true.json",
            "--pipeline-model-parallel-size", "1", "--no-pipeline-parallel", "--deepspeed-activation-checkpointing",
        ),
        json=Source(_REPO, "examples_deepspeed/MoE/ds_config_gpt_TEMPLATE.json", _COMMIT),
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
        name="megatron-deepspeed-moe-gpt-350m-pr-moe32or64",
        script=Source(_REPO, "examples_deepspeed/MoE/ds_pretrain_gpt_350M_PR-MoE32or64.sh", _COMMIT),
        program="pretrain_gpt.py", world_size=64,
        expanded="the script as written; NUM_GPUS=64, MP_SIZE=1, PP_SIZE=1, EP_SIZE=32 32 32 32 32 32 32 32 32 32 64 64, EP_PARALLEL_SIZE=64, CL_ENABLED=false; the JSON is the sed-filled ds_config_gpt_TEMPLATE.json",
        argv=(
            "--override-opt_param-scheduler", "--adam-beta1", "0.9", "--adam-beta2", "0.95",
            "--tensor-model-parallel-size", "1", "--moe-expert-parallel-size", "64", "--num-experts", "32", "32",
            "32", "32", "32", "32", "32", "32", "32", "32", "64", "64", "--moe-loss-coeff", "0.01", "--mlp-type",
            "residual", "--moe-train-capacity-factor", "1.0", "--moe-eval-capacity-factor", "1.0",
            "--moe-min-capacity", "4", "--init-method-std", "0.014", "--lr-decay-tokens", "300000000000",
            "--lr-warmup-tokens", "375000000", "--micro-batch-size", "4", "--exit-duration-in-mins", "30000000",
            "--global-batch-size", "256", "--num-layers", "24", "--hidden-size", "1024", "--num-attention-heads",
            "16", "--seq-length", "2048", "--max-position-embeddings", "2048", "--train-tokens", "300000000000",
            "--train-iters", "1716613", "--lr", "3.0e-4", "--min-lr", "1.0e-06", "--lr-decay-style", "cosine",
            "--split", "98,2,0", "--log-interval", "10", "--eval-interval", "100", "--eval-iters", "10",
            "--save-interval", "10000", "--weight-decay", "0.1", "--clip-grad", "1.0", "--hysteresis", "2",
            "--num-workers", "0", "--fp16", "--load",
            "examples_deepspeed/MoE/output/checkpoint/gpt-0.35B-lr-3.0e-4-minlr-1.0e-06-bs-256-gpus-64-mp-1-pp-1-ep-pyramid-32+64-mlc-0.01-cap-1.0-drop-true",
            "--save",
            "examples_deepspeed/MoE/output/checkpoint/gpt-0.35B-lr-3.0e-4-minlr-1.0e-06-bs-256-gpus-64-mp-1-pp-1-ep-pyramid-32+64-mlc-0.01-cap-1.0-drop-true",
            "--tensorboard-queue-size", "1", "--log-timers-to-tensorboard", "--log-batch-size-to-tensorboard",
            "--log-validation-ppl-to-tensorboard", "--tensorboard-dir",
            "examples_deepspeed/MoE/output/tensorboard/gpt-0.35B-lr-3.0e-4-minlr-1.0e-06-bs-256-gpus-64-mp-1-pp-1-ep-pyramid-32+64-mlc-0.01-cap-1.0-drop-true_HOSTNAME_DATE",
            "--checkpoint-activations", "--create-moe-param-group", "--vocab-file",
            "/data/the_pile_public_merged_nopreprocessing/gpt2-vocab.json", "--merge-file",
            "/data/the_pile_public_merged_nopreprocessing/gpt2-merges.txt", "--data-path",
            "/data/the_pile_public_merged_nopreprocessing/pile_text_document", "--data-impl", "mmap", "--deepspeed",
            "--deepspeed_config",
            "ds_config_gpt_gpt-0.35B-lr-3.0e-4-minlr-1.0e-06-bs-256-gpus-64-mp-1-pp-1-ep-pyramid-32+64-mlc-0.01-cap-1.0-drop-true.json",
            "--pipeline-model-parallel-size", "1", "--no-pipeline-parallel", "--deepspeed-activation-checkpointing",
        ),
        json=Source(_REPO, "examples_deepspeed/MoE/ds_config_gpt_TEMPLATE.json", _COMMIT),
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
        name="megatron-deepspeed-moe-gpt-1-3b-dense",
        script=Source(_REPO, "examples_deepspeed/MoE/ds_pretrain_gpt_1.3B_dense.sh", _COMMIT),
        program="pretrain_gpt.py", world_size=64,
        expanded="the script as written; NUM_GPUS=64, MP_SIZE=4, PP_SIZE=1, EP_SIZE=1, EP_PARALLEL_SIZE=1, CL_ENABLED=false; the JSON is the sed-filled ds_config_gpt_TEMPLATE.json",
        argv=(
            "--override-opt_param-scheduler", "--adam-beta1", "0.9", "--adam-beta2", "0.95",
            "--tensor-model-parallel-size", "4", "--moe-expert-parallel-size", "1", "--num-experts", "1",
            "--moe-loss-coeff", "0.01", "--moe-train-capacity-factor", "1.0", "--moe-eval-capacity-factor", "1.0",
            "--moe-min-capacity", "4", "--init-method-std", "0.014", "--lr-decay-tokens", "260000000000",
            "--lr-warmup-tokens", "375000000", "--micro-batch-size", "2", "--exit-duration-in-mins", "30000000",
            "--rampup-batch-size", "32", "32", "1953125", "--global-batch-size", "512", "--num-layers", "24",
            "--hidden-size", "2048", "--num-attention-heads", "16", "--seq-length", "2048",
            "--max-position-embeddings", "2048", "--train-tokens", "300000000000", "--train-samples", "439453125",
            "--lr", "2.0e-4", "--min-lr", "2.0e-5", "--lr-decay-style", "cosine", "--split", "98,2,0",
            "--log-interval", "10", "--eval-interval", "100", "--eval-iters", "10", "--save-interval", "1000",
            "--weight-decay", "0.1", "--clip-grad", "1.0", "--hysteresis", "2", "--num-workers", "0", "--fp16",
            "--load",
            "examples_deepspeed/MoE/output/checkpoint/gpt-1.3B-lr-2.0e-4-minlr-2.0e-5-bs-512-gpus-64-mp-4-pp-1",
            "--save",
            "examples_deepspeed/MoE/output/checkpoint/gpt-1.3B-lr-2.0e-4-minlr-2.0e-5-bs-512-gpus-64-mp-4-pp-1",
            "--tensorboard-queue-size", "1", "--log-timers-to-tensorboard", "--log-batch-size-to-tensorboard",
            "--log-validation-ppl-to-tensorboard", "--tensorboard-dir",
            "examples_deepspeed/MoE/output/tensorboard/gpt-1.3B-lr-2.0e-4-minlr-2.0e-5-bs-512-gpus-64-mp-4-pp-1_HOSTNAME_DATE",
            "--checkpoint-activations", "--vocab-file",
            "/data/the_pile_public_merged_nopreprocessing/gpt2-vocab.json", "--merge-file",
            "/data/the_pile_public_merged_nopreprocessing/gpt2-merges.txt", "--data-path",
            "/data/the_pile_public_merged_nopreprocessing/pile_text_document", "--data-impl", "mmap", "--deepspeed",
            "--deepspeed_config", "ds_config_gpt_gpt-1.3B-lr-2.0e-4-minlr-2.0e-5-bs-512-gpus-64-mp-4-pp-1.json",
            "--pipeline-model-parallel-size", "1", "--deepspeed-activation-checkpointing",
        ),
        json=Source(_REPO, "examples_deepspeed/MoE/ds_config_gpt_TEMPLATE.json", _COMMIT),
        json_generated=True,
        json_text="""\
{
  "train_batch_size" : 512,
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
      "total_curriculum_step": 110138,
      "difficulty_step": 8
    }
  },

  "wall_clock_breakdown" : false
}
""",
        outcome="trains",
    ),
    Launch(
        name="megatron-deepspeed-moe-gpt-1-3b-dense-cl",
        script=Source(_REPO, "examples_deepspeed/MoE/ds_pretrain_gpt_1.3B_dense_cl.sh", _COMMIT),
        program="pretrain_gpt.py", world_size=128,
        expanded="the script as written; NUM_GPUS=128, MP_SIZE=2, PP_SIZE=1, CL_ENABLED=true, ZERO_STAGE=0; the JSON is the sed-filled ds_config_gpt_TEMPLATE.json",
        argv=(
            "--override-opt_param-scheduler", "--adam-beta1", "0.9", "--adam-beta2", "0.95",
            "--tensor-model-parallel-size", "2", "--init-method-std", "0.013", "--lr-decay-tokens", "260000000000",
            "--lr-warmup-tokens", "375000000", "--micro-batch-size", "16", "--exit-duration-in-mins", "30000000",
            "--global-batch-size", "4096", "--num-layers", "24", "--hidden-size", "2048", "--num-attention-heads",
            "16", "--seq-length", "2048", "--max-position-embeddings", "2048", "--train-tokens", "300000000000",
            "--train-samples", "439453125", "--lr", "8.0e-4", "--min-lr", "2.0e-5", "--lr-decay-style", "cosine",
            "--split", "98,2,0", "--log-interval", "10", "--eval-interval", "100", "--eval-iters", "10",
            "--save-interval", "1000", "--weight-decay", "0.1", "--clip-grad", "1.0", "--hysteresis", "2",
            "--num-workers", "0", "--fp16", "--load",
            "/blob/users/conglli/project/gpt3_with_pile/checkpoint/gpt3-with-pile-1.3B-lr-8.0e-4-minlr-2.0e-5-bs-4096-gpus-128-zero-0-mp-2-pp-1-no_pp-cl-startseqlen-80-step-13767-token-60B",
            "--save",
            "/blob/users/conglli/project/gpt3_with_pile/checkpoint/gpt3-with-pile-1.3B-lr-8.0e-4-minlr-2.0e-5-bs-4096-gpus-128-zero-0-mp-2-pp-1-no_pp-cl-startseqlen-80-step-13767-token-60B",
            "--tensorboard-queue-size", "1", "--log-timers-to-tensorboard", "--log-batch-size-to-tensorboard",
            "--log-validation-ppl-to-tensorboard", "--tensorboard-dir",
            "tensorboard/gpt3-with-pile-1.3B-lr-8.0e-4-minlr-2.0e-5-bs-4096-gpus-128-zero-0-mp-2-pp-1-no_pp-cl-startseqlen-80-step-13767-token-60B_HOSTNAME_DATE",
            "--checkpoint-activations", "--log-optimizer-states-to-tensorboard", "--vocab-file",
            "/data/the_pile_public_merged_nopreprocessing/gpt2-vocab.json", "--merge-file",
            "/data/the_pile_public_merged_nopreprocessing/gpt2-merges.txt", "--data-path",
            "/data/the_pile_public_merged_nopreprocessing/pile_text_document", "--data-impl", "mmap", "--deepspeed",
            "--deepspeed_config",
            "ds_config_gpt3-with-pile-1.3B-lr-8.0e-4-minlr-2.0e-5-bs-4096-gpus-128-zero-0-mp-2-pp-1-no_pp-cl-startseqlen-80-step-13767-token-60B.json",
            "--zero-stage", "0", "--pipeline-model-parallel-size", "1", "--no-pipeline-parallel",
            "--deepspeed-activation-checkpointing",
        ),
        json=Source(_REPO, "examples_deepspeed/MoE/ds_config_gpt_TEMPLATE.json", _COMMIT),
        json_generated=True,
        json_text="""\
{
  "train_batch_size" : 4096,
  "train_micro_batch_size_per_gpu": 16,
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
    "enabled": true,
    "curriculum_type": "seqlen",
    "min_difficulty": 80,
    "max_difficulty": 2048,
    "schedule_type": "fixed_linear",
    "schedule_config": {
      "total_curriculum_step": 13767,
      "difficulty_step": 8
    }
  },

  "wall_clock_breakdown" : false
}
""",
        outcome="refused: curriculum_learning",
    ),
    Launch(
        name="megatron-deepspeed-moe-gpt-1-3b-moe128",
        script=Source(_REPO, "examples_deepspeed/MoE/ds_pretrain_gpt_1.3B_MoE128.sh", _COMMIT),
        program="pretrain_gpt.py", world_size=64,
        expanded="the script as written; NUM_GPUS=64, MP_SIZE=1, PP_SIZE=1, EP_SIZE=128, EP_PARALLEL_SIZE=64, CL_ENABLED=false; the JSON is the sed-filled ds_config_gpt_TEMPLATE.json",
        argv=(
            "--override-opt_param-scheduler", "--adam-beta1", "0.9", "--adam-beta2", "0.95",
            "--tensor-model-parallel-size", "1", "--moe-expert-parallel-size", "64", "--num-experts", "128",
            "--moe-loss-coeff", "0.01", "--moe-train-capacity-factor", "1.0", "--moe-eval-capacity-factor", "1.0",
            "--moe-min-capacity", "4", "--init-method-std", "0.014", "--lr-decay-tokens", "300000000000",
            "--lr-warmup-tokens", "375000000", "--micro-batch-size", "8", "--exit-duration-in-mins", "30000000",
            "--global-batch-size", "512", "--num-layers", "24", "--hidden-size", "2048", "--num-attention-heads",
            "16", "--seq-length", "2048", "--max-position-embeddings", "2048", "--train-tokens", "300000000000",
            "--train-iters", "858306", "--lr", "1.2e-4", "--min-lr", "1.0e-6", "--lr-decay-style", "cosine",
            "--split", "98,2,0", "--log-interval", "10", "--eval-interval", "100", "--eval-iters", "10",
            "--save-interval", "10000", "--weight-decay", "0.1", "--clip-grad", "1.0", "--hysteresis", "2",
            "--num-workers", "0", "--fp16", "--load",
            "examples_deepspeed/MoE/output/checkpoint/gpt-1.3B-lr-1.2e-4-minlr-1.0e-6-bs-512-gpus-64-mp-1-pp-1-ep-128-mlc-0.01-cap-1.0-drop-true",
            "--save",
            "examples_deepspeed/MoE/output/checkpoint/gpt-1.3B-lr-1.2e-4-minlr-1.0e-6-bs-512-gpus-64-mp-1-pp-1-ep-128-mlc-0.01-cap-1.0-drop-true",
            "--tensorboard-queue-size", "1", "--log-timers-to-tensorboard", "--log-batch-size-to-tensorboard",
            "--log-validation-ppl-to-tensorboard", "--tensorboard-dir",
            "examples_deepspeed/MoE/output/tensorboard/gpt-1.3B-lr-1.2e-4-minlr-1.0e-6-bs-512-gpus-64-mp-1-pp-1-ep-128-mlc-0.01-cap-1.0-drop-true_HOSTNAME_DATE",
            "--checkpoint-activations", "--create-moe-param-group", "--vocab-file",
            "/data/the_pile_public_merged_nopreprocessing/gpt2-vocab.json", "--merge-file",
            "/data/the_pile_public_merged_nopreprocessing/gpt2-merges.txt", "--data-path",
            "/data/the_pile_public_merged_nopreprocessing/pile_text_document", "--data-impl", "mmap", "--deepspeed",
            "--deepspeed_config",
            "ds_config_gpt_gpt-1.3B-lr-1.2e-4-minlr-1.0e-6-bs-512-gpus-64-mp-1-pp-1-ep-128-mlc-0.01-cap-1.0-drop-true.json",
            "--pipeline-model-parallel-size", "1", "--no-pipeline-parallel", "--deepspeed-activation-checkpointing",
        ),
        json=Source(_REPO, "examples_deepspeed/MoE/ds_config_gpt_TEMPLATE.json", _COMMIT),
        json_generated=True,
        json_text="""\
{
  "train_batch_size" : 512,
  "train_micro_batch_size_per_gpu": 8,
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
      "total_curriculum_step": 110138,
      "difficulty_step": 8
    }
  },

  "wall_clock_breakdown" : false
}
""",
        outcome="trains",
    ),
    Launch(
        name="megatron-deepspeed-moe-gpt-1-3b-pr-moe64or128",
        script=Source(_REPO, "examples_deepspeed/MoE/ds_pretrain_gpt_1.3B_PR-MoE64or128.sh", _COMMIT),
        program="pretrain_gpt.py", world_size=64,
        expanded="the script as written; NUM_GPUS=64, MP_SIZE=1, PP_SIZE=1, EP_SIZE=64 64 64 64 64 64 64 64 64 64 128 128, EP_PARALLEL_SIZE=64, CL_ENABLED=false; the JSON is the sed-filled ds_config_gpt_Zero2_TEMPLATE.json",
        argv=(
            "--override-opt_param-scheduler", "--adam-beta1", "0.9", "--adam-beta2", "0.95",
            "--tensor-model-parallel-size", "1", "--moe-expert-parallel-size", "64", "--num-experts", "64", "64",
            "64", "64", "64", "64", "64", "64", "64", "64", "128", "128", "--moe-loss-coeff", "0.01", "--mlp-type",
            "residual", "--moe-train-capacity-factor", "1.0", "--moe-eval-capacity-factor", "1.0",
            "--moe-min-capacity", "4", "--init-method-std", "0.014", "--lr-decay-tokens", "300000000000",
            "--lr-warmup-tokens", "375000000", "--micro-batch-size", "8", "--exit-duration-in-mins", "30000000",
            "--global-batch-size", "512", "--num-layers", "24", "--hidden-size", "2048", "--num-attention-heads",
            "16", "--seq-length", "2048", "--max-position-embeddings", "2048", "--train-tokens", "300000000000",
            "--train-iters", "858306", "--lr", "1.2e-4", "--min-lr", "1.0e-6", "--lr-decay-style", "cosine",
            "--split", "98,2,0", "--log-interval", "10", "--eval-interval", "100", "--eval-iters", "10",
            "--save-interval", "10000", "--weight-decay", "0.1", "--clip-grad", "1.0", "--hysteresis", "2",
            "--num-workers", "0", "--fp16", "--load",
            "examples_deepspeed/MoE/output/checkpoint/gpt-1.3B-lr-1.2e-4-minlr-1.0e-6-bs-512-gpus-64-mp-1-pp-1-ep-pyramid-64+128-mlc-0.01-cap-1.0-drop-true",
            "--save",
            "examples_deepspeed/MoE/output/checkpoint/gpt-1.3B-lr-1.2e-4-minlr-1.0e-6-bs-512-gpus-64-mp-1-pp-1-ep-pyramid-64+128-mlc-0.01-cap-1.0-drop-true",
            "--tensorboard-queue-size", "1", "--log-timers-to-tensorboard", "--log-batch-size-to-tensorboard",
            "--log-validation-ppl-to-tensorboard", "--tensorboard-dir",
            "examples_deepspeed/MoE/output/tensorboard/gpt-1.3B-lr-1.2e-4-minlr-1.0e-6-bs-512-gpus-64-mp-1-pp-1-ep-pyramid-64+128-mlc-0.01-cap-1.0-drop-true_HOSTNAME_DATE",
            "--checkpoint-activations", "--create-moe-param-group", "--vocab-file",
            "/data/the_pile_public_merged_nopreprocessing/gpt2-vocab.json", "--merge-file",
            "/data/the_pile_public_merged_nopreprocessing/gpt2-merges.txt", "--data-path",
            "/data/the_pile_public_merged_nopreprocessing/pile_text_document", "--data-impl", "mmap", "--deepspeed",
            "--deepspeed_config",
            "ds_config_gpt_gpt-1.3B-lr-1.2e-4-minlr-1.0e-6-bs-512-gpus-64-mp-1-pp-1-ep-pyramid-64+128-mlc-0.01-cap-1.0-drop-true.json",
            "--pipeline-model-parallel-size", "1", "--no-pipeline-parallel", "--deepspeed-activation-checkpointing",
        ),
        json=Source(_REPO, "examples_deepspeed/MoE/ds_config_gpt_Zero2_TEMPLATE.json", _COMMIT),
        json_generated=True,
        json_text="""\
{
  "train_batch_size" : 512,
  "train_micro_batch_size_per_gpu": 8,
  "steps_per_print": 10,

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
      "total_curriculum_step": 110138,
      "difficulty_step": 8
    }
  },

  "wall_clock_breakdown" : false
}
""",
        outcome="trains",
    ),
    Launch(
        name="megatron-deepspeed-moe-gpt-1-3b-pr-moe64or128-mos",
        script=Source(_REPO, "examples_deepspeed/MoE/ds_pretrain_gpt_1.3B_PR-MoE64or128_MoS.sh", _COMMIT),
        program="pretrain_gpt.py", world_size=128,
        expanded="the script as written; NUM_GPUS=128, MP_SIZE=1, PP_SIZE=1, EP_SIZE=64 64 64 64 64 64 64 64 128 128, EP_PARALLEL_SIZE=128, CL_ENABLED=false; the JSON is the sed-filled ds_config_gpt_Zero2_TEMPLATE.json",
        argv=(
            "--override-opt_param-scheduler", "--adam-beta1", "0.9", "--adam-beta2", "0.95",
            "--tensor-model-parallel-size", "1", "--moe-expert-parallel-size", "128", "--num-experts", "64", "64",
            "64", "64", "64", "64", "64", "64", "128", "128", "--moe-loss-coeff", "0.01", "--mlp-type", "residual",
            "--moe-train-capacity-factor", "1.0", "--moe-eval-capacity-factor", "1.0", "--moe-min-capacity", "4",
            "--init-method-std", "0.014", "--lr-decay-tokens", "300000000000", "--lr-warmup-tokens", "375000000",
            "--micro-batch-size", "4", "--exit-duration-in-mins", "30000000", "--global-batch-size", "512",
            "--num-layers", "21", "--hidden-size", "2048", "--num-attention-heads", "16", "--seq-length", "2048",
            "--max-position-embeddings", "2048", "--train-tokens", "300000000000", "--train-iters", "858306", "--lr",
            "1.2e-4", "--min-lr", "1.0e-6", "--lr-decay-style", "cosine", "--split", "98,2,0", "--log-interval", "10",
            "--eval-interval", "100", "--eval-iters", "10", "--save-interval", "10000", "--weight-decay", "0.1",
            "--clip-grad", "1.0", "--hysteresis", "2", "--num-workers", "0", "--fp16", "--load",
            "examples_deepspeed/MoE/output/checkpoint/gpt-1.3B-lr-1.2e-4-minlr-1.0e-6-bs-512-gpus-128-mp-1-pp-1-ep-pyramid-64+128-mos-mlc-0.01-cap-1.0-drop-true",
            "--save",
            "examples_deepspeed/MoE/output/checkpoint/gpt-1.3B-lr-1.2e-4-minlr-1.0e-6-bs-512-gpus-128-mp-1-pp-1-ep-pyramid-64+128-mos-mlc-0.01-cap-1.0-drop-true",
            "--mos", "--kd-beta-ce", "1", "--num-layers-teacher", "24", "--num-experts-teacher", "64", "64", "64",
            "64", "64", "64", "64", "64", "64", "64", "128", "128", "--hidden-size-teacher", "2048",
            "--num-attention-heads-teacher", "16", "--load-teacher",
            "examples_deepspeed/MoE/output/checkpoint/gpt-1.3B-lr-1.2e-4-minlr-1.0e-6-bs-512-gpus-128-mp-1-pp-1-ep-pyramid-64+128-mlc-0.01-cap-1.0-drop-true/",
            "--tensorboard-queue-size", "1", "--log-timers-to-tensorboard", "--log-batch-size-to-tensorboard",
            "--log-validation-ppl-to-tensorboard", "--tensorboard-dir",
            "examples_deepspeed/MoE/output/tensorboard/gpt-1.3B-lr-1.2e-4-minlr-1.0e-6-bs-512-gpus-128-mp-1-pp-1-ep-pyramid-64+128-mos-mlc-0.01-cap-1.0-drop-true_HOSTNAME",
            "--checkpoint-activations", "--create-moe-param-group", "--vocab-file",
            "/vc_data/Megatron-LM/data/gpt2-vocab.json", "--merge-file", "/vc_data/Megatron-LM/data/gpt2-merges.txt",
            "--data-path", "0.14336", "/vc_data/pile-cc1-cc2-shuf/Books3_ftfy_cleaned_id_shuf_text_document",
            "0.08962", "/vc_data/pile-cc1-cc2-shuf/rn_dedup_shuf_cleaned_0.7_cleaned_shuf_text_document", "0.19336",
            "/vc_data/pile-cc1-cc2-shuf/OpenWebText2_ftfy_cleaned_id_shuf_text_document", "0.05689",
            "/vc_data/pile-cc1-cc2-shuf/StackExchange_ftfy_id_shuf_text_document", "0.00859",
            "/vc_data/pile-cc1-cc2-shuf/stories_dedup0.7_shuf_cleaned_shuf_text_document", "0.02897",
            "/vc_data/pile-cc1-cc2-shuf/PubMed_Abstracts_ftfy_id_shuf_text_document", "0.04771",
            "/vc_data/pile-cc1-cc2-shuf/Wikipedia_en_ftfy_id_shuf_text_document", "0.00873",
            "/vc_data/pile-cc1-cc2-shuf/Gutenberg_PG-19_ftfy_cleaned_id_cleaned_shuf_text_document", "0.01007",
            "/vc_data/pile-cc1-cc2-shuf/BookCorpus2_ftfy_cleaned_id_shuf_text_document", "0.00208",
            "/vc_data/pile-cc1-cc2-shuf/NIH_ExPorter_ftfy_id_shuf_text_document", "0.13017",
            "/vc_data/pile-cc1-cc2-shuf/CC-2020-50_id_cleaned_shuf_text_document", "0.09446",
            "/vc_data/pile-cc1-cc2-shuf/Pile-CC_id_cleaned_shuf_text_document", "0.15652",
            "/vc_data/pile-cc1-cc2-shuf/CC-2021-04_id_cleaned_shuf_text_document", "0.01359",
            "/vc_data/pile-cc1-cc2-shuf/ArXiv_ftfy_cleaned_id_shuf_text_document", "0.01588",
            "/vc_data/pile-cc1-cc2-shuf/Github_ftfy_id_shuf_text_document", "--data-impl", "mmap", "--deepspeed",
            "--deepspeed_config",
            "ds_config_gpt_gpt-1.3B-lr-1.2e-4-minlr-1.0e-6-bs-512-gpus-128-mp-1-pp-1-ep-pyramid-64+128-mos-mlc-0.01-cap-1.0-drop-true.json",
            "--pipeline-model-parallel-size", "1", "--no-pipeline-parallel", "--deepspeed-activation-checkpointing",
        ),
        json=Source(_REPO, "examples_deepspeed/MoE/ds_config_gpt_Zero2_TEMPLATE.json", _COMMIT),
        json_generated=True,
        json_text="""\
{
  "train_batch_size" : 512,
  "train_micro_batch_size_per_gpu": 4,
  "steps_per_print": 10,

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
      "total_curriculum_step": 110138,
      "difficulty_step": 8
    }
  },

  "wall_clock_breakdown" : false
}
""",
        outcome="refused: --mos: knowledge distillation is not implemented",
    ),
    Launch(
        name="megatron-deepspeed-moe-gpt-6-7b-dense",
        script=Source(_REPO, "examples_deepspeed/MoE/ds_pretrain_gpt_6.7B_dense.sh", _COMMIT),
        program="pretrain_gpt.py", world_size=64,
        expanded="the script as written; NUM_GPUS=64, MP_SIZE=8, PP_SIZE=1, EP_SIZE=1, EP_PARALLEL_SIZE=1, CL_ENABLED=false; the JSON is the sed-filled ds_config_gpt_TEMPLATE.json",
        argv=(
            "--override-opt_param-scheduler", "--adam-beta1", "0.9", "--adam-beta2", "0.95",
            "--tensor-model-parallel-size", "8", "--moe-expert-parallel-size", "1", "--num-experts", "1",
            "--moe-loss-coeff", "0.01", "--moe-train-capacity-factor", "1.0", "--moe-eval-capacity-factor", "1.0",
            "--moe-min-capacity", "4", "--init-method-std", "0.01", "--lr-decay-tokens", "260000000000",
            "--lr-warmup-tokens", "375000000", "--micro-batch-size", "4", "--exit-duration-in-mins", "30000000",
            "--rampup-batch-size", "32", "32", "4882812", "--global-batch-size", "1024", "--num-layers", "32",
            "--hidden-size", "4096", "--num-attention-heads", "32", "--seq-length", "2048",
            "--max-position-embeddings", "2048", "--train-tokens", "300000000000", "--train-samples", "439453125",
            "--lr", "1.2e-4", "--min-lr", "1.2e-5", "--lr-decay-style", "cosine", "--split", "98,2,0",
            "--log-interval", "10", "--eval-interval", "100", "--eval-iters", "10", "--save-interval", "1000",
            "--weight-decay", "0.1", "--clip-grad", "1.0", "--hysteresis", "2", "--num-workers", "0", "--fp16",
            "--load",
            "examples_deepspeed/MoE/output/checkpoint/gpt-6.7B-lr-1.2e-4-minlr-1.2e-5-bs-1024-gpus-64-mp-8-pp-1",
            "--save",
            "examples_deepspeed/MoE/output/checkpoint/gpt-6.7B-lr-1.2e-4-minlr-1.2e-5-bs-1024-gpus-64-mp-8-pp-1",
            "--tensorboard-queue-size", "1", "--log-timers-to-tensorboard", "--log-batch-size-to-tensorboard",
            "--log-validation-ppl-to-tensorboard", "--tensorboard-dir",
            "examples_deepspeed/MoE/output/tensorboard/gpt-6.7B-lr-1.2e-4-minlr-1.2e-5-bs-1024-gpus-64-mp-8-pp-1_HOSTNAME_DATE",
            "--checkpoint-activations", "--vocab-file",
            "/data/the_pile_public_merged_nopreprocessing/gpt2-vocab.json", "--merge-file",
            "/data/the_pile_public_merged_nopreprocessing/gpt2-merges.txt", "--data-path",
            "/data/the_pile_public_merged_nopreprocessing/pile_text_document", "--data-impl", "mmap", "--deepspeed",
            "--deepspeed_config", "ds_config_gpt_gpt-6.7B-lr-1.2e-4-minlr-1.2e-5-bs-1024-gpus-64-mp-8-pp-1.json",
            "--pipeline-model-parallel-size", "1", "--deepspeed-activation-checkpointing",
        ),
        json=Source(_REPO, "examples_deepspeed/MoE/ds_config_gpt_TEMPLATE.json", _COMMIT),
        json_generated=True,
        json_text="""\
{
  "train_batch_size" : 1024,
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
      "total_curriculum_step": 55069,
      "difficulty_step": 8
    }
  },

  "wall_clock_breakdown" : false
}
""",
        outcome="trains",
    ),
)
