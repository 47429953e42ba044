"""Rotary position embeddings in Megatron-Core's and transformers' rotate-half layout, or interleaved
(--rotary-interleaved), with Llama 3 and YaRN scaling. The angles are no parameters: RotaryCache makes them once per key
and shares them across layers."""

from __future__ import annotations

import math
from typing import Callable, Hashable, Optional

import torch


def inverse_frequencies(rotary_dim: int, base: float, device: torch.device,
                        scaling_factor: Optional[float] = None) -> torch.Tensor:
    """1 / base^(2i / dim) in fp32, as Megatron-Core and transformers compute it; with `scaling_factor`, Llama 3's
    scaling."""
    frequencies = 1.0 / (base ** (torch.arange(0, rotary_dim, 2, dtype=torch.float32, device=device) / rotary_dim))
    return frequencies if scaling_factor is None else llama3_scaled(frequencies, scaling_factor)


def llama3_scaled(frequencies: torch.Tensor, factor: float, low_freq_factor: float = 1.0,
                  high_freq_factor: float = 4.0, original_context: int = 8192) -> torch.Tensor:
    """Llama 3's rope scaling, as Megatron-Core's _apply_scaling: long wavelengths slow by `factor`, short ones stay,
    those between interpolate."""
    low_freq_wavelen = original_context / low_freq_factor
    high_freq_wavelen = original_context / high_freq_factor
    wavelen = 2 * math.pi / frequencies
    scaled = torch.where(wavelen > low_freq_wavelen, frequencies / factor, frequencies)
    smooth = (original_context / wavelen - low_freq_factor) / (high_freq_factor - low_freq_factor)
    smoothed = (1 - smooth) * scaled / factor + smooth * scaled
    is_medium = ~(wavelen < high_freq_wavelen) * ~(wavelen > low_freq_wavelen)
    return torch.where(is_medium, smoothed, scaled)


def rotary_angles(seq_length: int, rotary_dim: int, base: float, device: torch.device,
                  scaling_factor: Optional[float] = None, interleaved: bool = False,
                  interpolation_factor: Optional[float] = None) -> tuple[torch.Tensor, torch.Tensor]:
    """cos and sin [seq, rotary_dim] in fp32, halves or (interleaved) pairs. `interpolation_factor`:
    --rotary-seq-len-interpolation-factor, positions times 1 / factor."""
    positions = torch.arange(seq_length, dtype=torch.float32, device=device)
    if interpolation_factor is not None:
        positions = positions * (1 / interpolation_factor)
    freqs = torch.outer(positions, inverse_frequencies(rotary_dim, base, device, scaling_factor))
    angles = freqs.repeat_interleave(2, dim=-1) if interleaved else torch.cat((freqs, freqs), dim=-1)
    return angles.cos(), angles.sin()


def _rotate_half(x: torch.Tensor, interleaved: bool = False) -> torch.Tensor:
    if interleaved:  # each pair (x[2i], x[2i + 1]) -> (-x[2i + 1], x[2i])
        return torch.stack((-x[..., 1::2], x[..., ::2]), dim=-1).flatten(-2)
    first, second = x.chunk(2, dim=-1)
    return torch.cat((-second, first), dim=-1)


def apply_rotary(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, interleaved: bool = False) -> torch.Tensor:
    """x: [batch, heads, seq, head_dim]; its first cos.shape[-1] dims rotate, the rest pass (--rotary-percent)."""
    rotary_dim = cos.shape[-1]
    rotating, passing = x[..., :rotary_dim], x[..., rotary_dim:]
    rotated = rotating * cos.to(x.dtype) + _rotate_half(rotating, interleaved) * sin.to(x.dtype)
    return torch.cat((rotated, passing), dim=-1) if passing.shape[-1] else rotated


def yarn_get_mscale(scale: float = 1.0, mscale: float = 1.0) -> float:
    """YaRN's attention scale: 1 for a factor <= 1, else 0.1 x mscale x ln(scale) + 1."""
    if scale <= 1:
        return 1.0
    return 0.1 * mscale * math.log(scale) + 1.0


def yarn_inverse_frequencies(rotary_dim: int, base: float, scaling_factor: float, original_max_positions: int,
                             beta_fast: float, beta_slow: float, device: torch.device,
                             round_to_int: bool = True) -> torch.Tensor:
    """YaRN's inverse frequencies, as Megatron-Core's YarnRotaryEmbedding: extrapolated above beta_fast rotations,
    interpolated below beta_slow, a linear ramp between."""
    exponents = torch.arange(0, rotary_dim, 2, dtype=torch.float32, device=device) / rotary_dim
    extrapolated = 1.0 / (base ** exponents)
    interpolated = 1.0 / (scaling_factor * base ** exponents)

    def correction_dim(rotations: float) -> float:
        return rotary_dim * math.log(original_max_positions / (rotations * 2 * math.pi)) / (2 * math.log(base))

    low, high = correction_dim(beta_fast), correction_dim(beta_slow)
    if round_to_int:
        low, high = math.floor(low), math.ceil(high)
    low, high = max(low, 0), min(high, rotary_dim - 1)
    if low == high:
        high += 0.001  # no division by zero
    ramp = ((torch.arange(rotary_dim // 2, dtype=torch.float32, device=device) - low) / (high - low)).clamp(0, 1)
    extrapolation = 1.0 - ramp
    return interpolated * (1 - extrapolation) + extrapolated * extrapolation


def yarn_concentration(scaling_factor: float, mscale: float, mscale_all_dim: float) -> float:
    return yarn_get_mscale(scaling_factor, mscale) / yarn_get_mscale(scaling_factor, mscale_all_dim)


def yarn_angles(seq_length: int, head_dim: int, base: float, device: torch.device, scaling_factor: float,
                original_max_positions: int, beta_fast: float, beta_slow: float, round_to_int: bool, mscale: float,
                mscale_all_dim: float) -> tuple[torch.Tensor, torch.Tensor]:
    """--position-embedding-type yarn's cos and sin [seq, head_dim], times the concentration factor, as Megatron-Core's
    YarnRotaryEmbedding for non-MLA attention."""
    frequencies = yarn_inverse_frequencies(head_dim, base, scaling_factor, original_max_positions, beta_fast,
                                           beta_slow, device, round_to_int)
    angles = torch.outer(torch.arange(seq_length, dtype=torch.float32, device=device), frequencies)
    angles = torch.cat((angles, angles), dim=-1)
    concentration = yarn_concentration(scaling_factor, mscale, mscale_all_dim)
    return angles.cos() * concentration, angles.sin() * concentration


class RotaryCache:
    """cos and sin by what decides them, computed and cast once and shared by every layer asking the same; a few MB at
    most."""

    def __init__(self) -> None:
        self._tables: dict[Hashable, tuple[torch.Tensor, torch.Tensor]] = {}

    def angles(self, key: Hashable, dtype: torch.dtype,
               compute: Callable[[], tuple[torch.Tensor, torch.Tensor]]) -> tuple[torch.Tensor, torch.Tensor]:
        """`compute()`'s cos and sin cast to `dtype`, made the first time `(key, dtype)` is asked."""
        if torch.compiler.is_compiling():
            cos, sin = compute()
            return cos.to(dtype), sin.to(dtype)
        table = self._tables.get((key, dtype))
        if table is None:
            cos, sin = compute()
            table = self._tables[(key, dtype)] = (cos.to(dtype), sin.to(dtype))
        return table
