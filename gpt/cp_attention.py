"""Causal attention over the whole sequence when each CP rank holds two chunks of it (parallel/context_parallel.py):
Megatron-LM's --context-parallel-size with --cp-comm-type all_gather, p2p, a2a or a2a+p2p, as TransformerEngine's
context_parallel.py offers them (AttnFuncWithCPAndKVAllGather, AttnFuncWithCPAndKVP2P). A query at global position i
attends to the keys at positions <= i; `a2a` (DeepSpeed-Ulysses) moves heads instead (`all_to_all_attention`), and
`a2a+p2p` is a2a then the ring (`hierarchical_attention`).
- `all_gather`: K and V gathered once, one masked SDPA call; backward reduce-scatters their gradients.
- `p2p`: the ring. K and V (one flat message: values may be narrower, as multi-latent attention's) travel round the
  group in CP - 1 steps; each step's partial result merges by log-sum-exp (lse = logaddexp(lse_a, lse_b), out =
  out_a exp(lse_a - lse) + out_b exp(lse_b - lse)). Its own backward (`_RingAttention`, as TE's) keeps only q, this
  rank's k and v, the output and the lse, passes K/V round again, recomputes each block's probabilities, adds dq
  here and sends the block's dk/dv accumulator on: one block at a time in both passes. A foreign block of the
  load-balanced chunks is half visible and unmasked (`_block_plan`): only those halves are computed, as TE does,
  scores explicit in fp32. With attention dropout (masks this backward cannot replay) autograd runs through the
  ring, every block whole under a mask (rows seeing no key weigh 0), kept until backward.

Documents (--reset-attention-mask): every rank holds the sample's document ids (data/documents_cp.py) and each
path compares them between its queries and the keys at hand: no communication, no [S, S] mask. Attention sinks
(--softmax-type, gpt/attention_sinks.py) on every path: the gathered keys' mask gains the sink's column (a2a's rank
takes its head group's sinks); the ring merges the sink as one more block (sink_rescaled), its own backward giving
the sinks' gradient -sum_i p_i,sink D_i."""

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

MASKED = -1.0e30  # a finite "minus infinity": a row with no visible key keeps finite gradients (zero weight)


def group_positions(local_length: int, state: ParallelState, device: torch.device) -> torch.Tensor:
    """The global positions of the CP group's tokens in CP-rank order (as all_gather_sequence concatenates)."""
    size = state.context_parallel_size
    return torch.cat([local_positions(local_length, size, rank, device) for rank in range(size)])


def _concatenated_positions(local_length: int, cp_size: int, cp_ranks_in_order: list[int],
                            device: torch.device) -> torch.Tensor:
    """The global positions of these CP ranks' tokens, concatenated in the order given (an all-to-all's)."""
    return torch.cat([local_positions(local_length, cp_size, rank, device) for rank in cp_ranks_in_order])


def same_document(query_documents: torch.Tensor, key_documents: torch.Tensor,
                  visible: Optional[torch.Tensor]) -> torch.Tensor:
    """[batch, 1, queries, keys]: `visible` ([queries, keys] or None: every key) where the key's document
    ([batch, keys]) is the query's ([batch, queries])."""
    same = (query_documents[:, :, None] == key_documents[:, None, :]).unsqueeze(1)
    return same if visible is None else same & visible


def rank_documents(document_ids: torch.Tensor, cp_size: int, cp_rank: int) -> torch.Tensor:
    """The document ids of CP rank `cp_rank`'s tokens, [batch, S / CP], from the whole sample's [batch, S]."""
    return take_local_chunks(document_ids, cp_size, cp_rank, dim=1)


