"""The global gradient norm of a tensor-parallel model, and clipping by it.

A TP-sharded parameter (one carrying `tensor_parallel_dim`) holds a different slice on every rank of
the TP group, so its squared norm is summed over the group. A replicated parameter (LayerNorms,
row-parallel biases, position embeddings) holds the same gradient on every TP rank, so it is counted
once, not TP times. Gradients are already averaged over data parallelism when this runs, so DP
ranks agree and need no reduction.
"""

from __future__ import annotations

import math
from typing import Iterable

import torch

from parallel.state import ParallelState


def global_grad_norm(parameters: Iterable[torch.nn.Parameter], state: ParallelState) -> torch.Tensor:
    """The L2 norm of the whole model's gradient, identical on every rank (fp32 scalar)."""
    sharded, replicated = [], []
    for param in parameters:
        if param.grad is not None:
            (sharded if hasattr(param, "tensor_parallel_dim") else replicated).append(param.grad)
    device = state.device
    sharded_sq = _sum_of_squares(sharded, device)
    state.comm.all_reduce(sharded_sq, state.tensor_parallel_group, "tp")
    return (sharded_sq + _sum_of_squares(replicated, device)).sqrt()


def clip_gradients(parameters: Iterable[torch.nn.Parameter], max_norm: float, state: ParallelState) -> float:
    """Scale gradients so their global norm is at most `max_norm` (0 or inf: measure only).

    Returns the norm before clipping."""
    parameters = [p for p in parameters if p.grad is not None]
    norm = global_grad_norm(parameters, state)
    if max_norm > 0 and math.isfinite(max_norm):
        scale = torch.clamp(max_norm / (norm + 1e-6), max=1.0)
        torch._foreach_mul_([p.grad for p in parameters], scale)
    return norm.item()


def _sum_of_squares(grads: list[torch.Tensor], device: torch.device) -> torch.Tensor:
    if not grads:
        return torch.zeros((), dtype=torch.float32, device=device)
    norms = torch._foreach_norm([g.float() for g in grads])
    return torch.stack(norms).square().sum()
