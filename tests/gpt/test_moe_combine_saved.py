"""The MoE combine keeps only its index for backward, and keeping less changed no bit.

LocalDispatcher.combine (gpt/moe/dispatcher.py) sums each token's weighted rows with scatter_add_ and the dispatchers'
_weighted_sum_over_choices (gpt/moe/dispatchers.py) places them with scatter, as Megatron-Core's unpermute does;
index_add_ / index_copy, which they replaced, keep their whole source for backward. On a CPU scatter_add_ adds the
rows into each output row in the same order as index_add_ (rows in index order), so the sums and both gradients are
bitwise the same, over repeated indices, several shapes and fp32 / bf16 / fp16; the combine's saved bytes
(zero/activations.py's SavedTensorMeter) drop by the weighted rows'.
"""

from __future__ import annotations

import pytest
import torch

from gpt.moe.dispatcher import LocalDispatcher
from gpt.moe.dispatchers import _weighted_sum_over_choices
from zero.activations import SavedTensorMeter


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("rows,tokens,width", [(7, 3, 4), (96, 12, 40), (2048, 256, 64)])
def test_scatter_add_sums_and_differentiates_as_index_add(dtype, rows, tokens, width):
    generator = torch.Generator().manual_seed(rows)
    index = torch.randint(0, tokens, (rows,), generator=generator)  # many rows a token, in no order
    source = (10 * torch.randn(rows, width, generator=generator)).to(dtype)
    grad = torch.randn(tokens, width, generator=generator).to(dtype)
    results = []
    for add in (lambda out, src: out.index_add_(0, index, src),
                lambda out, src: out.scatter_add_(0, index.unsqueeze(-1).expand_as(src), src)):
        leaf = source.clone().requires_grad_()
        output = add(torch.zeros(tokens, width, dtype=dtype), leaf * 1)
        output.backward(grad)
        results.append((output.detach(), leaf.grad))
    (summed, source_grad), (scattered, scattered_grad) = results
    assert torch.equal(summed, scattered) and torch.equal(source_grad, scattered_grad)


def _combine(dtype: torch.dtype, index_add: bool):
    generator = torch.Generator().manual_seed(0)
    hidden = torch.randn(12, 16, generator=generator).to(dtype)
    indices = torch.stack([torch.randperm(4, generator=generator)[:2] for _ in range(12)])
    probs = torch.rand(12, 2, generator=generator)
    dispatcher = LocalDispatcher(4)
    rows, _ = dispatcher.dispatch(hidden, probs, indices)
    rows = (rows * 3).requires_grad_()
    tokens, weights = dispatcher._tokens, dispatcher._weights
    meter = SavedTensorMeter(torch.device("cpu"))
    with meter.hooks():
        if index_add:  # the formulation replaced
            weighted = rows * weights.unsqueeze(-1).to(dtype)
            output = torch.zeros(12, 16, dtype=dtype).index_add_(0, tokens, weighted)
        else:
            output = dispatcher.combine(rows)
    output.backward(torch.ones_like(output))
    return output.detach(), rows.grad, meter.peak["device"], rows.numel() * rows.element_size()


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_the_local_combine_keeps_no_weighted_rows(dtype):
    output, grad, saved, row_bytes = _combine(dtype, index_add=False)
    plain_output, plain_grad, plain_saved, _ = _combine(dtype, index_add=True)
    assert torch.equal(output, plain_output) and torch.equal(grad, plain_grad)
    assert plain_saved - saved == row_bytes


def test_the_choices_are_placed_as_index_copy_placed_them():
    generator = torch.Generator().manual_seed(1)
    tokens, k, width = 6, 2, 8
    order = torch.randperm(tokens * k, generator=generator)[:10]  # two choices dropped
    probs = torch.rand(tokens, k, generator=generator)
    rows = torch.randn(10, width, generator=generator, dtype=torch.bfloat16).requires_grad_()
    output = _weighted_sum_over_choices(rows, order, probs, tokens * k)
    output.backward(torch.ones_like(output))
    weighted = rows.detach() * probs.reshape(-1)[order].unsqueeze(-1)
    expected = weighted.new_zeros((tokens * k, width)).index_copy(0, order, weighted).view(tokens, k, width).sum(1)
    assert torch.equal(output, expected)
    assert torch.equal(rows.grad, probs.reshape(-1)[order].unsqueeze(-1).expand(10, width).to(torch.bfloat16))
