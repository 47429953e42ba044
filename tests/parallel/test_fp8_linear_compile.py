"""The FP8 linear under torch.compile (--compile, issue 76 item 1): traced whole into the caller's graph, forward and
backward, with `fullgraph=True` (a graph break anywhere in it, or in its backward, fails the compile), for every
recipe, the guard off, on in FP8 and on in high precision; and the same bits as eager: outputs, data and weight
gradients, the guard's figures and delayed scaling's scales, over two micro-batches run as a pipeline schedule runs
them (both forwards, then both backwards, delayed scaling's update after each pass). The bias gradient alone may
differ: inductor sums its rows in another order (fp32, 7.6e-6 here on values of a few units)."""

import pytest
import torch

from parallel.fp8.delayed_updates import BACKWARD, FORWARD, update_delayed_scales
from parallel.fp8.guard import LayerGuard
from parallel.fp8.linear import Fp8LinearState, fp8_linear
from parallel.fp8.recipes import Fp8Recipe

# (recipe, guard: None off, False in FP8, True in high precision, (in, out) features); blockwise's 192 out makes a
# weight of a whole and a partial 128-row tile (whose scales torch 2.13's inductor once read as garbage:
# block_scaling.expand_2d_scales), and 160 in a partial second 128-wide K block
CASES = [("delayed", False, (64, 96)), ("delayed", None, (64, 96)), ("tensorwise", True, (64, 96)),
         ("blockwise", False, (64, 192)), ("blockwise", False, (160, 96)), ("mxfp8", False, (64, 96))]
TOKENS = 64


def _states():
    states = []
    for recipe, high_precision, _ in CASES:
        guard = None if high_precision is None else LayerGuard(recipe, in_high_precision=high_precision)
        states.append(Fp8LinearState(Fp8Recipe(fp8_format="hybrid", recipe=recipe), guard=guard))
    return states


def _forward(states, inputs):
    return [fp8_linear(x, w, b, state) for state, (x, w, b) in zip(states, inputs)]


def _two_micro_batches(forward, states):
    """Forward 0, forward 1, backward 0, backward 1 (a pipeline's order), each pass followed by delayed scaling's
    update: what each micro-batch gave, and the states' tensors after."""
    generator = torch.Generator().manual_seed(0)
    weights = [(torch.randn(out, features, generator=generator) * 0.1, torch.randn(out, generator=generator))
               for _, _, (features, out) in CASES]
    delayed = [state.delayed for state in states if state.delayed is not None]
    runs = []
    for micro_batch in range(2):
        inputs = [(torch.randn(TOKENS, w.size(1), generator=generator) * (1 + micro_batch), w, b) for w, b in weights]
        inputs = [tuple(t.clone().requires_grad_() for t in case) for case in inputs]
        outputs = forward(states, inputs)
        update_delayed_scales(delayed, FORWARD)
        runs.append((inputs, outputs, [torch.randn(TOKENS, w.size(0), generator=generator) for w, _ in weights]))
    for inputs, outputs, grads in runs:
        torch.autograd.backward(outputs, grads)
        update_delayed_scales(delayed, BACKWARD)
    results = [[(y.detach(), x.grad, w.grad, b.grad) for (x, w, b), y in zip(inputs, outputs)]
               for inputs, outputs, _ in runs]
    kept = [[s.guard.forward_figures, s.guard.backward_figures] if s.guard is not None else [] for s in states]
    kept += [[scaling.amax_history, scaling.scale] for scaling in delayed]
    return results, kept, [inputs for inputs, _, _ in runs]


@pytest.mark.slow
def test_every_recipe_traces_whole_and_gives_eagers_bits():
    torch._dynamo.reset()
    eager, eager_kept, _ = _two_micro_batches(_forward, _states())
    compiled, compiled_kept, inputs = _two_micro_batches(torch.compile(_forward, fullgraph=True), _states())
    for micro_batch, (mine, theirs) in enumerate(zip(compiled, eager)):
        for (recipe, guard, _), got, want in zip(CASES, mine, theirs):
            for name, a, b in zip(("y", "dx", "dW"), got, want):
                assert torch.equal(a, b), (micro_batch, recipe, guard, name)
            torch.testing.assert_close(got[3], want[3], rtol=1e-5, atol=1e-5)  # the bias gradient
    for mine, theirs in zip(compiled_kept, eager_kept):
        for a, b in zip(mine, theirs):
            assert torch.equal(a, b)
    # the guarded high-precision case ran F.linear, the others FP8
    for index, (recipe, high_precision, _) in enumerate(CASES):
        x, w, b = (t.detach() for t in inputs[1][index])
        assert torch.allclose(compiled[1][index][0], torch.nn.functional.linear(x, w, b), rtol=1e-5,
                              atol=1e-5) == bool(high_precision), recipe
