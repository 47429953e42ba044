"""DeepSpeed JSON as users write it: every documented key is classified -- honoured (as flags),
accepted with no effect on the math (one info line), or unsupported (one error line listing them all,
each with its reason or alternative)."""

import json

import pytest

from arguments.config import ConfigError
from arguments.deepspeed.keys import SECTION_KEYS, TOP_LEVEL_KEYS
from arguments.deepspeed.translation import deepspeed_config_to_flags
from arguments.parser import parse_arguments, parse_config
from tests.readme import doc_section

# The keys of DeepSpeed's configuration reference, https://www.deepspeed.ai/docs/config-json/ (its
# source: deepspeedai/DeepSpeed docs/_pages/config-json.md, read at commit 00376da4), section by section.
DOCUMENTED_TOP_LEVEL = [
    "train_batch_size", "train_micro_batch_size_per_gpu", "gradient_accumulation_steps",
    "managed_gradient_accumulation", "optimizer", "scheduler", "communication_data_type", "gradient_allreduce_op",
    "prescale_gradients", "gradient_predivide_factor", "torch_autocast", "gradient_clipping", "aio",
    "tensor_parallel", "hybrid_engine", "expert_parallel", "disable_python_gc", "steps_per_print",
    "wall_clock_breakdown", "dump_state", "autotuning", "flops_profiler", "data_efficiency", "tensorboard", "wandb",
    "comet", "csv_monitor", "comms_logger", "compile",
]
DOCUMENTED_SECTION_KEYS = {
    "fp16": ["enabled", "auto_cast", "loss_scale", "initial_scale_power", "loss_scale_window", "hysteresis",
             "consecutive_hysteresis", "min_loss_scale", "fp16_master_weights_and_grads"],
    "bf16": ["enabled", "bf16_master_weights_and_grads", "bf16_optimizer_states"],
    "zero_optimization": ["stage", "allgather_partitions", "allgather_bucket_size", "compute_grad_norm",
                          "overlap_comm", "reduce_scatter", "reduce_bucket_size", "contiguous_gradients",
                          "load_from_fp32_weights", "round_robin_gradients", "parameter_alignment", "offload_param",
                          "offload_optimizer", "stage3_max_live_parameters", "stage3_max_reuse_distance",
                          "stage3_prefetch_bucket_size", "stage3_param_persistence_threshold", "sub_group_size",
                          "elastic_checkpoint", "stage3_gather_16bit_weights_on_model_save",
                          "stage3_module_granularity_threshold", "zero_hpz_partition_size", "zero_quantized_weights",
                          "zero_quantized_gradients", "log_trace_cache_warnings", "cpu_offload",
                          "ignore_unused_parameters", "save_muon_momentum_buffer_in_memory"],
    "activation_checkpointing": ["partition_activations", "cpu_checkpointing", "contiguous_memory_optimization",
                                 "number_checkpoints", "synchronize_checkpoint_boundary", "profile"],
    "checkpoint": ["tag_validation", "load_universal", "use_node_local_storage", "parallel_write"],
    "data_types": ["grad_accum_dtype"],
}


def test_every_documented_key_is_classified():
    assert [key for key in DOCUMENTED_TOP_LEVEL if key not in TOP_LEVEL_KEYS] == []
    missing = [f"{section}.{key}" for section, keys in DOCUMENTED_SECTION_KEYS.items() for key in keys
               if f"{section}.{key}" not in SECTION_KEYS]
    assert missing == []


def write(tmp_path, config):
    path = tmp_path / "ds.json"
    path.write_text(json.dumps(config))
    return str(path)


# The documentation's own examples, with the features this codebase does not have switched off.
DOCS_EXAMPLE = {
    "train_batch_size": 32, "train_micro_batch_size_per_gpu": 4, "gradient_accumulation_steps": 8,
    "optimizer": {"type": "Adam", "params": {"lr": 0.001, "betas": [0.8, 0.999], "eps": 1e-8, "weight_decay": 3e-7}},
    "scheduler": {"type": "WarmupLR", "params": {"warmup_min_lr": 0, "warmup_max_lr": 0.001,
                                                 "warmup_num_steps": 1000, "warmup_type": "linear"}},
    "fp16": {"enabled": True, "auto_cast": False, "loss_scale": 0, "initial_scale_power": 16,
             "loss_scale_window": 1000, "hysteresis": 2, "consecutive_hysteresis": False, "min_loss_scale": 1},
    "gradient_clipping": 1.0,
    "zero_optimization": {"stage": 2, "allgather_partitions": True, "allgather_bucket_size": 5e8,
                          "overlap_comm": False, "reduce_scatter": True, "reduce_bucket_size": 5e8,
                          "contiguous_gradients": True, "offload_optimizer": {"device": "none"},
                          "round_robin_gradients": False},
    "steps_per_print": 10, "wall_clock_breakdown": False, "dump_state": False, "memory_breakdown": False,
    "flops_profiler": {"enabled": False, "profile_step": 1}, "comms_logger": {"enabled": False},
    "tensorboard": {"enabled": True, "output_path": "output/ds_logs/", "job_name": "train_bert"},
    "wandb": {"enabled": True, "group": "my_group", "team": "my_team", "project": "my_project"},
    "csv_monitor": {"enabled": False}, "autotuning": {"enabled": False}, "data_types": {"grad_accum_dtype": "fp32"},
}


