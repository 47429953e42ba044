"""Fused cast regions (issue 87 item 1, parallel/fp8/fused.py and casts.py): the fused FP8 linear gives the unfused
one's bits, for every recipe with the guard and the per-tensor recipes without it (CASES): outputs, data, weight and bias gradients, the guard's figures,
delayed scaling's histories and scales, over two micro-batches of one iteration (the weight cast in the first and
reused by the second, parallel/fp8/weight_cache.py), each pass followed by delayed scaling's update (itself fused in
the fused run); and with the weight gradient added into an fp32 main gradient in the backward's epilogue (gradient
accumulation fusion). And where a region runs its plain function instead: fusion off, meta tensors, a non-infra dispatch
mode, inside dynamo.

These tests compile (inductor, on the CPU): the first run of a region costs seconds, later ones hit inductor's
on-disk cache. Every case is bf16 and one shape, so the cases share their regions' graphs where they can."""

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from parallel.fp8 import casts
from parallel.fp8.delayed_updates import BACKWARD, FORWARD, update_delayed_scales
from parallel.fp8.fused import compile_unavailable, fused_region
from parallel.fp8.guard import LayerGuard
from parallel.fp8.linear import Fp8LinearState, fp8_linear
from parallel.fp8.recipes import Fp8Recipe
from scripts.bench.op_counter import inductor_kernel_events
from tests.parallel.test_fp8_launch_counts import MainGradient

# 160 in: a partial second 128-wide K block (blockwise); every size a multiple of 32 (MXFP8)
TOKENS, IN, OUT = 64, 160, 96

pytestmark = pytest.mark.skipif(compile_unavailable("cpu") is not None, reason="inductor cannot compile here")


def _run(recipe: str, guarded: bool, fused: bool, main_grad: bool = False):
    """Two micro-batches of one iteration (forward, forward update, backward, backward update each) on one linear:
    what each gave, and the state's tensors after. `main_grad`: the weight gradient goes into a MainGradient (gradient
    accumulation fusion), which stands for the weight's gradient in what is returned."""
    state = Fp8LinearState(Fp8Recipe(fp8_format="hybrid", recipe=recipe, margin=1, amax_history_len=2,
                                     amax_compute_algo="max"),
                           guard=LayerGuard(recipe) if guarded else None, fused=fused, cache_weight=True)
    generator = torch.Generator().manual_seed(0)
    weight = (torch.randn(OUT, IN, generator=generator) * 0.05).bfloat16().requires_grad_()
    bias = (torch.randn(OUT, generator=generator) * 0.1).bfloat16().requires_grad_()
    holder = state.main_grads = MainGradient(weight) if main_grad else None
    results = []
    for micro_batch in range(2):
        x = (torch.randn(TOKENS, IN, generator=generator) * (1 + micro_batch)).bfloat16().requires_grad_()
        grad = (torch.randn(TOKENS, OUT, generator=generator) * 1e-2).bfloat16()
        y = fp8_linear(x, weight, bias, state)
        if state.delayed is not None:
            update_delayed_scales([state.delayed], FORWARD, fused=fused)
        y.backward(grad)
        if state.delayed is not None:
            update_delayed_scales([state.delayed], BACKWARD, fused=fused)
        results.append((y.detach(), x.grad))
    if holder is not None:
        assert weight.grad is None  # autograd got no weight gradient: it went into the main gradient
    results.append((weight.grad if holder is None else holder.grad, bias.grad))
    kept = []
    if state.guard is not None:
        kept += [state.guard.forward_figures, state.guard.backward_figures]
    if state.delayed is not None:
        kept += [state.delayed.amax_history, state.delayed.scale]
    return results, kept, state.weight_cache.casts


# Every recipe with the guard (the default); without it the per-tensor recipes, whose regions a guard-off run
# compiles apart (the block recipes' guard-off regions differ from their guarded ones by the counts alone, and each
# costs a minute of compiling on a cold 2-core machine)
CASES = [(recipe, True) for recipe in ("delayed", "tensorwise", "blockwise", "mxfp8")] + \
    [("delayed", False), ("tensorwise", False)]


@pytest.fixture(autouse=True)
def kernel_events():
    """Compiled as tests/parallel/test_fp8_launch_counts.py compiles them (inductor's kernel events on), so the two
    modules share inductor's cached graphs."""
    with inductor_kernel_events():
        yield


@pytest.mark.parametrize("recipe, guarded", CASES, ids=[f"{r}-{'guard' if g else 'no-guard'}" for r, g in CASES])
def test_the_fused_linear_gives_the_unfused_bits(recipe, guarded):
    fused, fused_kept, fused_casts = _run(recipe, guarded, fused=True)
    plain, plain_kept, plain_casts = _run(recipe, guarded, fused=False)
    for index, (mine, theirs) in enumerate(zip(fused, plain)):
        for name, got, want in zip(("y or dW", "dx or db"), mine, theirs):
            assert got.dtype == want.dtype and torch.equal(got, want), (index, name)
    assert len(fused_kept) == len(plain_kept) == 2 * guarded + 2 * (recipe == "delayed")
    for got, want in zip(fused_kept, plain_kept):
        assert torch.equal(got, want)
    assert fused_casts == plain_casts == 1  # the weight cast in the first micro-batch only
    if guarded:  # the counts are real: every value of every cast counted, forward and backward
        assert fused_kept[0][0] > 0 and fused_kept[1][0] > 0


