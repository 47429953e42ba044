"""--fp8-guard (issue 65 item 4, parallel/fp8/guard.py): the counters of each cast against counts written out
by hand, and one FP8 linear that falls back to high precision when a cast saturates or its output is not
finite, and comes back to FP8 when its next check passes; under TP the verdict is the TP group's."""

import pytest
import torch

from parallel.fp8.guard import CastCounts, GuardMonitor, LayerGuard, merge_iterations
from parallel.fp8.kernel import E4M3, E5M2
from parallel.fp8.linear import Fp8LinearState, fp8_linear
from parallel.fp8.recipes import GRAD_OUTPUT, INPUT, WEIGHT, Fp8Recipe, quantize_tensorwise, saturating_cast

# e4m3: largest 448, smallest subnormal 2^-9 (half of it, 2^-10, rounds to even: 0). e5m2: 57344, 2^-16.
E4M3_VALUES = [500.0, -449.0, 448.0, -448.0, 2.0 ** -10 * 0.9, -(2.0 ** -11), 2.0 ** -10 * 1.1, 0.0, -0.0, 1.0,
               float("nan")]
E5M2_VALUES = [6.0e4, -1.0e9, 57344.0, 2.0 ** -17 * 0.5, 2.0 ** -17 * 1.5, 0.0, -3.0]


@pytest.mark.parametrize("dtype, values, saturated, flushed", [
    # 500 and -449 clip to +-448 (448 itself is not clipped); 0.9 x 2^-10 and -2^-11 become 0 (1.1 x 2^-10
    # rounds up to 2^-9; the zeros were zero already; NaN is neither)
    (E4M3, E4M3_VALUES, 2, 2),
    # 6e4 and -1e9 clip to +-57344; 2^-18 becomes 0 (1.5 x 2^-17 rounds up to 2^-16)
    (E5M2, E5M2_VALUES, 2, 1),
])
def test_the_counters_of_one_cast_match_the_written_out_count(dtype, values, saturated, flushed):
    counts = CastCounts()
    data = saturating_cast(torch.tensor(values), dtype, counts)
    assert (int(counts.saturated), int(counts.flushed), counts.values) == (saturated, flushed, len(values))
    assert float(counts.worst_fraction) == pytest.approx(saturated / len(values))  # fp32
    # the written-out flush: exactly the non-zero values the cast made zero
    made_zero = [v for v, q in zip(values, data.float().tolist()) if v != 0 and q == 0]
    assert len(made_zero) == flushed


def test_the_counters_over_a_scaled_cast_are_the_elementwise_count():
    """quantize_tensorwise at a scale 4x too large: the count is, value by value, |x * scale| > 448."""
    generator = torch.Generator().manual_seed(0)
    x = torch.randn(64, 32, generator=generator)
    scale = torch.tensor(448.0 / x.abs().max().item() * 4)
    counts = CastCounts()
    quantize_tensorwise(x, scale, E4M3, counts)
    expected = sum(1 for value in (x.float() * scale).flatten().tolist() if abs(value) > 448.0)
    assert int(counts.saturated) == expected > 0


RECIPE = Fp8Recipe(fp8_format="hybrid", recipe="delayed")
TOKENS, FEATURES = 32, 32


def _linear(threshold=0.05, guarded=True):
    lines = []
    guard = LayerGuard("blocks.0.mlp.dense_h_to_4h", threshold, log=lines.append) if guarded else None
    return Fp8LinearState(RECIPE, guard=guard), guard, lines


def _step(state, x, weight, grad):
    x = x.clone().requires_grad_(True)
    w = weight.clone().requires_grad_(True)
    out = fp8_linear(x, w, None, state)
    out.backward(grad)
    return out.detach(), x.grad, w.grad


def _reference(x, weight, grad):
    x = x.clone().requires_grad_(True)
    w = weight.clone().requires_grad_(True)
    out = torch.nn.functional.linear(x, w)
    out.backward(grad)
    return out.detach(), x.grad, w.grad


def _data():
    generator = torch.Generator().manual_seed(1)
    return [torch.randn(shape, generator=generator) for shape in ((TOKENS, FEATURES), (FEATURES, FEATURES),
                                                                     (TOKENS, FEATURES))]


