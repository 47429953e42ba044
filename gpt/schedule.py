"""Learning rate as a pure function of the schedule's position: linear warmup, then decay to min-lr.

A pure function (no scheduler object with hidden state) means a resumed run needs only its position
to continue the schedule exactly. The position is the iteration, or, with a batch-size ramp, the
samples consumed in iterations of the final global batch (gpt/batch_schedule.py), as Megatron's
scheduler counts.
"""

from __future__ import annotations

import math

from gpt.config import OptimizerConfig


def warmup_iterations(config: OptimizerConfig, train_iters: int) -> float:
    """--lr-warmup-iters, or Megatron's --lr-warmup-fraction of the decay length (--lr-decay-iters,
    else --train-iters); a fraction need not give a whole number."""
    if config.lr_warmup_fraction is not None:
        return config.lr_warmup_fraction * (config.lr_decay_iters or train_iters)
    return config.lr_warmup_iters


def learning_rate(position: float, config: OptimizerConfig, train_iters: int) -> float:
    """The rate used for the update that ends at `position` (iteration 1 is position 1)."""
    warmup = warmup_iterations(config, train_iters)
    if warmup > 0 and position <= warmup:
        return config.lr * position / warmup
    if config.lr_decay_style == "constant":
        return config.lr
    decay_iters = config.lr_decay_iters or train_iters
    if position >= decay_iters:
        return config.min_lr
    progress = (position - warmup) / max(1, decay_iters - warmup)
    if config.lr_decay_style == "linear":
        fraction = 1.0 - progress
    else:  # cosine
        fraction = 0.5 * (1.0 + math.cos(math.pi * progress))
    return config.min_lr + (config.lr - config.min_lr) * fraction
