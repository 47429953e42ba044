"""The gated MLP's activation, act(gate) x (linear + offset) with optional clamping, as Megatron-Core's MLP.glu: SwiGLU,
quick-GeGLU (GPT-OSS) or GeGLU (Gemma)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Optional

import torch
import torch.nn.functional as F
from torch.autograd.function import once_differentiable

from gpt.recomputed import gradients_made_again, plain_call

QUICK_GELU_ALPHA = 1.702  # Megatron's quick_gelu; GPT-OSS's swiglu_alpha


@dataclass(frozen=True)
class GatedActivation:
    """act(gate) x (linear + offset), keeping only `gate` and `linear` for backward and computing the activation again
    there, as Megatron-Core's fused SwiGLU; bit-identical to autograd through `math`."""

    quick: bool = False
    clamp: Optional[float] = None
    offset: float = 0.0
    # --gated-linear-unit's GeLU; None: SiLU, or quick_gelu with `quick`
    activation: Optional[Callable[[torch.Tensor], torch.Tensor]] = None

    def __call__(self, gate: torch.Tensor, linear: torch.Tensor) -> torch.Tensor:
        if plain_call(gate, linear):
            return self.math(gate, linear)
        return _GatedProduct.apply(gate, linear, self)

    def math(self, gate: torch.Tensor, linear: torch.Tensor) -> torch.Tensor:
        """The plain formulation, autograd through every op."""
        if self.clamp is not None:
            gate, linear = gate.clamp(max=self.clamp), linear.clamp(min=-self.clamp, max=self.clamp)
        activated = self.activate(gate)
        return activated * (linear + self.offset) if self.offset else activated * linear

    def backward_widths(self) -> int:
        """How many MLP-wide tensors `_GatedProduct.backward` holds at its peak beside gate and linear (3, plus one each
        for quick_gelu and the clamp); what the planner counts."""
        return 3 + (1 if self.quick and self.activation is None else 0) + (1 if self.clamp is not None else 0)

    def activate(self, gate: torch.Tensor) -> torch.Tensor:
        if self.activation is not None:
            return self.activation(gate)
        return gate * torch.sigmoid(QUICK_GELU_ALPHA * gate) if self.quick else F.silu(gate)


class _GatedProduct(torch.autograd.Function):
    """GatedActivation.math keeping only gate and linear; its backward is autograd's, op for op."""

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
        if glu.quick and glu.activation is None:
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
                # in place on this backward's own tensors: the same kernels, so the same bits
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
    """ClampBackward1: the gradient where the input was within the bounds."""
    zero = torch.zeros((), dtype=grad.dtype, device=grad.device)
    inside = before <= high if low is None else (before >= low).logical_and_(before <= high)
    return torch.where(inside, grad, zero)




SWIGLU = GatedActivation()


def gated_activation(mlp, activation: Optional[Callable[[torch.Tensor], torch.Tensor]] = None
                     ) -> GatedActivation:
    """The blocks' gated activation from the MLP section; `activation` is --activation's function."""
    return GatedActivation(mlp.quick_geglu, mlp.activation_func_clamp_value, mlp.glu_linear_offset,
                           activation if mlp.gated_linear_unit else None)
