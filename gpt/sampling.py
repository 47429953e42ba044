"""The next token from the last position's logits, as Megatron-Core's text generation picks it: top-k 1 is greedy,
otherwise temperature, top-k or top-p filtering, and a draw from the softmax."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import torch

from base.errors import ConfigError

# Megatron-LM's text generation server's bound; 0 is greedy here
MAX_TEMPERATURE = 100.0


@dataclass(frozen=True)
class Sampling:
    temperature: float = 1.0
    top_k: int = 0
    top_p: float = 0.0

    @property
    def greedy(self) -> bool:
        return self.top_k == 1 or self.temperature == 0

    def validate(self, vocab_size: int) -> None:
        if not 0 <= self.temperature <= MAX_TEMPERATURE:  # NaN too
            raise ConfigError(f"--temperature {self.temperature}: give 0 (greedy) up to {MAX_TEMPERATURE:g} (Megatron-LM's "
                              f"text generation server's bound)")
        if self.top_k < 0 or self.top_k > vocab_size:
            raise ConfigError(f"--top-k {self.top_k}: give 0 (off) to the vocabulary's {vocab_size}")
        if not 0.0 <= self.top_p <= 1.0:
            raise ConfigError(f"--top-p {self.top_p}: give 0 (off) to 1")
        if self.top_k > 0 and self.top_p > 0:
            raise ConfigError(f"--top-k {self.top_k} with --top-p {self.top_p}: give one of them, as Megatron-LM "
                              f"asks (\"Cannot have top-p and top-k both greater than zero\")")


def next_tokens(logits: torch.Tensor, sampling: Sampling, generator: Optional[torch.Generator] = None) -> torch.Tensor:
    if sampling.greedy:
        return logits.argmax(dim=-1)
    # subtract the largest first: a tiny temperature then gives -inf (the greedy limit), never NaN
    logits = logits.float()
    logits = (logits - logits.max(dim=-1, keepdim=True).values) / sampling.temperature
    if sampling.top_k > 1:
        logits = logits.masked_fill(logits < torch.topk(logits, sampling.top_k)[0][..., -1:], float("-inf"))
    if sampling.top_p > 0:
        logits = _nucleus(logits, sampling.top_p)
    probabilities = logits.softmax(dim=-1)
    return torch.multinomial(probabilities, num_samples=1, generator=generator).view(-1)


def _nucleus(logits: torch.Tensor, top_p: float) -> torch.Tensor:
    """Logits outside the smallest prefix whose mass passes `top_p` set to -inf."""
    sorted_logits, order = torch.sort(logits, descending=True)
    beyond = sorted_logits.softmax(dim=-1).cumsum(dim=-1) > top_p
    beyond[..., 1:] = beyond[..., :-1].clone()  # keep the token that crosses p
    beyond[..., 0] = False
    return logits.masked_fill(beyond.scatter(-1, order, beyond), float("-inf"))
