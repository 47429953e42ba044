"""Autograd collectives that mark the entry and exit of a tensor-parallel region, each the transpose of its pair
(copy/reduce, scatter/gather, and under sequence parallelism the sequence scatter, gather and reduce-scatter along our
dim 1), and the experts' row exchanges along dim 0. At TP=1 every function returns its input."""

from __future__ import annotations

import torch

from parallel.comm import group_size
from parallel.state import ParallelState


def _all_reduce(tensor: torch.Tensor, state: ParallelState) -> torch.Tensor:
    # reduce into a fresh buffer: the incoming tensor may be shared with another autograd branch
    reduced = tensor.clone(memory_format=torch.contiguous_format)
    state.comm.all_reduce(reduced, state.tensor_parallel_group, "tp")
    return reduced


def _keep_last_dim_chunk(tensor: torch.Tensor, state: ParallelState) -> torch.Tensor:
    size = tensor.shape[-1]
    if size % state.tensor_parallel_size != 0:
        raise ValueError(f"last dimension {size} is not divisible by the tensor-parallel size "
                         f"{state.tensor_parallel_size}")
    chunk = size // state.tensor_parallel_size
    return tensor.narrow(-1, state.tensor_parallel_rank * chunk, chunk).contiguous()


def _gather_last_dim(tensor: torch.Tensor, state: ParallelState) -> torch.Tensor:
    # the single-tensor all-gather concatenates along dim 0
    leading = tensor.movedim(-1, 0).contiguous()
    gathered = leading.new_empty((leading.shape[0] * state.tensor_parallel_size, *leading.shape[1:]))
    state.comm.all_gather(gathered, leading, state.tensor_parallel_group, "tp")
    return gathered.movedim(0, -1).contiguous()


SEQUENCE_DIM = 1  # [batch, sequence, hidden]


def _keep_sequence_chunk(tensor: torch.Tensor, state: ParallelState) -> torch.Tensor:
    size = tensor.shape[SEQUENCE_DIM]
    if size % state.tensor_parallel_size != 0:
        raise ValueError(f"sequence length {size} is not divisible by the tensor-parallel size "
                         f"{state.tensor_parallel_size}")
    chunk = size // state.tensor_parallel_size
    return tensor.narrow(SEQUENCE_DIM, state.tensor_parallel_rank * chunk, chunk).contiguous()


def gather_sequence(tensor: torch.Tensor, state: ParallelState) -> torch.Tensor:
    leading = tensor.movedim(SEQUENCE_DIM, 0).contiguous()
    gathered = leading.new_empty((leading.shape[0] * state.tensor_parallel_size, *leading.shape[1:]))
    state.comm.all_gather(gathered, leading, state.tensor_parallel_group, "tp")
    return gathered.movedim(0, SEQUENCE_DIM).contiguous()


