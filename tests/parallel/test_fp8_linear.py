"""The FP8 linear (parallel/fp8/linear.py), forward, dgrad and wgrad, for each recipe and format: bitwise
equal on the CPU to the recipe written out here (quantize with the scale the recipe computes, torch's
_scaled_mm, dequantize), over three steps for delayed scaling (its history in use), one for the others. The
reference's torch._scaled_mm runs with oneDNN off (the `emulated_scaled_mm` fixture), the CPU implementation
the kernel path uses (parallel/fp8/kernel.py says why).

What is written out, and where it comes from:
- Megatron (megatron/core/fp8_utils.py, get_fp8_recipe): e4m3 -> Format.E4M3, hybrid -> Format.HYBRID
  (e4m3 forward, e5m2 gradients); delayed -> DelayedScaling with override_linear_precision=(False, False,
  not fp8_wgrad); tensorwise -> Float8CurrentScaling; blockwise -> Float8BlockScaling; mxfp8 -> MXFP8BlockScaling.
- TE's Linear (transformer_engine/pytorch/module/linear.py): fprop y = x W^T; dgrad dx = dy W; wgrad
  dW = dy^T x. Float8BlockScaling (transformer_engine/common/recipe/__init__.py): x_block_scaling_dim 1
  (1x128), w_block_scaling_dim 2 (128x128), grad_block_scaling_dim 1, power-of-two scales, split
  accumulation; block recipes quantize each direction from the high-precision tensor.
- MXFP8BlockScaling: 1x32 blocks, E8M0 scales (float_to_e8m0 rounds amax / fp8_max up to a power of two).
- Scales: compute_scale_from_amax (recipe_common.cuh), _default_sf_compute (quantization.py); casts
  saturate (satfinite).
"""

import math

import pytest
import torch

from parallel.fp8.delayed_updates import BACKWARD, FORWARD, update_delayed_scales
from parallel.fp8.linear import Fp8LinearState, fp8_linear, shape_rule_broken
from parallel.fp8.recipes import Fp8Recipe

E4M3, E5M2 = torch.float8_e4m3fn, torch.float8_e5m2
MAX = {E4M3: 448.0, E5M2: 57344.0}
TOKENS, IN, OUT = 32, 160, 64  # 160: a partial last 128-block; every size a multiple of 32 for MXFP8


@pytest.fixture(autouse=True)
def emulated_scaled_mm():
    """torch's CPU _scaled_mm takes its emulated implementation (aten/src/ATen/native/Blas.cpp,
    _scaled_mm_out_cpu_emulated) with oneDNN off; with oneDNN on it takes oneDNN's for two e4m3 operands."""
    with torch.backends.mkldnn.flags(enabled=False):
        yield


def f32(value):
    return float(torch.tensor(value, dtype=torch.float32))


def te_scale(amax, fp8_max, power_of_two, value_for_inf):
    """compute_scale_from_amax, epsilon 0."""
    if amax == 0 or not math.isfinite(amax):
        return 1.0
    scale = f32(fp8_max / amax)
    scale = value_for_inf if math.isinf(scale) else scale
    return math.ldexp(0.5, math.frexp(scale)[1]) if power_of_two else scale


def cast(values, scale, dtype):
    return (values.float() * scale).clamp(-MAX[dtype], MAX[dtype]).to(dtype)


def per_tensor(tensor, scale, dtype):
    return cast(tensor, torch.tensor(scale, dtype=torch.float32), dtype), 1 / torch.tensor(scale,
                                                                                            dtype=torch.float32)


def rows_in_blocks(tensor, dtype, block, scale_of):
    """Quantize each row's blocks along the last dimension; scale_of(amax) -> (quantizing, dequantizing)."""
    data = torch.empty(tensor.shape, dtype=dtype)
    scales = torch.empty(tensor.size(0), math.ceil(tensor.size(1) / block))
    for row in range(tensor.size(0)):
        for index, start in enumerate(range(0, tensor.size(1), block)):
            piece = tensor[row, start:start + block].float()
            quantizing, dequantizing = scale_of(piece.abs().max().item(), tensor.dtype, dtype)
            data[row, start:start + block] = cast(piece, torch.tensor(quantizing, dtype=torch.float32), dtype)
            scales[row, index] = dequantizing
    return data, scales


def pow2_block_scale(amax, input_dtype, dtype):
    scale = te_scale(amax, MAX[dtype], True, torch.finfo(input_dtype).max)
    return scale, f32(1 / scale)


