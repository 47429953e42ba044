"""Autoregressive generation: the prompt's forward, then one new token a step from the last position's logits until
`max_new` or the stop token; with a KV cache a step runs one token, without it the whole sequence (the cache's
reference)."""

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
    """The new tokens [batch, <= max_new] after `prompt`; a row's tokens after its stop are `stop_id` again. `model`
    must be in eval mode."""
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


@torch.no_grad()
def generate_prompts(model: GPTModel, prompts: list[list[int]], max_new: int, sampling: Sampling,
                     generator: Optional[torch.Generator] = None, stop_id: Optional[int] = None,
                     use_cache: bool = True, max_batch_size: int = 8) -> list[list[int]]:
    """Each prompt's new tokens, the prompts run in right-padded batches as Megatron-LM's text generation batches
    them."""
    if max_batch_size < 1:
        raise ValueError(f"max_batch_size {max_batch_size}: give at least 1")
    made: list[list[int]] = []
    for start in range(0, len(prompts), max_batch_size):
        made += _generate_batch(model, prompts[start:start + max_batch_size], max_new, sampling, generator, stop_id,
                                use_cache)
    return made


def _generate_batch(model: GPTModel, prompts: list[list[int]], max_new: int, sampling: Sampling,
                    generator: Optional[torch.Generator], stop_id: Optional[int], use_cache: bool) -> list[list[int]]:
    device = model.state.device
    lengths = torch.tensor([len(prompt) for prompt in prompts], device=device)
    shortest, total = min(map(len, prompts)), max(map(len, prompts)) + max_new
    check_positions(model, total)
    cache = new_cache(model, total) if use_cache else None
    tokens = torch.zeros(len(prompts), total, dtype=torch.long, device=device)
    for row, prompt in enumerate(prompts):
        tokens[row, :len(prompt)] = torch.tensor(prompt, dtype=torch.long, device=device)
    made = torch.zeros(len(prompts), dtype=torch.long, device=device)
    done = torch.zeros(len(prompts), dtype=torch.bool, device=device)
    before = 0
    for at in range(shortest, total):
        logits = decode(model, tokens[:, before:at], cache) if cache is not None else model(tokens[:, :at])
        chosen = next_tokens(logits[:, -1], sampling, generator)
        in_prompt = lengths > at
        tokens[:, at] = torch.where(in_prompt, tokens[:, at], chosen)
        generating = ~in_prompt & ~done
        made += generating.long()
        if stop_id is not None:
            done |= generating & (chosen == stop_id)
        done |= made >= max_new
        before = at
        if bool(done.all()):
            break
    return [tokens[row, len(prompt):len(prompt) + int(made[row])].tolist() for row, prompt in enumerate(prompts)]
