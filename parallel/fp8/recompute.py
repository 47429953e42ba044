"""Delayed scaling under activation recomputation, as TransformerEngine's checkpoint keeps it: the recomputed forward
casts with the scales the original forward used and leaves the amax histories as it left them, so a recomputed block
matches bit for bit and no history is updated twice."""

from __future__ import annotations

import contextlib
from typing import Iterable, Iterator

from torch import nn

from parallel.fp8.linear import fp8_states
from parallel.fp8.recipes import DelayedScaling


def delayed_scalings_in(modules: Iterable[nn.Module]) -> list[DelayedScaling]:
    """The delayed-scaling states of the FP8 linears inside `modules`; [] without delayed scaling."""
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
