"""Attention with soft-capped scores (Gemma 2's --attn-logit-softcapping): c x tanh(score / c) before the mask and
softmax. No SDPA kernel takes it, so the scores are explicit, as transformers' Gemma 2 eager attention computes them."""

from __future__ import annotations

import math
from typing import Optional

import torch
import torch.nn.functional as F


def softcapped_attention(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, softcap: float,
                         scale: Optional[float] = None, visible: Optional[torch.Tensor] = None,
                         dropout_p: float = 0.0) -> torch.Tensor:
    """Queries [batch, heads, seq, d] over grouped keys and values; `visible` the bool mask (causal where None); `scale`
    1/sqrt(d) where None."""
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
