"""The replay corpus: microsoft/DeepSpeedExamples' Megatron forks: Megatron-LM/scripts (2020-21), Megatron-
LM-v1.1.5-ZeRO3 and Megatron-LM-v1.1.5-3D_parallelism. See launch.py for what an entry holds."""

from tests.replay_corpus.launch import SIMPLE_LAUNCH, Launch, Source

LAUNCHES = (
    Launch(
        name="deepspeedexamples-ds-pretrain-gpt2",
        script=Source("microsoft/DeepSpeedExamples", "Megatron-LM/scripts/ds_pretrain_gpt2.sh",
                      "69785c7cff23b0d2f7e4d96bc6a0a442f9b60a94"),
        program="pretrain_gpt2.py", world_size=1,
        expanded=("`deepspeed.pt --num_nodes 1 --num_gpus 1`; config_json=$script_dir/ds_config.json (the "
                  "script's folder); `$@` empty"),
        argv=(
            "--num-layers", "24", "--hidden-size", "1024", "--num-attention-heads", "16", "--batch-size", "8",
            "--seq-length", "1024", "--max-position-embeddings", "1024", "--train-iters", "320000",
            "--save", "checkpoints/gpt2_345m", "--load", "checkpoints/gpt2_345m", "--resume-dataloader",
            "--train-data", "webtext", "--lazy-loader", "--tokenizer-type", "GPT2BPETokenizer",
            "--cache-dir", "cache", "--split", "949,50,1", "--distributed-backend", "nccl", "--lr", "0.00015",
            "--lr-decay-style", "cosine", "--weight-decay", "1e-2", "--clip-grad", "1.0", "--warmup", ".01",
            "--checkpoint-activations", "--fp16", "--local_rank", "0", "--deepspeed",
            "--deepspeed_config", "Megatron-LM/scripts/ds_config.json",
        ),
        json=Source("microsoft/DeepSpeedExamples", "Megatron-LM/scripts/ds_config.json",
                    "69785c7cff23b0d2f7e4d96bc6a0a442f9b60a94"),
        json_text="""\
{
  "train_batch_size": 16,
  "gradient_accumulation_steps": 1,
  "steps_per_print": 1,
  "zero_optimization": true,
  "optimizer": {
    "type": "Adam",
    "params": {
      "lr": 0.00015,
      "max_grad_norm": 1.0
    }
  },

  "fp16": {
    "enabled": true,
    "loss_scale": 0,
    "loss_scale_window": 1000,
    "hysteresis": 2,
    "min_loss_scale": 1
  } 
}
""",
        outcome="trains",
    ),

    Launch(
        name="deepspeedexamples-ds-zero2-pretrain-gpt2-model-parallel",
        script=Source("microsoft/DeepSpeedExamples", "Megatron-LM/scripts/ds_zero2_pretrain_gpt2_model_parallel.sh",
                      "5c6b1c8f364797a986aa79f65d17a3c22c2741aa"),
        program="pretrain_gpt2.py", world_size=16,
        expanded=("MP_SIZE=4, NUM_WORKERS=1 x NUM_GPUS_PER_WORKER=16; "
                  "config_json=$script_dir/ds_zero2_config.json"),
        argv=(
            "--model-parallel-size", "4", "--num-layers", "24", "--hidden-size", "1024",
            "--num-attention-heads", "16", "--batch-size", "8", "--seq-length", "1024",
            "--max-position-embeddings", "1024", "--train-iters", "100000", "--resume-dataloader",
            "--train-data", "webtext", "--lazy-loader", "--tokenizer-type", "GPT2BPETokenizer",
            "--split", "949,50,1", "--distributed-backend", "nccl", "--lr", "0.00015", "--no-load-optim",
            "--lr-decay-style", "cosine", "--weight-decay", "1e-2", "--clip-grad", "1.0", "--warmup", ".01",
            "--checkpoint-activations", "--deepspeed-activation-checkpointing", "--fp16", "--deepspeed",
            "--deepspeed_config", "Megatron-LM/scripts/ds_zero2_config.json",
        ),
        json=Source("microsoft/DeepSpeedExamples", "Megatron-LM/scripts/ds_zero2_config.json",
                    "5c6b1c8f364797a986aa79f65d17a3c22c2741aa"),
        json_text="""\
{
  "train_batch_size": 16,
  "gradient_accumulation_steps": 1,
  "steps_per_print": 1,
  "optimizer": {
    "type": "Adam",
    "params": {
      "lr": 0.00015,
      "weight_decay": 1e-2
    }
  },
  "zero_optimization": {
    "stage": 2
  },
  "zero_allow_untested_optimizer": true,
  "gradient_clipping": 1.0,
  "fp16": {
    "enabled": true,
    "loss_scale": 0,
    "loss_scale_window": 1000,
    "hysteresis": 2,
    "min_loss_scale": 1
  },
  "activation_checkpointing": {
    "partition_activations": true,
    "contiguous_memory_optimization": false
  },
  "wall_clock_breakdown": false
}
""",
        outcome="trains",
    ),

    Launch(
        name="deepspeedexamples-ds-zero-offload-pretrain-gpt2-model-parallel",
        script=Source("microsoft/DeepSpeedExamples", "Megatron-LM/scripts/ds_zero-offload_pretrain_gpt2_model_parallel.sh",
                      "5c6b1c8f364797a986aa79f65d17a3c22c2741aa"),
        program="pretrain_gpt2.py", world_size=16,
        expanded=("MP_SIZE=4, NUM_WORKERS=1 x NUM_GPUS_PER_WORKER=16; "
                  "config_json=$script_dir/ds_zero-offload_config.json"),
        argv=(
            "--model-parallel-size", "4", "--num-layers", "4", "--hidden-size", "1024",
            "--num-attention-heads", "16", "--batch-size", "12", "--seq-length", "1024",
            "--max-position-embeddings", "1024", "--train-iters", "400", "--resume-dataloader",
            "--train-data", "webtext", "--lazy-loader", "--tokenizer-type", "GPT2BPETokenizer",
            "--split", "949,50,1", "--distributed-backend", "nccl", "--lr", "0.00015", "--no-load-optim",
            "--lr-decay-style", "cosine", "--weight-decay", "1e-2", "--clip-grad", "1.0", "--warmup", ".01",
            "--checkpoint-activations", "--deepspeed-activation-checkpointing", "--fp16", "--log-interval", "5",
            "--deepspeed", "--deepspeed_config", "Megatron-LM/scripts/ds_zero-offload_config.json",
        ),
        json=Source("microsoft/DeepSpeedExamples", "Megatron-LM/scripts/ds_zero-offload_config.json",
                    "5c6b1c8f364797a986aa79f65d17a3c22c2741aa"),
        json_text="""\
{
  "train_micro_batch_size_per_gpu": 12,
  "gradient_accumulation_steps": 5,
  "steps_per_print": 100,
  "optimizer": {
    "type": "Adam",
    "params": {
      "lr": 0.00015,
      "weight_decay": 1e-2
    }
  },
  "zero_optimization": {
    "stage": 2,
    "cpu_offload": true,
    "reduce_bucket_size": 50000000
  },
  "gradient_clipping": 1.0,
  "fp16": {
    "enabled": true,
    "loss_scale": 0,
    "loss_scale_window": 1000,
    "hysteresis": 2,
    "min_loss_scale": 1
  },
  "activation_checkpointing": {
    "partition_activations": true,
    "contiguous_memory_optimization": true,
    "cpu_checkpointing": true
  },
  "wall_clock_breakdown": false
}
""",
        outcome="trains",
    ),

    Launch(
        name="deepspeedexamples-v1.1.5-zero3-ds-pretrain-gpt2-zero3",
        script=Source("microsoft/DeepSpeedExamples", "Megatron-LM-v1.1.5-ZeRO3/examples/ds_pretrain_gpt2-zero3.sh",
                      "5c6b1c8f364797a986aa79f65d17a3c22c2741aa"),
        program="pretrain_gpt2.py", world_size=1,
        expanded=("DEBUG=1 (as committed): MP_SIZE=1, one worker of one GPU, HIDDEN_SIZE=1024, "
                  "NUM_ATTN_HEADS=16, NUM_LAYERS=5, BATCHSIZE=4; no $1, so "
                  "config_json=$script_dir/ds_zero_stage_3_config.json; stage=3, rbs=50000000, "
                  "agbs=5000000000, contigious_gradients, reduce_scatter, chkp_layers=1, PA, PA_CPU, CC, "
                  "SYNCHRONIZE true, PROFILE and TILED_LINEAR false"),
        argv=(
            "--model-parallel-size", "1", "--num-layers", "5", "--hidden-size", "1024",
            "--num-attention-heads", "16", "--seq-length", "1024", "--max-position-embeddings", "1024",
            "--batch-size", "4", "--train-iters", "320000", "--lr-decay-iters", "320000",
            "--save", "checkpoints/gpt2_345m_ds", "--load", "checkpoints/gpt2_345m_ds",
            "--data-path", "/data/Megatron-LM/data/indexed_datasets/megatron",
            "--vocab-file", "/data/Megatron-LM/data/gpt2-vocab.json",
            "--merge-file", "/data/Megatron-LM/data/gpt2-merges.txt", "--data-impl", "mmap", "--split", "949,50,1",
            "--distributed-backend", "nccl", "--lr", "1.5e-4", "--lr-decay-style", "cosine", "--min-lr", "1.0e-5",
            "--weight-decay", "1e-2", "--clip-grad", "1.0", "--warmup", "0.01", "--checkpoint-activations",
            "--log-interval", "1", "--save-interval", "10000", "--eval-interval", "2000", "--eval-iters", "10",
            "--fp16", "--scattered-embeddings", "--split-transformers", "--deepspeed",
            "--deepspeed_config", "Megatron-LM-v1.1.5-ZeRO3/examples/ds_zero_stage_3_config.json",
            "--zero-stage", "3", "--zero-reduce-bucket-size", "50000000",
            "--zero-allgather-bucket-size", "5000000000", "--zero-contigious-gradients", "--zero-reduce-scatter",
            "--deepspeed-activation-checkpointing", "--checkpoint-num-layers", "1", "--partition-activations",
            "--checkpoint-in-cpu", "--synchronize-each-layer", "--contigious-checkpointing",
        ),
        json=Source("microsoft/DeepSpeedExamples", "Megatron-LM-v1.1.5-ZeRO3/examples/ds_zero_stage_3_config.json",
                    "5c6b1c8f364797a986aa79f65d17a3c22c2741aa"),
        json_text="""\
{
  "train_batch_size": 64,
  "gradient_accumulation_steps": 1,
  "steps_per_print": 1,
  "zero_optimization": {
    "stage": 3,
    "stage3_max_live_parameters": 1e9,
    "stage3_max_reuse_distance": 1e9,
    "stage3_prefetch_bucket_size": 1e7,
    "stage3_param_persitence_threshold": 1e5,
    "reduce_bucket_size": 1e7,
    "contiguous_gradients": true
  },
  "gradient_clipping": 1.0,
  "fp16": {
    "enabled": true,
    "loss_scale": 0,
    "loss_scale_window": 1000,
    "hysteresis": 2,
    "min_loss_scale": 1
  },
  "wall_clock_breakdown": true,
  "zero_allow_untested_optimizer": false
}
""",
        # Modern DeepSpeed refuses the misspelt key (its ZeRO config model forbids extra keys); the
        # DeepSpeed of the fork ignored it. We refuse it as DeepSpeed does now, with the right name.
        outcome='refused: did you mean "zero_optimization.stage3_param_persistence_threshold"',
    ),

    Launch(
        name="deepspeedexamples-v1.1.5-zero3-ds-pretrain-gpt2-zero2",
        script=Source("microsoft/DeepSpeedExamples", "Megatron-LM-v1.1.5-ZeRO3/examples/ds_pretrain_gpt2-zero2.sh",
                      "5c6b1c8f364797a986aa79f65d17a3c22c2741aa"),
        program="pretrain_gpt2.py", world_size=1,
        expanded=("DEBUG=1: MP_SIZE=1, one GPU, NUM_LAYERS=24, HIDDEN_SIZE=1024, BATCHSIZE=4; "
                  "config_json=$script_dir/ds_zero_stage_2_config.json; stage=2, and the same ZeRO and "
                  "checkpointing switches as the stage-3 script"),
        argv=(
            "--model-parallel-size", "1", "--num-layers", "24", "--hidden-size", "1024",
            "--num-attention-heads", "16", "--seq-length", "1024", "--max-position-embeddings", "1024",
            "--batch-size", "4", "--train-iters", "320000", "--lr-decay-iters", "320000",
            "--save", "checkpoints/gpt2_345m_ds", "--load", "checkpoints/gpt2_345m_ds",
            "--data-path", "/data/Megatron-LM/data/indexed_datasets/megatron",
            "--vocab-file", "/data/Megatron-LM/data/gpt2-vocab.json",
            "--merge-file", "/data/Megatron-LM/data/gpt2-merges.txt", "--data-impl", "mmap", "--split", "949,50,1",
            "--distributed-backend", "nccl", "--lr", "1.5e-4", "--lr-decay-style", "cosine", "--min-lr", "1.0e-5",
            "--weight-decay", "1e-2", "--clip-grad", "1.0", "--warmup", "0.01", "--checkpoint-activations",
            "--log-interval", "1", "--save-interval", "10000", "--eval-interval", "2000", "--eval-iters", "10",
            "--fp16", "--scattered-embeddings", "--split-transformers", "--deepspeed",
            "--deepspeed_config", "Megatron-LM-v1.1.5-ZeRO3/examples/ds_zero_stage_2_config.json",
            "--zero-stage", "2", "--zero-reduce-bucket-size", "50000000",
            "--zero-allgather-bucket-size", "5000000000", "--zero-contigious-gradients", "--zero-reduce-scatter",
            "--deepspeed-activation-checkpointing", "--checkpoint-num-layers", "1", "--partition-activations",
            "--checkpoint-in-cpu", "--synchronize-each-layer", "--contigious-checkpointing",
        ),
        json=Source("microsoft/DeepSpeedExamples", "Megatron-LM-v1.1.5-ZeRO3/examples/ds_zero_stage_2_config.json",
                    "5c6b1c8f364797a986aa79f65d17a3c22c2741aa"),
        json_text="""\
{
  "train_batch_size": 2048,
  "gradient_accumulation_steps": 1,
  "steps_per_print": 1,
  "zero_optimization": {
    "stage": 2,
    "allgather_partitions": true,
    "reduce_scatter": true,
    "allgather_bucket_size": 50000000,
    "reduce_bucket_size": 50000000,
    "overlap_comm": true
  },
  "optimizer": {
    "type": "Adam",
    "params": {
      "lr": 0.00015,
      "max_grad_norm": 1.0,
      "betas": [0.9, 0.95]
    }
  },
  "gradient_clipping": 1.0,
  "fp16": {
    "enabled": true,

    "loss_scale": 0,
    "loss_scale_window": 1000,
    "hysteresis": 2,
    "min_loss_scale": 1
  },
  "wall_clock_breakdown": true,
  "zero_allow_untested_optimizer": false
}
""",
        outcome="trains",
    ),

    Launch(
        name="deepspeedexamples-v1.1.5-3d-ds-pretrain-gpt2",
        script=Source("microsoft/DeepSpeedExamples", "Megatron-LM-v1.1.5-3D_parallelism/examples/ds_pretrain_gpt2.sh",
                      "5c6b1c8f364797a986aa79f65d17a3c22c2741aa"),
        program="pretrain_gpt2.py", world_size=8,
        expanded=("GPUS_PER_NODE=8 x NNODES=1, mp_size=4, BATCHSIZE=9, stage=0, PA=true, PA_CPU=false, "
                  "CC=true, SYNCHRONIZE=true; config_json=$script_dir/ds_zero_stage_2_config.json (so the "
                  "flags say --zero-stage 0 and the JSON stage 2, as in the original); "
                  "--checkpoint-activations twice, as the script passes it"),
        argv=(
            "--model-parallel-size", "4", "--num-layers", "24", "--hidden-size", "1024",
            "--num-attention-heads", "16", "--seq-length", "1024", "--max-position-embeddings", "1024",
            "--batch-size", "9", "--train-iters", "320000", "--lr-decay-iters", "320000",
            "--save", "checkpoints/gpt2_345m_ds", "--load", "checkpoints/gpt2_345m_ds",
            "--data-path", "data/webtext/webtext_text_document", "--vocab-file", "data/gpt2-vocab.json",
            "--merge-file", "data/gpt2-merges.txt", "--data-impl", "mmap", "--split", "949,50,1",
            "--distributed-backend", "nccl", "--lr", "1.5e-4", "--lr-decay-style", "cosine", "--min-lr", "1.0e-5",
            "--weight-decay", "1e-2", "--clip-grad", "1.0", "--warmup", "0.01", "--checkpoint-activations",
            "--log-interval", "100", "--save-interval", "10000", "--eval-interval", "1000", "--eval-iters", "10",
            "--fp16", "--tensorboard-dir", "tensorboard_data/24l_1024h_1n_8g_4mp_9b_ds4", "--deepspeed",
            "--deepspeed_config", "Megatron-LM-v1.1.5-3D_parallelism/examples/ds_zero_stage_2_config.json",
            "--zero-stage", "0", "--zero-reduce-bucket-size", "50000000",
            "--zero-allgather-bucket-size", "5000000000", "--zero-contigious-gradients", "--zero-reduce-scatter",
            "--checkpoint-activations", "--checkpoint-num-layers", "1", "--partition-activations",
            "--synchronize-each-layer", "--contigious-checkpointing",
        ),
        json=Source("microsoft/DeepSpeedExamples", "Megatron-LM-v1.1.5-3D_parallelism/examples/ds_zero_stage_2_config.json",
                    "5c6b1c8f364797a986aa79f65d17a3c22c2741aa"),
        json_text="""\
{
  "train_batch_size": 2048,
  "gradient_accumulation_steps": 1,
  "steps_per_print": 1,
  "zero_optimization": {
    "stage": 2,
    "allgather_partitions": true,
    "reduce_scatter": true,
    "allgather_bucket_size": 50000000,
    "reduce_bucket_size": 50000000,
    "overlap_comm": true
  },
  "optimizer": {
    "type": "Adam",
    "params": {
      "lr": 0.00015,
      "max_grad_norm": 1.0,
      "betas": [0.9, 0.95]
    }
  },
  "gradient_clipping": 1.0,
  "fp16": {
    "enabled": true,

    "loss_scale": 0,
    "loss_scale_window": 1000,
    "hysteresis": 2,
    "min_loss_scale": 1
  },
  "wall_clock_breakdown": true,
  "zero_allow_untested_optimizer": false
}
""",
        outcome="trains",
    ),

    Launch(
        name="deepspeedexamples-v1.1.5-3d-ds-pretrain-gpt2-pipe",
        script=Source("microsoft/DeepSpeedExamples", "Megatron-LM-v1.1.5-3D_parallelism/examples/ds_pretrain_gpt2_pipe.sh",
                      "5c6b1c8f364797a986aa79f65d17a3c22c2741aa"),
        program="pretrain_gpt2.py", world_size=16,
        expanded=("GPUS_PER_NODE=16, mp_size=2, pp_size=2, BATCHSIZE=4, GAS=16, stage=0; "
                  "config_json=$script_dir/ds_config.json"),
        argv=(
            "--model-parallel-size", "2", "--pipe-parallel-size", "2", "--num-layers", "24", "--hidden-size", "1024",
            "--num-attention-heads", "16", "--seq-length", "1024", "--max-position-embeddings", "1024",
            "--batch-size", "4", "--gas", "16", "--train-iters", "320000", "--lr-decay-iters", "320000",
            "--save", "checkpoints/gpt2_345m_ds", "--load", "checkpoints/gpt2_345m_ds",
            "--data-path", "data/webtext/webtext_text_document", "--vocab-file", "data/gpt2-vocab.json",
            "--merge-file", "data/gpt2-merges.txt", "--data-impl", "mmap", "--split", "949,50,1",
            "--distributed-backend", "nccl", "--lr", "1.5e-4", "--lr-decay-style", "cosine", "--min-lr", "1.0e-5",
            "--weight-decay", "1e-2", "--clip-grad", "1.0", "--warmup", "0.01", "--checkpoint-activations",
            "--log-interval", "1", "--save-interval", "500", "--eval-interval", "100", "--eval-iters", "10",
            "--fp16", "--tensorboard-dir", "tensorboard_data/24l_1024h_1n_16g_2pp_2mp_4b_ds4", "--deepspeed",
            "--deepspeed_config", "Megatron-LM-v1.1.5-3D_parallelism/examples/ds_config.json", "--zero-stage", "0",
            "--zero-reduce-bucket-size", "50000000", "--zero-allgather-bucket-size", "5000000000",
            "--zero-contigious-gradients", "--zero-reduce-scatter", "--checkpoint-activations",
            "--checkpoint-num-layers", "1", "--partition-activations", "--synchronize-each-layer",
            "--contigious-checkpointing",
        ),
        json=Source("microsoft/DeepSpeedExamples", "Megatron-LM-v1.1.5-3D_parallelism/examples/ds_config.json",
                    "5c6b1c8f364797a986aa79f65d17a3c22c2741aa"),
        json_text="""\
{
  "train_batch_size": 256,
  "train_micro_batch_size_per_gpu": 4,
  "steps_per_print": 10,
  "gradient_clipping": 1.0,
  "fp16": {
    "enabled": true,

    "loss_scale": 0,
    "loss_scale_window": 1000,
    "hysteresis": 2,
    "min_loss_scale": 1
  },
  "wall_clock_breakdown": true,
  "zero_allow_untested_optimizer": false
}
""",
        outcome="trains",
    ),

    Launch(
        name="deepspeedexamples-v1.1.5-zero3-stage3-release-json",
        script=None, program="pretrain_gpt.py", world_size=1,
        expanded="a standalone JSON, launched with SIMPLE_LAUNCH",
        argv=SIMPLE_LAUNCH,
        json=Source("microsoft/DeepSpeedExamples", "Megatron-LM-v1.1.5-ZeRO3/examples/ds_zero_stage_3_config_release.json",
                    "5c6b1c8f364797a986aa79f65d17a3c22c2741aa"),
        json_text="""\
{
  "train_batch_size": 64,
  "gradient_accumulation_steps": 1,
  "steps_per_print": 1,
  "zero_optimization": {
    "stage": 3,
    "stage3_max_live_parameters": 1e9,
    "stage3_max_reuse_distance": 1e8,
    "stage3_param_persitance_threshold": 1e5,
    "stage3_prefetch_bucket_size": 5e7,
    "contiguous_gradients": true,
    "cpu_offload": true,
    "cpu_offload_params": true,
    "cpu_offload_use_pin_memory": true,
    "overlap_comm": true,
    "reduce_bucket_size": 90000000,
    "sub_group_size": 4e8
  },
  "gradient_clipping": 1.0,
  "fp16": {
    "enabled": true,
    "loss_scale": 0,
    "loss_scale_window": 1000,
    "hysteresis": 2,
    "min_loss_scale": 1
  },
  "wall_clock_breakdown": true,
  "zero_allow_untested_optimizer": false
}""",
        outcome="refused: stage3_param_persitance_threshold (unknown key",
    ),

    Launch(
        name="deepspeedexamples-v1.1.5-zero3-stage-infinity-json",
        script=None, program="pretrain_gpt.py", world_size=1,
        expanded="a standalone JSON, launched with SIMPLE_LAUNCH",
        argv=SIMPLE_LAUNCH,
        json=Source("microsoft/DeepSpeedExamples", "Megatron-LM-v1.1.5-ZeRO3/examples/ds_zero_stage_infinity_config.json",
                    "5c6b1c8f364797a986aa79f65d17a3c22c2741aa"),
        json_text="""\
{
  "train_micro_batch_size_per_gpu": 4,
  "gradient_accumulation_steps": 1,
  "steps_per_print": 1,
  "zero_optimization": {
    "stage": 3,
    "stage3_max_live_parameters": 1e9,
    "stage3_max_reuse_distance": 1e9,
    "stage3_param_persitence_threshold": 1e5,
    "stage3_prefetch_bucket_size": 5e7,
    "contiguous_gradients": true,
    "overlap_comm": true,
    "reduce_bucket_size": 90000000,
    "sub_group_size": 1e8,
    "offload_optimizer": {
      "device": "nvme",
      "nvme_path": "/nvme_data",
      "buffer_count": 4,
      "pipeline_read": false,
      "pipeline_write": false,
      "pin_memory": true
    },
    "offload_param": {
      "device": "nvme",
      "nvme_path": "/nvme_data",
      "max_in_cpu": 1,
      "pin_memory": true
    }
  },
  "gradient_clipping": 1.0,
  "fp16": {
    "enabled": true,
    "loss_scale": 0,
    "loss_scale_window": 1000,
    "hysteresis": 2,
    "min_loss_scale": 1
  },
  "wall_clock_breakdown": true,
  "zero_allow_untested_optimizer": false,
  "aio": {
    "block_size": 1048576,
    "queue_depth": 16,
    "single_submit": false,
    "overlap_events": true,
    "thread_count": 2
  }
}
""",
        outcome="refused: NVMe offload (ZeRO-Infinity)",
    ),

    Launch(
        name="deepspeedexamples-v1.1.5-curriculum-baseline-json",
        script=None, program="pretrain_gpt.py", world_size=1,
        expanded="a standalone JSON, launched with SIMPLE_LAUNCH",
        argv=SIMPLE_LAUNCH,
        json=Source("microsoft/DeepSpeedExamples", "Megatron-LM-v1.1.5-ZeRO3/curriculum_learning/ds_zero_stage_2_config_baseline.json",
                    "5c6b1c8f364797a986aa79f65d17a3c22c2741aa"),
        json_text="""\
{
  "train_batch_size": 512,
  "gradient_accumulation_steps": 1,
  "steps_per_print": 1,
  "zero_optimization": {
    "stage": 2,
    "allgather_partitions": true,
    "reduce_scatter": true,
    "allgather_bucket_size": 50000000,
    "reduce_bucket_size": 50000000,
    "overlap_comm": true
  },
  "optimizer": {
    "type": "Adam",
    "params": {
      "lr": 0.00015,
      "max_grad_norm": 1.0,
      "betas": [0.9, 0.95]
    }
  },
  "gradient_clipping": 1.0,
  "fp16": {
    "enabled": true,
    "loss_scale": 0,
    "loss_scale_window": 1000,
    "hysteresis": 2,
    "min_loss_scale": 1
  },
  "wall_clock_breakdown": false,
  "zero_allow_untested_optimizer": false
}
""",
        outcome="trains",
    ),

    Launch(
        name="deepspeedexamples-zero3-run-gpt-1gpu",
        script=Source("microsoft/DeepSpeedExamples", "Megatron-LM-v1.1.5-ZeRO3/examples/run_gpt_1gpu.sh",
                      "44be774aadc3d23ebb0edcce6d8c31748679e93e"),
        program="pretrain_gpt2.py", world_size=16,
        expanded=("NUM_WORKERS=1 x NUM_GPUS_PER_WORKER=16 under `deepspeed` (despite the name), MP_SIZE=1, "
                  "NUM_LAYERS=40, HIDDEN_SIZE=1600, BATCHSIZE=8; `${@:2}` empty, so no --deepspeed: plain "
                  "Megatron data parallelism"),
        argv=(
            "--model-parallel-size", "1", "--num-layers", "40", "--hidden-size", "1600",
            "--num-attention-heads", "16", "--seq-length", "1024", "--max-position-embeddings", "1024",
            "--batch-size", "8", "--lr", "0.00015", "--lr-decay-style", "cosine", "--min-lr", "1.0e-5",
            "--train-iters", "5", "--lr-decay-iters", "800", "--warmup", "0.01", "--weight-decay", "1e-2",
            "--clip-grad", "1.0", "--data-path", "/data/Megatron-LM/data/indexed_datasets/megatron",
            "--vocab-file", "/data/Megatron-LM/data/gpt2-vocab.json",
            "--merge-file", "/data/Megatron-LM/data/gpt2-merges.txt", "--data-impl", "mmap",
            "--split", "1000,0,0", "--fp16", "--checkpoint-activations", "--log-interval", "1",
            "--eval-iters", "10", "--distributed-backend", "nccl",
        ),
        outcome="trains",
    ),
)
