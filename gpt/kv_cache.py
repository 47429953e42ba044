"""A KV cache, so generation runs only the new tokens at each step (as Megatron-Core's StaticInferenceContext and
transformers' DynamicCache): each layer's keys after rotary and before grouped-query copies, in buffers made at the
first step for `capacity` tokens."""

from __future__ import annotations

from typing import Optional

import torch

from base.errors import ConfigError
from gpt.hybrid_pattern import MLA
from gpt.layer_spec import mixer_symbols
from gpt.model_config import ModelConfig


def cached_elements_per_token(config: ModelConfig) -> int:
    """Key and value elements a cache holds per token over all layers and TP ranks, each layer by its own mixer."""
    groups = config.attention.query_groups(config.num_attention_heads)
    mla = config.mla
    widths = {MLA: config.num_attention_heads * (mla.qk_head_dim + mla.qk_pos_emb_head_dim + mla.v_head_dim)}
    return sum(widths.get(mixer, 2 * groups * config.head_dim) for mixer in mixer_symbols(config))


class KVCache:
    """The keys and values of `length` tokens for every layer of one model, room for `capacity`."""

    def __init__(self, capacity: int) -> None:
        if capacity < 1:
            raise ConfigError(f"a KV cache needs room for at least one token, got {capacity}")
        self.capacity = capacity
        self.length = 0  # the next tokens' first position
        self._keys: dict[int, torch.Tensor] = {}
        self._values: dict[int, torch.Tensor] = {}

    def layer(self, index: int) -> "LayerCache":
        return LayerCache(self, index)

    def check_room(self, new: int) -> None:
        if self.length + new > self.capacity:
            raise ConfigError(f"the KV cache holds {self.capacity} positions, and {self.length + new} were asked: "
                              f"generate fewer tokens or give the cache more room")

    def advance(self, count: int) -> None:
        """Every layer has stored `count` more tokens."""
        self.length += count

    def extend(self, index: int, key: torch.Tensor, value: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Store layer `index`'s new keys and values after the held ones; return all of them."""
        end = self.length + key.shape[2]
        if index not in self._keys:  # made at the first step, when heads, dtype and device are known
            self._keys[index] = key.new_empty(*key.shape[:2], self.capacity, key.shape[3])
            self._values[index] = value.new_empty(*value.shape[:2], self.capacity, value.shape[3])
        keys, values = self._keys[index], self._values[index]
        keys[:, :, self.length:end] = key
        values[:, :, self.length:end] = value
        return keys[:, :, :end], values[:, :, :end]

    def visible(self, new: int, window: Optional[int], device: torch.device) -> torch.Tensor:
        """[new, length + new] bool: keys at or before each new query's position, within the layer's window."""
        queries = torch.arange(self.length, self.length + new, device=device)
        distance = queries[:, None] - torch.arange(self.length + new, device=device)[None, :]
        seen = distance >= 0
        return seen if window is None else seen & (distance <= window)


class LayerCache:
    """One layer's view of the model's cache."""

    def __init__(self, cache: KVCache, index: int) -> None:
        self.cache, self.index = cache, index

    @property
    def start(self) -> int:
        return self.cache.length

    @property
    def capacity(self) -> int:
        return self.cache.capacity

    def extend(self, key: torch.Tensor, value: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return self.cache.extend(self.index, key, value)

    def visible(self, new: int, window: Optional[int], device: torch.device) -> torch.Tensor:
        return self.cache.visible(new, window, device)