def all_gather_attention(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, state: ParallelState,
                         dropout_p: float = 0.0, enable_gqa: bool = False, window: Optional[int] = None,
                         scale: Optional[float] = None, softcap: Optional[float] = None,
                         sinks: Optional[torch.Tensor] = None, document_ids: Optional[torch.Tensor] = None,
                         pad_value: bool = False) -> torch.Tensor:
    """[batch, heads, local seq, d] queries against the group's gathered keys and values, causal by position (and
    within `window` keys before each query where one is given); `scale` and `softcap` as gpt/model.py's; `sinks`: a
    sink logit per query head; `document_ids` (the whole sample's, [batch, S]): only the query's document's keys;
    `pad_value`: as `_masked_attention`'s."""
    local = query.shape[2]
    keys = all_gather_sequence(key, state, dim=2)
    values = all_gather_sequence(value, state, dim=2)
    query_positions = local_positions(local, state.context_parallel_size, state.context_parallel_rank, query.device)
    key_positions = group_positions(local, state, query.device)
    visible = key_positions[None, :] <= query_positions[:, None] if window is None else \
        window_visible(query_positions, key_positions, window)
    if document_ids is not None:  # the gathered keys are in CP-rank order
        size = state.context_parallel_size
        key_documents = torch.cat([rank_documents(document_ids, size, rank) for rank in range(size)], dim=1)
        visible = same_document(rank_documents(document_ids, size, state.context_parallel_rank), key_documents,
                                visible)
    return _masked_attention(query, keys, values, visible, dropout_p, enable_gqa, scale, softcap, sinks, pad_value)


def _masked_attention(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, visible: Optional[torch.Tensor],
                      dropout_p: float, enable_gqa: bool, scale: Optional[float], softcap: Optional[float],
                      sinks: Optional[torch.Tensor], pad_value: bool = False) -> torch.Tensor:
    """SDPA under the bool mask `visible` (causal over equal lengths where None; at `scale` where given), with
    `sinks` through gpt/attention_sinks.py, or with `softcap` the explicit scores of gpt/attention_softcap.py
    (sinks with soft-capping are refused: gpt/model_config.py). `pad_value`: values narrower than the queries
    zero-padded to their width for the kernel and the output cut back (gpt/mla.py value_needs_padding), here after
    the exchanges so that they carry the values at their own width."""
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
    """Softmax attention of the queries over one block of keys at `scale` (None: 1/sqrt(query width)), in fp32:
    (output [b, h, s, value width], its log-sum-exp [b, h, s]); a row that sees no key of the block gets a
    log-sum-exp of about -1e30. `visible` None: every key."""
    scale = _scale(query, scale)
    scores = torch.matmul(query.float(), key.float().transpose(-2, -1)) * scale
    if visible is not None:
        scores = scores.masked_fill(~visible, MASKED)
    lse = torch.logsumexp(scores, dim=-1)
    probabilities = torch.exp(scores - lse.unsqueeze(-1))
    if dropout_p > 0.0:
        # dropout on the final probabilities: each block's are its share exp(lse_b - lse) of them, scaled after
        probabilities = F.dropout(probabilities, dropout_p)
    return torch.matmul(probabilities, value.float()), lse


def merge_partial(output: torch.Tensor, lse: torch.Tensor, block_output: torch.Tensor,
                  block_lse: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Two partial softmax results over disjoint keys, as one (the log-sum-exp rule)."""
    merged = torch.logaddexp(lse, block_lse)
    return (output * torch.exp(lse - merged).unsqueeze(-1)
            + block_output * torch.exp(block_lse - merged).unsqueeze(-1)), merged


def _visible(local: int, ring: CPRanks, source: int, device: torch.device) -> torch.Tensor:
    """[local, local]: which of ring rank `source`'s keys each of this rank's queries sees (key position <= its own)."""
    size, rank = ring.size, ring.rank
    return local_positions(local, size, source, device)[None, :] <= local_positions(local, size, rank, device)[:, None]


def _block_plan(local: int, ring: CPRanks, source: int,
                device: torch.device) -> tuple[slice, slice, Optional[torch.Tensor]]:
    """Which of this rank's queries (rows) attend to which of ring rank `source`'s keys, and the mask among them:
    with the load-balanced chunks every block but the rank's own is half of it, unmasked (TransformerEngine's
    AttnFuncWithCPAndKVP2P splits the same way). Rank r holds chunks (r, 2CP-1-r), source c holds (c, 2CP-1-c):
      c == r: all queries, all keys, causal in local order (the positions increase along it);
      c <  r: all queries see chunk c whole and nothing of chunk 2CP-1-c (later than 2CP-1-r);
      c >  r: chunk r sees nothing of c's (both later), chunk 2CP-1-r sees both whole."""
    half, every = local // 2, slice(None)
    if source == ring.rank:
        return every, every, _visible(local, ring, source, device)
    if source < ring.rank:
        return every, slice(0, half), None
    return slice(half, None), every, None


