"""The weight cast once an iteration (issue 87 item 2, parallel/fp8/weight_cache.py), as TransformerEngine does when
Megatron-Core passes is_first_microbatch: transformer_engine/pytorch/module/linear.py casts the weight where
`update_workspace = is_first_microbatch is None or is_first_microbatch` and module/base.py's quantize_weight returns the
cached workspace untouched otherwise, so the later micro-batches use the first one's cast (with delayed scaling: its
scale) and record no weight amax. Unfused here (no compile): the cache is the same fused or not
(tests/parallel/test_fp8_fused.py)."""

import pytest
import torch
from torch import nn

from gpt.fp8 import forget_fp8_weight_casts
from parallel.fp8 import casts
from parallel.fp8.delayed_updates import BACKWARD, FORWARD, update_delayed_scales
from parallel.fp8.guard import LayerGuard
from parallel.fp8.linear import Fp8LinearState, fp8_linear
from parallel.fp8.recipes import INPUT, WEIGHT, Fp8Recipe

TOKENS, IN, OUT = 32, 64, 96  # multiples of 32 (MXFP8)


@pytest.fixture
def weight_casts(monkeypatch):
    """How many times each cast function ran on the weight (the linear calls them through the casts module)."""
    calls = {"weight": 0, "other": 0}
    for name in ("cast_current", "cast_delayed", "cast_blocks_both_ways", "cast_block_weight", "cast_mx_both_ways"):
        region = getattr(casts, name)

        def counting(tensor, *args, region=region, **kwargs):
            calls["weight" if tensor.shape == (OUT, IN) else "other"] += 1
            return region(tensor, *args, **kwargs)
        monkeypatch.setattr(casts, name, counting)
    return calls


def _micro_batch(state, weight, generator, scale=1.0):
    x = (torch.randn(TOKENS, IN, generator=generator) * scale).requires_grad_()
    y = fp8_linear(x, weight, None, state)
    if state.delayed is not None:
        update_delayed_scales([state.delayed], FORWARD)
    y.backward(torch.randn(TOKENS, OUT, generator=generator))
    if state.delayed is not None:
        update_delayed_scales([state.delayed], BACKWARD)
    return y.detach()


def _weight(seed=0):
    return nn.Parameter(torch.randn(OUT, IN, generator=torch.Generator().manual_seed(seed)) * 0.1)


@pytest.mark.parametrize("recipe", ["tensorwise", "delayed", "blockwise", "mxfp8"])
def test_the_weight_is_cast_once_an_iteration_and_its_cast_reused(recipe, weight_casts):
    state = Fp8LinearState(Fp8Recipe(fp8_format="hybrid", recipe=recipe), guard=LayerGuard("l"), cache_weight=True)
    weight, generator = _weight(), torch.Generator().manual_seed(1)
    outputs = [_micro_batch(state, weight, generator) for _ in range(3)]
    assert weight_casts["weight"] == 1 and state.weight_cache.casts == 1
    assert weight_casts["other"] == 6  # x's and dy's, once a micro-batch each
    # the guard counted the weight's values once, x's and dy's three times (the block recipes cast x and dy both
    # ways, MXFP8 the weight too; blockwise's 128x128 blocks serve both)
    both_ways = 1 if recipe in ("tensorwise", "delayed") else 2
    weight_ways = 2 if recipe == "mxfp8" else 1
    values = state.guard.forward_figures[0] + state.guard.backward_figures[0]
    assert values == weight_ways * OUT * IN + both_ways * 3 * TOKENS * (IN + OUT)
    if recipe != "delayed":  # a stateless cast of the same weight gives the same bits: reuse changes nothing
        plain = Fp8LinearState(Fp8Recipe(fp8_format="hybrid", recipe=recipe))
        generator = torch.Generator().manual_seed(1)
        again = [_micro_batch(plain, _weight(), generator) for _ in range(3)]
        assert all(torch.equal(a, b) for a, b in zip(outputs, again))


def test_delayed_scaling_reuses_the_first_micro_batchs_scale_and_records_the_weight_amax_once():
    """As TE: micro-batch 2 takes the weight cast with micro-batch 1's scale (1, TE's initial), though micro-batch
    1's forward update moved the weight's scale; its forward records no weight amax (history 1, most recent: the
    scale stays). Written out: micro-batch 2's output equals a linear whose weight scale is 1 in both."""
    recipe = Fp8Recipe(fp8_format="hybrid", recipe="delayed", amax_history_len=2)
    state = Fp8LinearState(recipe, cache_weight=True)
    weight, generator = _weight(), torch.Generator().manual_seed(1)
    _micro_batch(state, weight, generator)
    moved = state.delayed.scale_of(WEIGHT)
    assert moved != 1.0  # the first forward's update gave the weight its scale
    second = _micro_batch(state, weight, generator, scale=2.0)
    # the second forward's amaxes, rolled into row 1 by its update: x's, and none for the weight
    assert state.delayed.forward_history[1, INPUT] > 0 and state.delayed.forward_history[1, WEIGHT] == 0.0
    assert state.delayed.scale_of(WEIGHT) == moved
    # written out: the same micro-batches with every call casting the weight, its scale held at 1
    reference = Fp8LinearState(recipe)
    generator = torch.Generator().manual_seed(1)
    _micro_batch(reference, _weight(), generator)
    reference.delayed.forward_scale = torch.stack([reference.delayed.forward_scale[0], torch.tensor(1.0)])
    assert torch.equal(_micro_batch(reference, _weight(), generator, scale=2.0), second)


