"""Which side wins where a DeepSpeed JSON key and a flag set the same thing: the side that wins in the real
Megatron-DeepSpeed + DeepSpeed pair, whose engine takes what it does itself (ZeRO, precision, loss scaling, clipping)
from the JSON and Megatron the rest from its flags. A rule's `why` ends the warning line; `code` is their code
path."""

from __future__ import annotations

from dataclasses import dataclass

FLAG_WINS, JSON_WINS, INDEPENDENT, MUST_AGREE = "flag wins", "JSON wins", "independent", "must agree"


@dataclass(frozen=True)
class Precedence:
    winner: str  # FLAG_WINS, JSON_WINS, INDEPENDENT or MUST_AGREE
    why: str  # what the real pair does (ends the warning line's sentence)
    code: str    # where: the real code path


BATCH_IDENTITY = "train_batch_size = train_micro_batch_size_per_gpu x gradient_accumulation_steps x DP"

OPTIMIZER = Precedence(
    FLAG_WINS, "which hands deepspeed.initialize its own Adam built from the flags, and a client optimizer "
               "replaces the JSON's optimizer block",
    "Megatron-DeepSpeed megatron/optimizer/__init__.py get_megatron_optimizer (returns the bare Adam(lr, "
    "weight_decay, betas, eps from args) under --deepspeed); megatron/training.py setup_model_and_optimizer: "
    "deepspeed.initialize(optimizer=optimizer); DeepSpeed runtime/engine.py _configure_optimizer uses "
    "client_optimizer when given")
ZERO = Precedence(
    JSON_WINS, "where DeepSpeed's engine reads its ZeRO settings from the JSON only (Megatron-DeepSpeed's "
               "--zero-reduce-bucket-size, --zero-allgather-bucket-size, --zero-reduce-scatter and "
               "--zero-contigious-gradients are parsed and never read)",
    "DeepSpeed runtime/config.py DeepSpeedConfig._initialize_params: zero_config = get_zero_config(param_dict) "
    "(runtime/zero/config.py); Megatron-DeepSpeed megatron/arguments.py _add_zero_args (no reader)")
LOSS_SCALE = Precedence(
    JSON_WINS, "where DeepSpeed's loss scaler takes its settings from the JSON and Megatron's --loss-scale, "
               "--initial-loss-scale, --loss-scale-window, --hysteresis, --min-loss-scale feed only Megatron's "
               "own grad scaler, which --deepspeed skips",
    "DeepSpeed runtime/config.py get_loss_scale, get_dynamic_loss_scale_args -> engine.dynamic_loss_scale_args(); "
    "Megatron-DeepSpeed megatron/optimizer/__init__.py returns before DynamicGradScaler(args.initial_loss_scale, "
    "...) when args.deepspeed")
PRECISION = Precedence(
    JSON_WINS, "where DeepSpeed's engine casts the model to the JSON's precision and wraps the optimizer for "
               "it; under --deepspeed, Megatron's --fp16/--bf16 only pick the dtype layers are built in",
    "DeepSpeed runtime/engine.py _configure_distributed_model (module.half() / module.bfloat16() from "
    "fp16_enabled() / bfloat16_enabled()); Megatron-DeepSpeed megatron/training.py get_model returns before "
    "Float16Module when args.deepspeed")
CHECKPOINTING = Precedence(
    FLAG_WINS, "which passes its flags to deepspeed.checkpointing.configure, where each argument overwrites "
               "the JSON's value",
    "Megatron-DeepSpeed megatron/initialize.py setup_deepspeed_random_and_activation_checkpointing -> DeepSpeed "
    "runtime/activation_checkpointing/checkpointing.py configure(): _configure_using_config_file, then every "
    "argument that is not None")
MICRO_BATCH = Precedence(
    FLAG_WINS, "whose data loader uses Megatron's value",
    "Megatron-DeepSpeed megatron/data/data_samplers.py build_pretraining_data_loader("
    "micro_batch_size=args.micro_batch_size); megatron/training.py train_step: forward_backward_func("
    "micro_batch_size=args.micro_batch_size)")
GLOBAL_BATCH = Precedence(
    FLAG_WINS, "whose train() overrides DeepSpeed's train_batch_size with Megatron's global batch every "
               "iteration (set_train_batch_size)",
    "Megatron-DeepSpeed megatron/training.py train(): model[0].set_train_batch_size(dp x args.micro_batch_size "
    "x get_num_microbatches()); DeepSpeed runtime/engine.py set_train_batch_size overwrites "
    "_config.train_batch_size")
ACCUMULATION = Precedence(
    FLAG_WINS, "where set_train_batch_size recomputes DeepSpeed's accumulation steps from Megatron's global "
               "batch every iteration, and Megatron's loop marks the accumulation boundary itself",
    "DeepSpeed runtime/engine.py set_train_batch_size: gradient_accumulation_steps = train_batch_size // "
    "(micro batch x dp); Megatron-DeepSpeed megatron/core/pipeline_parallel/schedules.py "
    "forward_backward_no_pipelining: model.set_gradient_accumulation_boundary")
BATCH_IDENTITY_RULE = Precedence(
    MUST_AGREE, "DeepSpeed refuses a JSON whose train_batch_size is not its micro batch x accumulation steps x "
                "the data-parallel size, at initialize",
    "DeepSpeed runtime/config.py DeepSpeedConfig._configure_train_batch_size: _set_batch_related_parameters "
    "(fills a missing one with floor division), then _batch_assertion")
