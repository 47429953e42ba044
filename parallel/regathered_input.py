"""A sequence-parallel column-parallel linear's gathered input, kept for backward as this rank's slice only and gathered
again at its first use in backward, as Megatron-Core's linear does (autograd alone would keep TP times the bytes). A
saved-tensor hook, so outer meters count the slice; compiled blocks save it whole."""

from __future__ import annotations

import contextlib
from typing import Iterator, Optional

import torch

from parallel.mappings import gather_from_sequence_parallel_region, gather_sequence
from parallel.state import ParallelState


class _Regather:
    """The slice (packed by the hooks outside, if any) and the whole gathered from it at most once."""

    __slots__ = ("packed_slice", "outer_unpack", "state", "whole")

    def __init__(self, packed_slice, outer_unpack, state: ParallelState) -> None:
        self.packed_slice, self.outer_unpack, self.state = packed_slice, outer_unpack, state
        self.whole: Optional[torch.Tensor] = None

    def get(self) -> torch.Tensor:
        if self.whole is None:
            hidden = self.packed_slice if self.outer_unpack is None else self.outer_unpack(self.packed_slice)
            with torch.no_grad():
                self.whole = gather_sequence(hidden, self.state)
        return self.whole


class _View:
    __slots__ = ("regather", "size", "stride", "offset")

    def __init__(self, regather: _Regather, tensor: torch.Tensor) -> None:
        self.regather, self.size, self.stride, self.offset = \
            regather, tensor.size(), tensor.stride(), tensor.storage_offset()


@contextlib.contextmanager
def gathered_for(hidden: torch.Tensor, state: ParallelState) -> Iterator[torch.Tensor]:
    """`hidden` (this rank's slice of the sequence) gathered, its consumers inside the block saving only the slice."""
    whole = gather_from_sequence_parallel_region(hidden, state)
    if (state.tensor_parallel_size == 1 or not torch.is_grad_enabled() or not whole.requires_grad
            or torch.compiler.is_compiling()):
        yield whole
        return
    whole._regathered_from = state
    outer = torch._C._autograd._top_saved_tensors_default_hooks(False)
    outer_pack, outer_unpack = outer if outer is not None else (None, None)
    slice_ = hidden.detach()
    regather = None

    def pack(tensor: torch.Tensor):
        nonlocal regather
        if tensor.dtype == whole.dtype and tensor.device == whole.device and torch._C._is_alias_of(tensor, whole):
            if regather is None:
                regather = _Regather(slice_ if outer_pack is None else outer_pack(slice_), outer_unpack, state)
            return _View(regather, tensor)
        return tensor if outer_pack is None else (outer_pack(tensor),)

    def unpack(packed):
        if isinstance(packed, _View):
            return packed.regather.get().as_strided(packed.size, packed.stride, packed.offset)
        return packed if outer_unpack is None else outer_unpack(packed[0])

    with torch.autograd.graph.saved_tensors_hooks(pack, unpack):
        yield whole


def regathered_state(tensor: torch.Tensor) -> Optional[ParallelState]:
    """The TP state `tensor` was gathered over where it is an entry's gathered input, so a GEMM keeping a cast of it
    keeps the cast's slice instead."""
    return getattr(tensor, "_regathered_from", None)


def keep_slice(rows: torch.Tensor, batch: int, state: ParallelState) -> torch.Tensor:
    """This rank's slice of the sequence of `rows` ([batch x sequence, width]), contiguous."""
    whole = rows.reshape(batch, -1, rows.shape[-1])
    chunk = whole.shape[1] // state.tensor_parallel_size
    return whole.narrow(1, state.tensor_parallel_rank * chunk, chunk).contiguous()


def gather_slice(kept: torch.Tensor, state: ParallelState) -> torch.Tensor:
    """`keep_slice`'s rows gathered again, the same bytes (FP8 travels as uint8)."""
    as_bytes = kept.view(torch.uint8) if kept.element_size() == 1 else kept
    whole = gather_sequence(as_bytes, state).view(kept.dtype)
    return whole.reshape(-1, kept.shape[-1])
