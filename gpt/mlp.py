"""The MLP's settings and modules: the dense MLP (h -> ffn -> h) and the gated MLP, down(act(gate(x)) * up(x)). Gate and
up are two column-parallel weights, so each whole tensor is the same at every TP size and checkpoints reshard by name;
where they lie back to back they still run as one GEMM."""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass
from typing import ClassVar, Optional

import torch
import torch.nn.functional as F
from torch import nn

from base.errors import ConfigError
from base.options import option
from gpt.gate_up_gemm import gate_and_up, gated_halves
from gpt.glu import SWIGLU, GatedActivation, gated_activation
from gpt.parallel_plan import TensorParallelPlan
from gpt.xielu import XIELU

# squared_relu: Megatron-LM's --squared-relu; xielu: swiss-ai's fork's --xielu.
ACTIVATIONS = ("gelu", "gelu_tanh", "squared_relu", "xielu")


@dataclass(frozen=True)
class MLPSettings:
    """The MLP section of the model settings: activation and gating."""
    SETTING_PREFIX: ClassVar[str] = ""

    swiglu: bool = option(False, action="store_true",
                          help="SwiGLU MLP (Llama); --ffn-hidden-size defaults to int(4h x 2/3 / 64) x 64")
    # --activation's GeLU gated (Gemma's GeGLU); --swiglu gates with SiLU
    gated_linear_unit: bool = option(
        False, feature=True, action="store_true",
        help="a gated MLP, down(act(gate(x)) * up(x)), with --activation's gelu or gelu_tanh (GeGLU: Gemma); "
             "--swiglu is the same gate with SiLU")
    quick_geglu: bool = option(
        False, feature=True, action="store_true",
        help="a gated MLP with quick_gelu(gate) = gate x sigmoid(1.702 gate) times its linear half (GPT-OSS)")
    glu_linear_offset: float = option(
        0.0, feature=True, help="with --swiglu or --quick-geglu: add this to the gated MLP's linear half (GPT-OSS: 1)")
    activation_func_clamp_value: Optional[float] = option(
        None, feature=True,
        help="with --quick-geglu (or --swiglu's experts): clamp the gate half at most and the linear half within "
             "+-this before the activation (GPT-OSS: 7)")
    # "gelu_tanh" is transformers' "gelu_new".
    activation: str = option("gelu_tanh", choices=ACTIVATIONS,
                             help="gelu_tanh is GPT-2's approximation, gelu the exact erf form, squared_relu "
                                  "relu(x)^2 (Megatron-LM's --squared-relu), xielu swiss-ai's xIELU with two "
                                  "learned scalars per MLP (its fork's --xielu)")

    @property
    def gated(self) -> bool:
        """The first projection is a gate and a linear half (Megatron-Core's gated_linear_unit)."""
        return self.swiglu or self.quick_geglu or self.gated_linear_unit

    def ffn_size(self, hidden_size: int, ffn_hidden_size: Optional[int]) -> int:
        """--ffn-hidden-size, else Megatron-LM's default: 4h, or for SwiGLU int(4h x 2/3 / 64) x 64."""
        if ffn_hidden_size:
            return ffn_hidden_size
        return int((4 * hidden_size * 2 / 3) / 64) * 64 if self.swiglu else 4 * hidden_size

    def validate_size(self, ffn_size: int, tensor_parallel_size: int = 1) -> None:
        if ffn_size < 1 or ffn_size % tensor_parallel_size:
            raise ConfigError(f"--ffn-hidden-size {ffn_size} is not a positive multiple of --tensor-model-parallel-size "
                              f"{tensor_parallel_size}; each tensor-parallel rank needs an equal share",
                              flags=("--ffn-hidden-size", "--tensor-model-parallel-size"))

    def validate(self) -> None:
        """One activation at a time, as Megatron-LM asserts."""
        if self.activation not in ACTIVATIONS:
            raise ConfigError(f"--activation {self.activation!r} is not one of {', '.join(ACTIVATIONS)}",
                              flags=("--activation",))
        if self.activation == "squared_relu" and self.swiglu:
            raise ConfigError("--squared-relu replaces the MLP's activation and --swiglu gates it with SiLU: "
                              "give one of them", flags=("--activation", "--swiglu"))
        if self.activation == "xielu" and self.swiglu:
            # as swiss-ai's fork: "Only one activation function can be selected at a time"
            raise ConfigError("--xielu replaces the MLP's activation and --swiglu gates it with SiLU: give one of "
                              "them (swiss-ai's Megatron-LM fork allows one activation at a time)",
                              flags=("--activation", "--swiglu"))
        self._validate_gate()

    def _validate_gate(self) -> None:
        """The gated MLP's flags as Megatron-LM takes them; an offset or clamp without a gated MLP would do nothing, so
        the launch is told."""
        if self.gated_linear_unit and (self.swiglu or self.quick_geglu):
            other = "--swiglu" if self.swiglu else "--quick-geglu"
            raise ConfigError(f"--gated-linear-unit with {other}: {other} is the gated MLP with "
                              f"{'SiLU' if self.swiglu else 'quick-GeLU'}; give one of them",
                              flags=("--gated-linear-unit", other))
        if self.gated_linear_unit and self.activation not in ("gelu", "gelu_tanh"):
            raise ConfigError(f"--gated-linear-unit gates --activation gelu or gelu_tanh here (GeGLU), not "
                              f"{self.activation}", flags=("--gated-linear-unit", "--activation"))
        if self.quick_geglu and (self.swiglu or self.activation in ("squared_relu", "xielu")):
            other = "--swiglu" if self.swiglu else f"--activation {self.activation}"
            raise ConfigError(f"--quick-geglu with {other}: give one activation (Megatron-LM asserts it)",
                              flags=("--quick-geglu", other.split()[0]))
        clamp = self.activation_func_clamp_value
        if (clamp is not None or self.glu_linear_offset) and not self.gated:
            raise ConfigError("--activation-func-clamp-value and --glu-linear-offset act on a gated MLP's halves: give "
                              "--quick-geglu, --swiglu or --gated-linear-unit, or drop them",
                              flags=("--activation-func-clamp-value", "--glu-linear-offset"))
        if clamp is not None and not (math.isfinite(clamp) and clamp > 0):
            raise ConfigError(f"--activation-func-clamp-value must be positive and finite, got {clamp}",
                              flags=("--activation-func-clamp-value",))
        if clamp is not None and self.swiglu and self.glu_linear_offset:
            raise ConfigError("--activation-func-clamp-value with --swiglu takes no --glu-linear-offset (as "
                              "Megatron-Core's TransformerConfig requires)",
                              flags=("--activation-func-clamp-value", "--glu-linear-offset"))
        if not math.isfinite(self.glu_linear_offset):
            raise ConfigError(f"--glu-linear-offset must be finite, got {self.glu_linear_offset}",
                              flags=("--glu-linear-offset",))

    def build(self, config, plan: TensorParallelPlan) -> nn.Module:
        """A layer's dense MLP: gated (SwiGLU, quick-GeGLU or GeGLU) or plain."""
        if self.gated:
            return SwiGLUMLP(config.hidden_size, config.ffn_size, plan=plan, init_std=config.init_method_std,
                             output_init_std=config.output_init_std, bias=config.add_bias_linear,
                             glu=gated_activation(self, functools.partial(activation_function, self.activation)))
        return MLP(config, plan, bias=config.add_bias_linear)


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
        # gate and up as one linear of another kind (FP8); None: gate_and_up's GEMM, or the two linears
        self.joined_linear = None

    def adjacent_parameters(self) -> list[tuple[nn.Parameter, nn.Parameter]]:
        """The pairs to lay back to back when parameters are allocated, so gate and up run as one GEMM."""
        gate, up = self.dense_h_to_4h_gate, self.dense_h_to_4h_up
        return [(gate.weight, up.weight)] + ([(gate.bias, up.bias)] if gate.bias is not None else [])

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        gate, up = self.dense_h_to_4h_gate, self.dense_h_to_4h_up
        with gate.entered(hidden) as hidden:
            if self.joined_linear is not None:
                activated = gated_halves(self.joined_linear(hidden, (gate.weight, up.weight)), self.glu)
            else:  # one GEMM where the two weights are one [2 ffn, h]
                activated = gate_and_up(hidden, gate, up, self.glu)
                if activated is None:
                    activated = self.glu(gate.linear(hidden, gate.weight, gate.bias),
                                         up.linear(hidden, up.weight, up.bias))
        return self.dense_4h_to_h(activated)


