"""Attention with soft-capped scores (Gemma 2's attn_logit_softcapping; --attn-logit-softcapping): each score
becomes c x tanh(score / c) before the mask and the softmax, which no SDPA kernel takes, so the scores are
computed explicitly here, as transformers' Gemma2 eager_attention_forward (the path it runs them on: its SDPA
integration refuses soft-capping) computes them: q.k^T x scale in the inputs' dtype, /c, tanh, x c, the mask, the
softmax in fp32 cast back, dropout, the weighted values. It keeps the [batch, heads, seq, keys] weights for
backward, as the math kernel does; the dry run, which runs this same code on meta tensors, counts them."""

from __future__ import annotations

import math
from typing import Optional

import torch
import torch.nn.functional as F


def softcapped_attention(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, softcap: float,
                         scale: Optional[float] = None, visible: Optional[torch.Tensor] = None,
                         dropout_p: float = 0.0) -> torch.Tensor:
    """[batch, heads, seq, d] queries over [batch, groups, keys, d] keys and values (a group's key/value head read
    by its heads / groups query heads, as repeat_kv); `visible` the bool mask (True where a query sees the key,
    broadcast over batch and heads), causal over equal lengths when None; `scale` 1/sqrt(d) when None."""
    heads, groups = query.shape[1], key.shape[1]
    if groups != heads:
        key, value = key.repeat_interleave(heads // groups, dim=1), value.repeat_interleave(heads // groups, dim=1)
    if visible is None:
        positions = torch.arange(query.shape[2], device=query.device)
        visible = positions[None, :] <= positions[:, None]
    scale = scale if scale is not None else 1 / math.sqrt(query.shape[-1])
    scores = torch.matmul(query, key.transpose(-2, -1)) * scale
    scores = torch.tanh(scores / softcap) * softcap
    scores = scores.masked_fill(~visible, torch.finfo(scores.dtype).min)
    weights = F.softmax(scores, dim=-1, dtype=torch.float32).to(query.dtype)
    if dropout_p > 0.0:
        weights = F.dropout(weights, dropout_p)
    return torch.matmul(weights, value)