def test_an_optimizer_step_and_a_write_to_the_weight_cast_it_again(weight_casts):
    state = Fp8LinearState(Fp8Recipe(fp8_format="hybrid", recipe="tensorwise"), cache_weight=True)
    weight, generator = _weight(), torch.Generator().manual_seed(1)
    optimizer = torch.optim.SGD([weight], lr=0.1)
    _micro_batch(state, weight, generator)
    optimizer.step()  # writes the parameter in place: its version counter moves
    stepped = _micro_batch(state, weight, generator)
    assert weight_casts["weight"] == 2
    with torch.no_grad():
        weight.mul_(3.0)
    written = _micro_batch(state, weight, generator)
    assert weight_casts["weight"] == 3
    # each reuse-free: a state without the cache gives the same outputs for the same weights
    generator = torch.Generator().manual_seed(1)
    plain, copy = Fp8LinearState(Fp8Recipe(fp8_format="hybrid", recipe="tensorwise")), _weight()
    plain_optimizer = torch.optim.SGD([copy], lr=0.1)
    _micro_batch(plain, copy, generator)
    plain_optimizer.step()
    assert torch.equal(_micro_batch(plain, copy, generator), stepped)
    with torch.no_grad():
        copy.mul_(3.0)
    assert torch.equal(_micro_batch(plain, copy, generator), written)


def test_a_write_through_zeros_flat_buffer_is_forgotten_by_the_train_step(weight_casts):
    """ZeRO sets a parameter's data to a view of its flat buffer (parallel/init.py replace_parameters), so the
    buffer's writes (the step, a gather) do not move the parameter's version counter: the cache alone would keep the
    old cast. The train step forgets the casts where the iteration's micro-batches start and end
    (forget_fp8_weight_casts), and the next micro-batch casts the new values."""
    flat = torch.zeros(OUT * IN + 16)
    weight = nn.Parameter(torch.empty(0))
    weight.data = flat[16:].view(OUT, IN)
    with torch.no_grad():
        flat[16:] = _weight().detach().flatten()
    model = nn.Linear(IN, OUT, bias=False)
    model.fp8_state = Fp8LinearState(Fp8Recipe(fp8_format="hybrid", recipe="tensorwise"), cache_weight=True)
    model.fp8_weight_caches = [model.fp8_state.weight_cache]
    generator = torch.Generator().manual_seed(1)
    _micro_batch(model.fp8_state, weight, generator)
    version = weight._version
    with torch.no_grad():
        flat.mul_(2.0)  # ZeRO's publish: the buffer written, not the parameter
    assert weight._version == version and model.fp8_state.weight_cache.get((weight,)) is not None  # stale
    forget_fp8_weight_casts(model)
    doubled = _micro_batch(model.fp8_state, weight, generator)
    assert weight_casts["weight"] == 2
    generator = torch.Generator().manual_seed(1)
    plain = Fp8LinearState(Fp8Recipe(fp8_format="hybrid", recipe="tensorwise"))
    _micro_batch(plain, _weight(), generator)
    assert torch.equal(_micro_batch(plain, nn.Parameter(_weight().detach() * 2.0), generator), doubled)


@pytest.mark.parametrize("recipe", ["delayed", "tensorwise", "blockwise"])
def test_a_compiled_blocks_in_graph_flags_give_the_caches_bits(recipe):
    """Under --compile the graph casts the weight in every micro-batch with the iteration's first cast's scale,
    recording no amax and counting nothing after the first (weight_cache.py's `iteration`). Run eagerly here (the same
    tensor code a compiled graph runs): over two iterations of two micro-batches the outputs, gradients, figures and
    histories equal the cache's."""
    def run(compiled):
        state = Fp8LinearState(Fp8Recipe(fp8_format="hybrid", recipe=recipe), guard=LayerGuard("l"),
                               cache_weight=True, compiled=compiled)
        model = nn.Module()
        model.fp8_weight_caches = [state.weight_cache]
        weight, generator = _weight(), torch.Generator().manual_seed(1)
        outputs = []
        for _ in range(2):
            forget_fp8_weight_casts(model)
            outputs += [_micro_batch(state, weight, generator, scale=1.0 + index) for index in range(2)]
            forget_fp8_weight_casts(model)
            with torch.no_grad():
                weight.add_(0.01)
        kept = [state.guard.forward_figures, state.guard.backward_figures, weight.grad]
        if state.delayed is not None:
            kept += [state.delayed.amax_history, state.delayed.scale]
        return outputs, kept, state.weight_cache.casts

    cached, cached_kept, cached_casts = run(False)
    in_graph, in_graph_kept, in_graph_casts = run(True)
    assert cached_casts == 2 and in_graph_casts == 0  # the cache's two casts; the graph's path keeps no copy
    assert all(torch.equal(a, b) for a, b in zip(cached, in_graph))
    assert all(torch.equal(a, b) for a, b in zip(cached_kept, in_graph_kept))
