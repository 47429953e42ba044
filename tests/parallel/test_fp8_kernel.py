"""The one FP8 kernel path (parallel/fp8/kernel.py) and the recipes' scales (recipes.py, block_scaling.py),
each against TransformerEngine's formula written out here from its source:

- per-tensor scale: transformer_engine/common/recipe/recipe_common.cuh, compute_scale_from_amax
  (scale = fp8_max / amax; 1 for amax 0/inf/nan; the input type's max where it overflows; power of two by
  masking the mantissa);
- delayed scaling: transformer_engine/pytorch/quantization.py, _default_get_amax_and_update_history,
  _update_amax_history, _default_sf_compute (scale = (fp8_max / amax) / 2^margin over an amax history);
- MXFP8: transformer_engine/common/util/ptx_arch_spec.cuh float_to_e8m0 (amax / fp8_max rounded up to a
  power of two) and ptx.cuh exp2f / exp2f_rcp;
- E4M3 max 448, E5M2 max 57344: transformer_engine/common/recipe/__init__.py, Format.
CUDA's operand rules: torch's aten/src/ATen/native/cuda/Blas.cpp, _scaled_mm_out_cuda."""

import math

import pytest
import torch

from parallel.fp8 import block_scaling as blocks
from parallel.fp8.delayed_updates import BACKWARD, FORWARD, update_delayed_scales
from parallel.fp8.kernel import E4M3, E5M2, Fp8OperandError, kernel_name, scaled_matmul
from parallel.fp8.recipes import DelayedScaling, Fp8Recipe, current_scale, saturating_cast

ONE = torch.tensor(1.0)


def f32(value):
    return float(torch.tensor(value, dtype=torch.float32))


def fp8(rows, cols, dtype=E4M3, seed=0):
    return torch.randn(rows, cols, generator=torch.Generator().manual_seed(seed)).to(dtype)


def test_scaled_matmul_is_one_scaled_mm_call_and_equals_the_dequantized_product():
    a, b_t = fp8(32, 64), fp8(48, 64, E5M2, seed=1)
    scale_a, scale_b = torch.tensor(0.25), torch.tensor(8.0)  # powers of two: the dequantized product is exact
    out = scaled_matmul(a, b_t.t(), scale_a, scale_b, torch.float32)
    assert torch.equal(out, torch._scaled_mm(a, b_t.t(), scale_a=scale_a, scale_b=scale_b, out_dtype=torch.float32))
    assert torch.allclose(out, (a.float() * 0.25) @ (b_t.float().t() * 8.0), rtol=1e-6, atol=1e-5)


@pytest.mark.parametrize("out_dtype", [torch.float32, torch.bfloat16])
def test_the_cpu_runs_torchs_emulated_scaled_mm_whatever_the_operand_dtypes(out_dtype):
    """Two e4m3 operands would take oneDNN's _scaled_mm on a CPU with AMX-int8 (a reference loop: seconds a
    GEMM); the kernel path takes torch's emulated implementation for every pair (aten/src/ATen/native/Blas.cpp,
    _scaled_mm_out_cpu_emulated), written out here: each operand upcast and multiplied by its scale in fp32, an
    fp32 matmul, one cast. Non-power-of-two scales, so that oneDNN's result (scales on the sum) differs."""
    a, b_t = fp8(64, 32, seed=2), fp8(48, 32, seed=3)
    scale_a, scale_b = torch.tensor(0.37), torch.tensor(0.011)
    enabled = torch.backends.mkldnn.enabled
    out = scaled_matmul(a, b_t.t(), scale_a, scale_b, out_dtype)
    assert torch.backends.mkldnn.enabled == enabled  # switched off for the call alone
    written_out = ((a.float() * scale_a) @ (b_t.float().t() * scale_b)).to(out_dtype)
    assert torch.equal(out, written_out)


