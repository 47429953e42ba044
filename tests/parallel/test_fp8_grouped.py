"""The experts' grouped GEMMs in FP8 (parallel/fp8/grouped.py), as TransformerEngine's GroupedLinear under
Megatron-Core's TEGroupedMLP runs them: one FP8 GEMM per expert with the expert's own scales (GroupedLinear's
per-GEMM quantizers), each expert's rows zero-padded to Megatron's alignment (Fp8Padding with
fp8_utils.get_fp8_align_size: 16, 32 for MXFP8) and unpadded after.

Checked against the recipe written out per expert (current scaling, TE's Float8CurrentScaling: scale = 448 / the
expert's rows' amax, e4m3 forward, e5m2 gradients under hybrid), with fp32 matmuls standing in for _scaled_mm (so
to fp32 rounding of sums of 32 products up to 60 in size, not bitwise: the point here is which rows share a scale, and that the padding changes none).
"""

import torch

from parallel.fp8.delayed_updates import FORWARD, update_delayed_scales
from parallel.fp8.grouped import alignment, fp8_grouped_linear, padded_rows
from parallel.fp8.linear import Fp8LinearState
from parallel.fp8.recipes import INPUT, WEIGHT, Fp8Recipe

E4M3, E5M2 = torch.float8_e4m3fn, torch.float8_e5m2
MAX = {E4M3: 448.0, E5M2: 57344.0}
IN, OUT = 32, 32
SIZES = [5, 0, 21, 16]  # not multiples of 16, an expert with no rows, one already aligned


def _dequantized(tensor, dtype):
    """TE's current scaling of one tensor, cast and back: its own amax."""
    scale = torch.tensor(MAX[dtype], dtype=torch.float32) / tensor.abs().amax()
    return (tensor * scale).clamp(-MAX[dtype], MAX[dtype]).to(dtype).float() / scale


def _inputs():
    generator = torch.Generator().manual_seed(0)
    rows = torch.randn(sum(SIZES), IN, generator=generator)
    rows[:5] *= 20  # expert 0's rows far larger than expert 2's: one shared scale would flush expert 2's
    weights = [torch.randn(OUT, IN, generator=generator) / (expert + 1) for expert in range(len(SIZES))]
    grad = torch.randn(sum(SIZES), OUT, generator=generator)
    return rows, weights, grad


def test_each_expert_casts_its_own_rows_and_the_padding_changes_nothing():
    rows, weights, grad = _inputs()
    recipe = Fp8Recipe(fp8_format="hybrid", recipe="tensorwise")
    x = rows.clone().requires_grad_(True)
    w = [weight.clone().requires_grad_(True) for weight in weights]
    out = fp8_grouped_linear(x, SIZES, w, [None] * len(SIZES), [Fp8LinearState(recipe) for _ in SIZES],
                             alignment("tensorwise"))
    out.backward(grad)
    assert out.shape == (sum(SIZES), OUT)
    start = 0
    for expert, size in enumerate(SIZES):
        rows_e, grad_e = rows[start:start + size], grad[start:start + size]
        start += size
        if size == 0:
            assert torch.equal(w[expert].grad, torch.zeros(OUT, IN))  # no rows: a zero weight gradient, as TE's
            continue
        x_q, w_q, g_q = _dequantized(rows_e, E4M3), _dequantized(weights[expert], E4M3), _dequantized(grad_e, E5M2)
        torch.testing.assert_close(out[start - size:start], x_q @ w_q.t(), rtol=1e-5, atol=1e-4)
        torch.testing.assert_close(x.grad[start - size:start], g_q @ w_q, rtol=1e-5, atol=1e-4)
        torch.testing.assert_close(w[expert].grad, g_q.t() @ x_q, rtol=1e-5, atol=1e-4)
    # one scale over every expert's rows (not TE's) would give expert 2 another output
    shared = _dequantized(rows, E4M3)[5:26] @ _dequantized(weights[2], E4M3).t()
    assert not torch.allclose(out[5:26], shared, rtol=1e-3, atol=1e-3)


def test_an_expert_with_no_rows_casts_its_weight_and_records_an_empty_amax():
    """Delayed scaling: TE quantizes every expert's weight, and an empty input's amax is 0, which moves no scale
    (_default_sf_compute keeps the previous scale where amax is 0); the zero rows here give the same."""
    rows, weights, _ = _inputs()
    recipe = Fp8Recipe(fp8_format="hybrid", recipe="delayed", amax_history_len=2)
    states = [Fp8LinearState(recipe) for _ in SIZES]
    fp8_grouped_linear(rows, SIZES, weights, [None] * len(SIZES), states, alignment("delayed"))
    update_delayed_scales([state.delayed for state in states], FORWARD)  # the forward pass's update
    empty = states[1].delayed
    assert empty.scale[INPUT] == 1.0 and empty.amax_history[-1, INPUT] == 0.0
    assert empty.amax_history[-1, WEIGHT] == weights[1].abs().amax()
    assert empty.scale[WEIGHT] == 448.0 / weights[1].abs().amax()  # TE's fp8_max / amax (a float over a tensor)
    assert states[0].delayed.amax_history[-1, INPUT] == rows[:5].abs().amax()


def test_megatrons_alignment_and_the_padded_counts():
    assert (alignment("tensorwise"), alignment("delayed"), alignment("blockwise"), alignment("mxfp8")) == (16, 16, 16, 32)
    assert [padded_rows(rows, 16) for rows in (0, 1, 16, 17)] == [16, 16, 16, 32]
