"""The run's configuration resolved once, after the tokenizer and the process grid are known.

A `PretrainConfig` holds what the user asked for; a few numbers depend on things known only later:
the vocabulary (from the tokenizer), the padded vocabulary (and the TP size), the accumulation steps
and global batch (and the DP size), the dtypes. `resolve_plan` computes them once into a frozen
`RunPlan`, whose `config` is a resolved copy (vocabulary and global batch filled in) that checkpoint
metadata records and everything downstream reads. Nothing changes the user's config object, so the
order in which functions are called cannot change a number.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import torch

from gpt.config import PretrainConfig, batch_arithmetic
from zero.optimizer import PRECISION_DTYPES


@dataclass(frozen=True)
class RunPlan:
    config: PretrainConfig          # resolved copy: model.vocab_size and training.global_batch_size set
    tensor_parallel_size: int
    data_parallel_size: int
    accumulation_steps: int         # micro-batches per rank per iteration
    global_batch_size: int          # samples per iteration over all DP ranks
    vocab_size: int                 # the tokenizer's
    padded_vocab_size: int          # rounded up for fast GEMMs and equal TP shards
    param_dtype: torch.dtype        # 16-bit (or fp32) parameters and activations
    grad_dtype: torch.dtype         # what gradients are accumulated and reduced in

    @property
    def tokens_per_iteration(self) -> int:
        return self.global_batch_size * self.config.model.seq_length


def resolve_plan(config: PretrainConfig, vocab_size: int, tensor_parallel_size: int,
                 data_parallel_size: int) -> RunPlan:
    """Everything derived from `config` for a grid of TP x DP and a tokenizer of `vocab_size` tokens.
    Raises ConfigError (naming the flags) when the batch arithmetic does not work out."""
    accumulation_steps, global_batch_size = batch_arithmetic(config.training, data_parallel_size)
    model = dataclasses.replace(config.model, vocab_size=vocab_size)
    training = dataclasses.replace(config.training, global_batch_size=global_batch_size)
    resolved = dataclasses.replace(config, model=model, training=training)
    return RunPlan(
        config=resolved, tensor_parallel_size=tensor_parallel_size, data_parallel_size=data_parallel_size,
        accumulation_steps=accumulation_steps, global_batch_size=global_batch_size, vocab_size=vocab_size,
        padded_vocab_size=model.padded_vocab_size(tensor_parallel_size),
        param_dtype=PRECISION_DTYPES[training.precision], grad_dtype=PRECISION_DTYPES[training.gradient_precision])