def test_a_config_as_the_documentation_writes_it_maps_onto_our_settings(tmp_path):
    parsed = parse_arguments(["--zero-config", write(tmp_path, DOCS_EXAMPLE)])
    config = parsed.config
    assert (config.training.global_batch_size, config.training.micro_batch_size, config.training.accumulation_steps) \
        == (32, 4, 8)
    assert (config.optimizer.lr, config.optimizer.adam_beta1, config.optimizer.adam_beta2, config.optimizer.adam_eps,
            config.optimizer.weight_decay) == (0.001, 0.8, 0.999, 1e-8, 3e-7)
    assert (config.optimizer.lr_warmup_iters, config.optimizer.lr_decay_style, config.optimizer.min_lr) == \
        (1000, "constant", 0.0)
    assert config.training.precision == "fp16" and config.training.mixed_precision.initial_loss_scale == 2.0 ** 16
    assert (config.zero.stage, config.zero.overlap_comm, config.training.log_interval) == (2, False, 10)
    assert config.logging.tensorboard_dir == "output/ds_logs/train_bert"
    assert (config.logging.wandb_project, config.logging.wandb_entity) == ("my_project", "my_team")
    assert config.training.gradient_precision == "fp32"
    info = [note for note in parsed.notes if "accepted with no effect on the math" in note]
    assert len(info) == 1  # one line, every such key in it
    for key in ("wall_clock_breakdown", "zero_optimization.allgather_partitions", "memory_breakdown", "dump_state",
                "flops_profiler", "zero_optimization.offload_optimizer", "wandb.group"):
        assert key + " (" in info[0], key


def test_warmup_decay_lr_is_our_linear_schedule(tmp_path):
    config = parse_config(["--zero-config", write(tmp_path, {"scheduler": {"type": "WarmupDecayLR", "params": {
        "warmup_max_lr": 3e-4, "warmup_num_steps": 10, "total_num_steps": 100, "warmup_type": "linear"}}})])
    optimizer = config.optimizer
    assert (optimizer.lr, optimizer.lr_warmup_iters, optimizer.lr_decay_iters, optimizer.lr_decay_style,
            optimizer.min_lr) == (3e-4, 10, 100, "linear", 0.0)


def test_the_schedulers_peak_wins_over_the_optimizers_lr_as_in_deepspeed(tmp_path):
    parsed = parse_arguments(["--zero-config", write(tmp_path, {
        "optimizer": {"type": "AdamW", "params": {"lr": 1e-3}},
        "scheduler": {"type": "WarmupLR", "params": {"warmup_max_lr": 2e-4, "warmup_type": "linear"}}})])
    assert parsed.config.optimizer.lr == 2e-4
    assert any("optimizer.params.lr (the scheduler's warmup_max_lr 0.0002 is the peak" in note for note in parsed.notes)


def test_every_unsupported_key_is_listed_in_one_line(tmp_path):
    config = {"optimizer": {"type": "Lamb", "params": {"lr": 1e-3}},
              "scheduler": {"type": "WarmupLR", "params": {"warmup_num_steps": 10}},
              "zero_optimization": {"stage": 3, "offload_param": {"device": "nvme"},
                                    "offload_optimizer": {"device": "nvme"}, "zero_quantized_weights": True},
              "sparse_attention": {"mode": "fixed"}, "fp16": {"enabled": True, "consecutive_hysteresis": True},
              "steps_per_prnt": 5}
    with pytest.raises(ConfigError) as error:
        parse_config(["--zero-config", write(tmp_path, config)])
    message = str(error.value)
    assert "\n" not in message and "8 key(s) not supported here" in message
    for words in ("optimizer.type ('Lamb': the optimizer here is AdamW",
                  "scheduler.params.warmup_type (absent, so DeepSpeed's default \"log\": the warmup here is linear",
                  "zero_optimization.offload_param.device (NVMe offload (ZeRO-Infinity) is not implemented",
                  "zero_optimization.offload_optimizer.device (NVMe offload (ZeRO-Infinity) is not implemented",
                  "zero_optimization.zero_quantized_weights (ZeRO++ weight quantization is not implemented",
                  "sparse_attention (block-sparse attention is not implemented",
                  "fp16.consecutive_hysteresis (refilling the hysteresis after every good step is not implemented",
                  'steps_per_prnt (unknown key; did you mean "steps_per_print"?)'):
        assert words in message, words


