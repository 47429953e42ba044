"""Megatron-LM's hybrid CPU optimizer: the first part of a rank's optimizer partition stepped on the host, the rest
on the device (--offload-optimizer or --optimizer-cpu-offload, with --optimizer-offload-fraction F; F = 1 is
zero/offload.py's whole host step). docs/zero.md tells the rule and Megatron-LM's code it follows
(cpu_offloading/hybrid_optimizer.py HybridDeviceOptimizer: whole parameters, in order, until F of the elements).

Here, in partition coordinates:
- `host_cut`: elements [0, cut) are the host's, [cut, end) the device's; the cut is moved up to PIECE_ALIGNMENT from
  its segment's start, so the fused CPU AdamW runs the same elements through its vector loop as without the split
  and the step changes no bit.
- The master and every moment are `SplitPartition`s (zero/split_partition.py), each side stepped by its own
  optimizer (`build_step_optimizer`).
- The gradient partition stays on the device; after unscaling, the norm and clipping there, the host part is
  copied into `host_gradient` (Megatron-LM's pinned cpu_copy_map_grad, allocated once).
- Checkpoints hold each state as one flat tensor, so a split run resumes unsplit and the other way round.
The copies are synchronous: --overlap-cpu-optimizer-d2h-h2d (side streams) has no counterpart here.
"""

from __future__ import annotations

from dataclasses import replace

import torch

from zero.flat_buffer import FlatLayout
from zero.offload import HOST, PIECE_ALIGNMENT, host_zeros
from zero.optimizer import ShardedAdamW, StepPiece, build_step_optimizer
from zero.split_partition import SplitPartition


def host_cut(layout: FlatLayout, fraction: float) -> int:
    """Where this rank's partition is cut for `fraction` (0 < fraction < 1) of it on the host: after the fragment
    that brings the elements taken to fraction x all of the partition's, as Megatron-LM takes whole parameters while
    fewer than that are taken; then up to a multiple of PIECE_ALIGNMENT from its segment's start (or that
    segment's end)."""
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
    """A zeroed partition of `numel` elements, the first `cut` in host memory (pinned when asked; a planner's meta
    rank keeps both sides on the meta device), the rest on `device`."""
    host = device if device.type == "meta" else HOST
    return SplitPartition(host_zeros(cut, pinned, host, dtype), torch.zeros(numel - cut, dtype=dtype, device=device))


class HybridDeviceAdamW(ShardedAdamW):
    """ShardedAdamW over a partition split at `master.cut`: the host part stepped on the host, the rest on the
    device (see the module docstring). `master` is a SplitPartition."""

    def __init__(self, layout: FlatLayout, master: SplitPartition, *args, pin_memory: bool, **kwargs) -> None:
        self.cut = master.cut  # read by step_pieces and new_partition_tensor while the base class builds
        self.pins = pin_memory and torch.cuda.is_available()
        super().__init__(layout, master, *args, **kwargs)
        # Megatron-LM's cpu_copy_map_grad: the host part's gradient, copied from the device partition at each step
        self.host_gradient = host_zeros(self.cut, self.pins, master.host.device)

    def step_pieces(self) -> list[StepPiece]:
        """The base pieces, the one the cut falls in cut in two there."""
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
        """One optimizer over the host's pieces, on the host, and one over the device's, on the device (Megatron-LM's
        cpu_optimizers and gpu_optimizer)."""
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
        """The host part of the unscaled, clipped gradient partition `grads` copied to the host (Megatron-LM's
        _set_sub_optimizer_grads), then each side's AdamW on its pieces."""
        self.host_gradient.copy_(grads[:self.cut])
        for param, piece in zip(self._segment_params, self._pieces):
            source = self.host_gradient if piece.end <= self.cut else grads
            param.grad = source[piece.start:piece.end]
        for optimizer in self._step_optimizers:
            optimizer.step()
        for param in self._segment_params:
            param.grad = None

    # ---- what memory reports, the planner and checkpoints read ----------------------------------------------

    def host_state_tensors(self) -> list[torch.Tensor]:
        return [self.master.host, *(moment.host for moment in self.moments().values()), self.host_gradient]

    def model_state_tensors(self) -> dict[str, list[torch.Tensor]]:
        """Both sides of the master and of each moment; the host gradient copy is a buffer of the step."""
        tensors = super().model_state_tensors()
        tensors["master_weights"] = list(self.master.parts)
        tensors["optimizer_states"] = [part for moment in self.moments().values() for part in moment.parts]
        tensors["buffers"] = [*tensors["buffers"], self.host_gradient]
        return tensors

    def _saved_partition_tensors(self) -> dict[str, torch.Tensor]:
        return {key: split.flat() for key, split in self._partition_tensors().items()}

    def step_working_bytes(self, gather_copy_bytes: int = 0, norm_in_blocks: bool = False) -> int:
        """The base step's, and (a bound) the device copy of the shard of the unit the cut falls in, which
        publishing reads across the cut."""
        across = max((unit.shard_numel for unit in self.layout.units
                      if unit.partition_offset < self.cut < unit.partition_offset + unit.shard_numel), default=0)
        return super().step_working_bytes(gather_copy_bytes, norm_in_blocks) + across * self.master.element_size()
