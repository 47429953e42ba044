"""One FP8 linear's kernel launches per micro-batch, counted on the CPU where the count is exact (issue 87;
scripts/bench/op_counter.py: every ATen op below autograd that launches a kernel, and each inductor kernel).

What is counted: x [256, 256] -> 384 (bf16, x and the weight requiring grad, no bias), forward and backward, the
second micro-batch of an iteration (its weight's version unchanged since the first, whose cast it reuses, as a
model's linears do: parallel/fp8/weight_cache.py), guard on and off. x is a fresh activation each micro-batch; the
weight's gradient accumulates (one add_). Delayed scaling's per-pass update is not the linear's (one update for all a
pass's linears). With a main-gradient holder (gradient accumulation fusion, zero/fused_accumulation.py) the weight
gradient's GEMM writes fp32 and the backward's epilogue adds it into the fp32 main gradient: no add of its own.

Measured (docs/fp8.md, "Launches"): fused (--fp8-fused-casts on), eager: 6 for every recipe, with the guard or without
it (TransformerEngine: 5-9), and 6 with a main-gradient holder; unfused: 121 / 101 / 221 / 309 with the guard; the
whole linear compiled (--compile): 7 with the guard or without it. The guard's checks are made in the casts (x's for
the forward, dy's for the backward: bounds on the GEMMs' outputs, parallel/fp8/guard.py record_output_bounds), so they
cost no launch. The weight's cast once an iteration: one kernel fused."""

import pytest
import torch

from parallel.fp8.fused import compile_unavailable
from parallel.fp8.guard import LayerGuard
from parallel.fp8.linear import Fp8LinearState, fp8_linear
from parallel.fp8.recipes import Fp8Recipe
from scripts.bench.op_counter import count_calls, inductor_kernel_events

TOKENS, IN, OUT = 256, 256, 384
compiles = pytest.mark.skipif(compile_unavailable("cpu") is not None, reason="inductor cannot compile here")


@pytest.fixture(autouse=True)
def kernel_events():
    """Inductor's kernels named in the profiler's events; regions compiled earlier in this process without them
    compiled again."""
    torch._dynamo.reset()
    with inductor_kernel_events():
        yield
    torch._dynamo.reset()


def _kernels(counts) -> int:
    return sum(count for op, count in counts.ops().items() if op.startswith("inductor."))


class MainGradient:
    """A main-gradient holder (parallel/grad_accumulation_fusion.py's MainGradients) shaped as ZeRO 0-1's: the weight's
    fp32 main gradient a view into a flat buffer, after another parameter's slice."""

    def __init__(self, weight: torch.Tensor, offset: int = 64) -> None:
        self.buffer = torch.zeros(offset + weight.numel())
        self.grad = self.buffer[offset:].view(weight.shape)

    def main_grad(self, param: torch.nn.Parameter) -> torch.Tensor:
        return self.grad


def _micro_batches(recipe: str, guarded: bool, fused: bool, compiled: bool = False, count: int = 2,
                   main_grad: bool = False):
    """`count` micro-batches of one iteration on a new linear; each a call() that runs one forward and backward.
    `main_grad`: the weight's gradient goes into a MainGradient (gradient accumulation fusion)."""
    state = Fp8LinearState(Fp8Recipe(fp8_format="hybrid", recipe=recipe), guard=LayerGuard(recipe) if guarded else None,
                           fused=fused, cache_weight=True, compiled=compiled)
    generator = torch.Generator().manual_seed(0)
    weight = (torch.randn(OUT, IN, generator=generator) * 0.05).bfloat16().requires_grad_()
    if main_grad:
        state.main_grads = MainGradient(weight)

    def linear(x, w):
        return fp8_linear(x, w, None, state)
    if compiled:
        linear = torch.compile(linear, fullgraph=True)
    calls = []
    for _ in range(count):
        x = torch.randn(TOKENS, IN, generator=generator).bfloat16().requires_grad_()
        grad = torch.randn(TOKENS, OUT, generator=generator).bfloat16()
        calls.append(lambda x=x, grad=grad: linear(x, weight).backward(grad))
    return calls


@pytest.mark.parametrize("recipe, launches", [("tensorwise", 121), ("delayed", 101), ("blockwise", 221),
                                              ("mxfp8", 309)])
def test_the_unfused_linear_launches(recipe, launches):
    second, = count_calls(_micro_batches(recipe, True, fused=False))
    assert second.total() == launches, dict(second.ops())
    gemm = "fp8_kernel.cpu_emulated_block_scaled_mm" if recipe in ("blockwise", "mxfp8") else \
        "fp8_kernel.cpu_emulated_scaled_mm"
    assert second.ops()[gemm] == 3  # one call per GEMM, the block recipes' K-block loop inside it


