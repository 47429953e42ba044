"""The grouped experts keep no stacked copy of their weights for backward, and keeping less changed no bit.

gpt/moe/experts.py's _GroupedMatmulOverStacked keeps the rows and the weights themselves and stacks the weights
again in backward; autograd through torch.stack + F.grouped_mm (put back here by monkeypatching) keeps the stacked
[E, in, out] copy per projection. Outputs, the input gradient and every expert weight's gradient are compared with
torch.equal, in fp32 and bf16; the bytes saved (zero/activations.py's SavedTensorMeter: parameters not counted) drop by
exactly the stacked copies'.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import gpt.moe.experts
from gpt.moe.experts import Experts, can_group
from parallel.init import materialize
from zero.activations import SavedTensorMeter

HIDDEN, FFN, EXPERTS = 16, 32, 4
COUNTS = [5, 0, 9, 2]  # an expert with no rows


class _AutogradThroughTheStack:
    """The plain formulation: autograd keeps the stacked weights grouped_mm was given."""

    @staticmethod
    def apply(inputs, offsets, *weights):
        output = F.grouped_mm(inputs, torch.stack(weights).transpose(-2, -1), offs=offsets)
        output.register_hook(lambda grad: grad.contiguous())
        return output


def _run(dtype: torch.dtype, swiglu: bool, bias: bool):
    experts = Experts(EXPERTS, HIDDEN, FFN, activation=F.gelu, swiglu=swiglu, init_std=0.5, output_init_std=0.5,
                      bias=bias)
    experts = materialize(experts, 5).to(dtype)
    generator = torch.Generator().manual_seed(7)
    rows = torch.randn(sum(COUNTS), HIDDEN, generator=generator).to(dtype).requires_grad_()
    grad = torch.randn(sum(COUNTS), HIDDEN, generator=generator).to(dtype)
    assert can_group(rows, list(experts.children()))
    meter = SavedTensorMeter(torch.device("cpu"))
    with meter.hooks():
        output = experts(rows, torch.tensor(COUNTS))
    output.backward(grad)
    return (output.detach(), rows.grad, [p.grad for p in experts.parameters()], meter.peak["device"],
            sum(p.numel() * p.element_size() for n, p in experts.named_parameters() if n.endswith("weight")))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("swiglu,bias", [(False, True), (True, False)])
def test_restacking_in_backward_changes_no_bit_and_keeps_no_stacked_copy(monkeypatch, dtype, swiglu, bias):
    output, rows_grad, grads, saved, weight_bytes = _run(dtype, swiglu, bias)
    monkeypatch.setattr(gpt.moe.experts, "_GroupedMatmulOverStacked", _AutogradThroughTheStack)
    plain_output, plain_rows_grad, plain_grads, plain_saved, _ = _run(dtype, swiglu, bias)
    assert torch.equal(output, plain_output)
    assert torch.equal(rows_grad, plain_rows_grad)
    assert len(grads) == len(plain_grads) and all(torch.equal(a, b) for a, b in zip(grads, plain_grads))
    # the plain graph kept one stacked copy of every projection's weights: all the expert weights' bytes
    assert plain_saved - saved == weight_bytes


def test_the_meta_dry_run_gives_the_shapes_and_gradients_without_the_copy():
    experts = Experts(EXPERTS, HIDDEN, FFN, activation=F.gelu, swiglu=True, init_std=0.5, output_init_std=0.5,
                      bias=False)
    experts.planned_device = "cpu"
    rows = torch.empty(sum(COUNTS), HIDDEN, device="meta", requires_grad=True)
    meter = SavedTensorMeter(torch.device("meta"))
    with meter.hooks():
        output = experts(rows, COUNTS)
    output.sum().backward()
    assert output.shape == rows.shape and rows.grad.shape == rows.shape
    assert all(p.grad is not None and p.grad.shape == p.shape for p in experts.parameters())
