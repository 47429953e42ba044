"""The gated MLP: down(act(gate(x)) * up(x)), SwiGLU's (act SiLU), quick-GeGLU's or GeGLU's (--gated-linear-unit:
Gemma's tanh GeLU) (gpt/glu.py).

Gate and up are two column-parallel weights rather than one of 2 x ffn rows: each TP rank holds the
same slice of both (the halves that multiply each other), and each weight's whole tensor is the same
at every TP size, so initial values (a function of name and whole-tensor index, parallel/init.py) and
checkpoints resharded across TP sizes need no knowledge of an interleaved layout. The input enters the
tensor-parallel region once for both (under sequence parallelism: one all-gather of the sequence). Where the two
weights lie back to back in memory (ZeRO's flat buffers, materialize's `adjacent_parameters`) they run as one GEMM of
width 2 x ffn, Megatron-Core's linear_fc1 (gpt/gate_up_gemm.py); in FP8, as one FP8 linear of their rows, cast with one
scale as TE casts linear_fc1 (`joined_linear`, gpt/fp8.py).
"""

from __future__ import annotations

import torch
from torch import nn

from gpt.gate_up_gemm import gate_and_up, gated_halves
from gpt.glu import SWIGLU, GatedActivation
from gpt.parallel_plan import TensorParallelPlan


class SwiGLUMLP(nn.Module):
    def __init__(self, hidden_size: int, ffn_size: int, *, plan: TensorParallelPlan, init_std: float,
                 output_init_std: float, bias: bool, glu: GatedActivation = SWIGLU):
        super().__init__()
        self.state, self.glu = plan.state, glu
        self.dense_h_to_4h_gate = plan.linear("mlp.dense_h_to_4h_gate", hidden_size, ffn_size, init_std=init_std,
                                              bias=bias)
        self.dense_h_to_4h_up = plan.linear("mlp.dense_h_to_4h_up", hidden_size, ffn_size, init_std=init_std,
                                            bias=bias)
        self.dense_4h_to_h = plan.linear("mlp.dense_4h_to_h", ffn_size, hidden_size, init_std=output_init_std,
                                         bias=bias)
        # where gate and up run as one linear of another kind, (x, (gate's weight, up's weight)) -> [gate(x), up(x)]:
        # one FP8 linear (gpt/fp8.py _joined_gate_up); None: gate_and_up's GEMM, or the two linears
        self.joined_linear = None

    def adjacent_parameters(self) -> list[tuple[nn.Parameter, nn.Parameter]]:
        """The pairs to lay out back to back where this module's parameters are allocated (parallel/init.py
        materialize), so that gate and up run as one GEMM (gpt/gate_up_gemm.py)."""
        gate, up = self.dense_h_to_4h_gate, self.dense_h_to_4h_up
        return [(gate.weight, up.weight)] + ([(gate.bias, up.bias)] if gate.bias is not None else [])

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        gate, up = self.dense_h_to_4h_gate, self.dense_h_to_4h_up
        hidden = gate.enter(hidden)  # copy, or the sequence all-gather: once for both
        if self.joined_linear is not None:
            return self.dense_4h_to_h(gated_halves(self.joined_linear(hidden, (gate.weight, up.weight)), self.glu))
        activated = gate_and_up(hidden, gate, up, self.glu)  # one GEMM where the two weights are one [2 ffn, h]
        if activated is None:
            activated = self.glu(gate.linear(hidden, gate.weight, gate.bias), up.linear(hidden, up.weight, up.bias))
        return self.dense_4h_to_h(activated)
