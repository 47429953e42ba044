"""ZeRO settings: the `zero` and `activations` sections of the configuration.

`ZeroConfig` is the `zero` section of `PretrainConfig` and `ActivationCheckpointConfig` (ZeRO-R's
activation checkpointing) its `activations` section; like every section, each field is a flag
(`reduce_bucket_size` <-> `--reduce-bucket-size`; `stage` is `--zero-stage`). Sizes count elements, not
bytes, as in DeepSpeed.

A DeepSpeed JSON (`--zero-config ds.json`) becomes flags in `arguments/deepspeed_json.py`; every key
DeepSpeed documents is classified in `arguments/deepspeed_keys.py`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

from base.errors import ConfigError

ZERO_STAGES = (0, 1, 2, 3)


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
