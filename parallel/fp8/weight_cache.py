"""The weight's FP8 copies, cast once per iteration and reused by its later micro-batches, as TransformerEngine does
when Megatron-Core says which micro-batch is the first (is_first_microbatch).

TE (transformer_engine/pytorch/module/linear.py, Linear.forward): with is_first_microbatch set, the FP8 weight
("weight" in the module's _fp8_workspaces) is cast in the first micro-batch (`update_workspace = is_first_microbatch
is None or is_first_microbatch`) and returned as it is in the others (module/base.py, quantize_weight: a cache hit with
update_workspace False casts nothing). Its delayed-scaling weight amax is therefore recorded once per iteration, and
the later micro-batches use the weight cast with the first one's scale. Megatron-Core sets the flag for the first
micro-batch of every forward_backward call (pipeline_parallel/schedules.py, forward_step -> set_is_first_microbatch).

Here the copies (what the GEMMs take: the data and its transpose for the per-tensor recipes, both directions or the
128x128 blocks' data, transpose and scales for the block recipes) are kept keyed on the weight itself: its identity,
data pointer, version counter and dtype. The optimizer step and ZeRO's parameter writes change the version (in-place
writes through a parameter or through the flat buffer it views share one version counter), so a changed weight is
cast again by itself; the train step also forgets every cache when an iteration's micro-batches start (Megatron's
is_first_microbatch), so each iteration casts its weights once, a re-run of the iteration (--fp8-guard) included.

A working set: about 2 bytes per weight element (data and transpose, e4m3), held from the weight's first cast until
the next one (planner/dry_run.py's fp8_weight_cache_bytes: the meta dry run holds the same tensors, on meta)."""

from __future__ import annotations

import weakref
from typing import Optional

import torch


class WeightCache:
    """One FP8 linear's cast weight: `get(weight)` gives what `put` stored for the same, unchanged weight, else
    None."""

    def __init__(self) -> None:
        self._key: Optional[tuple] = None
        self._weight: Optional[weakref.ref] = None
        self.value: Optional[tuple] = None
        self.casts = 0  # how many times the weight was cast (tests count them)

    @staticmethod
    def _key_of(weight: torch.Tensor) -> tuple:
        return weight.data_ptr(), weight._version, weight.dtype, weight.device, tuple(weight.shape)

    def get(self, weight: torch.Tensor) -> Optional[tuple]:
        if self.value is None or self._weight() is not weight or self._key != self._key_of(weight):
            return None
        return self.value

    def put(self, weight: torch.Tensor, value: tuple) -> None:
        self._key, self._weight, self.value = self._key_of(weight), weakref.ref(weight), value
        self.casts += 1

    def forget(self) -> None:
        """Drop the copies (a new iteration, or before casting a changed weight: the old copies go first)."""
        self._key = self._weight = self.value = None

    def nbytes(self) -> int:
        """The bytes the copies hold (meta tensors included: the planner's dry run)."""
        if self.value is None:
            return 0
        return sum(tensor.untyped_storage().nbytes() if tensor.device.type != "meta"
                   else tensor.numel() * tensor.element_size()
                   for tensor in _storages(self.value))


def _storages(value: tuple) -> list:
    """The tensors of `value`, one per storage (a view of another counts once)."""
    seen, tensors = set(), []
    for tensor in value:
        if not isinstance(tensor, torch.Tensor):
            continue
        key = (tensor.device, tensor.untyped_storage().data_ptr()) if tensor.device.type != "meta" else id(tensor)
        if key not in seen:
            seen.add(key)
            tensors.append(tensor)
    return tensors