@pytest.mark.parametrize("case, words", [
    ("a column-major", "A row-major"),
    ("b row-major", "B column-major"),
    ("k 40", "K=40 not a multiple of 16"),
    ("m 40", "M=40 not a multiple of 16"),
    ("both e5m2", "two float8_e5m2"),
    ("scale bf16", "scale_a must be an fp32 singleton"),
    ("row scale", "scale_a must be an fp32 singleton"),
])
def test_cuda_operand_rules_are_enforced_on_the_cpu_too(case, words):
    """The CPU kernel itself accepts each of these (checked below), so only our check keeps a CPU-tested
    call from failing on an H100."""
    a, b, scale_a, scale_b = fp8(32, 64), fp8(48, 64, seed=1).t(), ONE, ONE
    if case == "a column-major":
        a = a.t().contiguous().t()
    elif case == "b row-major":
        b = b.contiguous()
    elif case == "k 40":
        a, b = fp8(32, 40), fp8(48, 40, seed=1).t()
    elif case == "m 40":
        a = fp8(40, 64)
    elif case == "both e5m2":
        a, b = fp8(32, 64, E5M2), fp8(48, 64, E5M2, seed=1).t()
    elif case == "scale bf16":
        scale_a = ONE.bfloat16()
    elif case == "row scale":
        scale_a, scale_b = torch.ones(32, 1), torch.ones(1, 48)
    with pytest.raises(Fp8OperandError, match=words):
        scaled_matmul(a, b, scale_a, scale_b, torch.float32)
    if case != "scale bf16":
        torch._scaled_mm(a, b, scale_a=scale_a, scale_b=scale_b, out_dtype=torch.float32)  # the CPU runs it


def test_kernel_names_say_which_recipes_are_emulated():
    assert kernel_name(torch.device("cpu"), "delayed") == "CPU _scaled_mm (torch's fp32 emulation)"
    assert kernel_name(torch.device("cuda"), "tensorwise") == "CUDA _scaled_mm"
    assert kernel_name(torch.device("cpu"), "mxfp8").startswith("emulated: one CPU _scaled_mm (torch's fp32 emulation) "
                                                                "per 32-wide K block")
    assert kernel_name(torch.device("cpu"), "blockwise").startswith("emulated: one CPU _scaled_mm (torch's fp32 "
                                                                    "emulation) per 128-wide")


def te_compute_scale_from_amax(amax, fp8_max, power_of_two, value_for_inf):
    """recipe_common.cuh's compute_scale_from_amax with epsilon 0, in Python floats (float division then a
    rounding to fp32 is fp32's correctly rounded division: double rounding is innocuous for division)."""
    if math.isinf(amax) or amax == 0 or math.isnan(amax):
        return 1.0
    scale = float(torch.tensor(fp8_max / amax, dtype=torch.float32))
    if math.isinf(scale):
        scale = value_for_inf
    if power_of_two:
        mantissa, exponent = math.frexp(scale)
        scale = math.ldexp(0.5, exponent)
    return scale


@pytest.mark.parametrize("power_of_two", [False, True])
def test_current_scale_is_transformer_engines(power_of_two):
    amaxes = [2.0, 3.0, 0.7, 1e-3, 0.0, float("inf"), float("nan"), 1e-45, 448.0, 60000.0]
    got = current_scale(torch.tensor(amaxes), 448.0, power_of_two, torch.finfo(torch.bfloat16).max)
    amaxes = torch.tensor(amaxes).tolist()  # the fp32 values the kernel sees
    want = [te_compute_scale_from_amax(a, 448.0, power_of_two, torch.finfo(torch.bfloat16).max) for a in amaxes]
    assert got.tolist() == [float(torch.tensor(w, dtype=torch.float32)) for w in want]
    if power_of_two:
        assert got[1].item() == 128.0  # 448 / 3 = 149.3 -> 128


def test_cast_saturates_as_te_does_instead_of_overflowing():
    values = torch.tensor([1000.0, -1e6, 448.0, float("nan")])
    assert saturating_cast(values, E4M3).float().tolist()[:3] == [448.0, -448.0, 448.0]
    assert math.isnan(saturating_cast(values, E4M3).float()[3].item())
    assert saturating_cast(torch.tensor([1e9]), E5M2).float().item() == 57344.0
    assert math.isinf(torch.tensor([1e9]).to(E5M2).float().item())  # why: torch's own e5m2 cast overflows


