"""The gated MLP's activation: act(gate) x (linear + offset), act SiLU (--swiglu), quick_gelu (--quick-geglu,
megatron/core/activations.py: x sigmoid(1.702 x)) or --activation's GeLU (--gated-linear-unit: Gemma's GeGLU), the two halves clamped first under --activation-func-clamp-value
(the gate at most the value, the linear half within +-it), as Megatron-Core's MLP.glu computes it
(megatron/core/transformer/mlp.py: `x_glu.clamp(min=None, max=val)`, `x_linear.clamp(min=-val, max=val)`,
`activation_func(x_glu) * (x_linear + glu_linear_offset)`). GPT-OSS's experts (transformers' GptOssExperts._apply_gate:
`gate * sigmoid(gate * alpha)` times `(up + 1)`, limit 7) are --quick-geglu --glu-linear-offset 1
--activation-func-clamp-value 7.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Optional

import torch
import torch.nn.functional as F
from torch.autograd.function import once_differentiable

from gpt.recomputed import gradients_made_again, plain_call

QUICK_GELU_ALPHA = 1.702  # megatron/core/activations.py quick_gelu; GPT-OSS's swiglu_alpha


@dataclass(frozen=True)
class GatedActivation:
    """act(gate) x (linear + offset), keeping only `gate` and `linear` for backward and computing the activation
    again there, as Megatron-Core's fused SwiGLU (megatron/core/fusions/fused_bias_swiglu.py) keeps only its input:
    autograd through `math` keeps the activation beside them (and under the clamp the clamped halves, with quick_gelu
    its sigmoid), one more tensor of the MLP's width or more. The output and both gradients are bit-identical to
    autograd's through `math`, for every variant here (tests/gpt/test_saved_activations.py): `_GatedProduct`'s
    backward makes them with the ops autograd's nodes run (derivatives.yaml's formulas), and holds no more of the
    MLP's width at once than autograd's backward did (the factors made again take the places of the kept ones, and
    each is dropped once used)."""

    quick: bool = False
    clamp: Optional[float] = None
    offset: float = 0.0
    # --gated-linear-unit's gate activation (--activation's GeLU); None: SiLU, or quick_gelu with `quick`
    activation: Optional[Callable[[torch.Tensor], torch.Tensor]] = None

    def __call__(self, gate: torch.Tensor, linear: torch.Tensor) -> torch.Tensor:
        if plain_call(gate, linear):
            return self.math(gate, linear)
        return _GatedProduct.apply(gate, linear, self)

    def math(self, gate: torch.Tensor, linear: torch.Tensor) -> torch.Tensor:
        """The plain formulation, autograd through every op (what `__call__` equals bit for bit)."""
        if self.clamp is not None:
            gate, linear = gate.clamp(max=self.clamp), linear.clamp(min=-self.clamp, max=self.clamp)
        activated = self.activate(gate)
        return activated * (linear + self.offset) if self.offset else activated * linear

    def backward_widths(self) -> int:
        """How many tensors of the MLP's width `_GatedProduct.backward` holds at once at its peak, beside the kept
        gate and linear: the gradient at the activation, the linear half's and the activation made again (3), with
        quick_gelu its sigmoid (1 more), under the clamp the clamped gate (1 more); the clamp's bool masks are not
        counted (a quarter of a width in fp32, half in 16 bits). What the planner counts beside a block's saved
        tensors (gpt/shape.py mlp_gradient_features), held to a CPU profile by tests/planner/test_plan_block_gradients.py.
        Gate and up as one GEMM (gpt/gate_up_gemm.py) hold as many: the two gradients' buffer and the same factors."""
        return 3 + (1 if self.quick and self.activation is None else 0) + (1 if self.clamp is not None else 0)

    def activate(self, gate: torch.Tensor) -> torch.Tensor:
        if self.activation is not None:
            return self.activation(gate)
        return gate * torch.sigmoid(QUICK_GELU_ALPHA * gate) if self.quick else F.silu(gate)


