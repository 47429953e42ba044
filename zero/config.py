"""ZeRO settings: `ZeroConfig` (the `zero` section, --zero-stage and friends) and `ActivationCheckpointConfig` (ZeRO-R's
`activations` section). Sizes count elements, not bytes, as in DeepSpeed."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

from base.errors import ConfigError
from base.options import count, flag_of_setting, option

ZERO_STAGES = (0, 1, 2, 3)
# Megatron-LM's --recompute-method choices
RECOMPUTE_METHODS = ("uniform", "block")


@dataclass(frozen=True)
class ZeroConfig:
    stage: int = option(0, flags=("--zero-stage",), choices=ZERO_STAGES,
                        help="0: data parallelism on flat buckets; 1: partition optimizer states (P_os); "
                             "2: and gradients (P_os+g); 3: and parameters (P_os+g+p)")
    reduce_bucket_size: int = option(500_000_000, type=count, help="elements per gradient reduce(-scatter)",
                                     aliases={"--zero-reduce-bucket-size": "DeepSpeed-Megatron",
                                              "--ddp-bucket-size": "Megatron-LM"})
    allgather_bucket_size: int = option(500_000_000, type=count,
                                        help="elements per parameter all-gather after the optimizer step",
                                        aliases={"--zero-allgather-bucket-size": "DeepSpeed-Megatron"})
    overlap_comm: bool = option(True, help="reduce gradient buckets while backward is still running",
                                aliases={"--overlap-grad-reduce": "Megatron-LM"})
    distributed_optimizer_instances: int = option(
        1, flags=("--num-distributed-optimizer-instances",), type=count,
        help="stages 1-3: shard the optimizer state (and gradients, parameters) within N equal blocks of the "
             "data-parallel ranks and replicate it across them (Megatron's distributed-optimizer instances, "
             "ZeRO++'s hpZ): the reduce-scatter and all-gather stay inside a block, the reduced shard is "
             "all-reduced across blocks; 1 shards over every data-parallel rank")
    overlap_param_gather: bool = option(
        False, help="stages 1-2: start the parameter all-gather after the step and wait for each bucket just before "
                    "the forward that needs it (Megatron's overlap-param-gather); stage 3 always gathers ahead "
                    "(--stage3-prefetch-bucket-size), so there it changes nothing, as Megatron-FSDP turns it on "
                    "itself for optim_grads_params")
    contiguous_gradients: bool = option(
        True, help="copy gradients into contiguous buckets (always on; --no- is rejected)",
        aliases={"--zero-contigious-gradients": "DeepSpeed-Megatron (their spelling)"})
    reduce_scatter: bool = option(
        True, help="reduce-scatter gradients (--no-: all-reduce, then keep this rank's shard)",
        aliases={"--zero-reduce-scatter": "DeepSpeed-Megatron"})
    stage3_prefetch_bucket_size: int = option(50_000_000, type=count,
                                              help="stage 3: elements of parameters fetched ahead of their use")
    # Ours is 0 (DeepSpeed's 1e5): stage 3 partitions everything, as the paper.
    stage3_param_persistence_threshold: int = option(
        0, type=count, help="stage 3: parameters with fewer elements stay whole on every rank (DeepSpeed's default "
                            "is 1e5; 0 partitions everything, as in the paper)")
    stage3_max_live_parameters: int = option(1_000_000_000, type=count,
                                             help="stage 3: most parameter elements gathered at once")
    # Megatron-LM's --no-gradient-accumulation-fusion: on by default.
    gradient_accumulation_fusion: bool = option(
        True, help="add each tensor-parallel linear's weight gradient into its fp32 main gradient inside the GEMM "
                   "(Megatron-LM's gradient accumulation fusion; the start-up line names the path); "
                   "--no-gradient-accumulation-fusion: autograd's weight gradient, then an add")

    offload_optimizer: bool = option(
        False, help="stages 1-3: keep the fp32 master partition and the Adam moments in host memory and run the "
                    "optimizer step there (ZeRO-Offload)",
        # Megatron-DeepSpeed's --cpu-optimizer builds DeepSpeedCPUAdam, which runs only with DeepSpeed's offload on.
        aliases={"--cpu-optimizer": "Megatron-DeepSpeed (its CPU Adam steps the offloaded optimizer states)"})
    optimizer_offload_fraction: float = option(
        1.0, help="with --offload-optimizer (Megatron-LM's --optimizer-cpu-offload): the fraction of this rank's "
                  "optimizer partition whose fp32 master, Adam moments and step live on the host, taken as Megatron-LM's "
                  "HybridDeviceOptimizer takes it (whole parameters in order until that share of the elements); the "
                  "rest steps on the device. 1.0: all of it (ZeRO-Offload); 0.0: none (zero/hybrid_offload.py)")
    offload_param: bool = option(
        False, help="stage 3: keep this rank's 16-bit parameter shard in host memory; each gather copies its "
                    "piece to the device first (ZeRO-3 Offload)")
    offload_pin_memory: bool = option(
        True, help="with --offload-optimizer / --offload-param: page-lock the host buffers where CUDA is present (faster copies; "
                   "DeepSpeed's pin_memory, whose default there is false)")
    sub_group_size: int = option(1_000_000_000, type=count,
                                 help="with --offload-optimizer of the whole partition (--optimizer-offload-fraction "
                                      "1): partition elements the host step updates at once (bounds its gradient "
                                      "buffer; DeepSpeed's default 1e9)")

    def validate(self) -> None:
        if self.stage not in ZERO_STAGES:
            raise ConfigError(f"--zero-stage must be one of 0, 1, 2, 3, got {self.stage}", flags=("--zero-stage",))
        if self.sub_group_size < 1:
            raise ConfigError(f"--sub-group-size must be at least 1 (elements), got {self.sub_group_size}",
                              flags=("--sub-group-size",))
        if self.offload_param and self.stage != 3:
            raise ConfigError(f"--offload-param needs --zero-stage 3 (only stage 3 partitions the parameters), got "
                              f"--zero-stage {self.stage}: add --zero-stage 3, or drop --offload-param",
                              flags=("--offload-param", "--zero-stage"))
        if self.offload_optimizer and self.stage == 0:
            raise ConfigError("--offload-optimizer needs --zero-stage 1, 2 or 3 (DeepSpeed offloads only its ZeRO "
                              "optimizer, which stage 0 does not build): add --zero-stage 1, or drop --offload-optimizer",
                              flags=("--offload-optimizer", "--zero-stage"))
        if not 0.0 <= self.optimizer_offload_fraction <= 1.0:
            raise ConfigError(f"--optimizer-offload-fraction must be a fraction from 0 to 1, got "
                              f"{self.optimizer_offload_fraction}", flags=("--optimizer-offload-fraction",))
        if self.distributed_optimizer_instances < 1:
            raise ConfigError(f"--num-distributed-optimizer-instances must be at least 1, got "
                              f"{self.distributed_optimizer_instances}", flags=("--num-distributed-optimizer-instances",))
        for name in ("reduce_bucket_size", "allgather_bucket_size"):
            if getattr(self, name) < 1:
                raise ConfigError(f"{zero_flag(name)} must be at least 1 (elements), got {getattr(self, name)}",
                                  flags=(zero_flag(name),))
        for name in ("stage3_prefetch_bucket_size", "stage3_param_persistence_threshold",
                     "stage3_max_live_parameters"):
            if getattr(self, name) < 0:
                raise ConfigError(f"{zero_flag(name)} must be >= 0 (elements), got {getattr(self, name)}",
                                  flags=(zero_flag(name),))
        # Megatron-LM takes --overlap-param-gather only with the distributed optimizer or FSDP.
        if self.overlap_param_gather and self.stage == 0:
            raise ConfigError("--overlap-param-gather applies to ZeRO stages 1-3, not --zero-stage 0 (stage 0 "
                              "gathers no parameters; Megatron-LM takes it only with the distributed optimizer or "
                              "Megatron-FSDP)", flags=("--overlap-param-gather", "--zero-stage"))
        if not self.contiguous_gradients:
            raise ConfigError("--no-contiguous-gradients is not supported: gradients are always copied into "
                              "contiguous buckets", flags=("--no-contiguous-gradients",))


@dataclass(frozen=True)
class ActivationCheckpointConfig:
    """ZeRO-R's activation memory: checkpointing, P_a, P_a+cpu and one contiguous buffer (M_D)."""

    checkpoint_activations: bool = option(
        False, help="keep only each group's input in forward and recompute the group in backward")
    checkpoint_num_layers: int = option(1, help="transformer blocks per checkpointed group (--recompute-method "
                                                "uniform), or blocks checkpointed at the start of each model chunk "
                                                "(block)",
                                        aliases={"--recompute-num-layers": "Megatron-LM",
                                                 "--activations-checkpoint-num-layers": "Megatron-LM 2.x"})
    partition_activations: bool = option(
        False, help="P_a: each tensor-parallel rank keeps 1/TP of every checkpointed input and they are all-gathered "
                    "before the recompute",
        aliases={"--distribute-saved-activations": "Megatron-LM",
                 "--distribute-checkpointed-activations": "Megatron-LM 2.x and DeepSpeed-Megatron"})
    cpu_checkpointing: bool = option(
        False, help="P_a+cpu: keep checkpointed inputs (their 1/TP slices with --partition-activations) in host "
                    "memory",
        aliases={"--checkpoint-in-cpu": "DeepSpeed-Megatron"})
    contiguous_checkpointing: bool = option(
        False, help="M_D: copy a micro-batch's checkpoints into one pre-allocated buffer (DeepSpeed's "
                    "contiguous_memory_optimization)",
        aliases={"--contigious-checkpointing": "DeepSpeed-Megatron (their spelling)"})
    number_checkpoints: Optional[int] = option(
        None, help="checkpoints the contiguous buffer holds (None: one per checkpointed group, ceil(num layers / "
                   "checkpoint num layers) under --recompute-method uniform)")
    synchronize_checkpoint_boundary: bool = option(False, help="CUDA synchronize at each checkpoint boundary "
                                                               "(debugging)",
                                                   aliases={"--synchronize-each-layer": "DeepSpeed-Megatron"})
    profile_checkpointing: bool = option(False, help="time each checkpoint's forward and recompute (DeepSpeed's "
                                                     "profile)")
    # Last, so that a positional ActivationCheckpointConfig(True, 2, ...) keeps its meaning
    recompute_method: str = option(
        "uniform", choices=RECOMPUTE_METHODS, aliases={"--activations-checkpoint-method": "Megatron-LM 2.x"},
        help="with --checkpoint-activations, which blocks are recomputed, as in Megatron-LM: uniform, every block, in "
             "groups of --checkpoint-num-layers; block, only the first --checkpoint-num-layers blocks of each "
             "pipeline stage's model chunk, one checkpoint each, the rest keeping their activations")

    NEEDS_CHECKPOINTING = ("partition_activations", "cpu_checkpointing", "contiguous_checkpointing",
                           "number_checkpoints", "synchronize_checkpoint_boundary", "profile_checkpointing")

    def validate(self) -> None:
        # Megatron-Core's block method takes 0; uniform groups of 0 blocks would never advance.
        if self.checkpoint_num_layers < (0 if self.recompute_method == "block" else 1):
            raise ConfigError(f"--checkpoint-num-layers must be at least 1 (0 only under --recompute-method block: "
                              f"no block recomputed), got {self.checkpoint_num_layers}",
                              flags=("--checkpoint-num-layers", "--recompute-method"))
        if self.number_checkpoints is not None and self.number_checkpoints < 1:
            raise ConfigError(f"--number-checkpoints must be at least 1, got {self.number_checkpoints}",
                              flags=("--number-checkpoints",))
        if not self.checkpoint_activations:
            for name in self.NEEDS_CHECKPOINTING:
                value = getattr(self, name)
                if value is not None and value is not False:
                    raise ConfigError(f"{activation_flag(name)} needs --checkpoint-activations (add it, or "
                                      f"drop {activation_flag(name)})",
                                      flags=(activation_flag(name), "--checkpoint-activations"))

    def validate_for_layers(self, num_layers: int) -> None:
        """The checks against the model's depth (only with --checkpoint-activations)."""
        if not self.checkpoint_activations:
            return
        if self.recompute_method == "uniform" and self.checkpoint_num_layers > num_layers:
            raise ConfigError(f"--checkpoint-num-layers {self.checkpoint_num_layers} is larger than --num-layers "
                              f"{num_layers}; a checkpointed group cannot span more blocks than the model has",
                              flags=("--checkpoint-num-layers", "--num-layers"))
        needed = self.num_checkpoints(num_layers)
        if self.number_checkpoints is not None and self.number_checkpoints < needed:
            raise ConfigError(f"--number-checkpoints {self.number_checkpoints} is fewer than the {needed} "
                              f"checkpoints of --num-layers {num_layers} / --checkpoint-num-layers "
                              f"{self.checkpoint_num_layers} (rounded up); raise it or leave it unset",
                              flags=("--number-checkpoints", "--num-layers", "--checkpoint-num-layers"))

    def checkpointed_groups(self, chunk_layers: int) -> list[tuple[int, int, bool]]:
        """A model chunk's block groups as (first, end, checkpointed), as Megatron-Core's checkpointed_forward runs
        them: uniform groups of checkpoint_num_layers, or under block the first checkpoint_num_layers blocks alone."""
        size = self.checkpoint_num_layers
        if self.recompute_method == "block":
            return [(layer, layer + 1, layer < size) for layer in range(chunk_layers)]
        return [(first, min(first + size, chunk_layers), True) for first in range(0, chunk_layers, size)]

    def num_checkpoints(self, num_layers: int) -> int:
        """Checkpointed groups per micro-batch of one model chunk of `num_layers` blocks."""
        return sum(checkpointed for _, _, checkpointed in self.checkpointed_groups(num_layers))

    def buffer_checkpoints(self, *chunk_layers: int) -> int:
        """Checkpoints one slot set of the contiguous buffer holds."""
        made = sum(self.num_checkpoints(layers) for layers in chunk_layers)
        if self.number_checkpoints is None:
            return made
        if self.number_checkpoints < made:  # a stage's chunks can make more than the whole model's groups
            raise ConfigError(f"--number-checkpoints {self.number_checkpoints} is fewer than the {made} checkpoints "
                              f"a micro-batch's forward makes on this pipeline stage (model chunks of "
                              f"{', '.join(map(str, chunk_layers))} layers, --checkpoint-num-layers "
                              f"{self.checkpoint_num_layers} a group within a chunk); raise it or leave it unset",
                              flags=("--number-checkpoints",))
        return self.number_checkpoints


def activation_flag(name: str) -> str:
    return flag_of_setting(ActivationCheckpointConfig, name)


def zero_flag(name: str) -> str:
    return flag_of_setting(ZeroConfig, name)
