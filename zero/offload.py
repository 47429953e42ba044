"""ZeRO-Offload's optimizer half: the fp32 master and both Adam moments in host memory, stepped there by PyTorch's fused
CPU AdamW in sub-groups of at most `sub_group_size` elements, reading the reducer's host gradient partition in place."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from zero.optimizer import ShardedAdamW, StepPiece

HOST = torch.device("cpu")


@dataclass(frozen=True)
class OffloadSettings:
    """Where the optimizer states go and how the host step is cut."""
    pin_memory: bool      # page-lock host buffers (only where CUDA is present)
    sub_group_size: int

    @property
    def pins(self) -> bool:
        return self.pin_memory and torch.cuda.is_available()


def host_zeros(numel: int, pinned: bool, device: torch.device = HOST, dtype: torch.dtype = torch.float32
               ) -> torch.Tensor:
    """A zeroed host tensor, pinned when asked (meta for a planner's rank)."""
    return torch.zeros(numel, dtype=dtype, device=device, pin_memory=pinned and device.type == "cpu")


# Pieces are cut at multiples of this many elements from their segment's start: the fused CPU AdamW rounds a tensor's
# tail differently, so any other cut would change bits.
PIECE_ALIGNMENT = 64


def cut_segment(start: int, end: int, size: int) -> list[tuple[int, int]]:
    """[start, end) in pieces of `size` elements (the last one shorter)."""
    return [(at, min(at + size, end)) for at in range(start, end, size)]


def pack_sub_groups(pieces: list[StepPiece], size: int) -> list[list[StepPiece]]:
    """Consecutive pieces packed greedily into sub-groups of at most `size` elements."""
    groups: list[list[StepPiece]] = []
    for piece in pieces:
        if groups and piece.end - groups[-1][0].start <= size:
            groups[-1].append(piece)
        else:
            groups.append([piece])
    return groups


class HostOffloadedAdamW(ShardedAdamW):
    """ShardedAdamW whose master and moments are host tensors, stepped in sub-groups."""

    def __init__(self, *args, offload: OffloadSettings, **kwargs) -> None:
        self.offload = offload
        super().__init__(*args, **kwargs)
        params = {(p.start, p.end): param for param, p in zip(self._segment_params, self._pieces)}
        self._sub_groups = [[(params[(p.start, p.end)], p) for p in group]
                            for group in pack_sub_groups(self._pieces, offload.sub_group_size)]

    def step_pieces(self) -> list[StepPiece]:
        """The segments cut in aligned pieces no larger than a sub-group."""
        size = self.offload.sub_group_size
        size = max(PIECE_ALIGNMENT, size - size % PIECE_ALIGNMENT)
        return [StepPiece(start, end, segment.weight_decay, segment.decoupled_lr) for segment in super().step_pieces()
                for start, end in cut_segment(segment.start, segment.end, size)]

    def new_partition_tensor(self, dtype: torch.dtype = torch.float32) -> torch.Tensor:
        return host_zeros(self.master.numel(), self.offload.pins, self.master.device, dtype)

    def update(self, grads: torch.Tensor) -> None:
        """AdamW one sub-group at a time; only its pieces get a gradient, so the others' step counts stay."""
        if grads.device != self.master.device:  # a reducer without a host partition
            grads = grads.to(self.master.device)
        for group in self._sub_groups:
            for param, piece in group:
                param.grad = grads[piece.start:piece.end]
            self.optimizer.step()
            for param, _ in group:
                param.grad = None

    def host_state_tensors(self) -> list[torch.Tensor]:
        return [self.master, *self.moments().values(), *self.gradients.host_tensors()]

    @property
    def num_sub_groups(self) -> int:
        return len(self._sub_groups)

    @property
    def largest_sub_group(self) -> int:
        """Elements one fused AdamW call updates at most."""
        return max((group[-1][1].end - group[0][1].start for group in self._sub_groups), default=0)
