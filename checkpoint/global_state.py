"""A checkpoint seen as whole tensors: the one interface every format's reader gives the loader. A `GlobalStateSource`
holds every tensor under this project's parameter name at the global shape a one-rank run holds, read a slice at a time;
a reader translates its format's fused or split projections, layer numbering and expert naming into that form.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional, Protocol

import torch

# The weights as trained ("model") and the fp32 optimizer states, keyed as zero/optimizer_state.py keys a partition.
MODEL_KEY = "model"


@dataclass(frozen=True)
class GlobalTensorInfo:
    """One tensor's whole shape and stored dtype; for a vocabulary tensor, its real rows or the multiple its rows were
    padded to (Megatron-LM: --make-vocab-size-divisible-by x TP size)."""
    shape: tuple[int, ...]
    dtype: torch.dtype
    real_rows: Optional[int] = None
    rows_multiple: Optional[int] = None


@dataclass(frozen=True)
class SourceProgress:
    """Where the saved run stood, as far as the format records it (None: not recorded, said at the load)."""
    iteration: int
    consumed_samples: Optional[int] = None
    schedule_samples: Optional[int] = None  # the learning-rate schedule's position in samples
    optimizer_step: Optional[int] = None    # updates applied (Adam's bias correction)
    loss_scaler_state: Optional[dict] = None
    # Format-specific values; the loader reads "loss_scaler_type" (restored only into the same type) and "optimizer"
    # (moments of another --optimizer are refused).
    extra: dict = field(default_factory=dict)


class GlobalStateSource(Protocol):
    """A checkpoint as global tensors by this project's names; a format overrides the optional parts it carries."""

    path: Path        # the iteration directory (or file) the source reads
    format_name: str  # for messages: "zero-gpt", "megatron torch_dist", "deepspeed zero-2", ...
    bytes_read: int
    # Whether saves hold every router's expert bias (checkpoint/router_state.py).
    saves_expert_bias: bool = False

    def keys(self) -> tuple[str, ...]:
        """MODEL_KEY and/or "master", "exp_avg", "exp_avg_sq" (, "exp_avg_slow")."""

    def tensors(self, key: str) -> dict[str, GlobalTensorInfo]:
        """Every tensor of `key` by parameter name, at its global shape."""

    def read(self, key: str, name: str, region: tuple[slice, ...]) -> torch.Tensor:
        """The `region` (one slice per dimension, global coordinates) of tensor `name`, in its stored dtype."""

    def progress(self) -> SourceProgress:
        """The iteration and the counters the run continues from."""

    def not_carried(self) -> list[str]:
        """What the checkpoint holds that this project does not carry over (said in one start-up line)."""

    def optimizer_not_read(self) -> Optional[str]:
        """Why the held optimizer states cannot be read (a resume of them is refused); None where read or absent."""
        return None

    def expert_biases(self) -> Optional[dict[str, list]]:
        """The routers' expert bias by "<router>.expert_bias"; None where not carried."""
        return None

    def fp8_histories(self) -> Optional[dict[str, dict]]:
        """Delayed FP8 scaling's amax histories and scales (checkpoint/fp8_state.py); None where not carried."""
        return None

    def restore_random_states(self, rng, state, log=print) -> None:
        """This rank's random streams where the layout allows; otherwise say so once and start from --seed."""
        if state.is_first_rank:
            log(f" note: {self.path} ({self.format_name}) holds no random states this run can take; the random "
                f"streams start from --seed", flush=True)


def megatron_rows_multiple(args) -> Optional[int]:
    """The multiple a Megatron-LM run padded its vocabulary to, from its saved args; None where they do not say."""
    divisor = getattr(args, "make_vocab_size_divisible_by", None)
    tp = getattr(args, "tensor_model_parallel_size", None)
    valid = all(isinstance(value, int) and not isinstance(value, bool) and value > 0 for value in (divisor, tp))
    return divisor * tp if valid else None