def test_a_saturating_cast_falls_back_for_that_pass_and_comes_back_when_its_check_passes():
    """The injection: delayed scaling's input scale 1e6 times too large (as after an input 1e6 times smaller,
    the amax spike delayed scaling is known for). Guarded, that forward and its backward run in fp32 here
    (the activations' dtype): F.linear's values; unguarded, the FP8 output is garbage."""
    x, weight, grad = _data()
    results = {}
    for guarded in (True, False):
        state, guard, lines = _linear(guarded=guarded)
        _step(state, x, weight, grad)  # step 1: the histories see x, the scales fit it
        state.delayed.scale[INPUT] *= 1e6
        if guard is not None:
            guard.iteration = 2
        results[guarded] = (_step(state, x, weight, grad), state, guard, lines)
    reference = _reference(x, weight, grad)
    (out, grad_x, grad_w), state, guard, lines = results[True]
    torch.testing.assert_close(out, reference[0], rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(grad_x, reference[1], rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(grad_w, reference[2], rtol=1e-6, atol=1e-6)
    assert len(lines) == 1 and "blocks.0.mlp.dense_h_to_4h runs in high precision from iteration 2" in lines[0]
    assert "forward cast saturated" in lines[0]
    figures = guard.take_iteration()
    assert figures["fell_back"] and figures["worst_fraction"] > 0.05
    unguarded_out = results[False][0][0]
    assert (unguarded_out - reference[0]).abs().max() > 0.5 * reference[0].abs().max()  # the injection bites
    # step 3: the history recorded x's true amax, the scale fits again, the check passes: back in FP8
    guard.iteration = 3
    out3, _, _ = _step(state, x, weight, grad)
    assert len(lines) == 2 and "back in FP8 at iteration 3" in lines[1]
    assert not torch.equal(out3, reference[0])  # FP8 again (its rounding), close to the reference
    assert (out3 - reference[0]).abs().max() < 0.1 * reference[0].abs().max()
    assert not guard.take_iteration()["fell_back"]


def test_a_non_finite_output_falls_back_and_says_why():
    x, weight, grad = _data()
    state, guard, lines = _linear()
    state.delayed.scale[WEIGHT] = float("nan")
    out, grad_x, grad_w = _step(state, x, weight, grad)
    assert torch.isfinite(out).all() and torch.isfinite(grad_x).all() and torch.isfinite(grad_w).all()
    assert len(lines) == 1 and "its FP8 forward is not finite" in lines[0]


def test_the_monitor_keeps_the_record_small_and_merges_an_interval():
    x, weight, grad = _data()
    monitor = GuardMonitor()
    states = []
    for name in ("blocks.0.a", "blocks.0.b"):
        guard = LayerGuard(name, 0.05, log=lambda line: None)
        monitor.layers.append(guard)
        states.append(Fp8LinearState(RECIPE, guard=guard))
    records = []
    for iteration in (1, 2):
        monitor.begin_iteration(iteration)
        for state in states:
            _step(state, x * iteration, weight, grad)
        records.append(monitor.finish_iteration())
    # 3 casts of TOKENS x FEATURES or FEATURES x FEATURES values per linear and iteration
    assert records[0]["fp8_cast_values"] == 2 * (2 * TOKENS * FEATURES + FEATURES * FEATURES)
    assert records[0]["fp8_amax_growth_max"] is None and records[1]["fp8_amax_growth_max"] == pytest.approx(2.0)
    merged = merge_iterations(records)
    assert merged["fp8_saturated"] == records[0]["fp8_saturated"] + records[1]["fp8_saturated"]
    assert merged["fp8_amax_max"] == records[1]["fp8_amax_max"]
    assert len(merged) == 8  # a handful of fields whatever the number of layers


def _tp_rank(rank, world_size):
    """Two TP ranks, one of whose inputs saturates: both take the high-precision path."""
    import torch.distributed as dist
    dist.init_process_group("gloo")
    x, weight, grad = _data()
    state, guard, lines = _linear()
    guard.reduce_verdict = lambda flags: dist.all_reduce(flags, op=dist.ReduceOp.MAX)
    _step(state, x, weight, grad)
    if rank == 1:
        state.delayed.scale[INPUT] *= 1e6
    out, _, _ = _step(state, x, weight, grad)
    return out.tolist(), lines


@pytest.mark.slow
def test_under_tp_every_rank_takes_the_verdict_of_the_group():
    from tests.distributed import run_distributed

    x, weight, grad = _data()
    reference = _reference(x, weight, grad)[0]
    for out, lines in run_distributed(_tp_rank, 2):
        torch.testing.assert_close(torch.tensor(out), reference, rtol=1e-6, atol=1e-6)  # rank 0's check passed
        assert len(lines) == 1 and "runs in high precision" in lines[0]
        assert "a forward cast saturated 100% of its values" in lines[0]  # the group's worst, on both ranks


@pytest.mark.parametrize("recipe, casts", [
    # (rows, cols) of every cast the recipe makes (parallel/fp8/linear.py), padding of the last blocks not counted
    ("delayed", [(TOKENS, FEATURES), (2 * FEATURES, FEATURES), (TOKENS, 2 * FEATURES)]),   # x, W, dy
    ("tensorwise", [(TOKENS, FEATURES), (2 * FEATURES, FEATURES), (TOKENS, 2 * FEATURES)]),
    # x, W (128 x 128 blocks over a 64 x 32 weight), dy by rows, dy^T and x^T by tokens
    ("blockwise", [(TOKENS, FEATURES), (2 * FEATURES, FEATURES), (TOKENS, 2 * FEATURES), (2 * FEATURES, TOKENS),
                   (FEATURES, TOKENS)]),
    # x, W, dy, W^T, dy^T, x^T
    ("mxfp8", [(TOKENS, FEATURES), (2 * FEATURES, FEATURES), (TOKENS, 2 * FEATURES), (FEATURES, 2 * FEATURES),
               (2 * FEATURES, TOKENS), (FEATURES, TOKENS)]),
])
def test_every_cast_of_every_recipe_is_counted(recipe, casts):
    x, _, _ = _data()
    generator = torch.Generator().manual_seed(2)
    weight, grad = torch.randn(2 * FEATURES, FEATURES, generator=generator), torch.randn(TOKENS, 2 * FEATURES,
                                                                                          generator=generator)
    guard = LayerGuard("l", 0.05, log=lambda line: None)
    _step(Fp8LinearState(Fp8Recipe(fp8_format="hybrid", recipe=recipe), guard=guard), x, weight, grad)
    assert guard.take_iteration()["values"] == sum(rows * cols for rows, cols in casts)


def test_a_saturating_gradient_cast_reruns_the_backward_in_high_precision():
    """The gradient's delayed scale 1e6 too large: the forward stays in FP8, the backward's GEMMs run again
    from dy in high precision and the forward's x and W dequantized (close to F.linear's gradients, FP8
    rounding of x and W only); unguarded, the gradients are garbage."""
    x, weight, grad = _data()
    grads = {}
    for guarded in (True, False):
        state, guard, lines = _linear(guarded=guarded)
        _step(state, x, weight, grad)
        state.delayed.scale[GRAD_OUTPUT] *= 1e6
        grads[guarded] = _step(state, x, weight, grad)[1:]
        if guarded:
            assert len(lines) == 1 and "a backward cast saturated" in lines[0]
            assert "the backward GEMMs ran again in high precision" in lines[0]
    reference = _reference(x, weight, grad)[1:]
    for got, unguarded, expected in zip(grads[True], grads[False], reference):
        assert (got - expected).abs().max() < 0.1 * expected.abs().max()
        assert (unguarded - expected).abs().max() > 0.5 * expected.abs().max()


def test_the_blockwise_fallback_dequantizes_the_weight_block_by_block():
    """_dequantized_operands for blockwise, over a weight that crosses block boundaries (160 x 200) with blocks
    of other magnitudes: each element is its block's cast written out, (w x s).to(e4m3) / s with s the
    block's power-of-two scale (the largest power of two <= 448 / the block's amax)."""
    from types import SimpleNamespace

    from parallel.fp8.block_scaling import quantize_blocks_2d
    from parallel.fp8.linear import _dequantized_operands

    generator = torch.Generator().manual_seed(3)
    weight = torch.randn(160, 200, generator=generator)
    weight[:, 128:] *= 1e3
    weight[128:, :] *= 1e-2
    w_q, w_scale = quantize_blocks_2d(weight, E4M3)
    _, dequantized = _dequantized_operands(SimpleNamespace(saved=(torch.zeros(1, 200), w_q, w_scale)), "blockwise")
    for rows in (slice(0, 128), slice(128, 160)):
        for cols in (slice(0, 128), slice(128, 200)):
            block = weight[rows, cols]
            s = 2.0 ** torch.floor(torch.log2(448.0 / block.abs().max()))
            assert torch.equal(dequantized[rows, cols], (block * s).to(E4M3).float() / s)
