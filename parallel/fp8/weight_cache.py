"""The weight's FP8 copies, cast once per iteration and reused by its later micro-batches, as TransformerEngine does
when Megatron-Core says which micro-batch is the first (is_first_microbatch).

TE (transformer_engine/pytorch/module/linear.py, Linear.forward) casts the FP8 weight ("weight" in _fp8_workspaces)
where `update_workspace = is_first_microbatch is None or is_first_microbatch`, and module/base.py's quantize_weight
returns the cached copy otherwise: the later micro-batches use the first one's cast (delayed scaling: its scale) and
record no weight amax. Megatron-Core sets the flag for the first micro-batch of every forward_backward call
(pipeline_parallel/schedules.py, forward_step -> set_is_first_microbatch).

Here the copies (the GEMMs' operands: data and transpose, or both directions, and the block recipes' scales) are keyed
on the weight (each of the weights a joined linear casts as one, gpt/fp8.py): identity, data pointer, version
counter, dtype, shape; a write through the parameter (`weight.add_`, an
optimizer over plain parameters) casts it again. ZeRO's writes do not reach that counter: its parameters' data is
*set* to views of its flat buffers (parallel/init.py replace_parameters), which the step and the gathers write. So the
train step forgets every cache where an iteration's micro-batches start and end (gpt/fp8.py forget_fp8_weight_casts):
each iteration casts its weights once, a re-run of it (--fp8-guard) included, and nothing after (the step, an
evaluation) reads a cast of the weights before the step.

A working set: about 2 bytes per weight element, from the first cast to the end of the micro-batches; `peak_bytes` is
what the planner adds to the passes' working set (planner/dry_run.py; its meta caches hold the same tensors)."""

from __future__ import annotations

import weakref
from typing import Optional

import torch


class WeightCache:
    """One FP8 linear's cast weight: `get(weights)` gives what `put` stored for the same, unchanged weights (a tuple:
    one, or the two a joined linear casts as one), else None. `in_graph` (the linear runs inside compiled blocks, --compile): a compiled graph cannot read the key on the
    host, so the weight is cast in every micro-batch instead, with the iteration's first cast's semantics kept in two
    device scalars the graph reads and writes: `first` (1.0 until the iteration's first cast) and `scale` (the scale
    that cast used, for delayed scaling); the later casts use that scale, record no amax and count nothing, so they
    give the cached cast's bits (casts.py)."""

    def __init__(self, in_graph: bool = False, device: torch.device | str = "cpu") -> None:
        self._key: Optional[tuple] = None
        self._weights: Optional[tuple] = None  # weak references
        self.value: Optional[tuple] = None
        self.casts = 0  # how many times the weight was cast (tests count them)
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
        """Drop the copies (an iteration's micro-batches start or end, or a changed weight is cast: the old copies go
        first)."""
        self._key = self._weights = self.value = None
        if self.iteration is not None:
            self.iteration[0].fill_(1.0)

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
