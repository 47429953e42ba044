"""Rotary position embeddings, in the rotate-half layout of Megatron-Core (rope_utils._rotate_half
without interleaving) and transformers' Llama (rotate_half), or with --rotary-interleaved in Megatron-Core's
interleaved one: dims (2i, 2i + 1) form the pair that frequency i rotates (RotaryEmbedding.get_emb repeats
each frequency twice in a row, and _rotate_half maps each pair (a, b) to (-b, a)).

The angles are no parameters (the model is built on the meta device and materialized parameter by parameter): they
are computed from positions and fp32 inverse frequencies at the first forward that needs them and kept by the model's
RotaryCache, which every layer reads (Megatron-Core computes them once per forward in GPTModel._preprocess and hands
them to every layer, its RotaryEmbedding.forward lru_cached on the sequence length).
"""

from __future__ import annotations

import math
from typing import Callable, Hashable, Optional

import torch


def inverse_frequencies(rotary_dim: int, base: float, device: torch.device,
                        scaling_factor: Optional[float] = None) -> torch.Tensor:
    """1 / base^(2i / dim) in fp32, the expression of Megatron-Core's RotaryEmbedding and transformers'
    default rope parameters (the same float32 arange divided by dim); with `scaling_factor`, Llama 3's
    scaling of them (Megatron's --use-rope-scaling)."""
    frequencies = 1.0 / (base ** (torch.arange(0, rotary_dim, 2, dtype=torch.float32, device=device) / rotary_dim))
    return frequencies if scaling_factor is None else llama3_scaled(frequencies, scaling_factor)


def llama3_scaled(frequencies: torch.Tensor, factor: float, low_freq_factor: float = 1.0,
                  high_freq_factor: float = 4.0, original_context: int = 8192) -> torch.Tensor:
    """Llama 3's rope scaling, as Megatron-Core's RotaryEmbedding._apply_scaling (adapted there from
    transformers' _compute_llama3_parameters, with the same fixed low/high factors and original context):
    long wavelengths slow down by `factor`, short ones stay, those between are interpolated."""
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
    """cos and sin, [seq, rotary_dim], fp32: each frequency's angles repeated for the two halves, or
    (interleaved) twice in a row, [f0, f0, f1, f1, ...]. `interpolation_factor`: Megatron-LM's
    --rotary-seq-len-interpolation-factor, the positions times 1 / factor (Megatron-Core's
    RotaryEmbedding.get_freqs_non_repeated: `seq *= 1 / self.seq_len_interpolation_factor`), which is transformers'
    "linear" rope scaling (inverse frequencies / factor)."""
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
    """x: [batch, heads, seq, head_dim]; its first cos.shape[-1] dims rotate, the rest pass through
    (Megatron's --rotary-percent). `interleaved` as the angles were made (rotary_angles)."""
    rotary_dim = cos.shape[-1]
    rotating, passing = x[..., :rotary_dim], x[..., rotary_dim:]
    rotated = rotating * cos.to(x.dtype) + _rotate_half(rotating, interleaved) * sin.to(x.dtype)
    return torch.cat((rotated, passing), dim=-1) if passing.shape[-1] else rotated


def yarn_get_mscale(scale: float = 1.0, mscale: float = 1.0) -> float:
    """YaRN's attention scale, Megatron-Core's _yarn_get_mscale (yarn_rotary_pos_embedding.py): 1 for a scaling
    factor of at most 1, else 0.1 x mscale x ln(scale) + 1."""
    if scale <= 1:
        return 1.0
    return 0.1 * mscale * math.log(scale) + 1.0


def yarn_inverse_frequencies(rotary_dim: int, base: float, scaling_factor: float, original_max_positions: int,
                             beta_fast: float, beta_slow: float, device: torch.device,
                             round_to_int: bool = True) -> torch.Tensor:
    """YaRN's inverse frequencies, as Megatron-Core's YarnRotaryEmbedding.get_emb: the plain ones (extrapolated)
    for the dims that turn more than beta_fast times over the original context, those divided by the scaling
    factor (interpolated) for the dims that turn less than beta_slow times, a linear ramp between; the
    correction range rounded to whole dims (`round_to_int`: correction_range_round_to_int, its default) and
    clamped."""
    exponents = torch.arange(0, rotary_dim, 2, dtype=torch.float32, device=device) / rotary_dim
    extrapolated = 1.0 / (base ** exponents)
    interpolated = 1.0 / (scaling_factor * base ** exponents)

    def correction_dim(rotations: float) -> float:  # _yarn_find_correction_dim
        return rotary_dim * math.log(original_max_positions / (rotations * 2 * math.pi)) / (2 * math.log(base))

    low, high = correction_dim(beta_fast), correction_dim(beta_slow)
    if round_to_int:
        low, high = math.floor(low), math.ceil(high)
    low, high = max(low, 0), min(high, rotary_dim - 1)
    if low == high:
        high += 0.001  # _yarn_linear_ramp_mask: no division by zero
    ramp = ((torch.arange(rotary_dim // 2, dtype=torch.float32, device=device) - low) / (high - low)).clamp(0, 1)
    extrapolation = 1.0 - ramp
    return interpolated * (1 - extrapolation) + extrapolated * extrapolation


def yarn_concentration(scaling_factor: float, mscale: float, mscale_all_dim: float) -> float:
    """YaRN's factor on cos and sin, Megatron-Core's _yarn_get_concentration_factor."""
    return yarn_get_mscale(scaling_factor, mscale) / yarn_get_mscale(scaling_factor, mscale_all_dim)


def yarn_angles(seq_length: int, head_dim: int, base: float, device: torch.device, scaling_factor: float,
                original_max_positions: int, beta_fast: float, beta_slow: float, round_to_int: bool, mscale: float,
                mscale_all_dim: float) -> tuple[torch.Tensor, torch.Tensor]:
    """--position-embedding-type yarn's cos and sin [seq, head_dim] (Megatron-Core's YarnRotaryEmbedding for attention
    other than multi-latent: get_emb's frequencies over the whole head, in halves, and cos and sin times the
    concentration factor, as apply_rotary_pos_emb takes its mscale; transformers' _compute_yarn_parameters with its
    attention_factor is the same)."""
    frequencies = yarn_inverse_frequencies(head_dim, base, scaling_factor, original_max_positions, beta_fast,
                                           beta_slow, device, round_to_int)
    angles = torch.outer(torch.arange(seq_length, dtype=torch.float32, device=device), frequencies)
    angles = torch.cat((angles, angles), dim=-1)
    concentration = yarn_concentration(scaling_factor, mscale, mscale_all_dim)
    return angles.cos() * concentration, angles.sin() * concentration


class RotaryCache:
    """cos and sin by what decides them (the layer's rotary settings, the sequence's length and this rank's positions
    in it, device, dtype), computed once, cast to the layer's dtype once, and shared by every layer of a model that
    asks the same: a layer's forward then issues none of the ~11 ops of making them (each layer made them in every
    micro-batch before). What it holds: per distinct key two [positions, rotary dims] tensors in the model's dtype (a
    model has one key, or two with --local-rotary-base or MLA beside a rope layer), a few MB at most.

    Nothing is kept while torch.compile traces: a tensor made in a traced graph is not the graph's to store (and
    inductor fuses the angles into the rotation's kernel there anyway)."""

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