def test_the_legacy_forms_deepspeed_still_reads(tmp_path):
    """`"zero_optimization": true` is stage 1 (DeepSpeed's first form), "bfloat16" the old name of bf16;
    the old FusedAdam's max_grad_norm is read but not used (tests/arguments/test_deepspeed_clipping.py)."""
    translation = deepspeed_config_to_flags({"zero_optimization": True, "bfloat16": {"enabled": True},
                                             "optimizer": {"type": "Adam", "params": {"max_grad_norm": 0.5}}}, "x")
    assert translation.argv == ["--zero-stage", "1", "--bf16", "--no-fp16"]


def test_hf_trainer_auto_values_are_named(tmp_path):
    with pytest.raises(ConfigError, match='ds.json: train_batch_size must be a whole number .* got "auto" '
                                          '.the HF Trainer fills in "auto"; write the value here.'):
        parse_config(["--zero-config", write(tmp_path, {"train_batch_size": "auto"})])


def test_the_docs_table_names_every_classified_key():
    section = doc_section("docs/coming-from-megatron-deepspeed.md", "Coming from Megatron-LM / DeepSpeed")
    missing = [key for key in TOP_LEVEL_KEYS if f"`{key}" not in section and f" {key}" not in section]
    missing += [key for key in SECTION_KEYS if key.split(".", 1)[1] not in section]
    assert missing == []


# HabanaAI/Megatron-DeepSpeed scripts/run_llama.sh @ 470cc029 (the Gaudi fork's Llama launch) writes this JSON with
# its defaults (LLaMA 3.1 8B, HL_SEQ_PARALLEL=1 so PARTITIONED_MODE=false, no HL_GRAD_ACCUM_DTYPE); DeepSpeed 0.19's
# runtime/config.py get_pipeline_config reads its `pipeline` section over the defaults and PipelineEngine asserts the
# two partition switches are bools. The batch is shrunk (2048 -> 8) to fit 2 ranks.
GAUDI_LLAMA = {
    "train_batch_size": 8, "train_micro_batch_size_per_gpu": 1, "steps_per_print": 10, "gradient_clipping": 1.0,
    "zero_optimization": {"stage": 0}, "zero_allow_untested_optimizer": True,
    "bf16": {"enabled": True, "immediate_grad_update": True}, "fp16": {"enabled": False},
    "wall_clock_breakdown": False, "pipeline": {"pipe_partitioned": False, "grad_partitioned": False},
    "timers": {"throughput": {"enabled": True, "synchronized": False}},
}


def test_deepspeeds_pipeline_section_is_read_and_named_not_refused(tmp_path):
    """The `pipeline` section says how DeepSpeed's pipeline engine sends and recomputes, none of it the math: each key
    is in the one info line (was refused as "pipeline parallelism is not implemented", false since PP trains here)."""
    parsed = parse_arguments(["--zero-config", write(tmp_path, GAUDI_LLAMA), "--pipeline-model-parallel-size", "2",
                              "--num-layers", "2"])
    (info,) = [note for note in parsed.notes if "accepted with no effect on the math" in note]
    assert "pipeline.pipe_partitioned (" in info and "pipeline.grad_partitioned (" in info
    # DeepSpeed's pipeline tutorial's section, with recomputation every layer: named beside the flags that set it here
    recompute = {**GAUDI_LLAMA, "pipeline": {"activation_checkpoint_interval": 1, "pipe_partitioned": True,
                                             "grad_partitioned": True}}
    (info,) = [note for note in parse_arguments(["--zero-config", write(tmp_path, recompute)]).notes
               if "accepted with no effect on the math" in note]
    assert "pipeline.activation_checkpoint_interval (DeepSpeed's pipeline engine recomputes" in info
    with pytest.raises(ConfigError, match="pipeline.pipe_partitioned must be true or false"):
        parse_arguments(["--zero-config", write(tmp_path, {**GAUDI_LLAMA, "pipeline": {"pipe_partitioned": 1}})])
