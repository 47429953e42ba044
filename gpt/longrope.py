"""LongRoPE, Phi-3's long-context rotary scaling (Phi-3-mini-128k; transformers' rope_type "longrope", which older
files call "su"), as transformers computes it (modeling_rope_utils.py _compute_longrope_parameters, and the
longrope_frequency_update of dynamic_rope_update that Phi3RotaryEmbedding.forward runs):

- each rotary frequency i is divided by its own factor: 1 / (factor_i x base^(2i / dim));
- the factors are `short_factor` while the sequence fits the context the model was pretrained at
  (original_max_position_embeddings), and `long_factor` for the whole sequence once it is longer (transformers picks
  by max(position_ids) + 1; a training sequence's positions are 0..seq-1, so by its length);
- cos and sin are multiplied by an attention factor: the file's `attention_factor`, else
  sqrt(1 + ln(factor) / ln(original_max_position_embeddings)) for factor > 1 (1 otherwise), where factor is the
  file's `factor`, else max_position_embeddings / original_max_position_embeddings.

The first Phi-3-mini-128k release's own modeling_phi3.py (Phi3SuScaledRotaryEmbedding, rope_scaling type "su")
computes the same: the top-level original context, long factors once max(position_ids) + 1 exceeds it, and that
attention factor from max_position_embeddings / original_max_position_embeddings.

Megatron-LM and Megatron-Core have no LongRoPE (no flag, no RotaryEmbedding of it): it is a Hugging Face folder's
setting, read by families/phi3/config.py into --position-embedding-type longrope and the --longrope-* settings.
"""

from __future__ import annotations

import math
from argparse import ArgumentTypeError
from dataclasses import dataclass
from typing import Optional

import torch


def factor_list_value(text) -> tuple[float, ...]:
    """--longrope-short-factor / --longrope-long-factor: numbers separated by commas ("1.0,1.05,..."), or a list (a
    YAML or recorded config's)."""
    parts = list(text) if isinstance(text, (tuple, list)) else str(text).strip().strip("()[]").split(",")
    try:
        return tuple(float(str(part).strip()) for part in parts)
    except ValueError:
        raise ArgumentTypeError(f"invalid factors {text!r}: give numbers separated by commas") from None


def default_attention_factor(factor: float, original_max_positions: int) -> float:
    """transformers' _compute_longrope_parameters: "Sets the attention factor as suggested in the paper"."""
    if factor <= 1.0:
        return 1.0
    return math.sqrt(1 + math.log(factor) / math.log(original_max_positions))


@dataclass(frozen=True)
class LongRope:
    """The resolved LongRoPE of a model: both factor lists (one per rotary frequency), the pretraining context that
    picks between them, and the factor on cos and sin."""
    short_factor: tuple[float, ...]
    long_factor: tuple[float, ...]
    original_max_positions: int
    attention_factor: float

    @classmethod
    def resolve(cls, short_factor: tuple[float, ...], long_factor: tuple[float, ...], original_max_positions: int,
                max_position_embeddings: int, factor: Optional[float] = None,
                attention_factor: Optional[float] = None) -> "LongRope":
        if attention_factor is None:
            if factor is None:  # transformers' "Phi3 ... use the ratio between these two values"
                factor = max_position_embeddings / original_max_positions
            attention_factor = default_attention_factor(factor, original_max_positions)
        return cls(tuple(short_factor), tuple(long_factor), original_max_positions, attention_factor)

    def factors_for(self, seq_length: int) -> tuple[float, ...]:
        return self.long_factor if seq_length > self.original_max_positions else self.short_factor

    def angles(self, seq_length: int, rotary_dim: int, base: float,
               device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
        """cos and sin [seq, rotary_dim] in fp32, in halves, times the attention factor: transformers' inv_freq
        (`1.0 / (ext_factors * base**inv_freq_shape)`, the exponents an int64 arange made float over dim) and
        Phi3RotaryEmbedding.forward (`emb = cat(freqs, freqs)`, `emb.cos() * self.attention_scaling`)."""
        factors = torch.tensor(self.factors_for(seq_length), dtype=torch.float32, device=device)
        exponents = torch.arange(0, rotary_dim, 2, dtype=torch.int64, device=device).float() / rotary_dim
        frequencies = 1.0 / (factors * base ** exponents)
        angles = torch.outer(torch.arange(seq_length, dtype=torch.float32, device=device), frequencies)
        angles = torch.cat((angles, angles), dim=-1)
        return angles.cos() * self.attention_factor, angles.sin() * self.attention_factor
