"""Attention sinks (--softmax-type, GPT-OSS's sinks): a per-head logit o_h in the softmax's denominator, learned or 0
(off-by-one). SDPA takes it as one extra key of value zero, with a dummy first query so causal masking still applies."""

from __future__ import annotations

import math
from typing import Optional

import torch
import torch.nn.functional as F

SOFTMAX_TYPES = ("vanilla", "off-by-one", "learnable")  # Megatron-Core's TransformerConfig.softmax_type
PAD_MULTIPLE = 8


def sink_logits(offset: Optional[torch.Tensor], heads: int, like: torch.Tensor) -> torch.Tensor:
    if offset is not None:
        return offset.float()
    return torch.zeros(heads, dtype=torch.float32, device=like.device)


def attention_with_sinks(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, sinks: torch.Tensor,
                         dropout_p: float = 0.0, enable_gqa: bool = False,
                         attention_mask: Optional[torch.Tensor] = None, scale: Optional[float] = None) -> torch.Tensor:
    """Causal (or masked) SDPA of [batch, heads, seq, d] with a sink logit per query head; `enable_gqa`: key and value
    hold a head per group."""
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
        # a dummy first query: is_causal over seq + 1 lets query i + 1 see the sink and keys 0..i
        query = torch.cat([query.new_zeros(batch, heads, 1, width), query], dim=2)
        context = F.scaled_dot_product_attention(query, key, value, dropout_p=dropout_p, is_causal=True, scale=scale,
                                                 **grouped)
        return context[:, :, 1:, :value_dim]
    mask = F.pad(attention_mask, (1, 0), value=True)  # every query sees the sink
    context = F.scaled_dot_product_attention(query, key, value, attn_mask=mask, dropout_p=dropout_p, scale=scale,
                                             **grouped)
    return context[..., :value_dim]


def sink_rescaled(output: torch.Tensor, lse: torch.Tensor, sinks: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """A softmax's output and log-sum-exp merged with the sink, a block of one key of value 0 and score o_h."""
    merged = torch.logaddexp(lse, sinks.view(1, -1, 1).to(lse.dtype))
    return output * torch.exp(lse - merged).unsqueeze(-1), merged
