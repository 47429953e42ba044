"""An attention layer's rotary positions: its angles (rope's, YaRN's or LongRoPE's, gpt/rotary.py and gpt/longrope.py;
a sliding-window layer's --local-rotary-base), at its tokens' positions (0..seq-1; under context parallelism this
rank's chunks' global positions; with a KV cache the new tokens'), read from the model's RotaryCache, which every layer
shares (made once, in the first forward that asks), and the rotation of the queries and keys by them. A layer without
rotary positions (--position-embedding-type learned_absolute or none, a --no-rope-freq layer: Megatron-Core's
Attention.forward with `rotary_pos_emb = None`) gets NO_ROTATION."""

from __future__ import annotations

from typing import Optional, Union

import torch

from gpt.kv_cache import LayerCache
from gpt.longrope import LongRope
from gpt.model_config import ModelConfig
from gpt.positions import PositionSettings
from gpt.rotary import RotaryCache, apply_rotary, rotary_angles, yarn_angles
from parallel.context_parallel import positions_on_this_rank
from parallel.state import ParallelState


class NoRotation:
    """Queries and keys pass through."""

    rotary = False

    def rotated(self, query: torch.Tensor, key: torch.Tensor, cache: Optional[LayerCache]
                ) -> tuple[torch.Tensor, torch.Tensor]:
        return query, key


NO_ROTATION = NoRotation()


class RotaryPositions:
    """One layer's rotary settings, its angles by way of the shared cache, and the rotation."""

    rotary = True

    def __init__(self, positions: PositionSettings, head_dim: int, window: Optional[int], longrope: Optional[LongRope],
                 context_parallel: Optional[ParallelState], cache: RotaryCache):
        """`context_parallel`: the state where the sequence here is this rank's chunks, else None."""
        self.positions, self.head_dim, self.longrope, self.cache = positions, head_dim, longrope, cache
        self.context_parallel = context_parallel
        # --local-rotary-base: a sliding-window layer's own rotary, unscaled (Gemma 3's rope_parameters for its
        # "sliding_attention" layers); the other layers' base, Llama 3 scaling and interpolation
        local = window is not None and positions.local_rotary_base is not None
        self.base = positions.local_rotary_base if local else positions.rotary_base
        self.rope_scaling = None if local else positions.rope_scaling
        self.interpolation = None if local else positions.rotary_seq_len_interpolation_factor
        self.interleaved = positions.rotary_interleaved
        self.dim = positions.rotary_dim(head_dim)

    def rotated(self, query: torch.Tensor, key: torch.Tensor, cache: Optional[LayerCache]
                ) -> tuple[torch.Tensor, torch.Tensor]:
        """query and key [batch, heads, seq, head_dim] rotated by their tokens' angles, made in the queries' dtype so
        that apply_rotary's own cast is a no-op; one pair for every layer (and for q and k), so the products' backward
        keeps one copy."""
        cos, sin = self.cos_sin(query.shape[2], query.device, query.dtype, cache)
        return apply_rotary(query, cos, sin, self.interleaved), apply_rotary(key, cos, sin, self.interleaved)

    def cos_sin(self, seq: int, device: torch.device, dtype: torch.dtype, cache: Optional[LayerCache]
                ) -> tuple[torch.Tensor, torch.Tensor]:
        """cos and sin of the `seq` tokens: positions 0..seq-1, or with a KV cache the new tokens' positions, cut from
        the angles of the cache's every position (the same values: each position's angle is its own product).
        LongRoPE picks its factors by the whole sequence's length, so its angles are made for the length so far, as
        transformers' dynamic LongRoPE picks them by the largest position."""
        if cache is None:
            return self.cache.angles(self._key(seq, device), dtype, lambda: self._angles_on_this_rank(seq, device))
        end = cache.start + seq
        if self.longrope is not None:
            cos, sin = (part.to(dtype) for part in self._angles(end, device))
        else:
            cos, sin = self.cache.angles(self._key(cache.capacity, device), dtype,
                                         lambda: self._angles(cache.capacity, device))
        return cos[cache.start:end], sin[cache.start:end]

    def _key(self, seq: int, device: torch.device) -> tuple:
        """What decides this layer's cos and sin besides their dtype (RotaryCache's key): its settings, the length
        and, with context parallelism, this rank's place in the sequence, and the device. (YaRN's settings are the
        model's, the same for every layer that shares the cache.)"""
        cp = self.context_parallel
        return ("rope", self.dim, self.head_dim, self.base, self.rope_scaling, self.interleaved, self.interpolation,
                id(self.longrope) if self.longrope is not None else None, self.positions.position_embedding_type, seq,
                str(device), None if cp is None else (cp.context_parallel_size, cp.context_parallel_rank))

    def _angles_on_this_rank(self, seq: int, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
        """cos and sin of this rank's `seq` tokens: with context parallelism, each token's at its global position."""
        if self.context_parallel is None:
            return self._angles(seq, device)
        positions = positions_on_this_rank(seq, self.context_parallel, device)
        cos, sin = self._angles(seq * self.context_parallel.context_parallel_size, device)
        return cos[positions], sin[positions]

    def _angles(self, length: int, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
        """cos and sin of positions 0..length-1: rope's (gpt/rotary.py rotary_angles), YaRN's (yarn_angles) or
        LongRoPE's (gpt/longrope.py: its short or long factors by the whole sequence's length, as transformers picks
        them by the largest position + 1)."""
        positions = self.positions
        if self.longrope is not None:
            return self.longrope.angles(length, self.dim, self.base, device)
        if positions.position_embedding_type == "yarn":
            return yarn_angles(length, self.head_dim, self.base, device, positions.rotary_scaling_factor,
                               positions.yarn_original_max_position_embeddings, positions.yarn_beta_fast,
                               positions.yarn_beta_slow, positions.yarn_correction_range_round_to_int,
                               positions.mscale, positions.mscale_all_dim)
        return rotary_angles(length, self.dim, self.base, device, self.rope_scaling, self.interleaved,
                             self.interpolation)


def layer_positions(config: ModelConfig, state: ParallelState, window: Optional[int], rotary: bool,
                    cache: Optional[RotaryCache]) -> Union[RotaryPositions, NoRotation]:
    """A layer's positions: `rotary` False on a --no-rope-freq layer; `cache` the model's (None: the layer's own)."""
    if not (config.positions.rotary and rotary):
        return NO_ROTATION
    return RotaryPositions(config.positions, config.head_dim, window, config.longrope,
                           state if state.context_parallel_size > 1 else None,
                           cache if cache is not None else RotaryCache())