def _block_mask(local: int, ring: CPRanks, source: int, device: torch.device,
                document_ids: Optional[torch.Tensor]) -> tuple[slice, slice, Optional[torch.Tensor]]:
    """`_block_plan`, its mask narrowed to each query's document where `document_ids` (the whole sample's) are
    given: [batch, 1, rows, keys] then."""
    rows, keys, visible = _block_plan(local, ring, source, device)
    if document_ids is None:
        return rows, keys, visible
    query_documents = rank_documents(document_ids, ring.size, ring.rank)[:, rows]
    return rows, keys, same_document(query_documents, rank_documents(document_ids, ring.size, source)[:, keys],
                                     visible)


def _scale(query: torch.Tensor, scale: Optional[float]) -> float:
    """The scores' scale: `scale` where given (MLA's, --softmax-scale's), else 1/sqrt(query width) as SDPA's."""
    return 1.0 / math.sqrt(query.shape[-1]) if scale is None else scale


def _packed(key: torch.Tensor, value: torch.Tensor) -> torch.Tensor:
    """K and V as one flat message (TransformerEngine's p2p_comm_buffers: `torch.cat((k.view(-1), v.view(-1)))`),
    so that their head widths may differ (multi-latent attention's values are narrower than its keys)."""
    return torch.cat((key.reshape(-1), value.reshape(-1)))


def _unpacked(message: torch.Tensor, key_shape: torch.Size, value_shape: torch.Size
              ) -> tuple[torch.Tensor, torch.Tensor]:
    """`_packed`'s K and V again, views of `message` (writing into them writes into it)."""
    split = math.prod(key_shape)
    return message[:split].view(key_shape), message[split:].view(value_shape)