PROGRESS_LINE = Precedence(
    INDEPENDENT, "where it is the cadence of DeepSpeed's own progress line (step, lr, momentum), and "
                 "Megatron's log line follows --log-interval",
    "DeepSpeed runtime/engine.py _take_model_step: (global_steps + 1) % steps_per_print() == 0 -> "
    "_report_progress; Megatron-DeepSpeed megatron/training.py training_log: iteration % args.log_interval")
TENSORBOARD = Precedence(
    INDEPENDENT, "where DeepSpeed's monitor writes its own events (Train/Samples/...) to output_path/job_name "
                 "and Megatron writes its own to --tensorboard-dir",
    "DeepSpeed runtime/engine.py self.monitor = MonitorMaster(self._config.monitor_config); Megatron-DeepSpeed "
    "megatron/global_vars.py _set_tensorboard_writer(log_dir=args.tensorboard_dir)")
WANDB = Precedence(
    INDEPENDENT, "where DeepSpeed's monitor and Megatron's --wandb-project each log on their own",
    "DeepSpeed monitor/wandb.py WandbMonitor (from the JSON's wandb block); Megatron-DeepSpeed "
    "megatron/global_vars.py _set_wandb_writer (args.wandb_project)")
SCHEDULER = Precedence(
    FLAG_WINS, "which hands deepspeed.initialize its own learning-rate scheduler, and a client scheduler "
               "replaces the JSON's scheduler block as a whole",
    "Megatron-DeepSpeed megatron/training.py setup_model_and_optimizer: deepspeed.initialize("
    "lr_scheduler=opt_param_scheduler); DeepSpeed runtime/engine.py _configure_lr_scheduler uses "
    "client_lr_scheduler first (since v0.14.5, f994fb2c; before it the JSON's scheduler came first, which "
    "arguments/deepspeed/client_objects.py keeps for DeepSpeedExamples' forks)")
GRADIENT_CLIPPING = Precedence(
    JSON_WINS, "where DeepSpeed's optimizer clips with gradient_clipping and --clip-grad is read only by "
               "Megatron's own optimizer wrappers, which --deepspeed skips",
    "DeepSpeed runtime/engine.py gradient_clipping() -> the ZeRO / FP16 / BF16 optimizers' clip_grad; "
    "Megatron-DeepSpeed megatron/optimizer/__init__.py returns before Float16OptimizerWithFloat16Params("
    "args.clip_grad) when args.deepspeed")
GRAD_ACCUM_DTYPE = Precedence(
    JSON_WINS, "where DeepSpeed takes the gradient accumulation dtype from the JSON and "
               "--accumulate-allreduce-grads-in-fp32 is read only by Megatron's own DDP, which --deepspeed "
               "replaces",
    "DeepSpeed runtime/engine.py get_data_types() (config grad_accum_dtype); Megatron-DeepSpeed "
    "megatron/training.py get_model returns before LocalDDP(accumulate_allreduce_grads_in_fp32) when "
    "args.deepspeed")
ZERO_STAGE = Precedence(
    JSON_WINS, "where DeepSpeed's engine runs the JSON's stage; --zero-stage only decides whether the model "
               "is built under deepspeed.zero.Init (and the v1.1.5 3D fork never reads it)",
    "DeepSpeed runtime/config.py zero_optimization_stage = get_zero_config(param_dict).stage; "
    "Megatron-DeepSpeed pretrain_gpt.py model_provider: deepspeed.zero.Init(enabled=args.zero_stage == 3)")
LEGACY_ZERO = Precedence(
    JSON_WINS, "where DeepSpeed's engine runs the JSON's stage (true is stage 1); --zero-stage only decides "
               "whether the model is built under deepspeed.zero.Init",
    "DeepSpeed runtime/zero/config.py read_zero_config_deprecated (true -> stage 1); Megatron-DeepSpeed "
    "pretrain_gpt.py model_provider: deepspeed.zero.Init(enabled=args.zero_stage == 3)")
CHECKPOINT_BLOCK = Precedence(
    FLAG_WINS, "where the block only configures checkpointing and Megatron's --checkpoint-activations decides "
               "whether blocks are checkpointed",
    "Megatron-DeepSpeed megatron/model/transformer.py ParallelTransformer.forward: "
    "if self.checkpoint_activations -> _checkpointed_forward")
AUTOTP = Precedence(
    FLAG_WINS, "whose layers are split by --tensor-model-parallel-size before DeepSpeed sees the model "
               "(AutoTP splits models DeepSpeed shards itself)",
    "Megatron-DeepSpeed megatron/initialize.py _initialize_distributed -> mpu.initialize_model_parallel("
    "args.tensor_model_parallel_size); DeepSpeed runtime/engine.py _configure_tensor_parallel_states "
    "(only when autotp_size > 1)")


UNIVERSAL_CHECKPOINT = Precedence(
    FLAG_WINS, "whose --universal-checkpoint replaces the JSON's checkpoint block with {\"load_universal\": true} "
               "(without the flag, the JSON's load_universal is what DeepSpeed's load reads)",
    "Megatron-DeepSpeed megatron/training.py _create_ds_config_dict (ds_config_dict[\"checkpoint\"] = "
    "{\"load_universal\": True}); DeepSpeed runtime/engine.py load_checkpoint (latest_universal when "
    "load_universal_checkpoint())")
