"""One FP8 linear's kernel launches per micro-batch, counted on the CPU where the count is exact (issue 87): every ATen
op that reaches the dispatcher below autograd and launches a kernel (not a view, alias, detach or allocation) is at
least one launch on a GPU, and each kernel inductor compiled is one (torch.profiler names them "cpp_fused..." with
inductor's cpp.enable_kernel_profile). The counter is an infra TorchDispatchMode, so compiled code runs under it.

What is counted: x [256, 256] -> 384 (bf16, x and the weight requiring grad, no bias), forward and backward, the
second micro-batch of an iteration (its weight's version unchanged since the first, whose cast it reuses:
parallel/fp8/weight_cache.py), guard on and off. x is a fresh activation each micro-batch; the weight's gradient
accumulates (one add_). Delayed scaling's per-pass update is not the linear's (one update for all a pass's linears).

Measured (docs/fp8.md, "Launches"): fused (--fp8-fused-casts on), eager: 8 for every recipe with the guard, 6 without
it (TransformerEngine: 5-9); unfused: 115 / 95 / 212 / 300 with the guard; the whole linear compiled (--compile): 9
with the guard, 7 without it. The weight's cast once an iteration: one kernel fused."""

import collections

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from parallel.fp8.fused import compile_unavailable
from parallel.fp8.guard import LayerGuard
from parallel.fp8.linear import Fp8LinearState, fp8_linear
from parallel.fp8.recipes import Fp8Recipe

TOKENS, IN, OUT = 256, 256, 384
_NO_LAUNCH = {"detach", "_unsafe_view", "empty", "empty_strided", "empty_like", "new_empty", "new_empty_strided",
              "lift_fresh", "alias", "set_"}
compiles = pytest.mark.skipif(compile_unavailable("cpu") is not None, reason="inductor cannot compile here")


class _Launches(TorchDispatchMode):
    """The aten ops that launch a kernel, by name; an infra mode, so that compiled regions run under it."""

    @classmethod
    def is_infra_mode(cls) -> bool:
        return True

    def __init__(self) -> None:
        super().__init__()
        self.ops = collections.Counter()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if not func.is_view and func._opname not in _NO_LAUNCH:
            self.ops[f"{func.namespace}.{func._opname}"] += 1
        return func(*args, **(kwargs or {}))


def _counted(call) -> collections.Counter:
    """`call()`'s launches: its aten ops and the inductor kernels the profiler saw."""
    import torch._inductor.config as inductor_config

    assert inductor_config.cpp.enable_kernel_profile  # set before compiling (the fixture)
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as profile:
        with _Launches() as mode:
            call()
    mode.ops["inductor kernels"] += sum("cpp_fused" in event.name for event in profile.events())
    return mode.ops


@pytest.fixture(scope="module", autouse=True)
def kernel_events():
    import torch._inductor.config as inductor_config

    previous = inductor_config.cpp.enable_kernel_profile
    inductor_config.cpp.enable_kernel_profile = True
    torch._dynamo.reset()  # regions compiled earlier in this process, without the events, compiled again
    yield
    inductor_config.cpp.enable_kernel_profile = previous
    torch._dynamo.reset()


def _micro_batches(recipe: str, guarded: bool, fused: bool, compiled: bool = False, count: int = 2):
    """`count` micro-batches of one iteration on a new linear; each a call() that runs one forward and backward."""
    state = Fp8LinearState(Fp8Recipe(fp8_format="hybrid", recipe=recipe), guard=LayerGuard(recipe) if guarded else None,
                           fused=fused, cache_weight=True, compiled=compiled)
    generator = torch.Generator().manual_seed(0)
    weight = (torch.randn(OUT, IN, generator=generator) * 0.05).bfloat16().requires_grad_()
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


@pytest.mark.parametrize("recipe, launches", [("tensorwise", 115), ("delayed", 95), ("blockwise", 212),
                                              ("mxfp8", 300)])
def test_the_unfused_linear_launches(recipe, launches):
    first, second = _micro_batches(recipe, True, fused=False)
    first()
    ops = _counted(second)
    assert sum(ops.values()) == launches, dict(ops)
    gemm = "fp8_kernel.cpu_emulated_block_scaled_mm" if recipe in ("blockwise", "mxfp8") else \
        "fp8_kernel.cpu_emulated_scaled_mm"
    assert ops[gemm] == 3  # one call per GEMM, the block recipes' K-block loop inside it


@compiles
@pytest.mark.parametrize("guarded, launches", [(True, 8), (False, 6)], ids=["guard", "no-guard"])
@pytest.mark.parametrize("recipe", ["tensorwise", "delayed", "blockwise", "mxfp8"])
def test_the_fused_linear_launches_as_few_as_transformer_engine(recipe, guarded, launches):
    """Forward: x's cast, the GEMM, the epilogue (the guard's check); backward: dy's cast, two GEMMs, the epilogue,
    the weight gradient's accumulation. The weight's cast, in the first micro-batch, one kernel more."""
    first, second = _micro_batches(recipe, guarded, fused=True)
    first()  # compiles the regions and casts the weight
    ops = _counted(second)
    assert sum(ops.values()) == launches, dict(ops)
    assert ops["inductor kernels"] == launches - 4  # 3 GEMMs and the accumulation; the rest fused
    # another linear's first micro-batch: the weight's cast one kernel more (and no gradient to accumulate yet)
    fresh_first, _ = _micro_batches(recipe, guarded, fused=True)
    assert _counted(fresh_first)["inductor kernels"] == launches - 4 + 1


@compiles
@pytest.mark.slow
@pytest.mark.parametrize("guarded, launches", [(True, 9), (False, 7)], ids=["guard", "no-guard"])
@pytest.mark.parametrize("recipe", ["tensorwise", "delayed", "blockwise", "mxfp8"])
def test_the_compiled_linear_launches(recipe, guarded, launches):
    """The linear traced whole (--compile's blocks): inductor fuses across the regions. The weight is cast in every
    micro-batch inside the graph, with its iteration's flags (weight_cache.py), as in a compiled model."""
    first, second = _micro_batches(recipe, guarded, fused=True, compiled=True)
    first()
    ops = _counted(second)
    assert sum(ops.values()) == launches, dict(ops)