def _per_query_head(tensor: torch.Tensor, heads: int) -> torch.Tensor:
    """Key/value heads [b, groups, s, d] as one per query head (query head i reads group i // (heads / groups))."""
    return tensor if tensor.shape[1] == heads else tensor.repeat_interleave(heads // tensor.shape[1], dim=1)


def _per_group(grad: torch.Tensor, groups: int) -> torch.Tensor:
    """The gradient of `_per_query_head`: each group's copies summed."""
    batch, heads, seq, dim = grad.shape
    return grad if heads == groups else grad.view(batch, groups, heads // groups, seq, dim).sum(2)


class _RingAttention(torch.autograd.Function):
    """The ring's forward and its own backward (see the module): no dropout. K/V travel at their own head count
    (grouped-query: heads / groups times fewer bytes than copies per query head) and are copied per query head
    only for each block's arithmetic, as TransformerEngine passes them; each block but the rank's own computes
    only its visible half (`_block_plan`), so the ring costs the FLOPs of causal attention."""

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
            if output is None:  # step 0: the rank's own block, every row
                output, lse = block_output, block_lse
            else:
                output[:, :, rows], lse[:, :, rows] = merge_partial(output[:, :, rows], lse[:, :, rows],
                                                                    block_output, block_lse)
        if sinks is not None:  # the sink: one more block, of one key, value zero, score o_h
            output, lse = sink_rescaled(output, lse, sinks)
        # Sequence-major in memory ([b, s, h, d] strides), as the fused SDPA kernels return theirs: the caller's
        # transpose to [b, s, heads x d] is then a view, and the output projection saves that view instead of a
        # copy of its own beside the output kept here (one [b, s/CP, h] tensor a layer more than CP 1 saved:
        # tests/training/test_context_parallel_activation_memory.py).
        output = output.transpose(1, 2).contiguous().transpose(1, 2)
        ctx.ring, ctx.has_sinks, ctx.document_ids = ring, sinks is not None, document_ids  # ids: no gradient
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
            # this block's share of the final softmax
            probabilities = torch.exp(scores - lse[:, :, rows].unsqueeze(-1))
            grad_scores = probabilities * (torch.matmul(block_grad, block_value.transpose(-2, -1))
                                           - delta[:, :, rows])
            grad_query[:, :, rows] += torch.matmul(grad_scores, block_key) * scale
            grad_key[:, :, keys] += _per_group(torch.matmul(grad_scores.transpose(-2, -1), block_query) * scale,
                                               groups)
            grad_value[:, :, keys] += _per_group(torch.matmul(probabilities.transpose(-2, -1), block_grad), groups)
        if size > 1:  # the block held now is rank + 1's: its accumulated gradient goes home
            grad_message = shift(grad_message, ring, 1, tag=84)
        grad_key, grad_value = _unpacked(grad_message, key.shape, value.shape)
        grad_sinks = None
        if sinks:  # the sink's share p = exp(o_h - lse) of each row; dL/do_h = -sum over rows of p D
            sink = sinks[0]
            share = torch.exp(sink.float().view(1, -1, 1) - lse)
            grad_sinks = (-(share * delta.squeeze(-1)).sum(dim=(0, 2))).to(sink.dtype)
        return (grad_query.to(query.dtype), grad_key.to(key.dtype), grad_value.to(value.dtype), None, grad_sinks, None,
                None)


def ring_attention(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, ring: CPRanks,
                   dropout_p: float = 0.0, sinks: Optional[torch.Tensor] = None,
                   document_ids: Optional[torch.Tensor] = None, scale: Optional[float] = None) -> torch.Tensor:
    """[batch, heads, local seq, d] queries against every `ring` rank's K/V, passed round the ring (see the module;
    `cp_ranks(state)`, or a2a+p2p's outer ring); key and value may hold one head per group of query heads
    (grouped-query), and the values their own head width (multi-latent attention's); `sinks`: a sink logit per
    head; `document_ids` (the whole sample's, [batch, S]): only the query's document's keys; `scale`: the scores'
    (None: 1/sqrt(d))."""
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
    """The ring with autograd through its shifts (each shift's backward sends the gradient back): what runs with
    attention dropout, whose masks autograd keeps; every block's K/V stays alive until backward."""
    size, rank = ring.size, ring.rank
    local = query.shape[2]
    query_positions = local_positions(local, size, rank, query.device)
    message = _packed(key, value)  # one message a step
    output = lse = None
    for step in range(size):
        if step > 0:
            message = ring_shift(message, ring)
        source = (rank - step) % size  # whose chunks arrived at this step
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
    """[b, H, local seq, d] on each of the N `group` ranks -> [b, H / N, N x local seq, d]: group rank j gets head
    group j of every group rank's tokens (an all-to-all), put in position order (`order`: the argsort of the
    group-rank-order tokens' positions). Over the whole CP group that is the whole sequence."""
    size = group.size
    batch, heads, local, dim = tensor.shape
    if heads % size:
        raise ValueError(f"{heads} heads do not split over {size} ranks")
    rows = tensor.reshape(batch, size, heads // size, local, dim).movedim(1, 0)  # [N (head group), b, H/N, s, d]
    arrived = all_to_all(rows, group)  # [N (source rank), b, H/N, s, d]
    whole = arrived.movedim(0, 2).reshape(batch, heads // size, size * local, dim)  # group-rank order
    return whole.index_select(2, order)


def heads_to_sequence(tensor: torch.Tensor, group: CPRanks, positions: torch.Tensor) -> torch.Tensor:
    """The inverse of `sequence_to_heads` (`positions`: the group-rank-order tokens' places in its result, which
    for the whole sequence are their global positions)."""
    size = group.size
    batch, group_heads, whole, dim = tensor.shape
    local = whole // size
    rows = tensor.index_select(2, positions).reshape(batch, group_heads, size, local, dim).movedim(2, 0)
    arrived = all_to_all(rows, group)  # [N (head group), b, H/N, s, d]
    return arrived.movedim(0, 1).reshape(batch, size * group_heads, local, dim)


def all_to_all_attention(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, state: ParallelState,
                         dropout_p: float = 0.0, enable_gqa: bool = False, window: Optional[int] = None,
                         scale: Optional[float] = None, softcap: Optional[float] = None,
                         sinks: Optional[torch.Tensor] = None, document_ids: Optional[torch.Tensor] = None,
                         pad_value: bool = False) -> torch.Tensor:
    """DeepSpeed-Ulysses (deepspeed/sequence/layer.py, DistributedAttention: a _SeqAllToAll before attention and
    one after), which Megatron-Core runs as --cp-comm-type a2a: an all-to-all turns the sequence split into a head
    split, each rank attends over the whole sequence with H / CP heads (plain causal attention), and the
    all-to-all back turns it into the sequence split again. The heads must divide by CP (DeepSpeed asserts it
    too); key/value heads that do not are copied per query head first. `document_ids` (the whole sample's, in
    order, as the sequence is here): only the query's document's keys."""
    size = state.context_parallel_size
    if key.shape[1] % size:  # grouped-query with fewer key/value heads than ranks: one copy per query head
        per_group = query.shape[1] // key.shape[1]
        key, value = key.repeat_interleave(per_group, dim=1), value.repeat_interleave(per_group, dim=1)
        enable_gqa = False
    positions = group_positions(query.shape[2], state, query.device)
    order = torch.argsort(positions)
    group_ranks = cp_ranks(state)
    query, key, value = (sequence_to_heads(t, group_ranks, order) for t in (query, key, value))
    grouped = enable_gqa and key.shape[1] != query.shape[1]
    # the whole sequence in order: plain causal attention, or the sliding window's mask over it
    if sinks is not None:  # this rank's head group's (CP rank j holds group j of the heads)
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
    """--cp-comm-type a2a+p2p (TransformerEngine's AttnFuncWithCPAndKVP2P with cp_group = [a2a group, p2p group],
    Megatron-Core's get_hierarchical_context_parallel_groups): over the all-to-all group of A adjacent CP ranks
    o A .. o A + A-1, `sequence_to_heads` gives this rank H / A heads of their chunks {o A + j} and
    {2CP-1-o A-j}, in position order (TE's get_seq_chunk_ids_for_reordering_before_attn): outer chunks o and
    2B-1-o of the sequence cut in 2B, the load-balanced layout of the ring over the B ranks with this rank's head
    group. So the ring runs unchanged there, with this head group's sinks, and the all-to-all turns back.
    Key/value heads must divide by A (arguments/config.py refuses others, as TE's a2a view would fail)."""
    inner, outer = hierarchical_cp_ranks(state)
    cp, local = state.context_parallel_size, query.shape[2]
    # CP rank o A + j is member j of its all-to-all group and member o of its ring (parallel/mesh.py)
    positions = _concatenated_positions(local, cp, [outer.rank * inner.size + j for j in range(inner.size)],
                                        query.device)
    order = torch.argsort(positions)
    query, key, value = (sequence_to_heads(t, inner, order) for t in (query, key, value))
    if sinks is not None:  # member j holds head group j
        group = query.shape[1]
        sinks = sinks[inner.rank * group:(inner.rank + 1) * group]
    context = ring_attention(query, key, value, outer, dropout_p, sinks, document_ids, scale)
    return heads_to_sequence(context, inner, torch.argsort(order))


def context_parallel_attention(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, state: ParallelState,
                               comm_type: str, dropout_p: float = 0.0, enable_gqa: bool = False,
                               window: Optional[int] = None, scale: Optional[float] = None,
                               softcap: Optional[float] = None, sinks: Optional[torch.Tensor] = None,
                               document_ids: Optional[torch.Tensor] = None, pad_value: bool = False) -> torch.Tensor:
    """Causal attention of this CP rank's queries over the whole sequence, by `comm_type`; with a sliding `window`
    (gpt/attention_window.py) or soft-capped scores over all_gather's or a2a's positions (the ring takes neither:
    arguments/config.py); the scores' `scale` (None: 1/sqrt(d)), `sinks` (a sink logit per query head:
    gpt/attention_sinks.py) and `document_ids` (--reset-attention-mask: the whole sample's, [batch, S]) on every
    path. The values may be narrower than the queries and keys (multi-latent attention: gpt/mla.py); `pad_value`
    pads them for all_gather's and a2a's kernel (`_masked_attention`), the ring computing its blocks itself."""
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