class MLP(nn.Module):
    """h -> 4h -> GeLU (or squared ReLU, or xIELU) -> h; TP splits the 4h dimension."""

    def __init__(self, config, plan: TensorParallelPlan, bias: bool = True):
        super().__init__()
        self.activation = config.mlp.activation
        self.dense_h_to_4h = plan.linear("mlp.dense_h_to_4h", config.hidden_size, config.ffn_size,
                                         init_std=config.init_method_std, bias=bias)
        if config.mlp.activation == "xielu":  # Megatron's activation_func, a module of its own
            self.activation_func = XIELU(plan.state)
        self.dense_4h_to_h = plan.linear("mlp.dense_4h_to_h", config.ffn_size, config.hidden_size,
                                         init_std=config.output_init_std, bias=bias)

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        if self.activation == "xielu":
            return self.dense_4h_to_h(self.activation_func(self.dense_h_to_4h(hidden)))
        return self.dense_4h_to_h(activation_function(self.activation, self.dense_h_to_4h(hidden)))


def activation_function(name: str, hidden: torch.Tensor) -> torch.Tensor:
    """GeLU exact or tanh, or squared ReLU, relu(x)^2."""
    if name == "squared_relu":
        return torch.pow(F.relu(hidden), 2)
    return F.gelu(hidden, approximate="tanh" if name == "gelu_tanh" else "none")


def build_mlp(config, plan: TensorParallelPlan, spec, layer_number: int, tracker) -> nn.Module:
    return config.mlp.build(config, plan)