@pytest.mark.parametrize("algo", ["max", "most_recent"])
@pytest.mark.parametrize("margin", [0, 2])
def test_delayed_scaling_follows_the_amax_history(algo, margin):
    """Five casts of one role through a history of 3, each followed by its pass's update
    (parallel/fp8/delayed_updates.py); the scales TE's update would give, step by step."""
    state = DelayedScaling(Fp8Recipe(recipe="delayed", margin=margin, amax_history_len=3, amax_compute_algo=algo))
    history, scale, used = [0.0, 0.0, 0.0], 1.0, []
    for amax in (3.0, 4.0, 2.9, 0.5, 0.0):  # 3.0 and 2.9: reciprocal-then-multiply differs from 448 / amax
        tensor = torch.tensor([amax, -amax / 3])
        data, scale_inv = state.quantize(tensor, 0, E4M3)
        update_delayed_scales([state], FORWARD)
        used.append(scale)
        assert scale_inv.item() == float(torch.reciprocal(torch.tensor(scale, dtype=torch.float32)))
        # TE: amax into row 0; reduce; roll by -1 and zero row 0; scale = (448 / amax) / 2^margin
        history[0] = max(history[0], f32(amax))
        reduced = max(history) if algo == "max" else history[0]
        history = history[1:] + history[:1]
        history[0] = 0.0
        if reduced > 0 and math.isfinite(reduced):
            # `fp8_max / amax` with amax a tensor is torch's __rtruediv__: amax.reciprocal() * fp8_max
            scale = f32(f32(1 / reduced) * 448.0) / 2 ** margin
        assert state.amax_history[:, 0].tolist() == history
        assert state.scale[0].item() == scale
    assert used[0] == 1.0  # the first cast uses TE's initial scale


def test_delayed_scaling_state_round_trips():
    recipe = Fp8Recipe(recipe="delayed", amax_history_len=4)
    state, restored = DelayedScaling(recipe), DelayedScaling(recipe)
    for role in range(3):
        state.quantize(torch.randn(8) * (role + 1), role, E4M3)
    update_delayed_scales([state], FORWARD)
    update_delayed_scales([state], BACKWARD)
    assert (state.scale != 1.0).all()  # every role moved: the round trip carries real values
    restored.load_state_dict(state.state_dict())
    assert torch.equal(restored.amax_history, state.amax_history) and torch.equal(restored.scale, state.scale)


def test_block_scales_are_power_of_two_per_1x128_and_128x128_block():
    x = torch.zeros(2, 160)
    x[0, :128], x[0, 128:], x[1, 5] = 3.0, 0.5, -1.0  # row 1's second block is all zeros: scale 1
    _, scale_inv = blocks.quantize_blocks_1d(x, E4M3)
    assert scale_inv.tolist() == [[1 / 128, 1 / 512], [1 / 256, 1.0]]  # 448/3 -> 128, 448/.5 -> 512 (896 -> 512)
    w = torch.zeros(130, 130)
    w[0, 0], w[129, 129] = 7.0, 1.0
    data, scale_inv = blocks.quantize_blocks_2d(w, E4M3)
    assert scale_inv.tolist() == [[1 / 64, 1.0], [1.0, 1 / 256]]
    assert data.shape == (130, 130) and data.float()[0, 0].item() == 448.0


def test_mx_scales_are_e8m0_rounded_up_as_te_does():
    """float_to_e8m0(amax * (1 / 448)) rounds the exponent up: 448 -> 2^0, 449 -> 2^1, 1 -> 2^-8
    (1/448 = 2^-8.8), 0 -> biased 0 (2^-127)."""
    x = torch.zeros(1, 128)
    x[0, 0], x[0, 32], x[0, 64] = 448.0, 449.0, 1.0
    data, scale = blocks.quantize_mx(x, E4M3)
    assert scale[0].tolist() == [1.0, 2.0, 2.0 ** -8, 2.0 ** -127]
    assert data.float()[0, 32].item() == 224.0 and data.float()[0, 64].item() == 256.0
    assert blocks.e8m0_exponent(torch.tensor([float("nan"), float("inf")])).tolist() == [255, 254]
    assert blocks.e8m0_to_reciprocal(torch.tensor([127, 0, 254])).tolist() == [1.0, 2.0 ** 127, 2.0 ** -127]
