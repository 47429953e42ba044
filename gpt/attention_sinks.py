"""Attention sinks: a per-head logit in the softmax's denominator (Megatron-LM's --softmax-type, Megatron-Core's
DotProductAttention.softmax_offset with fused_softmax.SoftmaxOne; GPT-OSS's self_attn.sinks):

    p_ij = exp(s_ij) / (exp(o_h) + sum_k exp(s_ik)),   out_i = sum_j p_ij v_j

with o_h learned per head (`learnable`, drawn from --init-method-std) or 0 (`off-by-one`). SoftmaxOne appends o_h as
one more column of the scores and drops it after the softmax, as transformers' GPT-OSS does.

SDPA takes no extra column, but one more key gives it exactly: a sink key, first, with value zero and score o_h
with query head h, from one more dim (each query head carries o_h / scale there, each real key 0, the sink key 1;
the scale passed explicitly). The extra dims are zero-padded to a multiple of 8 (the values too) so the fused CUDA
kernels still take the heads. Causality without a mask: a dummy query goes first too, so SDPA's is_causal over the
longer sequence lets query i + 1 see the sink and keys 0..i (the dummy row dropped); with an explicit mask
(documents, CP's gathered keys) the sink's column is added to it. Dropout of the sink's probability changes
nothing: its value is zero.

Context parallelism's ring (gpt/cp_attention.py) merges partial softmaxes by their log-sum-exp; there the sink is
one more block: out x sigmoid(lse - o_h) (`sink_rescaled`), its gradient for o_h -sum_i p_i,sink D_i."""

from __future__ import annotations

import math
from typing import Optional

import torch
import torch.nn.functional as F

SOFTMAX_TYPES = ("vanilla", "off-by-one", "learnable")  # Megatron-Core's TransformerConfig.softmax_type
PAD_MULTIPLE = 8  # the fused CUDA kernels' head-dim alignment (gpt/attention_padding.py)


def sink_logits(offset: Optional[torch.Tensor], heads: int, like: torch.Tensor) -> torch.Tensor:
    """The heads' sink logits: the learned offset, or zeros (off-by-one), as fp32 [heads]."""
    if offset is not None:
        return offset.float()
    return torch.zeros(heads, dtype=torch.float32, device=like.device)


def attention_with_sinks(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, sinks: torch.Tensor,
                         dropout_p: float = 0.0, enable_gqa: bool = False,
                         attention_mask: Optional[torch.Tensor] = None, scale: Optional[float] = None) -> torch.Tensor:
    """Causal (or `attention_mask`ed: bool [.., queries, keys], True where visible) SDPA of [batch, heads, seq, d]
    tensors with a sink logit per query head (`sinks`, [heads]); `enable_gqa`: key and value hold a head per group.
    The result is [batch, heads, seq, value width]."""
    batch, heads, length, dim = query.shape
    value_dim = value.shape[-1]
    scale = 1.0 / math.sqrt(dim) if scale is None else scale
    width = -(-(max(dim + 1, value_dim)) // PAD_MULTIPLE) * PAD_MULTIPLE
    sink_column = (sinks.to(query.dtype) / scale).view(1, heads, 1, 1).expand(batch, heads, length, 1)
    query = torch.cat([query, sink_column], dim=-1)
    query = F.pad(query, (0, width - dim - 1))
    key = F.pad(key, (0, width - dim))
    sink_key = key.new_zeros(batch, key.shape[1], 1, width)
    sink_key[..., dim] = 1.0
    key = torch.cat([sink_key, key], dim=2)
    value = F.pad(value, (0, width - value_dim))
    value = torch.cat([value.new_zeros(batch, value.shape[1], 1, width), value], dim=2)
    grouped = {"enable_gqa": True} if enable_gqa and key.shape[1] != heads else {}
    if attention_mask is None:
        # a dummy first query: is_causal over seq + 1 then lets query i + 1 see the sink and keys 0..i
        query = torch.cat([query.new_zeros(batch, heads, 1, width), query], dim=2)
        context = F.scaled_dot_product_attention(query, key, value, dropout_p=dropout_p, is_causal=True, scale=scale,
                                                 **grouped)
        return context[:, :, 1:, :value_dim]
    mask = F.pad(attention_mask, (1, 0), value=True)  # every query sees the sink
    context = F.scaled_dot_product_attention(query, key, value, attn_mask=mask, dropout_p=dropout_p, scale=scale,
                                             **grouped)
    return context[..., :value_dim]


def sink_rescaled(output: torch.Tensor, lse: torch.Tensor, sinks: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """A softmax's output and log-sum-exp [b, h, s] (fp32) merged with the sink, a block of one key of value 0 and
    score o_h: (output x exp(lse - lse'), lse' = logaddexp(lse, o_h))."""
    merged = torch.logaddexp(lse, sinks.view(1, -1, 1).to(lse.dtype))
    return output * torch.exp(lse - merged).unsqueeze(-1), merged