def mx_block_scale(amax, input_dtype, dtype):
    """float_to_e8m0(amax * (1/fp8_max)): the power of two at or above it; the values times its reciprocal."""
    value = f32(amax * f32(1 / MAX[dtype]))
    if value == 0:
        return 2.0 ** 127, 2.0 ** -127
    mantissa, exponent = math.frexp(value)  # value = mantissa * 2^exponent, mantissa in [0.5, 1)
    power = exponent - 1 if mantissa == 0.5 else exponent
    return 2.0 ** -power, 2.0 ** power


def weight_in_tiles(weight, dtype, block=128):
    data = torch.empty(weight.shape, dtype=dtype)
    scales = torch.empty(math.ceil(weight.size(0) / block), math.ceil(weight.size(1) / block))
    for i, r in enumerate(range(0, weight.size(0), block)):
        for j, c in enumerate(range(0, weight.size(1), block)):
            tile = weight[r:r + block, c:c + block]
            scale, scales[i, j] = pow2_block_scale(tile.abs().max().item(), weight.dtype, dtype)
            data[r:r + block, c:c + block] = cast(tile, torch.tensor(scale, dtype=torch.float32), dtype)
    return data, scales


def blocked_gemm(a, a_scales, b_t, b_scales, block):
    """Sum over K blocks of _scaled_mm(block, unit scales, fp32) * (row scale x column scale)."""
    unit, out = torch.tensor(1.0), 0
    for index, start in enumerate(range(0, a.size(1), block)):
        part = torch._scaled_mm(a[:, start:start + block].contiguous(), b_t[:, start:start + block].contiguous().t(),
                                scale_a=unit, scale_b=unit, out_dtype=torch.float32)
        out = out + part * (a_scales[:, index:index + 1] * b_scales[:, index].unsqueeze(0))
    return out


class DelayedReference:
    """TE's delayed scaling for the three roles, in Python floats: cast with the current scale; amax into
    the history's row 0; reduce (max or most recent); roll by -1, zero row 0; scale = (max/amax)/2^margin."""

    def __init__(self, recipe):
        self.recipe, self.history, self.scales = recipe, [[0.0] * recipe.amax_history_len for _ in range(3)], [1.0] * 3

    def scale_then_update(self, role, tensor, dtype):
        scale, history = self.scales[role], self.history[role]
        history[0] = max(history[0], f32(tensor.abs().max().item()))
        amax = max(history) if self.recipe.amax_compute_algo == "max" else history[0]
        self.history[role] = history = history[1:] + history[:1]
        history[0] = 0.0
        if amax > 0 and math.isfinite(amax):
            # _default_sf_compute's `fp8_max / amax` divides a float by a tensor: torch's __rtruediv__,
            # amax.reciprocal() * fp8_max, two fp32 roundings (not one correctly rounded division).
            self.scales[role] = f32(f32(1 / amax) * MAX[dtype]) / 2 ** self.recipe.margin
        return scale


def reference_step(recipe, delayed, x, weight, bias, grad):
    """One forward and backward of the recipe written out: (y, dx, dW, db) in the tensors' dtypes."""
    fwd, bwd = E4M3, (E5M2 if recipe.fp8_format == "hybrid" else E4M3)
    kind = recipe.recipe
    if kind in ("delayed", "tensorwise"):
        def scale(role, tensor, dtype):
            if kind == "delayed":
                return delayed.scale_then_update(role, tensor, dtype)
            return te_scale(f32(tensor.abs().max().item()), MAX[dtype], False, torch.finfo(tensor.dtype).max)
        x_q, x_s = per_tensor(x, scale(0, x, fwd), fwd)
        w_q, w_s = per_tensor(weight, scale(1, weight, fwd), fwd)
        y = torch._scaled_mm(x_q, w_q.t(), scale_a=x_s, scale_b=w_s, out_dtype=torch.float32)
        g_q, g_s = per_tensor(grad, scale(2, grad, bwd), bwd)
        dx = torch._scaled_mm(g_q, w_q.t().contiguous().t(), scale_a=g_s, scale_b=w_s, out_dtype=torch.float32)
        if recipe.wgrad or kind != "delayed":
            dw = torch._scaled_mm(g_q.t().contiguous(), x_q.t().contiguous().t(), scale_a=g_s, scale_b=x_s,
                                  out_dtype=torch.float32)
        else:
            dw = grad.t() @ x  # --no-fp8-wgrad: TE's wgrad in high precision
    elif kind == "blockwise":
        x_q, x_s = rows_in_blocks(x, fwd, 128, pow2_block_scale)
        w_q, w_s = weight_in_tiles(weight, fwd)
        y = blocked_gemm(x_q, x_s, w_q, w_s.repeat_interleave(128, 0)[:OUT], 128)
        g_q, g_s = rows_in_blocks(grad, bwd, 128, pow2_block_scale)
        dx = blocked_gemm(g_q, g_s, w_q.t().contiguous(), w_s.t().repeat_interleave(128, 0)[:IN], 128)
        gc_q, gc_s = rows_in_blocks(grad.t(), bwd, 128, pow2_block_scale)
        xc_q, xc_s = rows_in_blocks(x.t(), fwd, 128, pow2_block_scale)
        dw = blocked_gemm(gc_q, gc_s, xc_q, xc_s, 128)
    else:
        x_q, x_s = rows_in_blocks(x, fwd, 32, mx_block_scale)
        w_q, w_s = rows_in_blocks(weight, fwd, 32, mx_block_scale)
        y = blocked_gemm(x_q, x_s, w_q, w_s, 32)
        g_q, g_s = rows_in_blocks(grad, bwd, 32, mx_block_scale)
        wc_q, wc_s = rows_in_blocks(weight.t(), fwd, 32, mx_block_scale)
        dx = blocked_gemm(g_q, g_s, wc_q, wc_s, 32)
        gc_q, gc_s = rows_in_blocks(grad.t(), bwd, 32, mx_block_scale)
        xc_q, xc_s = rows_in_blocks(x.t(), fwd, 32, mx_block_scale)
        dw = blocked_gemm(gc_q, gc_s, xc_q, xc_s, 32)
    y = (y + bias.float()).to(x.dtype)
    return y, dx.to(x.dtype), dw.to(weight.dtype), grad.sum(0)


