"""swiss-ai's xIELU activation (--xielu; https://arxiv.org/abs/2411.13010), as its Megatron-LM fork defines it
(swiss-ai/Megatron-LM megatron/training/activations.py, `compiled_xielu` and class `XIELU`):

    alpha_p = softplus(a_p),  alpha_n = beta + softplus(a_n)
    xielu(x) = alpha_p x^2 + beta x                                    where x > 0
             = alpha_n expm1(min(x, eps)) - alpha_n x + beta x          elsewhere

with beta = 0.5, eps = -1e-6 held in bf16 (so -9.98e-7), and two learned scalars per MLP (shape [1]) whose raw
values start at the inverse softplus of 0.8 and of 0.8 - beta computed in bf16 as the fork does: 0.2109375 and
-1.046875. Megatron's MLP applies it between linear_fc1 and linear_fc2, without a gate, as does each expert (each
with its own two scalars, `local_experts.<e>.activation_func.alpha_p` in the fork's schema_core.py) and the shared
expert; transformers' ApertusMLP (`XIELUActivation`) is the same function.

Under TP each rank holds a slice of the ffn columns and the same two scalars, whose gradient on a rank is a partial
sum over its columns: the scalars enter the TP region through `copy`, whose backward all-reduces the gradient over
TP (as gpt/norms.py HeadNorm's gains), so every rank steps them by TP 1's gradient. (The fork leaves them
unreduced: finalize_model_grads reduces only the sequence-parallel norms', so its TP ranks' copies drift.)"""

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

# What autograd keeps for xielu's backward beyond its input, per element, in bf16 (the comparison masks, 1 byte
# each, and expm1's 16-bit output: tests/gpt/test_xielu.py measures it); the planner's activation terms add it
# (gpt/shape.py). The fork's compiled (fused) kernel would keep less.
XIELU_SAVED_BYTES = 5
XIELU_BETA = 0.5
XIELU_ALPHA_P_INIT = 0.8
XIELU_ALPHA_N_INIT = 0.8
# The fork keeps eps as a bf16 tensor: -1e-6 rounded to bf16.
XIELU_EPS = float(torch.tensor(-1e-6, dtype=torch.bfloat16))


def inverse_softplus_in_bf16(value: float) -> float:
    """The fork's initial raw value: log(exp(value) - 1) computed in bf16."""
    return float(torch.log(torch.exp(torch.tensor(value, dtype=torch.bfloat16)) - 1.0))


def xielu(hidden: torch.Tensor, alpha_p: torch.Tensor, alpha_n: torch.Tensor, beta: float = XIELU_BETA,
          eps: float = XIELU_EPS) -> torch.Tensor:
    """`compiled_xielu` of the fork, given the raw (pre-softplus) scalars."""
    alpha_p = F.softplus(alpha_p)
    alpha_n = beta + F.softplus(alpha_n)
    return torch.where(hidden > 0, alpha_p * hidden * hidden + beta * hidden,
                       alpha_n * torch.expm1(torch.clamp(hidden, max=eps)) - alpha_n * hidden + beta * hidden)


class XIELU(nn.Module):
    """One MLP's activation with its two learned scalars (named alpha_p, alpha_n as the fork's and
    transformers' parameters), replicated on every TP rank."""

    def __init__(self, state: Optional[ParallelState] = None,
                 replicated_over: tuple[str, ...] = (TENSOR_PARALLEL, *DENSE_DATA)):
        """`state`: the TP state whose group sums the scalars' gradients (a dense MLP's); None for an expert's
        MLP, which no TP rank splits here (under expert parallelism the scalars are its rank's, as its weights).
        `replicated_over`: the ranks holding the same scalars, as the MLP's weights (parallel/sharding.py)."""
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
