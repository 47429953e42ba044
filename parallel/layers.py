"""Linear and embedding layers that own a tensor-parallel slice of their weight, built on the meta device: each
parameter's InitMethod defines the whole TP=1 tensor, so a model at TP=k holds exactly the TP=1 model's slices. With
`sequence_parallel` the tensors outside TP regions hold a slice of the sequence. A linear's GEMM is its replaceable
`linear` attribute."""

from __future__ import annotations

import contextlib
from typing import Optional

import torch
import torch.nn.functional as F
from torch import nn

from parallel.init import InitMethod, set_init_method
from parallel.mappings import (
    copy_to_tensor_parallel_region,
    gather_from_tensor_parallel_region,
    reduce_from_tensor_parallel_region,
    reduce_scatter_to_sequence_parallel_region,
    scatter_to_tensor_parallel_region,
)
from parallel.regathered_input import gathered_for
from parallel.sharding import TENSOR_PARALLEL, set_record, split_record, whole_record
from parallel.state import ParallelState


def meta_parameter(shape: tuple[int, ...], init: InitMethod, state: Optional[ParallelState] = None,
                   split_dim: int | None = None, real_rows: Optional[int] = None) -> nn.Parameter:
    """A parameter with a shape and an initialisation but no memory yet: with `split_dim` this TP rank's slice along
    it."""
    param = set_init_method(nn.Parameter(torch.empty(shape, device="meta")), init)
    if split_dim is None:
        return set_record(param, whole_record(shape, real_rows))
    return set_record(param, split_record(shape, split_dim, state.tensor_parallel_size, state.tensor_parallel_rank,
                                          TENSOR_PARALLEL, real_rows))


def _check_divisible(size: int, state: ParallelState, what: str) -> None:
    if size % state.tensor_parallel_size != 0:
        raise ValueError(f"{what} ({size}) is not divisible by the tensor-parallel size "
                         f"({state.tensor_parallel_size})")


class ColumnParallelLinear(nn.Module):
    """Y = X A^T + b with A split along its outputs; the output stays split unless `gather_output`. The input must be
    identical on all ranks of the TP group."""

    def __init__(self, input_size: int, output_size: int, *, state: ParallelState, init_std: float,
                 bias: bool = True, gather_output: bool = False,
                 sequence_parallel: bool = False, real_rows: Optional[int] = None):
        """`real_rows`: of the output features, how many are real where the rest pad the vocabulary."""
        super().__init__()
        _check_divisible(output_size, state, "column-parallel output size")
        self.input_size, self.output_size = input_size, output_size
        self.state, self.gather_output, self.sequence_parallel = state, gather_output, sequence_parallel
        self.linear = F.linear
        local = output_size // state.tensor_parallel_size
        self.weight = meta_parameter((local, input_size), InitMethod.normal(init_std), state, split_dim=0,
                                     real_rows=real_rows)
        if bias:
            self.bias = meta_parameter((local,), InitMethod.zeros(), state, split_dim=0)
        else:
            self.register_parameter("bias", None)

    def entered(self, hidden: torch.Tensor) -> contextlib.AbstractContextManager[torch.Tensor]:
        """The input as every rank of the region needs it, for the GEMMs inside the block: gathered along the sequence
        under SP, kept for backward as this rank's slice. Layers that share one input enter once."""
        return entered_region(hidden, self.state, self.sequence_parallel)

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        with self.entered(hidden) as whole:
            output = self.linear(whole, self.weight, self.bias)
        return gather_from_tensor_parallel_region(output, self.state) if self.gather_output else output


def entered_region(hidden: torch.Tensor, state: ParallelState, sequence_parallel: bool
                   ) -> contextlib.AbstractContextManager[torch.Tensor]:
    """A column-parallel region's entry for GEMMs that are not one linear's."""
    if sequence_parallel:
        return gathered_for(hidden, state)
    return contextlib.nullcontext(copy_to_tensor_parallel_region(hidden, state))


