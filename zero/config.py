"""ZeRO settings, and DeepSpeed-style JSON configs translated into our command-line flags.

`ZeroConfig` is the `zero` section of `PretrainConfig` and `ActivationCheckpointConfig` (ZeRO-R's
activation checkpointing) its `activations` section; like every section, each field is a flag
(`reduce_bucket_size` <-> `--reduce-bucket-size`; `stage` is `--zero-stage`). Sizes count elements, not
bytes, as in DeepSpeed.

`--zero-config ds.json` reads the subset of a DeepSpeed config that we implement (`SUPPORTED_KEYS`) and
turns it into flags, which `gpt.arguments` places between a YAML preset's flags and the user's, so the
precedence is preset < JSON < command line. Any other key is an error naming the key and the file,
rather than a setting silently ignored.
"""

from __future__ import annotations

import difflib
import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional, Union

from gpt.errors import ConfigError

ZERO_STAGES = (0, 1, 2, 3)
EXAMPLE_DIR = Path(__file__).resolve().parent.parent / "configs" / "zero"


@dataclass
class ZeroConfig:
    # 0: plain data parallelism on ZeRO's flat buckets; 1: P_os (optimizer states partitioned);
    # 2: P_os+g (and gradients); 3: P_os+g+p (and parameters).
    stage: int = 0
    reduce_bucket_size: int = 500_000_000  # elements per gradient reduce(-scatter)
    allgather_bucket_size: int = 500_000_000  # elements per parameter all-gather after the step
    overlap_comm: bool = True  # reduce gradient buckets while backward still runs
    # Stages 1-2: gather the updated parameters while the next forward runs (Megatron's flag).
    overlap_param_gather: bool = False
    contiguous_gradients: bool = True  # only True is implemented; kept so DeepSpeed configs read as they do
    reduce_scatter: bool = True  # reduce-scatter gradients (False: all-reduce, then keep our shard)
    stage3_prefetch_bucket_size: int = 50_000_000  # elements of parameters fetched ahead (stage 3)
    # Parameters with fewer elements stay whole on every rank (stage 3). DeepSpeed's default is 1e5;
    # ours is 0 so stage 3 partitions everything, as the paper describes.
    stage3_param_persistence_threshold: int = 0
    stage3_max_live_parameters: int = 1_000_000_000  # cap on gathered parameter elements (stage 3)

    def validate(self) -> None:
        if self.stage not in ZERO_STAGES:
            raise ConfigError(f"--zero-stage must be one of 0, 1, 2, 3, got {self.stage}")
        for name in ("reduce_bucket_size", "allgather_bucket_size"):
            if getattr(self, name) < 1:
                raise ConfigError(f"{zero_flag(name)} must be at least 1 (elements), got {getattr(self, name)}")
        for name in ("stage3_prefetch_bucket_size", "stage3_param_persistence_threshold",
                     "stage3_max_live_parameters"):
            if getattr(self, name) < 0:
                raise ConfigError(f"{zero_flag(name)} must be >= 0 (elements), got {getattr(self, name)}")
        if self.overlap_param_gather and self.stage not in (1, 2):
            raise ConfigError(f"--overlap-param-gather applies to ZeRO stages 1-2, not --zero-stage {self.stage} "
                              "(stage 3 gathers ahead with --stage3-prefetch-bucket-size; stage 0 gathers nothing)")
        if not self.contiguous_gradients:
            raise ConfigError("--no-contiguous-gradients is not supported: gradients are always copied into "
                              "contiguous buckets")


