"""swiss-ai's xIELU activation (--xielu) as its Megatron-LM fork defines it: alpha_p x^2 + beta x for x > 0, alpha_n
expm1(min(x, eps)) - alpha_n x + beta x elsewhere, with two learned scalars per MLP initialized in bf16 as the fork
does."""

from __future__ import annotations

from typing import Optional

import torch
import torch.nn.functional as F
from torch import nn

from parallel.init import InitMethod
from parallel.layers import meta_parameter
from parallel.mappings import copy_to_tensor_parallel_region
from parallel.sharding import DENSE_DATA, TENSOR_PARALLEL, record_whole
from parallel.state import ParallelState

# What autograd keeps beyond xielu's input, bytes per element in bf16 (measured); the planner adds it.
XIELU_SAVED_BYTES = 5
XIELU_BETA = 0.5
XIELU_ALPHA_P_INIT = 0.8
XIELU_ALPHA_N_INIT = 0.8
# the fork keeps eps as a bf16 tensor
XIELU_EPS = float(torch.tensor(-1e-6, dtype=torch.bfloat16))


def inverse_softplus_in_bf16(value: float) -> float:
    """log(exp(value) - 1) computed in bf16."""
    return float(torch.log(torch.exp(torch.tensor(value, dtype=torch.bfloat16)) - 1.0))


def xielu(hidden: torch.Tensor, alpha_p: torch.Tensor, alpha_n: torch.Tensor, beta: float = XIELU_BETA,
          eps: float = XIELU_EPS) -> torch.Tensor:
    """The fork's `compiled_xielu`, given the raw scalars."""
    alpha_p = F.softplus(alpha_p)
    alpha_n = beta + F.softplus(alpha_n)
    return torch.where(hidden > 0, alpha_p * hidden * hidden + beta * hidden,
                       alpha_n * torch.expm1(torch.clamp(hidden, max=eps)) - alpha_n * hidden + beta * hidden)


class XIELU(nn.Module):
    """One MLP's activation with its two learned scalars, replicated on every TP rank."""

    def __init__(self, state: Optional[ParallelState] = None,
                 replicated_over: tuple[str, ...] = (TENSOR_PARALLEL, *DENSE_DATA)):
        """`state`: the TP state whose group sums the scalars' gradients (None for an expert's MLP); `replicated_over`:
        the ranks holding the same scalars."""
        super().__init__()
        self.state = state
        self.alpha_p = record_whole(meta_parameter((1,), InitMethod(
            constant=inverse_softplus_in_bf16(XIELU_ALPHA_P_INIT))), replicated_over)
        self.alpha_n = record_whole(meta_parameter((1,), InitMethod(
            constant=inverse_softplus_in_bf16(XIELU_ALPHA_N_INIT - XIELU_BETA))), replicated_over)

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        if self.state is None:
            return xielu(hidden, self.alpha_p, self.alpha_n)
        alpha_p = copy_to_tensor_parallel_region(self.alpha_p, self.state)
        alpha_n = copy_to_tensor_parallel_region(self.alpha_n, self.state)
        return xielu(hidden, alpha_p, alpha_n)
