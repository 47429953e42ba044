"""Megatron-LM's hybrid CPU optimizer (--optimizer-offload-fraction F < 1): the first F of a rank's optimizer partition
(whole parameters, in order) stepped on the host, the rest on the device. The cut is aligned so the step changes no bit,
and checkpoints hold each state flat, so a split run resumes unsplit and back."""

from __future__ import annotations

from dataclasses import replace

import torch

from zero.flat_buffer import FlatLayout
from zero.offload import HOST, PIECE_ALIGNMENT, host_zeros
from zero.optimizer import ShardedAdamW, StepPiece, build_step_optimizer
from zero.split_partition import SplitPartition


def host_cut(layout: FlatLayout, fraction: float) -> int:
    """Where the partition is cut for `fraction` on the host: whole parameters, as Megatron-LM, then aligned."""
    fragments = sorted(layout.fragments(), key=lambda fragment: fragment.partition_offset)
    threshold = fraction * sum(fragment.numel for fragment in fragments)
    taken = cut = 0
    for fragment in fragments:
        if taken >= threshold:
            break
        taken += fragment.numel
        cut = fragment.partition_offset + fragment.numel
    for segment in layout.segments():
        if segment.start < cut < segment.end:
            aligned = segment.start + -(-(cut - segment.start) // PIECE_ALIGNMENT) * PIECE_ALIGNMENT
            return min(aligned, segment.end)
    return cut


def split_zeros(numel: int, cut: int, pinned: bool, device: torch.device, dtype: torch.dtype = torch.float32
                ) -> SplitPartition:
    """A zeroed partition, the first `cut` elements on the host."""
    host = device if device.type == "meta" else HOST
    return SplitPartition(host_zeros(cut, pinned, host, dtype), torch.zeros(numel - cut, dtype=dtype, device=device))


class HybridDeviceAdamW(ShardedAdamW):
    """ShardedAdamW over a SplitPartition master, each side stepped where it lives."""

    def __init__(self, layout: FlatLayout, master: SplitPartition, *args, pin_memory: bool, **kwargs) -> None:
        self.cut = master.cut  # read by step_pieces while the base class builds
        self.pins = pin_memory and torch.cuda.is_available()
        super().__init__(layout, master, *args, **kwargs)
        # Megatron-LM's cpu_copy_map_grad: the host part's gradient, copied at each step
        self.host_gradient = host_zeros(self.cut, self.pins, master.host.device)

    def step_pieces(self) -> list[StepPiece]:
        pieces = []
        for piece in super().step_pieces():
            if piece.start < self.cut < piece.end:
                pieces += [replace(piece, end=self.cut), replace(piece, start=self.cut)]
            else:
                pieces.append(piece)
        return pieces

    def new_partition_tensor(self, dtype: torch.dtype = torch.float32) -> SplitPartition:
        return split_zeros(self.master.numel(), self.cut, self.pins, self.device, dtype)

    def build_step_optimizers(self) -> list[torch.optim.Optimizer]:
        """One optimizer for the host's pieces and one for the device's (Megatron-LM's cpu and gpu optimizers)."""
        optimizers = []
        for on_host, device in ((True, HOST), (False, self.device)):
            side = [(param, piece) for param, piece in zip(self._segment_params, self._pieces)
                    if (piece.end <= self.cut) == on_host]
            if side:
                params, pieces = zip(*side)
                optimizers.append(build_step_optimizer(self.step_groups(params, pieces), self.optimizer_config,
                                                       device))
        return optimizers

    def update(self, grads: torch.Tensor) -> None:
        """Copy the host part of the gradient over, then step both sides."""
        self.host_gradient.copy_(grads[:self.cut])
        for param, piece in zip(self._segment_params, self._pieces):
            source = self.host_gradient if piece.end <= self.cut else grads
            param.grad = source[piece.start:piece.end]
        for optimizer in self._step_optimizers:
            optimizer.step()
        for param in self._segment_params:
            param.grad = None


    def host_state_tensors(self) -> list[torch.Tensor]:
        return [self.master.host, *(moment.host for moment in self.moments().values()), self.host_gradient]

    def model_state_tensors(self) -> dict[str, list[torch.Tensor]]:
        """Both sides of the master and each moment."""
        tensors = super().model_state_tensors()
        tensors["master_weights"] = list(self.master.parts)
        tensors["optimizer_states"] = [part for moment in self.moments().values() for part in moment.parts]
        tensors["buffers"] = [*tensors["buffers"], self.host_gradient]
        return tensors

    def _saved_partition_tensors(self) -> dict[str, torch.Tensor]:
        return {key: split.flat() for key, split in self._partition_tensors().items()}

    def step_working_bytes(self, gather_copy_bytes: int = 0, norm_in_blocks: bool = False) -> int:
        """The base step's, plus the device copy of the shard the cut falls in."""
        across = max((unit.shard_numel for unit in self.layout.units
                      if unit.partition_offset < self.cut < unit.partition_offset + unit.shard_numel), default=0)
        return super().step_working_bytes(gather_copy_bytes, norm_in_blocks) + across * self.master.element_size()
