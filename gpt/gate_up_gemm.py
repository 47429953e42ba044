"""The gated MLP's gate and up as one GEMM of width 2 x ffn, as Megatron-Core's linear_fc1, while the model keeps two
parameters: where the two weights lie back to back in one storage (ZeRO's flat buffers), that view is the one weight,
and forward and backward run one GEMM each."""

from __future__ import annotations

from typing import Optional

import torch
import torch.nn.functional as F
from torch import nn
from torch.autograd.function import once_differentiable

from gpt.glu import QUICK_GELU_ALPHA, GatedActivation
from gpt.recomputed import gradients_made_again
from parallel.grad_accumulation_fusion import LinearIntoMainGrad, accumulate_weight_gradient


def back_to_back(first: torch.Tensor, second: torch.Tensor) -> bool:
    """Whether `second` starts where `first` ends in one storage, both contiguous with the same trailing shape and
    dtype."""
    if first.dtype != second.dtype or first.shape[1:] != second.shape[1:] or first.device != second.device:
        return False
    if not (first.is_contiguous() and second.is_contiguous()) or not torch._C._is_alias_of(first, second):
        return False
    return second.storage_offset() == first.storage_offset() + first.numel()


def joined(first: torch.Tensor, second: torch.Tensor) -> torch.Tensor:
    """[first; second] as one view of their storage."""
    return first.as_strided((first.shape[0] + second.shape[0], *first.shape[1:]), first.stride())


def _plain_gemm(linear) -> bool:
    return linear is F.linear or isinstance(linear, LinearIntoMainGrad)


def gate_and_up(hidden: torch.Tensor, gate: nn.Module, up: nn.Module, glu: GatedActivation) -> Optional[torch.Tensor]:
    """glu(gate(hidden), up(hidden)) through one GEMM; None where the two weights cannot be one."""
    if torch.compiler.is_compiling() or not (_plain_gemm(gate.linear) and _plain_gemm(up.linear)):
        return None
    if (gate.bias is None) != (up.bias is None):
        return None
    gate_first = back_to_back(gate.weight, up.weight)
    if not gate_first and not back_to_back(up.weight, gate.weight):
        return None
    first, second = (gate, up) if gate_first else (up, gate)
    if first.bias is not None and not back_to_back(first.bias, second.bias):
        return None
    weight = joined(first.weight, second.weight)
    main_grads = None  # gradient accumulation fusion's owner of both main gradients
    if isinstance(first.linear, LinearIntoMainGrad) or isinstance(second.linear, LinearIntoMainGrad):
        if getattr(first.linear, "main_grads", None) is not getattr(second.linear, "main_grads", None):
            return None
        main_grads = first.linear.main_grads if LinearIntoMainGrad.fuses(weight) else None
    if not torch.is_grad_enabled() or not (hidden.requires_grad or weight.requires_grad):
        with torch.no_grad():
            bias = None if first.bias is None else joined(first.bias, second.bias)
            return _forward(hidden, weight, bias, glu, gate_first)[0]
    return one_gemm(hidden, first.weight, second.weight, first.bias, second.bias, glu, gate_first, main_grads)


def one_gemm(hidden: torch.Tensor, first_weight: nn.Parameter, second_weight: nn.Parameter,
             first_bias: Optional[nn.Parameter], second_bias: Optional[nn.Parameter], glu: GatedActivation,
             gate_first: bool, main_grads=None) -> torch.Tensor:
    """The gated product of the joined projection, keeping its input and the projection for backward; `main_grads`:
    where weight gradients are added (None: autograd's)."""
    return _GateUpGemm.apply(hidden, first_weight, second_weight, first_bias, second_bias, glu, gate_first,
                             main_grads)