@dataclass
class ActivationCheckpointConfig:
    """ZeRO-R's activation memory: checkpointing, partitioned (P_a) and offloaded (P_a+cpu) checkpoints,
    and one contiguous buffer for them (M_D).

    Checks that need the model's depth (`--checkpoint-num-layers`, `--number-checkpoints` against
    `--num-layers`) are in `validate_for_layers`, which `PretrainConfig.validate` calls.
    """

    checkpoint_activations: bool = False  # keep each group's input, recompute the group in backward
    checkpoint_num_layers: int = 1  # transformer blocks per checkpointed group
    partition_activations: bool = False  # P_a: each TP rank keeps 1/TP of every checkpointed input
    cpu_checkpointing: bool = False  # P_a+cpu: checkpointed inputs (or their slices) live in host memory
    contiguous_checkpointing: bool = False  # M_D: one pre-allocated buffer for a micro-batch's checkpoints
    # Checkpoints the contiguous buffer holds; None means one per group, ceil(num_layers / checkpoint_num_layers).
    number_checkpoints: Optional[int] = None
    synchronize_checkpoint_boundary: bool = False  # CUDA synchronize at each checkpoint (debugging)
    profile_checkpointing: bool = False  # time each checkpoint's forward and recompute

    # The options that only mean something with --checkpoint-activations.
    NEEDS_CHECKPOINTING = ("partition_activations", "cpu_checkpointing", "contiguous_checkpointing",
                           "number_checkpoints", "synchronize_checkpoint_boundary", "profile_checkpointing")

    def validate(self) -> None:
        if self.checkpoint_num_layers < 1:
            raise ConfigError(f"--checkpoint-num-layers must be at least 1, got {self.checkpoint_num_layers}")
        if self.number_checkpoints is not None and self.number_checkpoints < 1:
            raise ConfigError(f"--number-checkpoints must be at least 1, got {self.number_checkpoints}")
        if not self.checkpoint_activations:
            for name in self.NEEDS_CHECKPOINTING:
                value = getattr(self, name)
                if value is not None and value is not False:
                    raise ConfigError(f"{activation_flag(name)} needs --checkpoint-activations (add it, or "
                                      f"drop {activation_flag(name)})")

    def validate_for_layers(self, num_layers: int) -> None:
        """The checks against the model's depth; they apply only with --checkpoint-activations."""
        if not self.checkpoint_activations:
            return
        if self.checkpoint_num_layers > num_layers:
            raise ConfigError(f"--checkpoint-num-layers {self.checkpoint_num_layers} is larger than --num-layers "
                              f"{num_layers}; a checkpointed group cannot span more blocks than the model has")
        needed = self.num_checkpoints(num_layers)
        if self.number_checkpoints is not None and self.number_checkpoints < needed:
            raise ConfigError(f"--number-checkpoints {self.number_checkpoints} is fewer than the {needed} "
                              f"checkpoints of --num-layers {num_layers} / --checkpoint-num-layers "
                              f"{self.checkpoint_num_layers} (rounded up); raise it or leave it unset")

    def num_checkpoints(self, num_layers: int) -> int:
        """Checkpointed groups per micro-batch: ceil(num_layers / checkpoint_num_layers)."""
        return -(-num_layers // self.checkpoint_num_layers)

    def buffer_checkpoints(self, num_layers: int) -> int:
        """Checkpoints the contiguous buffer is sized for: --number-checkpoints, else one per group."""
        return self.number_checkpoints if self.number_checkpoints is not None else self.num_checkpoints(num_layers)


def activation_flag(name: str) -> str:
    """The flag of an ActivationCheckpointConfig field."""
    return "--" + name.replace("_", "-")


def zero_flag(name: str) -> str:
    """The flag of a ZeroConfig field."""
    return "--zero-stage" if name == "stage" else "--" + name.replace("_", "-")


# The one list of DeepSpeed keys that --zero-config accepts: key path -> (our flag, kind of value).
# Kinds: "count" (a whole number; 5e8 is fine, 1.5 is not), "number", "bool", and the two fp16 keys
# whose values change meaning on the way ("loss_scale": 0 means dynamic; "scale_power": 2**p), and
# "optional_count" (a whole number, or null for "not set": no flag).
SUPPORTED_KEYS: dict[str, tuple[str, str]] = {
    "zero_optimization.stage": ("--zero-stage", "count"),
    "zero_optimization.reduce_bucket_size": ("--reduce-bucket-size", "count"),
    "zero_optimization.allgather_bucket_size": ("--allgather-bucket-size", "count"),
    "zero_optimization.overlap_comm": ("--overlap-comm", "bool"),
    "zero_optimization.contiguous_gradients": ("--contiguous-gradients", "bool"),
    "zero_optimization.reduce_scatter": ("--reduce-scatter", "bool"),
    "zero_optimization.stage3_prefetch_bucket_size": ("--stage3-prefetch-bucket-size", "count"),
    "zero_optimization.stage3_param_persistence_threshold": ("--stage3-param-persistence-threshold", "count"),
    "zero_optimization.stage3_max_live_parameters": ("--stage3-max-live-parameters", "count"),
    "fp16.enabled": ("--fp16", "bool"),
    "fp16.loss_scale": ("--loss-scale", "loss_scale"),
    "fp16.initial_scale_power": ("--initial-loss-scale", "scale_power"),
    "fp16.loss_scale_window": ("--loss-scale-window", "count"),
    "fp16.hysteresis": ("--hysteresis", "count"),
    "fp16.min_loss_scale": ("--min-loss-scale", "number"),
    "bf16.enabled": ("--bf16", "bool"),
    "activation_checkpointing.partition_activations": ("--partition-activations", "bool"),
    "activation_checkpointing.cpu_checkpointing": ("--cpu-checkpointing", "bool"),
    "activation_checkpointing.contiguous_memory_optimization": ("--contiguous-checkpointing", "bool"),
    "activation_checkpointing.number_checkpoints": ("--number-checkpoints", "optional_count"),
    "activation_checkpointing.synchronize_checkpoint_boundary": ("--synchronize-checkpoint-boundary", "bool"),
    "activation_checkpointing.profile": ("--profile-checkpointing", "bool"),
    "gradient_clipping": ("--clip-grad", "number"),
    "train_micro_batch_size_per_gpu": ("--micro-batch-size", "count"),
    "train_batch_size": ("--global-batch-size", "count"),
    "gradient_accumulation_steps": ("--gradient-accumulation-steps", "count"),
}
_SECTIONS = {key.split(".")[0] for key in SUPPORTED_KEYS if "." in key}

# DeepSpeed keys we know but do not implement. They are reported as unsupported; any other key as
# unknown (most likely a typo), with the nearest supported key as a hint.
DEEPSPEED_UNSUPPORTED_KEYS = frozenset({
    "optimizer", "scheduler", "steps_per_print", "wall_clock_breakdown", "memory_breakdown", "dump_state",
    "prescale_gradients", "gradient_predivide_factor", "communication_data_type", "sparse_gradients",
    "amp", "bfloat16", "flops_profiler", "tensorboard", "wandb", "csv_monitor",
    "comms_logger", "zero_allow_untested_optimizer", "zero_force_ds_cpu_optimizer", "elasticity",
    "autotuning", "aio", "checkpoint", "data_types", "compression_training", "data_efficiency", "pipeline",
    "fp16.auto_cast", "fp16.consecutive_hysteresis", "fp16.fp16_master_weights_and_grads",
    "bf16.immediate_grad_update",
    "zero_optimization.offload_param", "zero_optimization.offload_optimizer", "zero_optimization.cpu_offload",
    "zero_optimization.cpu_offload_params", "zero_optimization.cpu_offload_use_pin_memory",
    "zero_optimization.allgather_partitions", "zero_optimization.round_robin_gradients",
    "zero_optimization.sub_group_size", "zero_optimization.stage3_max_reuse_distance",
    "zero_optimization.stage3_gather_16bit_weights_on_model_save",
    "zero_optimization.stage3_gather_fp16_weights_on_model_save", "zero_optimization.elastic_checkpoint",
    "zero_optimization.load_from_fp32_weights", "zero_optimization.ignore_unused_parameters",
    "zero_optimization.legacy_stage1", "zero_optimization.zero_hpz_partition_size",
    "zero_optimization.zero_quantized_weights", "zero_optimization.zero_quantized_gradients",
    "zero_optimization.mics_shard_size", "zero_optimization.mics_hierarchical_params_gather",
    "zero_optimization.memory_efficient_linear", "zero_optimization.use_multi_rank_bucket_allreduce",
    "zero_optimization.stage3_module_granularity_threshold",
})


def deepspeed_config_to_flags(config: dict, source: str) -> list[str]:
    """The flags equivalent to a DeepSpeed config (a parsed JSON object); `source` names it in errors.

    Only the keys present become flags, so the rest keep their preset or default values. A config that
    enables one of fp16/bf16 also disables the other (the two are exclusive, and a preset may have
    turned the other on); one that enables both is an error.

    In DeepSpeed the `activation_checkpointing` block only configures checkpointing; Megatron's
    --checkpoint-activations turns it on. Here a block with any option on (a true flag, or a
    `number_checkpoints` that is not null) also emits --checkpoint-activations, so the JSON takes
    effect on its own; a block with every option off or null leaves checkpointing as it was, and
    --no-checkpoint-activations on the command line still wins (and then rejects the options).
    """
    if not isinstance(config, dict):
        raise ConfigError(f"{source}: a DeepSpeed config must be a JSON object")
    values: dict[str, Any] = {}
    for key, value in config.items():
        if key in _SECTIONS:
            if not isinstance(value, dict):
                raise ConfigError(f'{source}: "{key}" must be an object, got {value!r}')
            for sub_key, sub_value in value.items():
                values[_supported(f"{key}.{sub_key}", source)] = sub_value
        else:
            values[_supported(key, source)] = value

    fp16, bf16 = values.get("fp16.enabled"), values.get("bf16.enabled")
    if fp16 is True and bf16 is True:
        raise ConfigError(f"{source}: fp16.enabled and bf16.enabled are both true; choose one precision")
    argv: list[str] = []
    for key, value in values.items():
        argv += _to_flag(key, value, source)
    if fp16 is True and bf16 is None:
        argv.append("--no-bf16")
    if bf16 is True and fp16 is None:
        argv.append("--no-fp16")
    if any(key.startswith("activation_checkpointing.") and value is not None and value is not False
           for key, value in values.items()):
        argv.append("--checkpoint-activations")
    return argv


def load_deepspeed_config(path: Union[str, Path]) -> list[str]:
    """Read a DeepSpeed JSON config and return the equivalent flags (see `deepspeed_config_to_flags`)."""
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as error:
        raise ConfigError(f"--zero-config {path}: cannot read it ({error.strerror or error})") from None
    except UnicodeDecodeError as error:
        raise ConfigError(f"{path}: not UTF-8 text ({error.reason} at byte {error.start})") from None
    try:
        config = json.loads(text, object_pairs_hook=_reject_duplicate_keys)
    except json.JSONDecodeError as error:
        raise ConfigError(f"{path}: not valid JSON ({error})") from None
    except RecursionError:
        raise ConfigError(f"{path}: nested too deeply to be a DeepSpeed config") from None
    except ConfigError as error:
        raise ConfigError(f"{path}: {error}") from None
    return deepspeed_config_to_flags(config, str(path))


def resolve_zero_config(name_or_path: str) -> Path:
    """A path to a JSON file, or the name of an example in configs/zero (`stage2` -> stage2.json)."""
    path = Path(name_or_path)
    if path.is_file() or path.suffix == ".json" or path.parent != Path("."):
        return path
    example = EXAMPLE_DIR / f"{name_or_path}.json"
    if example.is_file():
        return example
    names = ", ".join(sorted(p.stem for p in EXAMPLE_DIR.glob("*.json")))
    raise ConfigError(f"--zero-config {name_or_path}: no such file, nor an example in configs/zero ({names})")


def _supported(key: str, source: str) -> str:
    if key in SUPPORTED_KEYS:
        return key
    if key in DEEPSPEED_UNSUPPORTED_KEYS or key.split(".")[0] in DEEPSPEED_UNSUPPORTED_KEYS:
        raise ConfigError(f'{source}: unsupported key "{key}" (a DeepSpeed setting this codebase does not '
                          f'implement; remove it)')
    nearest = difflib.get_close_matches(key, SUPPORTED_KEYS, n=1)
    hint = f'did you mean "{nearest[0]}"?' if nearest else \
        "supported: " + ", ".join(sorted({k.split(".")[0] for k in SUPPORTED_KEYS}))
    raise ConfigError(f'{source}: unknown key "{key}" ({hint})')


def _to_flag(key: str, value: Any, source: str) -> list[str]:
    flag, kind = SUPPORTED_KEYS[key]
    if kind == "bool":
        if not isinstance(value, bool):
            raise ConfigError(f"{source}: {key} must be true or false, got {_show(value)}")
        return [flag if value else "--no-" + flag[2:]]
    if kind == "count":
        return [flag, str(_whole_number(key, value, source))]
    if kind == "optional_count":
        return [] if value is None else [flag, str(_whole_number(key, value, source))]
    number = _number(key, value, source)
    if kind == "loss_scale":
        if number < 0:
            raise ConfigError(f"{source}: {key} must be >= 0 (0 means dynamic loss scaling), got {_show(value)}")
        return [flag, repr(float(number))] if number > 0 else []  # dynamic: --loss-scale stays unset
    if kind == "scale_power":
        power = _whole_number(key, value, source)
        if not 0 <= power <= 64:
            raise ConfigError(f"{source}: {key} must be a whole number in 0..64 (the initial scale is "
                              f"2**power), got {_show(value)}")
        return [flag, repr(float(2 ** power))]
    return [flag, repr(float(number))]


def _number(key: str, value: Any, source: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise ConfigError(f"{source}: {key} must be a number, got {_show(value)}")
    return value


def _whole_number(key: str, value: Any, source: str) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or \
            (isinstance(value, float) and not value.is_integer()):
        raise ConfigError(f"{source}: {key} must be a whole number (5e8 is fine, 1.5 is not), got {_show(value)}")
    return int(value)


def _show(value: Any) -> str:
    text = json.dumps(value)
    return text + ' (the HF Trainer fills in "auto"; write the value here)' if value == "auto" else text


def _reject_duplicate_keys(pairs: list[tuple[str, Any]]) -> dict:
    result: dict = {}
    for key, value in pairs:
        if key in result:
            raise ConfigError(f'key "{key}" appears twice')
        result[key] = value
    return result
