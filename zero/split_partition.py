"""A rank's partition tensor cut in two (zero/hybrid_offload.py): the first `cut` elements in host memory, the rest on
the device, read and written by flat slices as one tensor would be. A slice within one side is a view; one across the
cut is a read-only copy on the device."""

from __future__ import annotations

import torch


class SplitPartition:
    """Partition elements [0, cut) in `host`, [cut, numel) in `device`."""

    def __init__(self, host: torch.Tensor, device: torch.Tensor) -> None:
        if host.dtype != device.dtype:
            raise ValueError(f"both sides of a partition have one dtype, got {host.dtype} and {device.dtype}")
        self.host, self.device_part = host, device
        self.cut = host.numel()


    @property
    def dtype(self) -> torch.dtype:
        return self.host.dtype

    @property
    def device(self) -> torch.device:
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
        if start < self.cut:
            stop = min(end, self.cut)
            self.host[start:stop].copy_(values[:stop - start])
        if end > self.cut:
            at = max(start, self.cut)
            self.device_part[at - self.cut:end - self.cut].copy_(values[at - start:end - start])

    def copy_(self, source: torch.Tensor) -> "SplitPartition":
        """Fill from a flat tensor of the whole partition (a checkpoint's)."""
        self[0:self.numel()] = source
        return self


    @property
    def parts(self) -> tuple[torch.Tensor, torch.Tensor]:
        return self.host, self.device_part

    def copy_into(self, target: torch.Tensor) -> None:
        """target.copy_(the whole partition), side by side."""
        target[:self.cut].copy_(self.host)
        target[self.cut:].copy_(self.device_part)

    def flat(self) -> torch.Tensor:
        """The whole partition as one new host tensor, for a checkpoint."""
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