def one_gemm_math(hidden: torch.Tensor, first_weight: nn.Parameter, second_weight: nn.Parameter,
                  first_bias: Optional[nn.Parameter], second_bias: Optional[nn.Parameter], glu: GatedActivation,
                  gate_first: bool, main_grads=None) -> torch.Tensor:
    """`one_gemm` as plain autograd: what `one_gemm` equals bit for bit."""
    projected = _JoinedLinear.apply(hidden.reshape(-1, hidden.shape[-1]), first_weight, second_weight, first_bias,
                                    second_bias)
    gate, up = _halves(projected, gate_first)
    return glu.math(gate, up).view(*hidden.shape[:-1], gate.shape[-1])


class _JoinedLinear(torch.autograd.Function):
    """rows @ [first; second]^T (+ biases) with autograd's backward split between the two parameters."""

    @staticmethod
    def forward(ctx, rows, first_weight, second_weight, first_bias, second_bias):
        ctx.save_for_backward(rows, first_weight, second_weight)
        ctx.has_bias = first_bias is not None
        weight = joined(first_weight, second_weight)
        if first_bias is None:
            return torch.mm(rows, weight.t())
        return torch.addmm(joined(first_bias, second_bias), rows, weight.t())

    @staticmethod
    @once_differentiable
    def backward(ctx, grad):
        rows, first_weight, second_weight = ctx.saved_tensors
        grad_rows = grad.mm(joined(first_weight, second_weight))
        grad_weights = grad.t().mm(rows).chunk(2)
        grad_biases = grad.sum(dim=0).chunk(2) if ctx.has_bias else (None, None)
        return grad_rows, *grad_weights, *grad_biases


def _forward(hidden: torch.Tensor, weight: torch.Tensor, bias: Optional[torch.Tensor], glu: GatedActivation,
             gate_first: bool) -> tuple[torch.Tensor, torch.Tensor]:
    rows = hidden.reshape(-1, hidden.shape[-1])
    projected = torch.mm(rows, weight.t()) if bias is None else torch.addmm(bias, rows, weight.t())
    gate, up = _halves(projected, gate_first)
    return glu.math(gate, up).view(*hidden.shape[:-1], gate.shape[-1]), projected


def _halves(both: torch.Tensor, gate_first: bool) -> tuple[torch.Tensor, torch.Tensor]:
    first, second = both.chunk(2, dim=-1)
    return (first, second) if gate_first else (second, first)


class _GateUpGemm(torch.autograd.Function):
    @staticmethod
    def forward(ctx, hidden, first_weight, second_weight, first_bias, second_bias, glu, gate_first, main_grads):
        weight = joined(first_weight, second_weight)
        bias = None if first_bias is None else joined(first_bias, second_bias)
        activated, projected = _forward(hidden, weight, bias, glu, gate_first)
        # the input and the projection, as the two linears and the activation kept them
        ctx.save_for_backward(hidden, projected, first_weight, second_weight)
        ctx.glu, ctx.gate_first, ctx.main_grads, ctx.has_bias = glu, gate_first, main_grads, first_bias is not None
        ctx.params = (first_weight, second_weight)
        return activated

    @staticmethod
    @once_differentiable
    def backward(ctx, grad: torch.Tensor):
        hidden, projected, first_weight, second_weight = ctx.saved_tensors
        grad = grad.reshape(-1, grad.shape[-1])
        both = torch.empty_like(projected)
        grad_gate, grad_up = _halves(both, ctx.gate_first)
        gate, up = _halves(projected, ctx.gate_first)
        gated_gradients_into(ctx.glu, grad, gate, up, grad_gate, grad_up)
        del grad, gate, up, projected
        rows = hidden.reshape(-1, hidden.shape[-1])
        weight = joined(first_weight, second_weight)
        grad_hidden = both.mm(weight).view(hidden.shape) if ctx.needs_input_grad[0] else None
        grad_biases = both.sum(dim=0).chunk(2) if ctx.has_bias else (None, None)
        grad_weights: tuple = (None, None)
        if ctx.main_grads is not None and (ctx.needs_input_grad[1] or ctx.needs_input_grad[2]):
            main = [ctx.main_grads.main_grad(param) for param in ctx.params]
            if back_to_back(*main):
                accumulate_weight_gradient(joined(*main), both, rows)
            else:
                for part, halve in zip(main, both.chunk(2, dim=-1)):
                    accumulate_weight_gradient(part, halve, rows)
        elif ctx.needs_input_grad[1] or ctx.needs_input_grad[2]:
            grad_weights = both.t().mm(rows).chunk(2)
        return (grad_hidden, *grad_weights, *grad_biases, None, None, None)


