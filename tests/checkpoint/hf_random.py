"""Random weights for a transformers model a test saves as a Hugging Face folder: each parameter drawn from one
seeded generator in `parameters()` order, times `scale`, vectors (norm gains, biases) around 1."""

from __future__ import annotations

import torch


def fill_random(model: torch.nn.Module, seed: int, scale: float) -> None:
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for param in model.parameters():
            param.copy_(torch.randn(param.shape, generator=generator) * scale + (1.0 if param.ndim == 1 else 0.0))
