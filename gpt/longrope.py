"""LongRoPE, Phi-3's long-context rotary scaling, as transformers computes it: each frequency divided by its own factor,
the short factors while the sequence fits the pretraining context and the long ones beyond, and cos and sin scaled by an
attention factor."""

from __future__ import annotations

import math
from argparse import ArgumentTypeError
from dataclasses import dataclass
from typing import Optional

import torch


def factor_list_value(text) -> tuple[float, ...]:
    """--longrope-short/long-factor: comma-separated numbers, or a list."""
    parts = list(text) if isinstance(text, (tuple, list)) else str(text).strip().strip("()[]").split(",")
    try:
        return tuple(float(str(part).strip()) for part in parts)
    except ValueError:
        raise ArgumentTypeError(f"invalid factors {text!r}: give numbers separated by commas") from None


def default_attention_factor(factor: float, original_max_positions: int) -> float:
    """transformers' _compute_longrope_parameters' default attention factor."""
    if factor <= 1.0:
        return 1.0
    return math.sqrt(1 + math.log(factor) / math.log(original_max_positions))


@dataclass(frozen=True)
class LongRope:
    """A model's resolved LongRoPE: both factor lists, the pretraining context picking between them, and the factor on
    cos and sin."""
    short_factor: tuple[float, ...]
    long_factor: tuple[float, ...]
    original_max_positions: int
    attention_factor: float

    @classmethod
    def resolve(cls, short_factor: tuple[float, ...], long_factor: tuple[float, ...], original_max_positions: int,
                max_position_embeddings: int, factor: Optional[float] = None,
                attention_factor: Optional[float] = None) -> "LongRope":
        if attention_factor is None:
            if factor is None:  # transformers' Phi-3 ratio of the two contexts
                factor = max_position_embeddings / original_max_positions
            attention_factor = default_attention_factor(factor, original_max_positions)
        return cls(tuple(short_factor), tuple(long_factor), original_max_positions, attention_factor)

    def factors_for(self, seq_length: int) -> tuple[float, ...]:
        return self.long_factor if seq_length > self.original_max_positions else self.short_factor

    def angles(self, seq_length: int, rotary_dim: int, base: float,
               device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
        """cos and sin [seq, rotary_dim] in fp32, in halves, times the attention factor, as transformers'
        Phi3RotaryEmbedding."""
        factors = torch.tensor(self.factors_for(seq_length), dtype=torch.float32, device=device)
        exponents = torch.arange(0, rotary_dim, 2, dtype=torch.int64, device=device).float() / rotary_dim
        frequencies = 1.0 / (factors * base ** exponents)
        angles = torch.outer(torch.arange(seq_length, dtype=torch.float32, device=device), frequencies)
        angles = torch.cat((angles, angles), dim=-1)
        return angles.cos() * self.attention_factor, angles.sin() * self.attention_factor
