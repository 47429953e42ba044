"""ZeRO-Offload's optimizer half: the fp32 master partition and both Adam moments in host memory, the
step on the host in sub-groups.

The gradient partition is in host memory already: the reducer moves each unit's reduced shard into a host fp32
partition as its reduction completes, accumulating the micro-batches there (zero/grad_reducer.py), so the device
never holds one. zero/optimizer.py's step runs unchanged on it: unscaled, its global norm computed (overflow agreed
on) and clipped in place. Then, one sub-group of `sub_group_size` partition elements at a time, AdamW updates that
window of the host master and moments, reading the host gradient in place (no `temp_grad_buffer_for_cpu_offload`
as DeepSpeed needs). Publishing copies the master back into the device's parameters in the training dtype
(zero/param_storage.py).

Following DeepSpeed (stage_1_and_2.py @edaa722: the pinned cpu `weights_partition`, 492-497; the offloaded
`unscale_and_clip_grads`, `_optimizer_step(i)` and the copy into the bit16 partition, 2321-2341; stage3.py
`_create_fp16_sub_groups`, 1160-1183). DeepSpeed's sub-group takes whole parameters until it reaches the size (one
can be larger); ours packs aligned pieces of the segments into sub-groups of at most that size, bounding what one
fused AdamW call touches. The host step is PyTorch's fused CPU AdamW, the non-offloaded CPU step's kernel: cutting at
aligned pieces changes no bit (tests/zero/test_offload.py). On CUDA the device step may be apex's FusedAdam or
PyTorch's CUDA kernel: the same AdamW, not the same bits. Where the states live does not enter checkpoints (the same
fragment table, zero/optimizer_state.py)."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from zero.optimizer import ShardedAdamW, StepPiece

HOST = torch.device("cpu")


@dataclass(frozen=True)
class OffloadSettings:
    """Where the optimizer states go and how the host step is cut."""
    pin_memory: bool      # page-lock host buffers, for asynchronous copies (only where CUDA is present)
    sub_group_size: int   # partition elements the host steps at once

    @property
    def pins(self) -> bool:
        return self.pin_memory and torch.cuda.is_available()


def host_zeros(numel: int, pinned: bool, device: torch.device = HOST, dtype: torch.dtype = torch.float32
               ) -> torch.Tensor:
    """A zeroed host tensor (fp32 unless asked), page-locked when asked (CUDA copies from it can then be
    asynchronous). `device` is "meta" for a planner's rank, which holds shapes only."""
    return torch.zeros(numel, dtype=dtype, device=device, pin_memory=pinned and device.type == "cpu")


# Pieces are cut at multiples of this many elements from their segment's start. PyTorch's fused CPU
# AdamW runs the last numel % (vector width) elements of each tensor through a scalar loop whose
# rounding differs from the vector loop's (its step size is a double there); cut anywhere else, a
# piece would move elements between the two and change their bits. 64 fp32 elements is a whole number
# of cache lines (the kernel's task unit) and of vectors up to AVX-512's.
PIECE_ALIGNMENT = 64


def cut_segment(start: int, end: int, size: int) -> list[tuple[int, int]]:
    """[start, end) in pieces of `size` elements from `start` (the last one shorter)."""
    return [(at, min(at + size, end)) for at in range(start, end, size)]


def pack_sub_groups(pieces: list[StepPiece], size: int) -> list[list[StepPiece]]:
    """Consecutive pieces packed greedily into sub-groups of at most `size` elements (a piece larger
    than that is a sub-group of its own)."""
    groups: list[list[StepPiece]] = []
    for piece in pieces:
        if groups and piece.end - groups[-1][0].start <= size:
            groups[-1].append(piece)
        else:
            groups.append([piece])
    return groups


class HostOffloadedAdamW(ShardedAdamW):
    """ShardedAdamW whose master partition and moments are host tensors, stepped in sub-groups.

    `master` must already be a host tensor (apply_zero allocates it there, pinned when asked), or a
    meta one for a planner's rank."""

    def __init__(self, *args, offload: OffloadSettings, **kwargs) -> None:
        self.offload = offload
        super().__init__(*args, **kwargs)
        params = {(p.start, p.end): param for param, p in zip(self._segment_params, self._pieces)}
        self._sub_groups = [[(params[(p.start, p.end)], p) for p in group]
                            for group in pack_sub_groups(self._pieces, offload.sub_group_size)]

    def step_pieces(self) -> list[StepPiece]:
        """The segments cut in aligned pieces no larger than a sub-group (see PIECE_ALIGNMENT)."""
        size = self.offload.sub_group_size
        size = max(PIECE_ALIGNMENT, size - size % PIECE_ALIGNMENT)
        return [StepPiece(start, end, segment.weight_decay, segment.decoupled_lr) for segment in super().step_pieces()
                for start, end in cut_segment(segment.start, segment.end, size)]

    def new_partition_tensor(self, dtype: torch.dtype = torch.float32) -> torch.Tensor:
        return host_zeros(self.master.numel(), self.offload.pins, self.master.device, dtype)

    def update(self, grads: torch.Tensor) -> None:
        """Per sub-group: AdamW on that sub-group's pieces only, their gradients views of the host
        partition `grads` (the other pieces have no gradient, so the fused kernel leaves them and their
        step counts alone)."""
        if grads.device != self.master.device:  # a reducer without a host partition: one copy, once
            grads = grads.to(self.master.device)
        for group in self._sub_groups:
            for param, piece in group:
                param.grad = grads[piece.start:piece.end]
            self.optimizer.step()
            for param, _ in group:
                param.grad = None

    def host_state_tensors(self) -> list[torch.Tensor]:
        """The master, the moments and the reducer's host gradient partition: all of them live in host memory."""
        return [self.master, *self.moments().values(), *self.gradients.host_tensors()]

    @property
    def num_sub_groups(self) -> int:
        return len(self._sub_groups)

    @property
    def largest_sub_group(self) -> int:
        """Partition elements of the largest sub-group (what one fused AdamW call updates)."""
        return max((group[-1][1].end - group[0][1].start for group in self._sub_groups), default=0)
