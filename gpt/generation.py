"""Autoregressive generation: the prompt's forward, then one new token a step, each picked from the last
position's logits (gpt/sampling.py), until `max_new` tokens or the stop token.

With a KV cache (gpt/kv_cache.py, gpt/decode.py) a step runs the one new token; without (`use_cache=False`)
every step runs the model's forward over the whole sequence so far, which is also the
reference the cache is tested against (tests/gpt/test_kv_cache.py).
"""

from __future__ import annotations

from typing import Optional

import torch

from gpt.decode import check_positions, decode, new_cache
from gpt.model import GPTModel
from gpt.sampling import Sampling, next_tokens


@torch.no_grad()
def generate(model: GPTModel, prompt: torch.Tensor, max_new: int, sampling: Sampling,
             generator: Optional[torch.Generator] = None, stop_id: Optional[int] = None,
             use_cache: bool = True) -> torch.Tensor:
    """The new tokens [batch, <= max_new] after `prompt` [batch, length]; a batch stops when every row has made
    `stop_id` (kept), and a row's tokens after its stop are `stop_id` again. `model` must be in eval mode."""
    sequence = prompt
    check_positions(model, prompt.shape[1] + max_new)
    cache = new_cache(model, prompt.shape[1] + max_new) if use_cache else None
    done = torch.zeros(prompt.shape[0], dtype=torch.bool, device=prompt.device)
    feed = prompt
    for _ in range(max_new):
        logits = decode(model, feed, cache) if cache is not None else model(sequence)
        chosen = next_tokens(logits[:, -1], sampling, generator)
        if stop_id is not None:
            chosen = torch.where(done, torch.full_like(chosen, stop_id), chosen)
            done |= chosen == stop_id
        sequence = torch.cat([sequence, chosen[:, None]], dim=1)
        feed = chosen[:, None]
        if stop_id is not None and bool(done.all()):
            break
    return sequence[:, prompt.shape[1]:]
