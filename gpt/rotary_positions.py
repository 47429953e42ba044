"""An attention layer's rotary positions: its angles at its tokens' positions (global under context parallelism, the new
tokens' with a KV cache), from the model's shared RotaryCache, and the rotation of queries and keys."""

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
    rotary = False

    def rotated(self, query: torch.Tensor, key: torch.Tensor, cache: Optional[LayerCache]
                ) -> tuple[torch.Tensor, torch.Tensor]:
        return query, key


NO_ROTATION = NoRotation()


class RotaryPositions:
    """One layer's rotary settings, angles and rotation."""

    rotary = True

    def __init__(self, positions: PositionSettings, head_dim: int, window: Optional[int], longrope: Optional[LongRope],
                 context_parallel: Optional[ParallelState], cache: RotaryCache):
        self.positions, self.head_dim, self.longrope, self.cache = positions, head_dim, longrope, cache
        self.context_parallel = context_parallel
        # --local-rotary-base: a sliding-window layer's own unscaled rotary (Gemma 3)
        local = window is not None and positions.local_rotary_base is not None
        self.base = positions.local_rotary_base if local else positions.rotary_base
        self.rope_scaling = None if local else positions.rope_scaling
        self.interpolation = None if local else positions.rotary_seq_len_interpolation_factor
        self.interleaved = positions.rotary_interleaved
        self.dim = positions.rotary_dim(head_dim)

    def rotated(self, query: torch.Tensor, key: torch.Tensor, cache: Optional[LayerCache]
                ) -> tuple[torch.Tensor, torch.Tensor]:
        """query and key rotated, angles in the queries' dtype; one pair shared by every layer."""
        cos, sin = self.cos_sin(query.shape[2], query.device, query.dtype, cache)
        return apply_rotary(query, cos, sin, self.interleaved), apply_rotary(key, cos, sin, self.interleaved)

    def cos_sin(self, seq: int, device: torch.device, dtype: torch.dtype, cache: Optional[LayerCache]
                ) -> tuple[torch.Tensor, torch.Tensor]:
        """cos and sin of the `seq` tokens, or of the new tokens with a cache. LongRoPE picks its factors by the length
        so far, as transformers' dynamic LongRoPE."""
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
        """RotaryCache's key: settings, length, this rank's place under CP, and device."""
        cp = self.context_parallel
        return ("rope", self.dim, self.head_dim, self.base, self.rope_scaling, self.interleaved, self.interpolation,
                id(self.longrope) if self.longrope is not None else None, self.positions.position_embedding_type, seq,
                str(device), None if cp is None else (cp.context_parallel_size, cp.context_parallel_rank))

    def _angles_on_this_rank(self, seq: int, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
        if self.context_parallel is None:
            return self._angles(seq, device)
        positions = positions_on_this_rank(seq, self.context_parallel, device)
        cos, sin = self._angles(seq * self.context_parallel.context_parallel_size, device)
        return cos[positions], sin[positions]

    def _angles(self, length: int, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
        """cos and sin of positions 0..length-1: rope's, YaRN's or LongRoPE's."""
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
    """A layer's positions: `rotary` False on a --no-rope-freq layer; `cache` the model's."""
    if not (config.positions.rotary and rotary):
        return NO_ROTATION
    return RotaryPositions(config.positions, config.head_dim, window, config.longrope,
                           state if state.context_parallel_size > 1 else None,
                           cache if cache is not None else RotaryCache())
