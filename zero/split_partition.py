"""A rank's partition tensor cut in two places: its first `cut` elements in host memory, the rest on the device.

Megatron-LM's hybrid optimizer (--optimizer-offload-fraction below 1, zero/hybrid_offload.py) keeps the fp32 master
weights and the Adam moments of the first parameters of a rank's partition on the host and the others on the device.
Each of those states is then two tensors, yet whatever reads the partition by its coordinates (the parameter
storages filling and publishing it, zero/param_storage.py; the FP8 weights cast from it, zero/fp8_params.py; a
checkpoint's fragments, zero/optimizer_state.py) reads slices [start, end) of one flat tensor. A `SplitPartition`
answers those slices: a slice within one side is a view of it (the optimizer's pieces are cut at `cut`, so their
parameters and moments are views, updated in place); a slice across the cut is a read-only copy on the device side
(at most one unit's shard, which publishing copies anyway); a write across it writes both sides.
"""

from __future__ import annotations

import torch


class SplitPartition:
    """Partition elements [0, cut) in `host`, [cut, numel) in `device`: one flat tensor's slices over two."""

    def __init__(self, host: torch.Tensor, device: torch.Tensor) -> None:
        if host.dtype != device.dtype:
            raise ValueError(f"both sides of a partition have one dtype, got {host.dtype} and {device.dtype}")
        self.host, self.device_part = host, device
        self.cut = host.numel()

    # ---- what the readers of a flat partition use -----------------------------------------------------

    @property
    def dtype(self) -> torch.dtype:
        return self.host.dtype

    @property
    def device(self) -> torch.device:
        """The training device: where a read across the cut is put together (and what `.to(device)` then keeps)."""
        return self.device_part.device

    @property
    def shape(self) -> torch.Size:
        return torch.Size([self.numel()])

    def numel(self) -> int:
        return self.cut + self.device_part.numel()

    def element_size(self) -> int:
        return self.host.element_size()

    def __getitem__(self, span: slice) -> torch.Tensor:
        start, end = self._bounds(span)
        if end <= self.cut:
            return self.host[start:end]
        if start >= self.cut:
            return self.device_part[start - self.cut:end - self.cut]
        return torch.cat([self.host[start:].to(self.device), self.device_part[:end - self.cut]])

    def __setitem__(self, span: slice, values: torch.Tensor) -> None:
        start, end = self._bounds(span)
        if start < self.cut:  # copy_: `values` may be on the other side's device
            stop = min(end, self.cut)
            self.host[start:stop].copy_(values[:stop - start])
        if end > self.cut:
            at = max(start, self.cut)
            self.device_part[at - self.cut:end - self.cut].copy_(values[at - start:end - start])

    def copy_(self, source: torch.Tensor) -> "SplitPartition":
        """Fill from a flat tensor of the whole partition (a checkpoint's, loaded)."""
        self[0:self.numel()] = source
        return self

    # ---- the two sides -------------------------------------------------------------------------------

    @property
    def parts(self) -> tuple[torch.Tensor, torch.Tensor]:
        return self.host, self.device_part

    def copy_into(self, target: torch.Tensor) -> None:
        """target.copy_(the whole partition), side by side (no copy of the whole on either side)."""
        target[:self.cut].copy_(self.host)
        target[self.cut:].copy_(self.device_part)

    def flat(self) -> torch.Tensor:
        """The whole partition as one new host tensor (what a checkpoint writes; on a planner's meta rank, a meta
        one)."""
        home = "meta" if self.host.is_meta else "cpu"
        return torch.cat([self.host.to(home), self.device_part.to(home)])

    def _bounds(self, span: slice) -> tuple[int, int]:
        if not isinstance(span, slice) or span.step not in (None, 1):
            raise TypeError("a SplitPartition is read and written by contiguous slices [start:end]")
        start, end, _ = span.indices(self.numel())
        return start, max(start, end)


def copy_partition(target: torch.Tensor, source) -> None:
    """target.copy_(source) for a flat partition tensor or a SplitPartition."""
    if isinstance(source, SplitPartition):
        source.copy_into(target)
    else:
        target.copy_(source)