class _GatedProduct(torch.autograd.Function):
    """GatedActivation.math keeping only gate and linear; its backward is autograd's, op for op: MulBackward0 (the
    gradient times the other factor; the offset's add passes it on), SiluBackward0 (aten's silu_backward), quick_gelu's
    MulBackward0 / SigmoidBackward0 / scalar MulBackward0 (its two gradients at the gate summed as autograd's buffer
    summed them, the product's first), ClampBackward1 (clamp_backward: the gradient where the input was within the
    bounds), and an --activation function's own graph, made again."""

    @staticmethod
    def forward(ctx, gate: torch.Tensor, linear: torch.Tensor, glu: GatedActivation) -> torch.Tensor:
        ctx.glu = glu
        ctx.save_for_backward(gate, linear)
        return glu.math(gate, linear)

    @staticmethod
    @once_differentiable
    def backward(ctx, grad: torch.Tensor):
        gate, linear = ctx.saved_tensors
        glu, clamp = ctx.glu, ctx.glu.clamp
        need_gate, need_linear = ctx.needs_input_grad[:2]
        grad_gate = grad_linear = grad_activated = sigmoid = None
        if need_gate:
            factor = linear if clamp is None else linear.clamp(min=-clamp, max=clamp)
            grad_activated = grad * (factor + glu.offset if glu.offset else factor)
            del factor
        gate_in = gate if clamp is None else gate.clamp(max=clamp)
        if glu.quick and glu.activation is None:  # the sigmoid of quick_gelu, once for both gradients
            sigmoid = torch.sigmoid(QUICK_GELU_ALPHA * gate_in)
        if need_linear:
            activated = gate_in * sigmoid if sigmoid is not None else glu.activate(gate_in)
            grad_linear = grad * activated
            del activated
            if clamp is not None:
                grad_linear = _clamp_gradient(grad_linear, linear, -clamp, clamp)
        if need_gate:
            if glu.activation is not None:
                (grad_gate,) = gradients_made_again(glu.activation, (gate_in,), (True,), grad_activated)
            elif sigmoid is not None:
                # in place on this backward's own tensors (the same kernels, so the same bits): the gradient arriving
                # stays alive through this backward, where autograd's had dropped it by now
                direct = grad_activated * sigmoid
                through = grad_activated.mul_(gate_in)
                grad_activated = gate_in = None
                torch.ops.aten.sigmoid_backward.grad_input(through, sigmoid, grad_input=through)
                sigmoid = None
                grad_gate = direct.add_(through.mul_(QUICK_GELU_ALPHA))
            else:
                grad_gate = torch.ops.aten.silu_backward(grad_activated, gate_in)
            grad_activated = gate_in = None
            if clamp is not None:
                grad_gate = _clamp_gradient(grad_gate, gate, None, clamp)
        return grad_gate, grad_linear, None


def _clamp_gradient(grad: torch.Tensor, before: torch.Tensor, low: Optional[float], high: float) -> torch.Tensor:
    """ClampBackward1 (FunctionsManual.cpp clamp_backward): the gradient where the input was within the bounds."""
    zero = torch.zeros((), dtype=grad.dtype, device=grad.device)
    inside = before <= high if low is None else (before >= low).logical_and_(before <= high)
    return torch.where(inside, grad, zero)




SWIGLU = GatedActivation()


def gated_activation(mlp, activation: Optional[Callable[[torch.Tensor], torch.Tensor]] = None
                     ) -> GatedActivation:
    """The blocks' gated activation (the MLP section's quick_geglu, activation_func_clamp_value,
    glu_linear_offset, gated_linear_unit); `activation` is --activation's function, the gate's under
    --gated-linear-unit."""
    return GatedActivation(mlp.quick_geglu, mlp.activation_func_clamp_value, mlp.glu_linear_offset,
                           activation if mlp.gated_linear_unit else None)
