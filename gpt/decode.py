"""One forward of a GPTModel over new tokens with a KV cache: the prompt once, then one token a step, at positions
cache.length onwards, each seeing every earlier token's keys and values."""

from __future__ import annotations

from typing import Optional

import torch

from base.errors import ConfigError
from gpt.kv_cache import KVCache
from gpt.model import GPTModel


def check_positions(model: GPTModel, length: int) -> None:
    """A learned position embedding has a row for each of `length` positions."""
    rows = model.config.max_position_embeddings
    if model.position_embeddings is not None and length > rows:
        raise ConfigError(f"{length} positions asked, and the learned position embedding has {rows} "
                          f"(--max-position-embeddings): generate fewer tokens")


def cache_refusal(model: GPTModel) -> Optional[str]:
    if model.state.context_parallel_size > 1 or model.sequence_parallel:
        return "a KV cache runs on one process (no context or sequence parallelism)"
    if not (model.stage.first and model.stage.last):
        return "a KV cache runs the whole model on one process (no pipeline stages)"
    for block in model.blocks:
        reason = getattr(block.attention, "no_decoding_cache", None)  # a mixer that keeps no state says why
        if reason is not None:
            return f"{reason}: generate without the KV cache (--no-kv-cache)"
    return None


def new_cache(model: GPTModel, capacity: int) -> KVCache:
    """A cache for `capacity` positions of `model`, after the checks (ConfigError)."""
    refusal = cache_refusal(model)
    if refusal is not None:
        raise ConfigError(refusal)
    check_positions(model, capacity)
    return KVCache(capacity)


@torch.no_grad()
def decode(model: GPTModel, tokens: torch.Tensor, cache: KVCache) -> torch.Tensor:
    """Logits [batch, new, vocab] of `tokens` after the cached ones, whose keys and values the cache then holds too.
    Eval mode only."""
    start, new = cache.length, tokens.shape[1]
    cache.check_room(new)
    positions = torch.arange(start, start + new, device=tokens.device)
    hidden = model.embed(tokens, positions=positions)
    for index, block in enumerate(model.blocks):
        hidden = block(hidden, cache=cache.layer(index))
    cache.advance(new)
    return model.output(model.final_layernorm(hidden), None)
