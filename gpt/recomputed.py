"""A function that keeps only its inputs for backward and runs again there under autograd, so its gradients come from
the same ops in the same order: bit-identical to plain autograd while keeping less (as Transformer Engine's RMSNorm
keeps only input and rsigma)."""

from __future__ import annotations

from typing import Callable, Optional, Sequence

import torch
from torch.autograd.function import once_differentiable
from torch.autograd.graph import get_gradient_edge


def plain_call(*inputs: torch.Tensor) -> bool:
    """Run the plain function instead: outside autograd, and under torch.compile, whose partitioner already chooses what
    to recompute."""
    return not torch.is_grad_enabled() or not any(tensor.requires_grad for tensor in inputs) or \
        torch.compiler.is_compiling()


class _RecomputedInBackward(torch.autograd.Function):
    @staticmethod
    def forward(ctx, function: Callable[..., torch.Tensor], *inputs: torch.Tensor) -> torch.Tensor:
        ctx.function = function
        ctx.save_for_backward(*inputs)
        return function(*inputs)

    @staticmethod
    @once_differentiable  # no gradient of a gradient through here
    def backward(ctx, grad: torch.Tensor):
        return (None, *gradients_made_again(ctx.function, ctx.saved_tensors, ctx.needs_input_grad[1:], grad))


def gradients_made_again(function: Callable[..., torch.Tensor], saved: Sequence[torch.Tensor],
                         needs: Sequence[bool], grad: torch.Tensor) -> list[Optional[torch.Tensor]]:
    """The gradients at `saved` of `function`, its graph made again; the output is dropped before autograd runs, so the
    graph lives only while it runs."""
    with torch.enable_grad():
        inputs = [tensor.detach().requires_grad_(need) for tensor, need in zip(saved, needs)]
        output = function(*inputs)
    edge = get_gradient_edge(output)
    del output
    found = iter(torch.autograd.grad(edge, [tensor for tensor, need in zip(inputs, needs) if need], grad))
    return [next(found) if need else None for need in needs]


def recomputed_in_backward(function: Callable[..., torch.Tensor], *inputs: torch.Tensor) -> torch.Tensor:
    """`function(*inputs)` (deterministic, one tensor out), keeping only `inputs` for backward."""
    if plain_call(*inputs):
        return function(*inputs)
    return _RecomputedInBackward.apply(function, *inputs)
