"""A checkpoint seen as whole tensors: the one interface every format's reader gives the loader.

A checkpoint in any format (ours, Megatron-LM's torch_dist, DeepSpeed's ZeRO or universal files, a Hugging Face
folder's weights) is opened as a `GlobalStateSource`: every tensor under this project's parameter name, at its
*global* shape, read a slice at a time, as torchtitan's DCP state dicts: each rank asks its own regions (the rule:
parallel/sharding.py).

The global form of a tensor is what a one-rank run (TP 1, PP 1, EP 1, no ZeRO) of the same model holds
under that name: the parameter's `model.named_parameters()` tensor, and the optimizer's states of the same
shape (fp32 master, Adam's moments). A reader of another framework's files translates into that form
(fused or split projections, layer numbering, expert naming); nothing downstream knows the format.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional, Protocol

import torch

# What a source may hold per parameter: the weights as trained ("model", in the training dtype) and the
# optimizer's fp32 states, keyed as zero/optimizer_state.py keys a partition (PARTITION_TENSORS_OF).
MODEL_KEY = "model"


@dataclass(frozen=True)
class GlobalTensorInfo:
    """One tensor of a source: its whole shape and the dtype it is stored in; for a vocabulary tensor what the format
    says of its rows: `real_rows`, the checkpoint's vocabulary (ours records it), or `rows_multiple`, what its
    vocabulary was padded to a multiple of (Megatron-LM's args: --make-vocab-size-divisible-by x its TP size)."""
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
    loss_scaler_state: Optional[dict] = None  # zero/loss_scaler.py's state_dict form
    # format-specific values a start-up line may name; the loader (checkpoint/global_load.py) reads two when given:
    # "loss_scaler_type" (the scaler class the state is of: it is restored only into the same type) and
    # "optimizer" (the --optimizer the moments are of: adam, ademamix, muon; another one is refused)
    extra: dict = field(default_factory=dict)


class GlobalStateSource(Protocol):
    """A checkpoint as global tensors by this project's names (see the module docstring). Every source subclasses
    it, so the parts a format may carry beside its tensors have their answers here: a source that carries one
    overrides it (checkpoint/ours/source.py carries all three), and the loader asks every source the same questions."""

    path: Path        # the iteration directory (or file) the source reads
    format_name: str  # for messages: "zero-gpt", "megatron torch_dist", "deepspeed zero-2", ...
    bytes_read: int   # what the source has read so far, headers included (said at the load, tested)
    # whether the format's saves hold every router's expert bias where the run used one (ours, Megatron's torch_dist):
    # a resume that routes with a bias then needs it (checkpoint/router_state.py)
    saves_expert_bias: bool = False

    def keys(self) -> tuple[str, ...]:
        """The state keys held: MODEL_KEY and/or "master", "exp_avg", "exp_avg_sq" (, "exp_avg_slow")."""

    def tensors(self, key: str) -> dict[str, GlobalTensorInfo]:
        """Every tensor of `key` by parameter name, at its global shape."""

    def read(self, key: str, name: str, region: tuple[slice, ...]) -> torch.Tensor:
        """The `region` (one slice per dimension, in global coordinates) of tensor `name` of `key`, in its
        stored dtype. Only the bytes of that region should be read where the format allows it."""

    def progress(self) -> SourceProgress:
        """The iteration and the counters the run continues from."""

    def not_carried(self) -> list[str]:
        """What the checkpoint holds that this project does not carry over (said in one start-up line)."""

    def optimizer_not_read(self) -> Optional[str]:
        """Why the optimizer states the checkpoint holds are not read here (a layout this reader does not take), so
        that a resume of them is refused for that reason; None where it reads them or holds none."""
        return None

    def expert_biases(self) -> Optional[dict[str, list]]:
        """The routers' expert bias by "<router>.expert_bias"; None where the format carries none (it starts at 0)."""
        return None

    def fp8_histories(self) -> Optional[dict[str, dict]]:
        """Delayed FP8 scaling's amax histories and scales (checkpoint/fp8_state.py); None where not carried."""
        return None

    def restore_random_states(self, rng, state, log=print) -> None:
        """This rank's random streams, where the layout allows; a format that carries none says so once, and the
        streams start from --seed."""
        if state.is_first_rank:
            log(f" note: {self.path} ({self.format_name}) holds no random states this run can take; the random "
                f"streams start from --seed", flush=True)


def megatron_rows_multiple(args) -> Optional[int]:
    """What a Megatron-LM (or Megatron-DeepSpeed) run padded its vocabulary to a multiple of, from its saved args
    (training/tokenizer _vocab_size_with_padding: --make-vocab-size-divisible-by x its TP size); None where they do
    not say."""
    divisor = getattr(args, "make_vocab_size_divisible_by", None)
    tp = getattr(args, "tensor_model_parallel_size", None)
    valid = all(isinstance(value, int) and not isinstance(value, bool) and value > 0 for value in (divisor, tp))
    return divisor * tp if valid else None