def _reduce_scatter_sequence(tensor: torch.Tensor, state: ParallelState) -> torch.Tensor:
    size = tensor.shape[SEQUENCE_DIM]
    if size % state.tensor_parallel_size != 0:
        raise ValueError(f"sequence length {size} is not divisible by the tensor-parallel size "
                         f"{state.tensor_parallel_size}")
    leading = tensor.movedim(SEQUENCE_DIM, 0).contiguous()
    output = leading.new_empty((leading.shape[0] // state.tensor_parallel_size, *leading.shape[1:]))
    state.comm.reduce_scatter(output, leading, state.tensor_parallel_group, "tp")
    return output.movedim(0, SEQUENCE_DIM).contiguous()


class _CopyToTensorParallelRegion(torch.autograd.Function):
    @staticmethod
    def forward(ctx, tensor: torch.Tensor, state: ParallelState) -> torch.Tensor:
        ctx.state = state
        return tensor.view_as(tensor)

    @staticmethod
    def backward(ctx, grad_output: torch.Tensor):
        return _all_reduce(grad_output, ctx.state), None


class _ReduceFromTensorParallelRegion(torch.autograd.Function):
    @staticmethod
    def forward(ctx, tensor: torch.Tensor, state: ParallelState) -> torch.Tensor:
        return _all_reduce(tensor, state)

    @staticmethod
    def backward(ctx, grad_output: torch.Tensor):
        return grad_output, None


class _ScatterToTensorParallelRegion(torch.autograd.Function):
    @staticmethod
    def forward(ctx, tensor: torch.Tensor, state: ParallelState) -> torch.Tensor:
        ctx.state = state
        return _keep_last_dim_chunk(tensor, state)

    @staticmethod
    def backward(ctx, grad_output: torch.Tensor):
        return _gather_last_dim(grad_output, ctx.state), None


class _GatherFromTensorParallelRegion(torch.autograd.Function):
    @staticmethod
    def forward(ctx, tensor: torch.Tensor, state: ParallelState) -> torch.Tensor:
        ctx.state = state
        return _gather_last_dim(tensor, state)

    @staticmethod
    def backward(ctx, grad_output: torch.Tensor):
        return _keep_last_dim_chunk(grad_output, ctx.state), None


def _reduce_scatter_last_dim(tensor: torch.Tensor, state: ParallelState) -> torch.Tensor:
    size = tensor.shape[-1]
    if size % state.tensor_parallel_size != 0:
        raise ValueError(f"last dimension {size} is not divisible by the tensor-parallel size "
                         f"{state.tensor_parallel_size}")
    leading = tensor.movedim(-1, 0).contiguous()
    output = leading.new_empty((leading.shape[0] // state.tensor_parallel_size, *leading.shape[1:]))
    state.comm.reduce_scatter(output, leading, state.tensor_parallel_group, "tp")
    return output.movedim(0, -1).contiguous()


class _GatherLastDimSummingBackward(torch.autograd.Function):
    @staticmethod
    def forward(ctx, tensor: torch.Tensor, state: ParallelState) -> torch.Tensor:
        ctx.state = state
        return _gather_last_dim(tensor, state)

    @staticmethod
    def backward(ctx, grad_output: torch.Tensor):
        return _reduce_scatter_last_dim(grad_output, ctx.state), None


class _ScatterToSequenceParallelRegion(torch.autograd.Function):
    @staticmethod
    def forward(ctx, tensor: torch.Tensor, state: ParallelState) -> torch.Tensor:
        ctx.state = state
        return _keep_sequence_chunk(tensor, state)

    @staticmethod
    def backward(ctx, grad_output: torch.Tensor):
        return gather_sequence(grad_output, ctx.state), None


class _GatherFromSequenceParallelRegion(torch.autograd.Function):
    @staticmethod
    def forward(ctx, tensor: torch.Tensor, state: ParallelState) -> torch.Tensor:
        ctx.state = state
        return gather_sequence(tensor, state)

    @staticmethod
    def backward(ctx, grad_output: torch.Tensor):
        return _reduce_scatter_sequence(grad_output, ctx.state), None


class _ReduceScatterToSequenceParallelRegion(torch.autograd.Function):
    @staticmethod
    def forward(ctx, tensor: torch.Tensor, state: ParallelState) -> torch.Tensor:
        ctx.state = state
        return _reduce_scatter_sequence(tensor, state)

    @staticmethod
    def backward(ctx, grad_output: torch.Tensor):
        return gather_sequence(grad_output, ctx.state), None


def copy_to_tensor_parallel_region(tensor: torch.Tensor, state: ParallelState) -> torch.Tensor:
    if state.tensor_parallel_size == 1:
        return tensor
    return _CopyToTensorParallelRegion.apply(tensor, state)


def reduce_from_tensor_parallel_region(tensor: torch.Tensor, state: ParallelState) -> torch.Tensor:
    if state.tensor_parallel_size == 1:
        return tensor
    return _ReduceFromTensorParallelRegion.apply(tensor, state)


def scatter_to_tensor_parallel_region(tensor: torch.Tensor, state: ParallelState) -> torch.Tensor:
    if state.tensor_parallel_size == 1:
        return tensor
    return _ScatterToTensorParallelRegion.apply(tensor, state)


def gather_from_tensor_parallel_region(tensor: torch.Tensor, state: ParallelState) -> torch.Tensor:
    if state.tensor_parallel_size == 1:
        return tensor
    return _GatherFromTensorParallelRegion.apply(tensor, state)


def gather_last_dim_summing_backward(tensor: torch.Tensor, state: ParallelState) -> torch.Tensor:
    if state.tensor_parallel_size == 1:
        return tensor
    return _GatherLastDimSummingBackward.apply(tensor, state)


def scatter_to_sequence_parallel_region(tensor: torch.Tensor, state: ParallelState) -> torch.Tensor:
    if state.tensor_parallel_size == 1:
        return tensor
    return _ScatterToSequenceParallelRegion.apply(tensor, state)


def gather_from_sequence_parallel_region(tensor: torch.Tensor, state: ParallelState) -> torch.Tensor:
    if state.tensor_parallel_size == 1:
        return tensor
    return _GatherFromSequenceParallelRegion.apply(tensor, state)


def reduce_scatter_to_sequence_parallel_region(tensor: torch.Tensor, state: ParallelState) -> torch.Tensor:
    if state.tensor_parallel_size == 1:
        return tensor
    return _ReduceScatterToSequenceParallelRegion.apply(tensor, state)


# ---- expert parallelism: collectives over a group the caller gives (gpt/moe/dispatchers.py) ---- The pairs as
# Megatron-Core's tensor_parallel/mappings.py defines them: all-to-all with splits swapped, all-gather and
# reduce-scatter, identity and all-reduce.


def _all_to_all_rows(tensor: torch.Tensor, comm, group, group_name: str, output_splits: list[int],
                     input_splits: list[int]) -> torch.Tensor:
    output = tensor.new_empty((sum(output_splits), *tensor.shape[1:]))
    comm.all_to_all(output, tensor.contiguous(), output_splits, input_splits, group, group_name)
    return output


def _gather_rows(tensor: torch.Tensor, comm, group, group_name: str, size: int) -> torch.Tensor:
    tensor = tensor.contiguous()
    gathered = tensor.new_empty((tensor.shape[0] * size, *tensor.shape[1:]))
    comm.all_gather(gathered, tensor, group, group_name)
    return gathered


def _reduce_scatter_rows(tensor: torch.Tensor, comm, group, group_name: str, size: int) -> torch.Tensor:
    if tensor.shape[0] % size:
        raise ValueError(f"reduce-scatter over {size} ranks of a tensor with {tensor.shape[0]} rows")
    output = tensor.new_empty((tensor.shape[0] // size, *tensor.shape[1:]))
    comm.reduce_scatter(output, tensor.contiguous(), group, group_name)
    return output


class _AllToAll(torch.autograd.Function):
    @staticmethod
    def forward(ctx, tensor, comm, group, group_name, output_splits, input_splits):
        ctx.args = (comm, group, group_name, output_splits, input_splits)
        return _all_to_all_rows(tensor, comm, group, group_name, output_splits, input_splits)

    @staticmethod
    def backward(ctx, grad_output):
        comm, group, group_name, output_splits, input_splits = ctx.args
        # a row's gradient goes back to its sender: the same exchange, splits swapped
        return _all_to_all_rows(grad_output, comm, group, group_name, input_splits, output_splits), \
            None, None, None, None, None


class _GatherAlongFirstDim(torch.autograd.Function):
    @staticmethod
    def forward(ctx, tensor, comm, group, group_name, size):
        ctx.args = (comm, group, group_name, size)
        return _gather_rows(tensor, comm, group, group_name, size)

    @staticmethod
    def backward(ctx, grad_output):
        return _reduce_scatter_rows(grad_output, *ctx.args), None, None, None, None


class _ReduceScatterAlongFirstDim(torch.autograd.Function):
    @staticmethod
    def forward(ctx, tensor, comm, group, group_name, size):
        ctx.args = (comm, group, group_name, size)
        return _reduce_scatter_rows(tensor, comm, group, group_name, size)

    @staticmethod
    def backward(ctx, grad_output):
        return _gather_rows(grad_output, *ctx.args), None, None, None, None


def all_to_all(tensor: torch.Tensor, comm, group, group_name: str, output_splits: list[int],
               input_splits: list[int]) -> torch.Tensor:
    """Rows of `tensor` in `input_splits` to each group rank; what each sent this rank, in `output_splits`."""
    if group_size(group) == 1:
        return tensor
    return _AllToAll.apply(tensor, comm, group, group_name, list(output_splits), list(input_splits))


def gather_along_first_dim(tensor: torch.Tensor, comm, group, group_name: str) -> torch.Tensor:
    """Every group rank's `tensor` concatenated along dim 0, in group-rank order."""
    size = group_size(group)
    if size == 1:
        return tensor
    return _GatherAlongFirstDim.apply(tensor, comm, group, group_name, size)


def reduce_scatter_along_first_dim(tensor: torch.Tensor, comm, group, group_name: str) -> torch.Tensor:
    """The sum over the group of `tensor`, this rank's 1/size of the rows."""
    size = group_size(group)
    if size == 1:
        return tensor
    return _ReduceScatterAlongFirstDim.apply(tensor, comm, group, group_name, size)


class _SumGradientOver(torch.autograd.Function):
    @staticmethod
    def forward(ctx, tensor, comm, group, group_name):
        ctx.args = (comm, group, group_name)
        return tensor.view_as(tensor)

    @staticmethod
    def backward(ctx, grad_output):
        comm, group, group_name = ctx.args
        reduced = grad_output.clone(memory_format=torch.contiguous_format)
        comm.all_reduce(reduced, group, group_name)
        return reduced, None, None, None


def sum_gradient_over(tensor: torch.Tensor, comm, group, group_name: str) -> torch.Tensor:
    """`tensor` unchanged; in backward its gradient summed over the group."""
    if group_size(group) == 1:
        return tensor
    return _SumGradientOver.apply(tensor, comm, group, group_name)
