"""Causal attention over the whole sequence when each CP rank holds two load-balanced chunks, by --cp-comm-type:
all_gather, p2p (a ring merging blocks by log-sum-exp with its own backward, as TransformerEngine's), a2a
(DeepSpeed-Ulysses) and a2a+p2p."""

from __future__ import annotations

import math
from typing import Optional

import torch
import torch.nn.functional as F

from gpt.attention_sinks import attention_with_sinks, sink_rescaled
from gpt.attention_softcap import softcapped_attention
from gpt.attention_window import window_visible
from parallel.context_parallel import (
    CPRanks,
    all_gather_sequence,
    all_to_all,
    cp_ranks,
    hierarchical_cp_ranks,
    local_positions,
    ring_shift,
    shift,
    take_local_chunks,
)
from parallel.state import ParallelState

MASKED = -1.0e30  # a finite "minus infinity": a row with no visible key keeps finite gradients


def group_positions(local_length: int, state: ParallelState, device: torch.device) -> torch.Tensor:
    size = state.context_parallel_size
    return torch.cat([local_positions(local_length, size, rank, device) for rank in range(size)])


def _concatenated_positions(local_length: int, cp_size: int, cp_ranks_in_order: list[int],
                            device: torch.device) -> torch.Tensor:
    return torch.cat([local_positions(local_length, cp_size, rank, device) for rank in cp_ranks_in_order])


def same_document(query_documents: torch.Tensor, key_documents: torch.Tensor,
                  visible: Optional[torch.Tensor]) -> torch.Tensor:
    """[batch, 1, queries, keys]: `visible` where the key's document is the query's."""
    same = (query_documents[:, :, None] == key_documents[:, None, :]).unsqueeze(1)
    return same if visible is None else same & visible


def rank_documents(document_ids: torch.Tensor, cp_size: int, cp_rank: int) -> torch.Tensor:
    return take_local_chunks(document_ids, cp_size, cp_rank, dim=1)


def all_gather_attention(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, state: ParallelState,
                         dropout_p: float = 0.0, enable_gqa: bool = False, window: Optional[int] = None,
                         scale: Optional[float] = None, softcap: Optional[float] = None,
                         sinks: Optional[torch.Tensor] = None, document_ids: Optional[torch.Tensor] = None,
                         pad_value: bool = False) -> torch.Tensor:
    """Queries against the group's gathered keys and values, causal by position, with optional sinks and documents."""
    local = query.shape[2]
    keys = all_gather_sequence(key, state, dim=2)
    values = all_gather_sequence(value, state, dim=2)
    query_positions = local_positions(local, state.context_parallel_size, state.context_parallel_rank, query.device)
    key_positions = group_positions(local, state, query.device)
    visible = key_positions[None, :] <= query_positions[:, None] if window is None else \
        window_visible(query_positions, key_positions, window)
    if document_ids is not None:
        size = state.context_parallel_size
        key_documents = torch.cat([rank_documents(document_ids, size, rank) for rank in range(size)], dim=1)
        visible = same_document(rank_documents(document_ids, size, state.context_parallel_rank), key_documents,
                                visible)
    return _masked_attention(query, keys, values, visible, dropout_p, enable_gqa, scale, softcap, sinks, pad_value)


def _masked_attention(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, visible: Optional[torch.Tensor],
                      dropout_p: float, enable_gqa: bool, scale: Optional[float], softcap: Optional[float],
                      sinks: Optional[torch.Tensor], pad_value: bool = False) -> torch.Tensor:
    """SDPA under `visible` (causal where None), with sinks or soft-capped scores; `pad_value` pads narrow values for
    the kernel only after the exchanges."""
    if pad_value and value.shape[-1] != query.shape[-1]:
        width = value.shape[-1]
        value = F.pad(value, (0, query.shape[-1] - width))
        return _masked_attention(query, key, value, visible, dropout_p, enable_gqa, scale, softcap, sinks)[..., :width]
    if sinks is not None:
        return attention_with_sinks(query, key, value, sinks, dropout_p, enable_gqa, attention_mask=visible,
                                    scale=scale)
    if softcap is not None:
        return softcapped_attention(query, key, value, softcap, scale, visible, dropout_p)
    extra = {"enable_gqa": True} if enable_gqa else {}
    if scale is not None:
        extra["scale"] = scale
    masking = {"is_causal": True} if visible is None else {"attn_mask": visible}
    return F.scaled_dot_product_attention(query, key, value, dropout_p=dropout_p, **masking, **extra)


