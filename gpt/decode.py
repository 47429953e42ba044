"""One forward of a GPTModel over new tokens with a KV cache (gpt/kv_cache.py): the prompt once, then one token a
step, each seeing the keys and values of every token before it (python -m training.generate).

The model runs as its forward does (embedding, blocks, final norm, output layer), the new tokens at positions
cache.length onwards: the learned position embedding reads those positions, rotary turns queries and keys by them.
What the cache cannot serve yet is refused before any step, in one line naming it; multi-token prediction's
layers are not run (their predictions are a training loss here).
"""

from __future__ import annotations

from typing import Optional

import torch

from base.errors import ConfigError
from gpt.kv_cache import KVCache
from gpt.model import GPTModel


def check_positions(model: GPTModel, length: int) -> None:
    """A learned position embedding has a row for each of `length` positions (rotary turns any position)."""
    rows = model.config.max_position_embeddings
    if model.position_embeddings is not None and length > rows:
        raise ConfigError(f"{length} positions asked, and the learned position embedding has {rows} "
                          f"(--max-position-embeddings): generate fewer tokens")


def cache_refusal(model: GPTModel) -> Optional[str]:
    """Why `model` cannot run over a KV cache (None: it can)."""
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
    """A cache for `capacity` positions of `model`, after `cache_refusal`'s and `check_positions`' checks
    (ConfigError)."""
    refusal = cache_refusal(model)
    if refusal is not None:
        raise ConfigError(refusal)
    check_positions(model, capacity)
    return KVCache(capacity)


@torch.no_grad()
def decode(model: GPTModel, tokens: torch.Tensor, cache: KVCache) -> torch.Tensor:
    """Logits [batch, new, vocab] of `tokens` [batch, new], the tokens after the `cache.length` the cache holds,
    whose keys and values it then holds too. The model must be in eval mode (no dropout)."""
    start, new = cache.length, tokens.shape[1]
    cache.check_room(new)
    positions = torch.arange(start, start + new, device=tokens.device)
    hidden = model.embed(tokens, positions=positions)  # (read only by a learned position embedding)
    for index, block in enumerate(model.blocks):
        hidden = block(hidden, cache=cache.layer(index))
    cache.advance(new)
    return model.output(model.final_layernorm(hidden), None)
