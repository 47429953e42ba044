"""The weight's FP8 copies, cast once per iteration and reused by its later micro-batches, as TransformerEngine does
with Megatron-Core's is_first_microbatch. The train step forgets every cache where an iteration's micro-batches start
and end, since ZeRO writes parameters through views the key cannot see. `peak_bytes` is what the planner counts."""

from __future__ import annotations

import weakref
from typing import Optional

import torch


class WeightCache:
    """One FP8 linear's cast weight: `get(weights)` gives what `put` stored for the same unchanged weights, else None.
    `in_graph` (compiled blocks): the graph cannot read the key, so every micro-batch casts, keeping the first cast's
    scale in device scalars `first` and `scale` so the bits match."""

    def __init__(self, in_graph: bool = False, device: torch.device | str = "cpu") -> None:
        self._key: Optional[tuple] = None
        self._weights: Optional[tuple] = None  # weak references
        self.value: Optional[tuple] = None
        self.casts = 0  # how many times the weight was cast
        self.peak_bytes = 0  # the most bytes the copies held at once
        self.iteration = None
        if in_graph:
            self.iteration = (torch.ones((), device=device), torch.ones((), device=device))

    @staticmethod
    def _key_of(weights: tuple) -> tuple:
        return tuple((weight.data_ptr(), weight._version, weight.dtype, weight.device, tuple(weight.shape))
                     for weight in weights)

    def get(self, weights: tuple) -> Optional[tuple]:
        if self.value is None or len(weights) != len(self._weights) or \
                any(ref() is not weight for ref, weight in zip(self._weights, weights)) or \
                self._key != self._key_of(weights):
            return None
        return self.value

    def put(self, weights: tuple, value: tuple) -> None:
        self._key, self._weights, self.value = self._key_of(weights), tuple(map(weakref.ref, weights)), value
        self.casts += 1
        self.peak_bytes = max(self.peak_bytes, self.nbytes())

    def forget(self) -> None:
        """Drop the copies."""
        self._key = self._weights = self.value = None
        if self.iteration is not None:
            self.iteration[0].fill_(1.0)

    def nbytes(self) -> int:
        """The bytes the copies hold (meta tensors included)."""
        if self.value is None:
            return 0
        return sum(tensor.untyped_storage().nbytes() if tensor.device.type != "meta"
                   else tensor.numel() * tensor.element_size()
                   for tensor in _storages(self.value))


def _storages(value: tuple) -> list:
    seen, tensors = set(), []
    for tensor in value:
        if not isinstance(tensor, torch.Tensor):
            continue
        key = (tensor.device, tensor.untyped_storage().data_ptr()) if tensor.device.type != "meta" else id(tensor)
        if key not in seen:
            seen.add(key)
            tensors.append(tensor)
    return tensors
