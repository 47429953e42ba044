"""zero/grad_reducer.py: a backward under no_sync() that brings a reducer no gradient leaves its accumulation alone.

A pipeline rank with interleaved chunks runs one backward per slot and finishes the gradient sync after each
(training/pipeline_step.py); the experts' reducer (zero/experts.py) gets nothing from a chunk without an MoE layer.
Issue 77 found such a slot, outside no_sync() by the time its finish_grad_sync() ran, reducing the experts' gradients
half-way through the accumulation: divided by the data-parallel size there and again at the real reduction (expert
gradients at 38-50% of their size at ZeRO 0 and 1).

One process: every collective is skipped, and `gradient_divisor` 2 stands for the dense data-parallel size the
experts' gradients are divided by (their own group being one rank, as at DP 2 x EP 2), so a second reduction shows
as a halving.
"""

from __future__ import annotations

import pytest
import torch
from torch import nn

from arguments.config import OptimizerConfig
from parallel.state import ParallelState
from zero.apply import build_zero
from zero.config import ZeroConfig

STATE = ParallelState(device=torch.device("cpu"))


def _accumulated(stage: int, empty_slots: int) -> torch.Tensor:
    """The reduced gradient partition after two micro-batches of one Linear, with `empty_slots` backward passes
    through another module (none of the reducer's parameters) between them, each under no_sync() and finished."""
    torch.manual_seed(0)
    reduced, elsewhere = nn.Linear(4, 4), nn.Linear(4, 4)
    zero = build_zero(reduced, ZeroConfig(stage=stage), OptimizerConfig(), STATE, gradient_divisor=2)
    inputs = torch.randn(2, 4, 4)
    with zero.reducer.no_sync():
        reduced(inputs[0]).square().sum().backward()
    zero.reducer.finish_grad_sync()
    for _ in range(empty_slots):
        with zero.reducer.no_sync():
            elsewhere(inputs[0]).sum().backward()
        zero.reducer.finish_grad_sync()
    reduced(inputs[1]).square().sum().backward()  # the last micro-batch: reduces
    zero.reducer.finish_grad_sync()
    return zero.reducer.partition_gradients().clone()


@pytest.mark.parametrize("stage", [0, 1, 2])
def test_a_backward_that_gave_the_reducer_nothing_changes_no_gradient(stage):
    assert torch.equal(_accumulated(stage, empty_slots=2), _accumulated(stage, empty_slots=0))
