"""Delayed scaling's amax reduction over data-parallel ranks, one FP8 linear (issue 65 item 3).

TransformerEngine all-reduces (max) the amaxes of a pass's casts over the autocast's fp8_group before it updates
the scales (here once a pass, parallel/fp8/delayed_updates.py) (transformer_engine/pytorch/quantization.py, reduce_and_update_fp8_tensors), and Megatron-Core
passes its amax reduction group, the tensor x data parallel ranks (megatron/core/fp8_utils.py,
get_fp8_context). So 2 ranks, each casting half of a batch's tokens, hold after every step the scales and
amax histories one process holds for the whole batch, bit for bit (a max is exact in any order), and cast
every value as it does: their outputs and data gradients are the one process's rows bit for bit. The weight
gradient sums the two ranks' halves (here by hand, as the data-parallel all-reduce would) where one process
sums all tokens in one GEMM: fp32 in another order, 1e-6 relative.

The GPT over 2 data-parallel ranks is in tests/gpt/test_fp8_parallel.py; its losses cannot show this alone
(each rank's loss is its own mean, so its first step's output gradients, cast at TE's initial scale 1, sit
twice as high in e5m2's subnormals as one process's), which is why this test holds the gradients equal.
"""

import pytest
import torch

from parallel.fp8.delayed_updates import BACKWARD, FORWARD, update_delayed_scales
from parallel.fp8.linear import Fp8LinearState, fp8_linear
from parallel.fp8.recipes import Fp8Recipe

RECIPE = Fp8Recipe(fp8_format="hybrid", recipe="delayed", amax_history_len=2, amax_compute_algo="max")
TOKENS, FEATURES, STEPS = 64, 32, 3


def _batches():
    """Per step: the whole batch's input and output gradient, the same on every rank; the amax grows so the
    delayed scales move (history 2, 'max')."""
    generator = torch.Generator().manual_seed(0)
    weight = torch.randn(FEATURES, FEATURES, generator=generator)
    steps = [(torch.randn(TOKENS, FEATURES, generator=generator) * (step + 1),
              torch.randn(TOKENS, FEATURES, generator=generator) / (step + 1)) for step in range(STEPS)]
    return weight, steps


def _train(x_rows, g_rows, reduce_amax):
    """STEPS forward and backward steps of one FP8 linear on the given token rows; what each step gave."""
    weight, steps = _batches()
    state = Fp8LinearState(RECIPE)
    results = []
    for x, g in steps:
        x = x[x_rows].clone().requires_grad_(True)
        w = weight.clone().requires_grad_(True)
        out = fp8_linear(x, w, None, state)
        update_delayed_scales([state.delayed], FORWARD, reduce_amax)  # the pass's reduction and update
        out.backward(g[g_rows])
        update_delayed_scales([state.delayed], BACKWARD, reduce_amax)
        results.append({"out": out.detach(), "grad_x": x.grad, "grad_w": w.grad,
                        **{name: value.clone() for name, value in state.delayed.state_dict().items()}})
    return results


def _rank(rank, world_size):
    import torch.distributed as dist
    dist.init_process_group("gloo")
    half = slice(rank * TOKENS // world_size, (rank + 1) * TOKENS // world_size)
    results = _train(half, half, lambda amax: dist.all_reduce(amax, op=dist.ReduceOp.MAX))
    # NumPy copies, pickled by value: a tensor crosses the result queue as shared memory the rank's exit can take
    # away before the parent reads it (EOFError in CI)
    return [{name: value.detach().numpy().copy() for name, value in step.items()} for step in results]


@pytest.mark.slow
def test_two_data_parallel_ranks_cast_as_one_process():
    from tests.distributed import run_distributed

    ranks = [[{name: torch.from_numpy(value) for name, value in step.items()} for step in rank]
             for rank in run_distributed(_rank, 2)]
    whole = _train(slice(None), slice(None), None)
    for step, one in enumerate(whole):
        for name in ("scale", "amax_history"):  # the same on both ranks and in one process, bit for bit
            for rank in ranks:
                assert torch.equal(rank[step][name], one[name]), (step, name)
        for name in ("out", "grad_x"):
            assert torch.equal(torch.cat([rank[step][name] for rank in ranks]), one[name]), (step, name)
        summed = ranks[0][step]["grad_w"] + ranks[1][step]["grad_w"]
        torch.testing.assert_close(summed, one["grad_w"], rtol=1e-6, atol=1e-6 * one["grad_w"].abs().max().item())
    # the scales moved (the reduction was exercised on scales other than the initial 1)
    assert not torch.equal(whole[-1]["scale"], torch.ones(3))


def test_without_the_reduction_the_ranks_scales_differ():
    """What the reduction is for: each half alone records its own amax, not the batch's."""
    alone = _train(slice(0, TOKENS // 2), slice(0, TOKENS // 2), None)
    whole = _train(slice(None), slice(None), None)
    assert not torch.equal(alone[0]["scale"], whole[0]["scale"])
