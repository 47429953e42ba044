"""Learning rate as a pure function of the iteration: linear warmup, then decay to min-lr.

A pure function (no scheduler object with hidden state) means a resumed run needs only the iteration
number to continue the schedule exactly.
"""

from __future__ import annotations

import math

from gpt.config import OptimizerConfig


def learning_rate(iteration: int, config: OptimizerConfig, train_iters: int) -> float:
    """The rate used for the update that ends `iteration` (1-based)."""
    warmup = config.lr_warmup_iters
    if warmup > 0 and iteration <= warmup:
        return config.lr * iteration / warmup
    if config.lr_decay_style == "constant":
        return config.lr
    decay_iters = config.lr_decay_iters or train_iters
    if iteration >= decay_iters:
        return config.min_lr
    progress = (iteration - warmup) / max(1, decay_iters - warmup)
    if config.lr_decay_style == "linear":
        fraction = 1.0 - progress
    else:  # cosine
        fraction = 0.5 * (1.0 + math.cos(math.pi * progress))
    return config.min_lr + (config.lr - config.min_lr) * fraction
