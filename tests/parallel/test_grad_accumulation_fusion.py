"""Gradient accumulation fusion's GEMM (parallel/grad_accumulation_fusion.py): the weight gradient lands in the fp32
main gradient, equal to autograd's, added (not overwritten) across micro-batches, in one op; the input and bias
gradients are autograd's.

The contract is Megatron-Core's (NVIDIA/Megatron-LM, megatron/core/tensor_parallel/layers.py,
LinearWithGradAccumulationAndAsyncCommunication.backward):
    if ctx.gradient_accumulation_fusion: ...
        if weight.main_grad.dtype == torch.float32:
            fused_weight_gradient_mlp_cuda.wgrad_gemm_accum_fp32(total_input, grad_output, weight.main_grad)
and autograd gets no real weight gradient (Megatron hands it a dummy; here none, and the weight's
post-accumulate-grad hook still fires: test_the_weights_hook_fires_without_a_gradient).
"""

import collections

import pytest
import torch
import torch.nn.functional as F
from torch.utils._python_dispatch import TorchDispatchMode

from parallel.grad_accumulation_fusion import LinearIntoMainGrad, accumulation_path, addmm_fp32_
from parallel.init import materialize
from parallel.layers import ColumnParallelLinear, RowParallelLinear
from parallel.state import ParallelState


class Held:
    """A MainGradients: one zeroed fp32 main gradient per parameter."""

    def __init__(self, *params):
        self.grads = {id(p): torch.zeros(p.shape, dtype=torch.float32) for p in params}

    def main_grad(self, param):
        return self.grads[id(param)]


class Ops(TorchDispatchMode):
    """The ATen and custom ops below autograd, by name."""

    def __init__(self):
        super().__init__()
        self.seen = collections.Counter()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if not func.is_view and func._opname not in ("detach", "empty", "empty_strided"):
            self.seen[f"{func.namespace}.{func._opname}"] += 1
        return func(*args, **(kwargs or {}))


def _reference_grads(inputs, weight, bias, grad_outputs):
    weight = weight.detach().double().requires_grad_()
    bias = bias.detach().double().requires_grad_()
    input_grads = []
    for x, g in zip(inputs, grad_outputs):
        x = x.detach().double().requires_grad_()
        F.linear(x, weight, bias).backward(g.double())
        input_grads.append(x.grad)
    return weight.grad, bias.grad, input_grads


