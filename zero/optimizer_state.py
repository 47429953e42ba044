"""How the sharded optimizer describes its own state to a checkpoint, so the checkpoint code never
reads the optimizer's internals (its flat layout, storages, AdamW groups or loss scaler).

The idea is Megatron-Core's `DistributedOptimizer.sharded_state_dict` and torchtitan's `Stateful`: the object that
owns the shards says what they are. The interface (`CheckpointableOptimizer`):

    model_state_dict(model)            every parameter whole, by name: what the model file holds
    sharded_state_dict(model)          this rank's partition tensors, the fragment table saying which
                                       parameter elements they hold, and the scalar state
    load_sharded_state_dict(tensors)   tensors laid out by that same fragment table back in, then the
                                       16-bit parameters published from them
    expert_model_state_dict(model)     optional, where ranks hold different parameters (zero/experts.py):
                                       (EP rank, this rank's experts whole by name) on the rank that writes
                                       them, None on the others

How these are written (file names, tensor names, metadata keys) is checkpoint/format.py's business; this module
says only what they are. Fragments are named by the model's parameter names, which is why the calls take the
model: the optimizer knows its parameters only as tensors."""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple, Optional, Protocol

import torch
from torch import nn

# The flat fp32 tensors of a partition, in partition coordinates. "master" alone restores the weights;
# the moments belong with it when an optimizer state is resumed. AdEMAMix (--optimizer ademamix) adds its
# slow momentum.
PARTITION_TENSORS = ("master", "exp_avg", "exp_avg_sq")
# Muon (--optimizer muon, zero/muon.py) keeps its momentum in exp_avg at its matrices' elements: Adam's tensors.
PARTITION_TENSORS_OF = {"adam": PARTITION_TENSORS, "ademamix": PARTITION_TENSORS + ("exp_avg_slow",),
                        "muon": PARTITION_TENSORS,
                        # Sophia-G (zero/sophia.py): its momentum in exp_avg, its Hessian estimate in exp_avg_sq
                        "sophiag": PARTITION_TENSORS}


class NamedFragment(NamedTuple):
    """Elements [param_offset, param_offset + numel) of parameter `name`, flattened at its TP-local
    shape, held at [partition_offset, partition_offset + numel) of this rank's partition. A tuple, so
    a fragment table serializes to JSON as lists `[name, param_offset, partition_offset, numel]`."""
    name: str
    param_offset: int
    partition_offset: int
    numel: int


@dataclass(frozen=True)
class ShardedOptimizerState:
    """One rank's optimizer state as a checkpoint needs it. `tensors` are the live partition tensors,
    not copies (a copy would double the largest state a rank holds): read them before the next step."""
    tensors: dict[str, torch.Tensor]  # PARTITION_TENSORS_OF[optimizer] -> flat fp32 tensor
    fragments: list[NamedFragment]    # which parameter elements the partition holds; padding is in none
    replicated: bool                  # every DP rank holds this same, whole partition (stage 0): one copy will do
    zero_stage: int                   # for the record; a checkpoint loads at any stage
    adam_step: int                    # AdamW updates applied (skipped fp16 steps do not count)
    loss_scaler_type: str             # a saved scaler state applies only to a scaler of the same type
    loss_scaler_state: dict
    param_dtype: torch.dtype          # the training dtype the master is published into
    optimizer: str = "adam"           # --optimizer: which moments `tensors` holds (PARTITION_TENSORS_OF)


class CheckpointableOptimizer(Protocol):
    """All that checkpoint/ asks of an optimizer (zero.optimizer.ShardedAdamW implements it)."""

    def model_state_dict(self, model: nn.Module, keep: bool = True) -> dict[str, torch.Tensor]:
        """Every parameter whole (this TP rank's piece), as CPU copies in the training dtype, by name.
        Every DP rank must call it (stage 3 gathers); with keep=False a rank only takes part."""

    def sharded_state_dict(self, model: nn.Module) -> ShardedOptimizerState:
        """This rank's partition and scalar state, fragments named by `model`'s parameter names."""

    def load_sharded_state_dict(self, tensors: dict[str, torch.Tensor], adam_step: Optional[int] = None,
                                loss_scaler_state: Optional[dict] = None) -> None:
        """Restore the partition from `tensors` (see ShardedAdamW.load_sharded_state_dict)."""

    def expert_model_state_dict(self, model: nn.Module) -> Optional[tuple[int, dict[str, torch.Tensor]]]:
        """(this rank's expert-parallel rank, its experts whole by global name) where the optimizer keeps the experts
        apart (zero/experts.py) and this rank writes them; None otherwise: this default keeps none apart, and
        model_state_dict holds every parameter."""
        return None


def check_partition_tensors(tensors: dict[str, torch.Tensor], shapes: dict[str, torch.Size]) -> None:
    """`tensors` must be "master" alone or all of the partition's tensors (`shapes`' keys), each of its
    partition's shape: a master loaded without its moments is a fine-tune, moments without their master a
    mistake."""
    keys = set(tensors)
    if keys not in ({"master"}, set(shapes)):
        raise ValueError(f"a partition loads as 'master' alone or as all of {', '.join(shapes)}; "
                         f"got {', '.join(sorted(keys)) or 'nothing'}")
    for key, tensor in tensors.items():
        if tensor.shape != shapes[key]:
            raise ValueError(f"{key}: shape {list(tensor.shape)}, this rank's partition is {list(shapes[key])}")