def gated_halves(both: torch.Tensor, glu: GatedActivation) -> torch.Tensor:
    """glu(gate, up) of a [..., 2 ffn] projection, writing both halves' gradients into one buffer instead of
    concatenating them. Under torch.compile autograd's own (dynamo cannot trace out= into a half)."""
    if not torch.is_grad_enabled() or not both.requires_grad or torch.compiler.is_compiling():
        return glu.math(*_halves(both, True))
    return _GatedHalves.apply(both, glu)


class _GatedHalves(torch.autograd.Function):
    @staticmethod
    def forward(ctx, both, glu):
        ctx.save_for_backward(both)
        ctx.glu = glu
        return glu.math(*_halves(both, True))

    @staticmethod
    @once_differentiable
    def backward(ctx, grad: torch.Tensor):
        (both,) = ctx.saved_tensors
        buffer = torch.empty_like(both)
        gated_gradients_into(ctx.glu, grad, *_halves(both, True), *_halves(buffer, True))
        return buffer, None


def gated_gradients_into(glu: GatedActivation, grad: torch.Tensor, gate: torch.Tensor, linear: torch.Tensor,
                         grad_gate: torch.Tensor, grad_linear: torch.Tensor) -> None:
    """_GatedProduct.backward's two gradients in out= form into the halves of one buffer, ordered so at most
    backward_widths() - 2 MLP-wide tensors live beside it."""
    clamp, offset = glu.clamp, glu.offset
    factor = linear if clamp is None else linear.clamp(min=-clamp, max=clamp)
    torch.mul(grad, factor + offset if offset else factor, out=grad_gate)
    del factor
    gate_in = gate if clamp is None else gate.clamp(max=clamp)
    sigmoid = torch.sigmoid(QUICK_GELU_ALPHA * gate_in) if glu.quick and glu.activation is None else None
    activated = gate_in * sigmoid if sigmoid is not None else glu.activate(gate_in)
    torch.mul(grad, activated, out=grad_linear)
    del activated
    if clamp is not None:
        _clamp_gradient_(grad_linear, linear, -clamp, clamp)
    if glu.activation is not None:
        (made_again,) = gradients_made_again(glu.activation, (gate_in,), (True,), grad_gate)
        grad_gate.copy_(made_again)
    elif sigmoid is not None:
        direct = grad_gate * sigmoid  # quick_gelu's two gradients at the gate, summed as autograd sums them
        through = grad_gate.mul_(gate_in)
        del gate_in
        torch.ops.aten.sigmoid_backward.grad_input(through, sigmoid, grad_input=through)
        del sigmoid
        torch.add(direct, through.mul_(QUICK_GELU_ALPHA), out=grad_gate)
    else:
        torch.ops.aten.silu_backward.grad_input(grad_gate, gate_in, grad_input=grad_gate)
    if clamp is not None:
        _clamp_gradient_(grad_gate, gate, None, clamp)


def _clamp_gradient_(grad: torch.Tensor, before: torch.Tensor, low: Optional[float], high: float) -> None:
    """gpt/glu.py's _clamp_gradient, in place."""
    zero = torch.zeros((), dtype=grad.dtype, device=grad.device)
    inside = before <= high if low is None else (before >= low).logical_and_(before <= high)
    torch.where(inside, grad, zero, out=grad)
