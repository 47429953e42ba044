"""Context parallelism's data layout and exchanges: the sequence is cut into 2 x CP chunks and CP rank r keeps chunks r
and 2CP-1-r, balancing causal attention's work (Megatron's get_batch_on_this_cp_rank); tokens keep their global
positions. Attention's differentiable exchanges over the CP group are here."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Optional

import torch

from parallel.comm import Communicator
from parallel.mappings import all_to_all as rows_all_to_all
from parallel.mesh import hierarchical_groups
from parallel.state import ParallelState


def chunk_ids(cp_size: int, cp_rank: int) -> tuple[int, int]:
    """The two of the 2 x CP chunks CP rank `cp_rank` holds: r and 2CP-1-r."""
    return cp_rank, 2 * cp_size - 1 - cp_rank


def check_sequence_splits(seq_length: int, cp_size: int) -> None:
    """The sequence must cut into 2 x CP equal chunks; a ValueError naming the flags."""
    if cp_size > 1 and seq_length % (2 * cp_size):
        raise ValueError(f"--seq-length {seq_length} must be divisible by 2 x --context-parallel-size "
                         f"({2 * cp_size}): each rank holds two equal chunks of the sequence")


def take_local_chunks(tensor: torch.Tensor, cp_size: int, cp_rank: int, dim: int = 1) -> torch.Tensor:
    """This CP rank's chunks r and 2CP-1-r of `tensor` along `dim` (the whole tensor at CP 1)."""
    if cp_size == 1:
        return tensor
    shape = tensor.shape
    chunked = tensor.reshape(*shape[:dim], 2 * cp_size, shape[dim] // (2 * cp_size), *shape[dim + 1:])
    index = torch.tensor(chunk_ids(cp_size, cp_rank), device=tensor.device)
    return chunked.index_select(dim, index).reshape(*shape[:dim], -1, *shape[dim + 1:])


def local_positions(local_length: int, cp_size: int, cp_rank: int, device: torch.device) -> torch.Tensor:
    """The global positions of this CP rank's `local_length` tokens."""
    chunk = local_length // 2
    first, second = chunk_ids(cp_size, cp_rank)
    return torch.cat([torch.arange(first * chunk, (first + 1) * chunk, device=device),
                      torch.arange(second * chunk, (second + 1) * chunk, device=device)])


def batch_on_this_rank(tensor: torch.Tensor, state: ParallelState, dim: int = 1) -> torch.Tensor:
    return take_local_chunks(tensor, state.context_parallel_size, state.context_parallel_rank, dim)


def positions_on_this_rank(local_length: int, state: ParallelState, device: torch.device) -> Optional[torch.Tensor]:
    """The global positions of this rank's tokens; None without context parallelism (positions 0..S-1)."""
    if state.context_parallel_size == 1:
        return None
    return local_positions(local_length, state.context_parallel_size, state.context_parallel_rank, device)


def roll_left_across_chunks(tensor: torch.Tensor, state: Optional[ParallelState]) -> torch.Tensor:
    """The sequence rolled left by one along the last dim on this rank's chunks, its last position 0: Megatron-Core's
    roll_tensor(shifts=-1, cp_group), by one all-gather of each rank's chunks' first elements. Integer and mask tensors
    only."""
    if state is None or state.context_parallel_size == 1:
        rolled = torch.roll(tensor, shifts=-1, dims=-1)
        rolled[..., -1] = 0
        return rolled
    size, rank = state.context_parallel_size, state.context_parallel_rank
    halves = tensor.chunk(2, dim=-1)
    firsts = torch.stack([half[..., 0] for half in halves]).contiguous()
    gathered = torch.empty((size * 2, *firsts.shape[1:]), dtype=firsts.dtype, device=firsts.device)
    state.comm.all_gather(gathered, firsts, state.context_parallel_group, "cp")
    gathered = gathered.view(size, *firsts.shape)
    after_first = gathered[rank + 1][0] if rank < size - 1 else firsts[1]
    after_second = gathered[rank - 1][1] if rank > 0 else torch.zeros_like(firsts[1])
    rolled = [torch.roll(half, shifts=-1, dims=-1) for half in halves]
    rolled[0][..., -1], rolled[1][..., -1] = after_first, after_second
    return torch.cat(rolled, dim=-1)


# ---- the ranks an exchange runs over ----

@dataclass(frozen=True)
class CPRanks:
    """The CP ranks one exchange runs over: the whole CP group, or one level of the hierarchical groups. Counted as
    "cp"."""
    size: int
    rank: int
    group: Any  # a VirtualGroup in a dry run; None while size is 1
    global_ranks: tuple[int, ...]
    comm: Communicator = field(compare=False, repr=False)


def cp_ranks(state: ParallelState) -> CPRanks:
    return CPRanks(state.context_parallel_size, state.context_parallel_rank, state.context_parallel_group,
                   tuple(state.dims.group_ranks("cp")), state.comm)


def hierarchical_cp_ranks(state: ParallelState) -> list[CPRanks]:
    """This rank's group at each level of --hierarchical-context-parallel-sizes; ValueError where the state has none."""
    if not state.hierarchical_context_sizes:
        raise ValueError("--cp-comm-type a2a+p2p needs --hierarchical-context-parallel-sizes (the state has no "
                         "hierarchical context-parallel groups)")
    levels = hierarchical_groups(state.dims.group_ranks("cp"), state.hierarchical_context_sizes)
    views = []
    for size, groups, group in zip(state.hierarchical_context_sizes, levels, state.hierarchical_context_groups):
        ranks = next(ranks for ranks in groups if state.rank in ranks)
        views.append(CPRanks(size, ranks.index(state.rank), group, tuple(ranks), state.comm))
    return views


# ---- the exchanges (autograd functions: each backward is the forward's transpose) ----

def _gather_along(tensor: torch.Tensor, dim: int, state: ParallelState) -> torch.Tensor:
    size = state.context_parallel_size
    moved = tensor.movedim(dim, 0).contiguous()
    output = torch.empty((size * moved.shape[0], *moved.shape[1:]), dtype=tensor.dtype, device=tensor.device)
    state.comm.all_gather(output, moved, state.context_parallel_group, "cp")
    return output.movedim(0, dim)


def _reduce_scatter_along(tensor: torch.Tensor, dim: int, state: ParallelState) -> torch.Tensor:
    size = state.context_parallel_size
    moved = tensor.movedim(dim, 0).contiguous()
    output = torch.empty((moved.shape[0] // size, *moved.shape[1:]), dtype=tensor.dtype, device=tensor.device)
    state.comm.reduce_scatter(output, moved, state.context_parallel_group, "cp")
    return output.movedim(0, dim)


class _AllGatherSequence(torch.autograd.Function):
    """The CP ranks' local tensors concatenated along `dim`; backward reduce-scatters, as TE's all-gather CP
    attention."""

    @staticmethod
    def forward(ctx, tensor: torch.Tensor, dim: int, state: ParallelState) -> torch.Tensor:
        ctx.dim, ctx.state = dim, state
        return _gather_along(tensor, dim, state)

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        return _reduce_scatter_along(grad, ctx.dim, ctx.state), None, None


def all_gather_sequence(tensor: torch.Tensor, state: ParallelState, dim: int) -> torch.Tensor:
    """The CP group's local tensors along `dim`, in CP-rank order."""
    if state.context_parallel_size == 1:
        return tensor
    return _AllGatherSequence.apply(tensor, dim, state)


def shift(tensor: torch.Tensor, ring: CPRanks, steps: int, tag: int) -> torch.Tensor:
    """`tensor` sent `steps` places round the `ring`; returns what rank r - steps sent."""
    size, rank = ring.size, ring.rank
    to, source = ring.global_ranks[(rank + steps) % size], ring.global_ranks[(rank - steps) % size]
    tensor = tensor.contiguous()
    received = torch.empty_like(tensor)
    # both posted before either is waited
    works = ring.comm.send(tensor, to, tag, group_name="cp") + ring.comm.receive(received, source, tag,
                                                                                  group_name="cp")
    for work in works:
        work.wait()
    return received


class _RingShift(torch.autograd.Function):
    """One step of the ring: this rank's tensor goes to the next CP rank; backward sends the gradient the other way."""

    @staticmethod
    def forward(ctx, tensor: torch.Tensor, ring: CPRanks) -> torch.Tensor:
        ctx.ring = ring
        return shift(tensor, ring, 1, tag=71)

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        return shift(grad, ctx.ring, -1, tag=72), None


def ring_shift(tensor: torch.Tensor, ring: CPRanks) -> torch.Tensor:
    """What the previous rank of `ring` holds, differentiable."""
    return _RingShift.apply(tensor, ring)


def all_to_all(tensor: torch.Tensor, ranks: CPRanks) -> torch.Tensor:
    """`tensor` [N, ...] over N `ranks`: row j to rank j, row j of the result from rank j; backward is the same
    exchange."""
    splits = [tensor.shape[0] // ranks.size] * ranks.size
    return rows_all_to_all(tensor, ranks.comm, ranks.group, "cp", splits, splits)


def all_reduce_over_context_parallel(tensor: torch.Tensor, state: ParallelState) -> torch.Tensor:
    """Sum `tensor` over the CP group in place, without autograd."""
    state.comm.all_reduce(tensor, state.context_parallel_group, "cp")
    return tensor