def block_attention(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, visible: Optional[torch.Tensor],
                    dropout_p: float = 0.0, scale: Optional[float] = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Softmax attention over one block of keys in fp32: (output, log-sum-exp [b, h, s]); a row seeing no key gets about
    -1e30."""
    scale = _scale(query, scale)
    scores = torch.matmul(query.float(), key.float().transpose(-2, -1)) * scale
    if visible is not None:
        scores = scores.masked_fill(~visible, MASKED)
    lse = torch.logsumexp(scores, dim=-1)
    probabilities = torch.exp(scores - lse.unsqueeze(-1))
    if dropout_p > 0.0:
        # each block's probabilities are its share exp(lse_b - lse) of the final ones, scaled after
        probabilities = F.dropout(probabilities, dropout_p)
    return torch.matmul(probabilities, value.float()), lse


def merge_partial(output: torch.Tensor, lse: torch.Tensor, block_output: torch.Tensor,
                  block_lse: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Two partial softmax results over disjoint keys as one (the log-sum-exp rule)."""
    merged = torch.logaddexp(lse, block_lse)
    return (output * torch.exp(lse - merged).unsqueeze(-1)
            + block_output * torch.exp(block_lse - merged).unsqueeze(-1)), merged


def _visible(local: int, ring: CPRanks, source: int, device: torch.device) -> torch.Tensor:
    size, rank = ring.size, ring.rank
    return local_positions(local, size, source, device)[None, :] <= local_positions(local, size, rank, device)[:, None]


def _block_plan(local: int, ring: CPRanks, source: int,
                device: torch.device) -> tuple[slice, slice, Optional[torch.Tensor]]:
    """Which queries see which of `source`'s keys: with load-balanced chunks every foreign block is half visible and
    unmasked, as TransformerEngine splits it."""
    half, every = local // 2, slice(None)
    if source == ring.rank:
        return every, every, _visible(local, ring, source, device)
    if source < ring.rank:
        return every, slice(0, half), None
    return slice(half, None), every, None


def _block_mask(local: int, ring: CPRanks, source: int, device: torch.device,
                document_ids: Optional[torch.Tensor]) -> tuple[slice, slice, Optional[torch.Tensor]]:
    """`_block_plan`, its mask narrowed to each query's document: [batch, 1, rows, keys] then."""
    rows, keys, visible = _block_plan(local, ring, source, device)
    if document_ids is None:
        return rows, keys, visible
    query_documents = rank_documents(document_ids, ring.size, ring.rank)[:, rows]
    return rows, keys, same_document(query_documents, rank_documents(document_ids, ring.size, source)[:, keys],
                                     visible)


def _scale(query: torch.Tensor, scale: Optional[float]) -> float:
    return 1.0 / math.sqrt(query.shape[-1]) if scale is None else scale


def _packed(key: torch.Tensor, value: torch.Tensor) -> torch.Tensor:
    return torch.cat((key.reshape(-1), value.reshape(-1)))


def _unpacked(message: torch.Tensor, key_shape: torch.Size, value_shape: torch.Size
              ) -> tuple[torch.Tensor, torch.Tensor]:
    split = math.prod(key_shape)
    return message[:split].view(key_shape), message[split:].view(value_shape)


def _per_query_head(tensor: torch.Tensor, heads: int) -> torch.Tensor:
    return tensor if tensor.shape[1] == heads else tensor.repeat_interleave(heads // tensor.shape[1], dim=1)


def _per_group(grad: torch.Tensor, groups: int) -> torch.Tensor:
    batch, heads, seq, dim = grad.shape
    return grad if heads == groups else grad.view(batch, groups, heads // groups, seq, dim).sum(2)


class _RingAttention(torch.autograd.Function):
    """The ring's forward and its own backward (no dropout): K/V travel at their own head count and each foreign block
    computes only its visible half."""

    @staticmethod
    def forward(ctx, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, ring: CPRanks,
                sinks: Optional[torch.Tensor] = None, document_ids: Optional[torch.Tensor] = None,
                scale: Optional[float] = None):
        size, rank, local, heads = ring.size, ring.rank, query.shape[2], query.shape[1]
        message = _packed(key, value)
        output = lse = None
        for step in range(size):
            if step > 0:
                message = shift(message, ring, 1, tag=81)
            block_key, block_value = _unpacked(message, key.shape, value.shape)
            rows, keys, visible = _block_mask(local, ring, (rank - step) % size, query.device, document_ids)
            block_output, block_lse = block_attention(query[:, :, rows], _per_query_head(block_key[:, :, keys], heads),
                                                      _per_query_head(block_value[:, :, keys], heads), visible,
                                                      scale=scale)
            if output is None:
                output, lse = block_output, block_lse
            else:
                output[:, :, rows], lse[:, :, rows] = merge_partial(output[:, :, rows], lse[:, :, rows],
                                                                    block_output, block_lse)
        if sinks is not None:  # the sink: one more block of one key, value zero, score o_h
            output, lse = sink_rescaled(output, lse, sinks)
        # Sequence-major in memory, as fused SDPA returns it, so the caller's transpose is a view and the output
        # projection saves no copy.
        output = output.transpose(1, 2).contiguous().transpose(1, 2)
        ctx.ring, ctx.has_sinks, ctx.document_ids = ring, sinks is not None, document_ids
        ctx.scale = _scale(query, scale)
        ctx.save_for_backward(query, key, value, output, lse, *(() if sinks is None else (sinks,)))
        return output.to(query.dtype)

    @staticmethod
    def backward(ctx, grad_output: torch.Tensor):
        query, key, value, output, lse, *sinks = ctx.saved_tensors
        ring = ctx.ring
        size, rank, local, heads = ring.size, ring.rank, query.shape[2], query.shape[1]
        groups, scale = key.shape[1], ctx.scale
        grad_output, query32 = grad_output.float(), query.float()
        delta = (grad_output * output).sum(-1, keepdim=True)  # FlashAttention's D = rowsum(dO * O)
        grad_query = torch.zeros_like(query32)
        message = _packed(key, value)
        grad_message = torch.zeros(message.shape, dtype=torch.float32, device=message.device)
        for step in range(size):
            if step > 0:
                message = shift(message, ring, 1, tag=82)
                grad_message = shift(grad_message, ring, 1, tag=83)
            grad_key, grad_value = _unpacked(grad_message, key.shape, value.shape)
            rows, keys, visible = _block_mask(local, ring, (rank - step) % size, query.device, ctx.document_ids)
            block_key, block_value = (_per_query_head(part[:, :, keys], heads).float()
                                      for part in _unpacked(message, key.shape, value.shape))
            block_query, block_grad = query32[:, :, rows], grad_output[:, :, rows]
            scores = torch.matmul(block_query, block_key.transpose(-2, -1)) * scale
            if visible is not None:
                scores = scores.masked_fill(~visible, MASKED)
            probabilities = torch.exp(scores - lse[:, :, rows].unsqueeze(-1))
            grad_scores = probabilities * (torch.matmul(block_grad, block_value.transpose(-2, -1))
                                           - delta[:, :, rows])
            grad_query[:, :, rows] += torch.matmul(grad_scores, block_key) * scale
            grad_key[:, :, keys] += _per_group(torch.matmul(grad_scores.transpose(-2, -1), block_query) * scale,
                                               groups)
            grad_value[:, :, keys] += _per_group(torch.matmul(probabilities.transpose(-2, -1), block_grad), groups)
        if size > 1:  # the block held now is rank + 1's: its gradient goes home
            grad_message = shift(grad_message, ring, 1, tag=84)
        grad_key, grad_value = _unpacked(grad_message, key.shape, value.shape)
        grad_sinks = None
        if sinks:  # sink share p = exp(o_h - lse); dL/do_h = -sum over rows of p D
            sink = sinks[0]
            share = torch.exp(sink.float().view(1, -1, 1) - lse)
            grad_sinks = (-(share * delta.squeeze(-1)).sum(dim=(0, 2))).to(sink.dtype)
        return (grad_query.to(query.dtype), grad_key.to(key.dtype), grad_value.to(value.dtype), None, grad_sinks, None,
                None)


def ring_attention(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, ring: CPRanks,
                   dropout_p: float = 0.0, sinks: Optional[torch.Tensor] = None,
                   document_ids: Optional[torch.Tensor] = None, scale: Optional[float] = None) -> torch.Tensor:
    """Queries against every `ring` rank's K/V, passed round the ring."""
    if dropout_p == 0.0:
        return _RingAttention.apply(query, key, value, ring, sinks, document_ids, scale)
    heads = query.shape[1]
    return ring_attention_through_autograd(query, _per_query_head(key, heads), _per_query_head(value, heads), ring,
                                           dropout_p, sinks, document_ids, scale)


def ring_attention_through_autograd(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                                    ring: CPRanks, dropout_p: float = 0.0,
                                    sinks: Optional[torch.Tensor] = None,
                                    document_ids: Optional[torch.Tensor] = None,
                                    scale: Optional[float] = None) -> torch.Tensor:
    """The ring with autograd through its shifts, for attention dropout: every block's K/V stays alive until
    backward."""
    size, rank = ring.size, ring.rank
    local = query.shape[2]
    query_positions = local_positions(local, size, rank, query.device)
    message = _packed(key, value)
    output = lse = None
    for step in range(size):
        if step > 0:
            message = ring_shift(message, ring)
        source = (rank - step) % size
        visible = local_positions(local, size, source, query.device)[None, :] <= query_positions[:, None]
        if document_ids is not None:
            visible = same_document(rank_documents(document_ids, size, rank),
                                    rank_documents(document_ids, size, source), visible)
        block_output, block_lse = block_attention(query, *_unpacked(message, key.shape, value.shape), visible,
                                                  dropout_p, scale)
        if output is None:
            output, lse = block_output, block_lse
        else:
            output, lse = merge_partial(output, lse, block_output, block_lse)
    if sinks is not None:
        output, lse = sink_rescaled(output, lse, sinks)
    return output.to(query.dtype)


def sequence_to_heads(tensor: torch.Tensor, group: CPRanks, order: torch.Tensor) -> torch.Tensor:
    """An all-to-all from a sequence split to a head split: [b, H, local, d] on N ranks -> [b, H / N, N x local, d] in
    position order."""
    size = group.size
    batch, heads, local, dim = tensor.shape
    if heads % size:
        raise ValueError(f"{heads} heads do not split over {size} ranks")
    rows = tensor.reshape(batch, size, heads // size, local, dim).movedim(1, 0)
    arrived = all_to_all(rows, group)
    whole = arrived.movedim(0, 2).reshape(batch, heads // size, size * local, dim)
    return whole.index_select(2, order)


def heads_to_sequence(tensor: torch.Tensor, group: CPRanks, positions: torch.Tensor) -> torch.Tensor:
    size = group.size
    batch, group_heads, whole, dim = tensor.shape
    local = whole // size
    rows = tensor.index_select(2, positions).reshape(batch, group_heads, size, local, dim).movedim(2, 0)
    arrived = all_to_all(rows, group)
    return arrived.movedim(0, 1).reshape(batch, size * group_heads, local, dim)


def all_to_all_attention(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, state: ParallelState,
                         dropout_p: float = 0.0, enable_gqa: bool = False, window: Optional[int] = None,
                         scale: Optional[float] = None, softcap: Optional[float] = None,
                         sinks: Optional[torch.Tensor] = None, document_ids: Optional[torch.Tensor] = None,
                         pad_value: bool = False) -> torch.Tensor:
    """DeepSpeed-Ulysses (a2a): an all-to-all to a head split, plain causal attention over the whole sequence, and
    back."""
    size = state.context_parallel_size
    if key.shape[1] % size:  # fewer key/value heads than ranks: one copy per query head
        per_group = query.shape[1] // key.shape[1]
        key, value = key.repeat_interleave(per_group, dim=1), value.repeat_interleave(per_group, dim=1)
        enable_gqa = False
    positions = group_positions(query.shape[2], state, query.device)
    order = torch.argsort(positions)
    group_ranks = cp_ranks(state)
    query, key, value = (sequence_to_heads(t, group_ranks, order) for t in (query, key, value))
    grouped = enable_gqa and key.shape[1] != query.shape[1]
    if sinks is not None:  # this rank's head group's (CP rank j holds head group j)
        group = query.shape[1]
        sinks = sinks[state.context_parallel_rank * group:(state.context_parallel_rank + 1) * group]
    whole = torch.arange(query.shape[2], device=query.device)
    visible = None if window is None else window_visible(whole, whole, window)
    if document_ids is not None:
        causal = visible if visible is not None else whole[None, :] <= whole[:, None]
        visible = same_document(document_ids, document_ids, causal)
    context = _masked_attention(query, key, value, visible, dropout_p, grouped, scale, softcap, sinks, pad_value)
    return heads_to_sequence(context, group_ranks, positions)


def hierarchical_attention(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, state: ParallelState,
                           dropout_p: float = 0.0, sinks: Optional[torch.Tensor] = None,
                           document_ids: Optional[torch.Tensor] = None, scale: Optional[float] = None
                           ) -> torch.Tensor:
    """a2a+p2p (Megatron-Core's hierarchical CP): an all-to-all over adjacent CP ranks, then the ring over the other
    axis."""
    inner, outer = hierarchical_cp_ranks(state)
    cp, local = state.context_parallel_size, query.shape[2]
    positions = _concatenated_positions(local, cp, [outer.rank * inner.size + j for j in range(inner.size)],
                                        query.device)
    order = torch.argsort(positions)
    query, key, value = (sequence_to_heads(t, inner, order) for t in (query, key, value))
    if sinks is not None:
        group = query.shape[1]
        sinks = sinks[inner.rank * group:(inner.rank + 1) * group]
    context = ring_attention(query, key, value, outer, dropout_p, sinks, document_ids, scale)
    return heads_to_sequence(context, inner, torch.argsort(order))


def context_parallel_attention(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, state: ParallelState,
                               comm_type: str, dropout_p: float = 0.0, enable_gqa: bool = False,
                               window: Optional[int] = None, scale: Optional[float] = None,
                               softcap: Optional[float] = None, sinks: Optional[torch.Tensor] = None,
                               document_ids: Optional[torch.Tensor] = None, pad_value: bool = False) -> torch.Tensor:
    """Causal attention of this CP rank's queries over the whole sequence, by `comm_type`."""
    if comm_type == "all_gather":
        return all_gather_attention(query, key, value, state, dropout_p, enable_gqa, window, scale, softcap, sinks,
                                    document_ids, pad_value)
    if comm_type == "p2p":
        if (window, softcap) != (None, None):
            raise ValueError("the ring (--cp-comm-type p2p) computes causal attention: no sliding window or "
                             "soft-capping")
        return ring_attention(query, key, value, cp_ranks(state), dropout_p, sinks, document_ids, scale)
    if comm_type == "a2a":
        return all_to_all_attention(query, key, value, state, dropout_p, enable_gqa, window, scale, softcap, sinks,
                                    document_ids, pad_value)
    if comm_type == "a2a+p2p":
        if (window, softcap) != (None, None):
            raise ValueError("a2a+p2p's ring computes causal attention: no sliding window or soft-capping")
        return hierarchical_attention(query, key, value, state, dropout_p, sinks, document_ids, scale)
    raise ValueError(f"--cp-comm-type {comm_type!r} is not implemented here: use p2p, all_gather, a2a or a2a+p2p")