@pytest.mark.parametrize("recipe", ["delayed", "tensorwise", "blockwise", "mxfp8"])
def test_the_weight_gradient_added_into_the_main_gradient_fused_gives_the_unfused_bits(recipe):
    """The backward's epilogue adding the weight gradient's fp32 GEMM result into the main gradient, the guard on:
    the same bits fused and unfused, everything else as without the holder; against autograd's bf16 gradients (each
    micro-batch's rounded to bf16, then added in bf16) it differs by that rounding only."""
    fused, fused_kept, _ = _run(recipe, True, fused=True, main_grad=True)
    plain, plain_kept, _ = _run(recipe, True, fused=False, main_grad=True)
    for mine, theirs in zip([*fused, fused_kept], [*plain, plain_kept]):
        assert all(got.dtype == want.dtype and torch.equal(got, want) for got, want in zip(mine, theirs))
    main, bf16 = plain[-1][0], _run(recipe, True, fused=False)[0][-1][0]
    assert main.dtype == torch.float32 and bf16.dtype == torch.bfloat16 and not torch.equal(main, bf16.float())
    # bf16 keeps 8 significant bits: three roundings (two gradients and their sum) within 2^-7 of the largest value
    assert (main - bf16.float()).abs().max() <= 2 ** -7 * main.abs().max()


def test_the_block_weight_cast_of_each_linear_shape_gives_the_unfused_bits():
    """A GPT's weights one after another through one region (qkv, dense, fc1 and fc2 at hidden 128). Compiled for
    symbolic shapes, inductor miscompiled fc2's weight [128, 512]: 40% of its values saturated, and a training run's
    guard sent the layer to high precision (found by the cuda tier run on a CPU: tests/training/test_cuda_paths.py)."""
    generator = torch.Generator().manual_seed(0)
    for shape in ((384, 128), (128, 128), (512, 128), (128, 512)):
        weight = (torch.randn(*shape, generator=generator) * 0.02).bfloat16()
        plain_figures, fused_figures = torch.zeros(6, dtype=torch.float64), torch.zeros(6, dtype=torch.float64)
        plain = casts.cast_block_weight(weight, torch.float8_e4m3fn, plain_figures, None, fused=False)
        fused = casts.cast_block_weight(weight, torch.float8_e4m3fn, fused_figures, None, fused=True)
        assert all(torch.equal(a.float(), b.float()) for a, b in zip(fused, plain)), shape
        assert torch.equal(fused_figures, plain_figures) and plain_figures[1] == 0, shape


def test_the_delayed_update_around_its_collective_gives_the_unfused_bits():
    """Three linears' histories (length 3, 'max') and scales, updated after a pass through the two regions around
    the amax reduction: a stand-in collective takes each amax's max with another rank's, as the all-reduce would."""
    def scalings(fused):
        states = [Fp8LinearState(Fp8Recipe(recipe="delayed", margin=1, amax_history_len=3, amax_compute_algo="max"),
                                 fused=fused) for _ in range(3)]
        generator = torch.Generator().manual_seed(1)
        for step in range(3):
            for index, state in enumerate(states):
                state.delayed.forward_history[0] = torch.rand(2, generator=generator) * (index + 1) * (step + 1)
                state.delayed.backward_history[0] = torch.rand(1, generator=generator)
            other_rank = torch.rand(3, 2, generator=generator) * 4
            update_delayed_scales([s.delayed for s in states], FORWARD,
                                  lambda amax: amax.copy_(torch.maximum(amax, other_rank)), fused=fused)
            update_delayed_scales([s.delayed for s in states], BACKWARD, None, fused=fused)
        return [tensor for state in states for tensor in (state.delayed.amax_history, state.delayed.scale)]

    fused, plain = scalings(True), scalings(False)
    assert all(torch.equal(a, b) for a, b in zip(fused, plain))
    assert all((scale != 1).all() for scale in fused[1::2])  # every role's scale moved


class _SeesOps(TorchDispatchMode):
    """Records the aten ops that reach the dispatcher (not an infra mode: dynamo refuses to run under it)."""

    def __init__(self) -> None:
        super().__init__()
        self.ops = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.ops.append(func._opname)
        return func(*args, **(kwargs or {}))


class _SeesOpsAsInfra(_SeesOps):
    """The same, as an infra mode (the launch counter's kind): compiled code runs under it."""

    @classmethod
    def is_infra_mode(cls) -> bool:
        return True


def test_a_region_runs_plain_where_it_must_and_compiled_elsewhere():
    region = fused_region(lambda x, y: (x * y + 1).abs())
    x, y = torch.randn(8, 4), torch.randn(8, 4)
    want = (x * y + 1).abs()
    assert torch.equal(region(x, y, fused=False), want) and region._compiled is None  # fusion off
    meta = region(x.to("meta"), y.to("meta"), fused=True)  # the planner's dry run
    assert meta.device.type == "meta" and meta.shape == want.shape and region._compiled is None
    with _SeesOps() as mode:  # the plain function, op by op
        got = region(x, y, fused=True)
    assert torch.equal(got, want) and region._compiled is None and mode.ops == ["mul", "add", "abs"]
    assert torch.equal(region(x, y, fused=True), want) and region._compiled is not None  # compiled here
    with _SeesOpsAsInfra() as mode:  # compiled under it: its kernel passes no aten op to the mode
        got = region(x, y, fused=True)
    assert torch.equal(got, want) and not {"mul", "add", "abs"} & set(mode.ops)
    # inside a compiled caller the region is inlined into the caller's graph (no nested compile)
    outer = torch.compile(lambda a, b: region(a, b, fused=True) * 2, fullgraph=True)
    assert torch.equal(outer(x, y), want * 2)
