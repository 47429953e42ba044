"""Delayed scaling under activation recomputation, as TransformerEngine's checkpoint keeps it: the recomputed
forward casts with the scales the original forward used and leaves the amax histories as that forward left them,
so a recomputed block computes its original forward bit for bit and no history is updated twice.

TE (transformer_engine/pytorch/distributed.py, checkpoint; quantization.py, FP8GlobalStateManager): before a
checkpointed forward each module's forward meta (amax history, scale) is copied into a FIFO
(copy_forward_fp8_meta_tensors_for_recompute); the recompute swaps the oldest copy in
(get_old_fp8_meta_tensors_for_recompute), its modules join no amax reduction or scale update, and afterwards the
updated values go back (restore_fp8_meta_tensors). zero/activations.py calls these around its checkpointed groups.
"""

from __future__ import annotations

import contextlib
from typing import Iterable, Iterator

from torch import nn

from parallel.fp8.linear import fp8_states
from parallel.fp8.recipes import DelayedScaling


def delayed_scalings_in(modules: Iterable[nn.Module]) -> list[DelayedScaling]:
    """The delayed-scaling states of the FP8 linears inside `modules` (linear.py fp8_states: each once); [] without
    delayed scaling."""
    return [state.delayed for module in modules for state in fp8_states(module).values() if state.delayed is not None]


def stash_for_recompute(scalings: list[DelayedScaling]) -> None:
    for scaling in scalings:
        scaling.stash_for_recompute()


@contextlib.contextmanager
def recomputing(scalings: list[DelayedScaling]) -> Iterator[None]:
    """The recomputed forward's body: the original forward's scales in, the updated ones back after."""
    updated = [scaling.begin_recompute() for scaling in scalings]
    try:
        yield
    finally:
        for scaling, values in zip(scalings, updated):
            scaling.end_recompute(values)
