"""How the sharded optimizer describes its own state to a checkpoint (`CheckpointableOptimizer`: whole parameters, this
rank's partition and its fragment table), so checkpoint/ never reads the optimizer's internals."""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple, Optional, Protocol

import torch
from torch import nn

# "master" alone restores the weights; the moments come with a resumed optimizer state.
PARTITION_TENSORS = ("master", "exp_avg", "exp_avg_sq")
PARTITION_TENSORS_OF = {"adam": PARTITION_TENSORS, "ademamix": PARTITION_TENSORS + ("exp_avg_slow",),
                        "muon": PARTITION_TENSORS,
                        "sophiag": PARTITION_TENSORS}


class NamedFragment(NamedTuple):
    """A piece of parameter `name` at an offset of this rank's partition; a tuple, so it serializes to JSON as a
    list."""
    name: str
    param_offset: int
    partition_offset: int
    numel: int


@dataclass(frozen=True)
class ShardedOptimizerState:
    """One rank's optimizer state; `tensors` are live, not copies: read them before the next step."""
    tensors: dict[str, torch.Tensor]  # PARTITION_TENSORS_OF[optimizer] -> flat fp32
    fragments: list[NamedFragment]    # padding is in none
    replicated: bool                  # stage 0: every DP rank holds the same partition
    zero_stage: int                   # a checkpoint loads at any stage
    adam_step: int                    # skipped fp16 steps do not count
    loss_scaler_type: str
    loss_scaler_state: dict
    param_dtype: torch.dtype
    optimizer: str = "adam"


class CheckpointableOptimizer(Protocol):
    """All that checkpoint/ asks of an optimizer (zero.optimizer.ShardedAdamW implements it)."""

    def model_state_dict(self, model: nn.Module, keep: bool = True) -> dict[str, torch.Tensor]:
        """Every parameter whole (this TP rank's piece) as CPU copies, by name; every DP rank calls it."""

    def sharded_state_dict(self, model: nn.Module) -> ShardedOptimizerState:
        """This rank's partition and scalar state, with named fragments."""

    def load_sharded_state_dict(self, tensors: dict[str, torch.Tensor], adam_step: Optional[int] = None,
                                loss_scaler_state: Optional[dict] = None) -> None:
        """Restore the partition from `tensors`."""

    def expert_model_state_dict(self, model: nn.Module) -> Optional[tuple[int, dict[str, torch.Tensor]]]:
        """(EP rank, this rank's experts by name) where experts are kept apart and this rank writes them, else None."""
        return None


def check_partition_tensors(tensors: dict[str, torch.Tensor], shapes: dict[str, torch.Size]) -> None:
    """`tensors` must be "master" alone or all of the partition's tensors."""
    keys = set(tensors)
    if keys not in ({"master"}, set(shapes)):
        raise ValueError(f"a partition loads as 'master' alone or as all of {', '.join(shapes)}; "
                         f"got {', '.join(sorted(keys)) or 'nothing'}")
    for key, tensor in tensors.items():
        if tensor.shape != shapes[key]:
            raise ValueError(f"{key}: shape {list(tensor.shape)}, this rank's partition is {list(shapes[key])}")