@pytest.mark.parametrize("dtype, tolerance", [
    (torch.float32, dict(rtol=1e-5, atol=1e-6)),
    # bf16: the input gradient is a bf16 GEMM (bf16 eps 7.8e-3); the weight gradient is the fp32 sum of exact products
    (torch.bfloat16, dict(rtol=1e-2, atol=1e-2)),
])
def test_main_grad_holds_the_sum_of_the_micro_batches_weight_gradients(dtype, tolerance):
    generator = torch.Generator().manual_seed(3)
    weight = torch.randn(6, 5, generator=generator).to(dtype).requires_grad_()
    bias = torch.randn(6, generator=generator).to(dtype).requires_grad_()
    held = Held(weight)
    linear = LinearIntoMainGrad(held)
    inputs = [torch.randn(2, 4, 5, generator=generator).to(dtype).requires_grad_() for _ in range(2)]
    grad_outputs = [torch.randn(2, 4, 6, generator=generator).to(dtype) for _ in range(2)]
    for x, g in zip(inputs, grad_outputs):  # two micro-batches, one optimizer step
        linear(x, weight, bias).backward(g)
    expected_weight_grad, expected_bias_grad, expected_input_grads = _reference_grads(inputs, weight, bias,
                                                                                      grad_outputs)
    assert weight.grad is None  # autograd got no weight gradient: the main gradient holds it
    # whatever the inputs' dtype, the products of their values summed in fp32, never rounded to 16 bits
    torch.testing.assert_close(held.main_grad(weight), expected_weight_grad.float(), rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(bias.grad.double(), expected_bias_grad, **tolerance)
    for x, expected in zip(inputs, expected_input_grads):
        torch.testing.assert_close(x.grad.double(), expected, **tolerance)


@pytest.mark.parametrize("dtype, weight_gradient_op", [(torch.float32, "aten.addmm_"),
                                                       (torch.bfloat16, "grad_accumulation.addmm_fp32_")])
def test_the_weight_gradient_is_one_op_where_autograd_ran_a_gemm_and_an_add(dtype, weight_gradient_op):
    """Autograd's path: mm (the weight gradient in the parameters' dtype), then the reducer's add_ into the fp32
    main gradient; fused: one op, torch's native bf16 x bf16 -> fp32 GEMM on CUDA, its emulation here."""
    weight = torch.randn(6, 5).to(dtype).requires_grad_()
    held = Held(weight)
    x, g = torch.randn(4, 5).to(dtype).requires_grad_(), torch.randn(4, 6).to(dtype)
    output = LinearIntoMainGrad(held)(x, weight)
    with Ops() as ops:
        output.backward(g)
    assert ops.seen == {"aten.mm": 1, weight_gradient_op: 1}  # the input gradient's mm and the weight gradient's op
    plain = F.linear(x.detach().requires_grad_(), weight)
    with Ops() as ops:
        plain.backward(g)
        held.main_grad(weight).add_(weight.grad)
    assert ops.seen == {"aten.mm": 2, "aten.add_": 1}


def test_the_cpu_emulation_is_the_fp32_gemm_of_the_16_bit_values():
    """bf16 x bf16 products are exact in fp32: the emulation's sum is the fp32 GEMM of the same values, as CUDA's
    addmm.dtype_out computes it (in its own order)."""
    generator = torch.Generator().manual_seed(0)
    a, b = torch.randn(16, 64, generator=generator).bfloat16(), torch.randn(64, 8, generator=generator).bfloat16()
    into, expected = torch.ones(16, 8), torch.ones(16, 8)
    addmm_fp32_(into, a, b)
    torch.testing.assert_close(into, expected.addmm_(a.float(), b.float()), rtol=0, atol=0)
    with pytest.raises((RuntimeError, NotImplementedError), match="addmm.dtype"):  # why the emulation exists
        torch.ops.aten.addmm.dtype(torch.ones(16, 8), a, b, torch.float32)
    assert "CPU emulation" in accumulation_path(torch.bfloat16, torch.device("cpu"))
    assert accumulation_path(torch.float32, torch.device("cpu")) == "addmm_ into the fp32 main gradient"


def test_the_emulation_upcasts_a_bounded_slice_at_a_time(monkeypatch):
    """Its fp32 copies of the factors are a slice of the token dimension at a time (EMULATION_CHUNK_ELEMENTS): the
    same sum in fp32, in another order."""
    import parallel.grad_accumulation_fusion as fusion

    generator = torch.Generator().manual_seed(1)
    a, b = torch.randn(16, 64, generator=generator).bfloat16(), torch.randn(64, 8, generator=generator).bfloat16()
    whole, sliced = torch.zeros(16, 8), torch.zeros(16, 8)
    addmm_fp32_(whole, a, b)
    monkeypatch.setattr(fusion, "EMULATION_CHUNK_ELEMENTS", 5 * (16 + 8))  # 5 tokens a slice: 13 slices
    converted = []
    monkeypatch.setattr(torch.Tensor, "to", lambda self, *args, **kwargs: converted.append(self.numel()) or
                        torch.Tensor.float(self))
    addmm_fp32_(sliced, a, b)
    assert max(converted) == 16 * 5 and len(converted) == 2 * 13
    torch.testing.assert_close(sliced, whole, rtol=1e-6, atol=1e-6)


def test_on_the_meta_device_the_emulation_is_shapes_only():
    main_grad = torch.zeros(6, 5, device="meta")
    addmm_fp32_(main_grad, torch.empty(6, 4, device="meta", dtype=torch.bfloat16),
                torch.empty(4, 5, device="meta", dtype=torch.bfloat16))
    assert main_grad.shape == (6, 5)


def test_the_weights_hook_fires_without_a_gradient():
    """What ZeRO's reducer counts a fused gradient by (zero/grad_reducer.py `_take_gradient`): torch runs the
    weight's AccumulateGrad node, and its post-accumulate-grad hook, though the backward gave the weight none."""
    weight = torch.randn(6, 5, requires_grad=True)
    held = Held(weight)
    fired = []
    weight.register_post_accumulate_grad_hook(lambda param: fired.append(param.grad))
    LinearIntoMainGrad(held)(torch.randn(4, 5), weight).sum().backward()
    assert fired == [None]
    assert held.main_grad(weight).abs().sum() > 0


def test_outside_autograd_it_is_f_linear():
    weight, x = torch.randn(6, 5, requires_grad=True), torch.randn(4, 5)
    linear = LinearIntoMainGrad(Held(weight))
    with torch.no_grad(), Ops() as ops:
        linear(x, weight)
    assert ops.seen == {"aten.mm": 1}


@pytest.mark.parametrize("layer_class", [ColumnParallelLinear, RowParallelLinear])
def test_a_layer_built_plain_routes_the_weight_gradient_once_its_linear_fuses(layer_class):
    state = ParallelState(device=torch.device("cpu"))
    x = torch.randn(3, 8, generator=torch.Generator().manual_seed(0))
    plain = materialize(layer_class(8, 4, state=state, init_std=0.02), 1, device=state.device)
    assert plain.linear is F.linear  # as built
    plain(x).sum().backward()
    fused = materialize(layer_class(8, 4, state=state, init_std=0.02), 1, device=state.device)
    held = Held(fused.weight)
    fused.linear = LinearIntoMainGrad(held)  # what zero/fused_accumulation.py does under ZeRO
    fused(x).sum().backward()
    assert fused.weight.grad is None
    torch.testing.assert_close(held.main_grad(fused.weight), plain.weight.grad, rtol=1e-6, atol=1e-7)
    torch.testing.assert_close(fused.bias.grad, plain.bias.grad)