# The recipes with the guard (the default, its ceilings); without it the per-tensor ones. Each case compiles its
# regions: a minute on a cold 2-core machine for a block recipe's, so MXFP8 (8 as well, measured by
# scripts/bench/benchmark_host_ops.py) is left to the bits test (test_fp8_fused.py), whose regions are the same.
FUSED = [(recipe, True, 6) for recipe in ("tensorwise", "delayed", "blockwise")] + \
    [("tensorwise", False, 6), ("delayed", False, 6)]
COMPILED = [("tensorwise", True, 7), ("tensorwise", False, 7), ("delayed", True, 7), ("blockwise", True, 7)]


# With a main-gradient holder: the weight gradient's accumulation is the backward's epilogue, with the guard or
# without it. The epilogue is every recipe's; a block recipe's case (a minute's compile) adds nothing.
INTO_MAIN_GRAD = [(recipe, True, 6) for recipe in ("tensorwise", "delayed")] + \
    [("tensorwise", False, 6), ("delayed", False, 6)]


def _ids(cases):
    return [f"{recipe}-{'guard' if guarded else 'no-guard'}" for recipe, guarded, _ in cases]


@compiles
@pytest.mark.parametrize("recipe, guarded, launches", FUSED, ids=_ids(FUSED))
def test_the_fused_linear_launches_as_few_as_transformer_engine(recipe, guarded, launches):
    """Forward: x's cast (the guard's check of the forward in it), the GEMM; backward: dy's cast (the backward's
    check), two GEMMs, the weight gradient's accumulation. The weight's cast, in the first micro-batch, one kernel
    more."""
    second, = count_calls(_micro_batches(recipe, guarded, fused=True))  # the first compiles and casts the weight
    assert second.total() == launches, dict(second.ops())
    assert _kernels(second) == launches - 4  # 3 GEMMs and the accumulation; the rest fused
    # another linear's first micro-batch: the weight's cast one kernel more (and no gradient to accumulate yet)
    first, = count_calls(_micro_batches(recipe, guarded, fused=True)[:1], warm_up=0)  # compiled above
    assert _kernels(first) == launches - 4 + 1


@compiles
@pytest.mark.slow
@pytest.mark.parametrize("recipe, guarded, launches", COMPILED, ids=_ids(COMPILED))
def test_the_compiled_linear_launches(recipe, guarded, launches):
    """The linear traced whole (--compile's blocks): inductor fuses across the regions. The weight is cast in every
    micro-batch inside the graph, with its iteration's flags (weight_cache.py), as in a compiled model."""
    second, = count_calls(_micro_batches(recipe, guarded, fused=True, compiled=True))
    assert second.total() == launches, dict(second.ops())


@compiles
@pytest.mark.parametrize("recipe, guarded, launches", INTO_MAIN_GRAD, ids=_ids(INTO_MAIN_GRAD))
def test_the_fused_linear_adds_its_weight_gradient_into_the_main_gradient_in_its_epilogue(recipe, guarded, launches):
    """Gradient accumulation fusion (TE's fuse_wgrad_accumulation): the weight gradient's GEMM writes fp32 and the
    backward's epilogue region adds it into the main gradient: the accumulation's add is that region, with the guard
    or without it (its checks are in the casts). Autograd gets no weight gradient."""
    calls = _micro_batches(recipe, guarded, fused=True, main_grad=True)
    second, = count_calls(calls)
    assert second.total() == launches, dict(second.ops())
    assert _kernels(second) == launches - 3  # the 3 GEMMs; the rest, the main gradient's add included, fused
    assert not any("add" in op for op in second.ops() if not op.startswith("inductor.")), dict(second.ops())
    first, = count_calls(_micro_batches(recipe, guarded, fused=True, main_grad=True)[:1], warm_up=0)
    assert _kernels(first) == launches - 3 + 1  # the weight's cast


def test_the_unfused_linear_adds_into_the_main_gradient_in_its_epilogue():
    """The same regions run eagerly: the same ops as without a holder (121 with the guard), autograd's add of the
    weight gradient replaced by the epilogue's add into the main gradient (the GEMM writing fp32 costs no cast)."""
    plain, = count_calls(_micro_batches("tensorwise", True, fused=False))
    into, = count_calls(_micro_batches("tensorwise", True, fused=False, main_grad=True))
    assert into.total() == 121 and dict(into.ops()) == dict(plain.ops()), dict(into.ops())
