"""What happens to queries and keys between the QKV split and the rotation, chosen once at build as Megatron-Core's
SelfAttention picks it: a per-head, whole-projection or L2 norm, or none; then --clip-qkv's clamp (OLMoE)."""

from __future__ import annotations

from typing import Optional

import torch
from torch import nn

from gpt.model_config import ModelConfig
from gpt.norms import HeadNorm, L2HeadNorm, ProjectionNorm
from parallel.state import ParallelState

Norm = Optional[nn.Module]


def qk_norms(config: ModelConfig, state: ParallelState) -> tuple[Norm, Norm]:
    """The query's and key's norms (one module for both under --qk-l2-norm), or None."""
    attention, norms = config.attention, config.norms
    kind, eps, zero_centered = norms.normalization, norms.layernorm_epsilon, norms.apply_layernorm_1p
    if attention.qk_l2_norm:  # before --qk-layernorm, as Megatron-Core picks its norm class
        l2 = L2HeadNorm(eps)
        return l2, l2
    if _over_projection(config):  # over all heads' features
        groups = attention.query_groups(config.num_attention_heads)
        return (ProjectionNorm(kind, config.num_attention_heads * config.head_dim, eps, state, zero_centered),
                ProjectionNorm(kind, groups * config.head_dim, eps, state, zero_centered))
    if attention.qk_layernorm:
        return (HeadNorm(kind, config.head_dim, eps, state, zero_centered),
                HeadNorm(kind, config.head_dim, eps, state, zero_centered))
    return None, None


class QKTreatment:
    """The norms' application and the clamp, as chosen at build."""

    def __init__(self, config: ModelConfig):
        attention = config.attention
        normed = attention.qk_l2_norm or attention.qk_layernorm
        self._normed = _over_the_projection if _over_projection(config) else _per_head if normed else _untouched
        self.clip = attention.clip_qkv

    def __call__(self, q_norm: Norm, k_norm: Norm, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor
                 ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Each [batch, heads, seq, head_dim], before rotary."""
        query, key = self._normed(q_norm, k_norm, query, key)
        if self.clip is not None:  # after the norms, as transformers' OlmoeAttention clamps
            query, key, value = (part.clamp(-self.clip, self.clip) for part in (query, key, value))
        return query, key, value


def _over_projection(config: ModelConfig) -> bool:
    return config.attention.qk_layernorm and config.attention.qk_layernorm_over_projection


def _per_head(q_norm: nn.Module, k_norm: nn.Module, query: torch.Tensor, key: torch.Tensor
              ) -> tuple[torch.Tensor, torch.Tensor]:
    return q_norm(query), k_norm(key)


def _over_the_projection(q_norm: nn.Module, k_norm: nn.Module, query: torch.Tensor, key: torch.Tensor
                         ) -> tuple[torch.Tensor, torch.Tensor]:
    return _heads_as_features(q_norm, query), _heads_as_features(k_norm, key)


def _untouched(q_norm: Norm, k_norm: Norm, query: torch.Tensor, key: torch.Tensor
               ) -> tuple[torch.Tensor, torch.Tensor]:
    return query, key


def _heads_as_features(norm: nn.Module, heads: torch.Tensor) -> torch.Tensor:
    """`norm` applied to [batch, heads, seq, d] as [batch, seq, heads x d] features."""
    batch, count, seq, dim = heads.shape
    features = norm(heads.transpose(1, 2).reshape(batch, seq, count * dim))
    return features.view(batch, seq, count, dim).transpose(1, 2)
