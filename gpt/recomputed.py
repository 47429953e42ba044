"""A function that keeps only its inputs for backward and runs again there (gpt/norms.py rms_norm).

Autograd keeps what each op's backward needs: for RMSNorm the fp32 copy of its 16-bit input (4 bytes a value) and
the normed values. Megatron-Core's blocks keep less: Transformer Engine's RMSNorm its input and the per-token
rsigma. Here such a function runs once in forward with nothing kept but its tensor inputs, and in backward runs
again from them under autograd (`torch.autograd.grad`), so its gradients come out of the very ops that autograd ran
before, each summed in the same order: bit-identical, on every device (the meta device of the planner's dry run
included), for the price of its forward a second time (a few elementwise passes beside the GEMMs). The output made
again is dropped before autograd runs through the graph; what the graph keeps lives only while it runs. (The gated
MLP's activation, gpt/glu.py, writes its backward out instead, so that it holds no more at once than autograd's.)

Why the same order: the function's node takes the place of its ops' nodes in autograd's graph, created at the
same point of the forward, so the engine (which runs the ready node created last first) reaches it where it would
have reached the first of them, and would have run the rest of them back to back (no other node was created between
them). Where a gradient reaches an input in parts that autograd sums at the input's own node, in an order that
decides the last bits, the caller passes that input once per part, in the order the parts arrived there (rms_norm's
fp32 input).

Not for functions that draw random numbers (their recompute would draw other ones) or that communicate.
"""

from __future__ import annotations

from typing import Callable, Optional, Sequence

import torch
from torch.autograd.function import once_differentiable
from torch.autograd.graph import get_gradient_edge


def plain_call(*inputs: torch.Tensor) -> bool:
    """Whether to run the plain function instead: outside autograd (no grad mode, or no input needing a gradient),
    and under torch.compile (--compile), where dynamo would break the block's graph at the `torch.autograd.grad` of
    the backward, and where AOTAutograd's partitioner already chooses what to keep and what to recompute among such
    elementwise ops."""
    return not torch.is_grad_enabled() or not any(tensor.requires_grad for tensor in inputs) or \
        torch.compiler.is_compiling()


class _RecomputedInBackward(torch.autograd.Function):
    @staticmethod
    def forward(ctx, function: Callable[..., torch.Tensor], *inputs: torch.Tensor) -> torch.Tensor:
        ctx.function = function
        ctx.save_for_backward(*inputs)
        return function(*inputs)

    @staticmethod
    @once_differentiable  # the recompute's graph is dropped after it: no gradient of a gradient through here
    def backward(ctx, grad: torch.Tensor):
        return (None, *gradients_made_again(ctx.function, ctx.saved_tensors, ctx.needs_input_grad[1:], grad))


def gradients_made_again(function: Callable[..., torch.Tensor], saved: Sequence[torch.Tensor],
                         needs: Sequence[bool], grad: torch.Tensor) -> list[Optional[torch.Tensor]]:
    """The gradients at `saved` (where `needs` says) of `function`, given `grad` at its output: its graph made again
    from them under autograd. The output made again is not needed, only its node: it is dropped before autograd runs
    through the graph, so what the graph keeps lives only while it runs."""
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
