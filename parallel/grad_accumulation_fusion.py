"""Gradient accumulation fusion: a linear's weight gradient is added straight into the fp32 main gradient by one GEMM,
with no 16-bit weight gradient. Autograd gets no weight gradient; ZeRO's post-accumulate hook still fires and finds it
in place. 16-bit inputs use CUDA's bf16 -> fp32 addmm, else an upcasting custom op."""

from __future__ import annotations

from typing import Optional, Protocol

import torch
import torch.nn.functional as F
from torch import nn
from torch.autograd.function import once_differentiable


class MainGradients(Protocol):
    """Who holds the fp32 main gradients."""

    def main_grad(self, param: nn.Parameter) -> torch.Tensor:
        """Where `param`'s gradient of this micro-batch is added: a tensor of its shape."""


# the emulation upcasts at most this many elements at once
EMULATION_CHUNK_ELEMENTS = 1 << 22


@torch.library.custom_op("grad_accumulation::addmm_fp32_", mutates_args=("main_grad",))
def addmm_fp32_(main_grad: torch.Tensor, mat1: torch.Tensor, mat2: torch.Tensor) -> None:
    """main_grad += mat1 @ mat2 in fp32, a slice of tokens at a time."""
    step = max(1, EMULATION_CHUNK_ELEMENTS // (mat1.shape[0] + mat2.shape[1]))
    for start in range(0, mat1.shape[1], step):
        main_grad.addmm_(mat1[:, start:start + step].to(main_grad.dtype), mat2[start:start + step].to(main_grad.dtype))


@addmm_fp32_.register_fake
def _addmm_fp32_on_meta(main_grad, mat1, mat2) -> None:
    return None


_NATIVE: dict[torch.device, Optional[str]] = {}


def native_16_bit_accumulation(device: torch.device) -> Optional[str]:
    """None when `device` adds a 16-bit GEMM into fp32 natively, else why not."""
    if device not in _NATIVE:
        if device.type != "cuda":
            _NATIVE[device] = f"aten::addmm.dtype has no {device.type} kernel in torch {torch.__version__}"
        else:
            generator = torch.Generator(device=device).manual_seed(0)
            a, b = (torch.randn(shape, device=device, generator=generator).bfloat16() for shape in ((16, 32), (32, 8)))
            into = torch.ones(16, 8, device=device)
            try:
                torch.ops.aten.addmm.dtype_out(into, a, b, torch.float32, out=into)
                expected = torch.ones(16, 8, device=device).addmm_(a.float(), b.float())
                ok = torch.allclose(into, expected, rtol=1e-5, atol=1e-5)
                _NATIVE[device] = None if ok else "aten::addmm.dtype_out gave another sum than the fp32 GEMM"
            except RuntimeError as error:
                _NATIVE[device] = f"aten::addmm.dtype_out refused an fp32 main gradient: {str(error).splitlines()[0]}"
    return _NATIVE[device]


def accumulate_weight_gradient(main_grad: torch.Tensor, grad_output: torch.Tensor, input: torch.Tensor) -> None:
    """main_grad += grad_output^T @ input in one op."""
    mat1 = grad_output.t()
    if mat1.dtype == main_grad.dtype:
        main_grad.addmm_(mat1, input)
    elif native_16_bit_accumulation(main_grad.device) is None:
        torch.ops.aten.addmm.dtype_out(main_grad, mat1, input, main_grad.dtype, out=main_grad)
    else:
        addmm_fp32_(main_grad, mat1, input)


def accumulation_path(dtype: torch.dtype, device: torch.device) -> str:
    if dtype == torch.float32:
        return "addmm_ into the fp32 main gradient"
    why_not = native_16_bit_accumulation(device)
    if why_not is None:
        return "torch's native bf16 x bf16 -> fp32 GEMM (aten::addmm.dtype_out)"
    emulation = "CPU emulation" if device.type == "cpu" else "emulation"
    return f"{emulation}: one custom op upcasting to the fp32 GEMM (grad_accumulation::addmm_fp32_; {why_not})"


class _LinearIntoMainGrad(torch.autograd.Function):
    @staticmethod
    def forward(ctx, input: torch.Tensor, weight: torch.Tensor, bias: Optional[torch.Tensor],
                main_grads: MainGradients) -> torch.Tensor:
        ctx.save_for_backward(input, weight)
        ctx.main_grads, ctx.has_bias = main_grads, bias is not None
        ctx.param = weight
        return F.linear(input, weight, bias)

    @staticmethod
    @once_differentiable
    def backward(ctx, grad_output: torch.Tensor):
        input, weight = ctx.saved_tensors
        flat_grad = grad_output.reshape(-1, grad_output.shape[-1])
        grad_input = flat_grad.mm(weight).view(input.shape) if ctx.needs_input_grad[0] else None
        grad_bias = flat_grad.sum(dim=0) if ctx.has_bias and ctx.needs_input_grad[2] else None
        if ctx.needs_input_grad[1]:
            accumulate_weight_gradient(ctx.main_grads.main_grad(ctx.param), flat_grad,
                                       input.reshape(-1, input.shape[-1]))
        return grad_input, None, grad_bias, None


class LinearIntoMainGrad:
    """F.linear whose weight gradient `main_grads` takes; plain F.linear outside autograd and under torch.compile."""

    def __init__(self, main_grads: MainGradients) -> None:
        self.main_grads = main_grads

    def __call__(self, input: torch.Tensor, weight: torch.Tensor, bias: Optional[torch.Tensor] = None
                 ) -> torch.Tensor:
        if not self.fuses(weight):
            return F.linear(input, weight, bias)
        return _LinearIntoMainGrad.apply(input, weight, bias, self.main_grads)

    @staticmethod
    def fuses(weight: torch.Tensor) -> bool:
        return torch.is_grad_enabled() and weight.requires_grad and not torch.compiler.is_compiling()