class RowParallelLinear(nn.Module):
    """Y = X A^T + b with A split along its inputs: partial sums all-reduced over TP (reduce-scattered under SP), the
    replicated bias added once after. `input_is_parallel`: the input is already this rank's slice."""

    def __init__(self, input_size: int, output_size: int, *, state: ParallelState, init_std: float,
                 bias: bool = True, input_is_parallel: bool = True,
                 sequence_parallel: bool = False):
        super().__init__()
        _check_divisible(input_size, state, "row-parallel input size")
        if sequence_parallel and not input_is_parallel:
            raise ValueError("a row-parallel linear under sequence parallelism needs its input split "
                             "(input_is_parallel=True), as Megatron-Core's RowParallelLinear asserts")
        self.input_size, self.output_size = input_size, output_size
        self.state, self.input_is_parallel, self.sequence_parallel = state, input_is_parallel, sequence_parallel
        self.linear = F.linear
        local = input_size // state.tensor_parallel_size
        self.weight = meta_parameter((output_size, local), InitMethod.normal(init_std), state, split_dim=1)
        if bias:
            self.bias = meta_parameter((output_size,), InitMethod.zeros())
            self.bias.sequence_parallel = sequence_parallel
        else:
            self.register_parameter("bias", None)

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        if self.state.tensor_parallel_size == 1:
            # nothing to reduce: exactly nn.Linear
            return self.linear(hidden, self.weight, self.bias)
        if not self.input_is_parallel:
            hidden = scatter_to_tensor_parallel_region(hidden, self.state)
        leave = (reduce_scatter_to_sequence_parallel_region if self.sequence_parallel
                 else reduce_from_tensor_parallel_region)
        output = leave(self.linear(hidden, self.weight), self.state)
        if self.bias is None:
            return output
        # under SP the bias meets only this rank's slice: its gradient is summed over TP
        return output + (copy_to_tensor_parallel_region(self.bias, self.state) if self.sequence_parallel else self.bias)


def padded_vocab_size(vocab_size: int, divisible_by: int, tensor_parallel_size: int,
                      pad_to: Optional[int] = None) -> int:
    """Round the vocabulary up to a multiple of divisible_by x TP, or to exactly `pad_to` (--padded-vocab-size), which
    must hold it and split evenly over TP."""
    if pad_to is not None:
        if pad_to < vocab_size or pad_to % tensor_parallel_size:
            raise ValueError(f"--pad-vocab-size-to {pad_to} must be at least the vocabulary ({vocab_size}) and "
                             f"divisible by --tensor-model-parallel-size {tensor_parallel_size}")
        return pad_to
    multiple = divisible_by * tensor_parallel_size
    return ((vocab_size + multiple - 1) // multiple) * multiple


class VocabParallelEmbedding(nn.Module):
    """Token embedding whose padded vocabulary rows are split across TP ranks; padding rows are zeros and real rows do
    not depend on the padding. Each rank looks up its own ids and the all-reduce (or, with `reduce_scatter_output`, a
    reduce-scatter along the sequence) adds them."""

    def __init__(self, vocab_size: int, padded_size: int, embedding_dim: int, *, state: ParallelState,
                 init_std: float, reduce_scatter_output: bool = False):
        super().__init__()
        if padded_size < vocab_size:
            raise ValueError(f"padded vocabulary {padded_size} is smaller than the vocabulary {vocab_size}")
        _check_divisible(padded_size, state, "padded vocabulary size")
        self.vocab_size, self.padded_size = vocab_size, padded_size
        rows_per_rank = padded_size // state.tensor_parallel_size
        self.vocab_start_index = state.tensor_parallel_rank * rows_per_rank
        self.vocab_end_index = self.vocab_start_index + rows_per_rank
        self.weight = meta_parameter((rows_per_rank, embedding_dim), InitMethod.normal(init_std, rows=vocab_size),
                                     state, split_dim=0, real_rows=vocab_size)
        self.state, self.reduce_scatter_output = state, reduce_scatter_output

    def forward(self, token_ids: torch.Tensor) -> torch.Tensor:
        if self.state.tensor_parallel_size == 1:
            # no masking: an out-of-range id must fail here as in nn.Embedding
            return F.embedding(token_ids, self.weight)
        outside = (token_ids < self.vocab_start_index) | (token_ids >= self.vocab_end_index)
        local_ids = (token_ids - self.vocab_start_index).masked_fill(outside, 0)
        partial = F.embedding(local_ids, self.weight).masked_fill(outside.unsqueeze(-1), 0.0)
        if self.reduce_scatter_output:
            return reduce_scatter_to_sequence_parallel_region(partial, self.state)
        return reduce_from_tensor_parallel_region(partial, self.state)
