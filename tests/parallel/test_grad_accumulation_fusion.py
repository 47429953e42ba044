"""Gradient accumulation fusion's CPU-checkable part (issue 40, point 5): the weight gradient lands in the
fp32 `main_grad`, equal to autograd's, added (not overwritten) across micro-batches, and the input and
bias gradients are autograd's.

The contract is Megatron-Core's (NVIDIA/Megatron-LM, megatron/core/tensor_parallel/layers.py,
LinearWithGradAccumulationAndAsyncCommunication.backward):
    if ctx.gradient_accumulation_fusion: ...
        if weight.main_grad.dtype == torch.float32:
            fused_weight_gradient_mlp_cuda.wgrad_gemm_accum_fp32(total_input, grad_output, weight.main_grad)
    ... grad_weight = None  (autograd gets no weight gradient)
"""

import pytest
import torch
import torch.nn.functional as F

from parallel.grad_accumulation_fusion import linear_with_main_grad_accumulation
from parallel.init import materialize
from parallel.layers import ColumnParallelLinear, RowParallelLinear
from parallel.state import ParallelState


def _reference_grads(inputs, weight, bias, grad_outputs):
    weight = weight.detach().float().requires_grad_()
    bias = bias.detach().float().requires_grad_()
    input_grads = []
    for x, g in zip(inputs, grad_outputs):
        x = x.detach().float().requires_grad_()
        F.linear(x, weight, bias).backward(g.float())
        input_grads.append(x.grad)
    return weight.grad, bias.grad, input_grads


@pytest.mark.parametrize("dtype, tolerance", [
    (torch.float32, dict(rtol=1e-5, atol=1e-6)),
    # bf16 inputs: the fused path's GEMM runs in fp32 on the same bf16 values, the reference in fp32 too;
    # the input gradient is a bf16 GEMM (bf16 eps 7.8e-3).
    (torch.bfloat16, dict(rtol=1e-2, atol=1e-2)),
])
def test_main_grad_holds_the_sum_of_the_micro_batches_weight_gradients(dtype, tolerance):
    generator = torch.Generator().manual_seed(3)
    weight = torch.randn(6, 5, generator=generator).to(dtype).requires_grad_()
    bias = torch.randn(6, generator=generator).to(dtype).requires_grad_()
    weight.main_grad = torch.zeros(6, 5, dtype=torch.float32)
    inputs = [torch.randn(2, 4, 5, generator=generator).to(dtype).requires_grad_() for _ in range(2)]
    grad_outputs = [torch.randn(2, 4, 6, generator=generator).to(dtype) for _ in range(2)]
    for x, g in zip(inputs, grad_outputs):  # two micro-batches, one optimizer step
        linear_with_main_grad_accumulation(x, weight, bias).backward(g)
    expected_weight_grad, expected_bias_grad, expected_input_grads = _reference_grads(inputs, weight, bias,
                                                                                      grad_outputs)
    assert weight.grad is None  # autograd got no weight gradient: main_grad holds it
    torch.testing.assert_close(weight.main_grad, expected_weight_grad, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(bias.grad.float(), expected_bias_grad, **tolerance)
    for x, expected in zip(inputs, expected_input_grads):
        torch.testing.assert_close(x.grad.float(), expected, **tolerance)


def test_without_a_main_grad_buffer_it_says_what_is_missing():
    with pytest.raises(ValueError, match="needs weight.main_grad"):
        linear_with_main_grad_accumulation(torch.ones(2, 3), torch.ones(4, 3, requires_grad=True))


@pytest.mark.parametrize("layer_class", [ColumnParallelLinear, RowParallelLinear])
def test_the_layer_option_is_off_by_default_and_routes_the_weight_gradient_when_on(layer_class):
    state = ParallelState(device=torch.device("cpu"))
    x = torch.randn(3, 8, generator=torch.Generator().manual_seed(0))
    plain = materialize(layer_class(8, 4, state=state, init_std=0.02), 1, device=state.device)
    plain(x).sum().backward()
    fused = materialize(layer_class(8, 4, state=state, init_std=0.02, gradient_accumulation_fusion=True), 1,
                        device=state.device)
    fused.weight.main_grad = torch.zeros_like(fused.weight)
    fused(x).sum().backward()
    assert plain.weight.grad is not None  # the default: today's path
    assert fused.weight.grad is None
    torch.testing.assert_close(fused.weight.main_grad, plain.weight.grad, rtol=1e-6, atol=1e-7)
    torch.testing.assert_close(fused.bias.grad, plain.bias.grad)