CASES = [(recipe, fmt, torch.float32, True) for recipe in ("delayed", "tensorwise", "blockwise", "mxfp8")
         for fmt in ("e4m3", "hybrid")]
CASES += [("delayed", "hybrid", torch.float32, False), ("tensorwise", "hybrid", torch.bfloat16, True),
          ("blockwise", "hybrid", torch.bfloat16, True)]


@pytest.mark.parametrize("recipe_name, fmt, dtype, wgrad", CASES)
def test_fp8_linear_equals_the_recipe_written_out_bitwise(recipe_name, fmt, dtype, wgrad):
    recipe = Fp8Recipe(fp8_format=fmt, recipe=recipe_name, margin=1, amax_history_len=2, amax_compute_algo="max",
                       wgrad=wgrad)
    state, delayed = Fp8LinearState(recipe), DelayedReference(recipe)
    generator = torch.Generator().manual_seed(0)
    weight = (torch.randn(OUT, IN, generator=generator) * 0.05).to(dtype).requires_grad_()
    bias = (torch.randn(OUT, generator=generator) * 0.1).to(dtype).requires_grad_()
    for step in range(3 if recipe_name == "delayed" else 1):
        x = (torch.randn(4, TOKENS // 4, IN, generator=generator) * (1 + step)).to(dtype).requires_grad_()
        grad = (torch.randn(4, TOKENS // 4, OUT, generator=generator) * 1e-3).to(dtype)
        y = fp8_linear(x, weight, bias, state)
        if state.delayed is not None:  # the forward pass's update (parallel/fp8/delayed_updates.py)
            update_delayed_scales([state.delayed], FORWARD)
        weight.grad = bias.grad = None
        y.backward(grad)
        if state.delayed is not None:
            update_delayed_scales([state.delayed], BACKWARD)
        want = reference_step(recipe, delayed, x.detach().reshape(TOKENS, IN), weight.detach(), bias.detach(),
                              grad.reshape(TOKENS, OUT))
        assert y.dtype == dtype and x.grad.dtype == dtype and weight.grad.dtype == dtype
        for name, got, expected in zip(("y", "dx", "dW", "db"), (y.reshape(TOKENS, OUT), x.grad.reshape(TOKENS, IN),
                                                                  weight.grad, bias.grad), want):
            assert torch.equal(got, expected), f"step {step}: {name} differs"
        # Close to the high-precision linear, as FP8 should be (a loose sanity bound, not the proof).
        exact = torch.nn.functional.linear(x.detach().float(), weight.detach().float(), bias.detach().float())
        assert (y.float() - exact).norm() / exact.norm() < 0.1


def test_a_shape_off_cudas_multiples_is_named():
    assert shape_rule_broken(160, 96, 64, "tensorwise") is None
    assert shape_rule_broken(160, 96, 48, "mxfp8") == "tokens 48 not a multiple of 32"
    assert shape_rule_broken(100, 96, 64, "delayed") == "in_features 100 not a multiple of 16"
