"""Issue 87: kernel launches per micro-batch, counted on the CPU, where the count is exact
(scripts/bench/op_counter.py), and
a dense layer's held at its value (scripts/bench/benchmark_host_ops.py's shapes; docs/performance.md's table).

The counter is checked on calls whose launches are known: eager ops below autograd (a composite arrives as its parts;
views, detach and allocations launch nothing), and a compiled function's extern call and inductor kernel. The
layer's count is the difference between a 2-layer and a 1-layer model's iteration-2 micro-batch: exact whatever the
embedding, loss and optimizer do. Megatron-LM's side (scripts/bench/megatron_lm_cpu.py --count-launches) needs the
benchmark venv and its tree, not here."""

from __future__ import annotations

import torch

from scripts.bench.benchmark_host_ops import PRECISIONS, SHAPES, common_flags, count_our_step, per_layer, summary
from scripts.bench.op_counter import count_calls, inductor_kernel_events

# this project's launches per layer and micro-batch, bf16 (forward + backward), at the commit that made them:
# GPT-2 shape 10 + 28; Llama shape 37 + 62 (rope made once, one q/k/v split, RMSNorm not recomputed, gate and up one
# GEMM, the weight gradients accumulated into the fp32 main gradients inside their GEMMs; each RMSNorm's backward one
# op more than autograd's, making its normed values again from its kept input and rsqrt: gpt/rms_norm_backward.py; the
# value's own copy, so that attention does not keep the whole QKV output for it: gpt/attention_kernel.py
# _only_view_left)
GPT2_BF16, LLAMA_BF16 = 38, 99
# the ceilings: GPT-2 at or under today's 51, Llama under Megatron-LM's torch path
GPT2_CEILING, LLAMA_CEILING = 51, 120


def test_the_counter_counts_kernels_not_views_and_a_composite_as_its_parts():
    x = torch.randn(8, 4, requires_grad=True)
    w = torch.randn(6, 4, requires_grad=True)

    def call():
        out = torch.nn.functional.linear(x, w)  # below autograd: t (a view) and mm
        out.t().relu().sum().backward()  # t: a view; relu, sum; backward: threshold_backward, expand (a view), mm x2
        x.grad = w.grad = None

    counts, = count_calls([call, call])
    assert dict(counts.ops()) == {"aten.mm": 3, "aten.relu": 1, "aten.sum": 1, "aten.threshold_backward": 1,
                                  "aten.ones_like": 1}, dict(counts.ops())
    assert counts.total() == 7


def test_a_compiled_function_counts_its_extern_calls_and_its_kernels():
    def scaled_relu(a, b):
        return (a @ b).relu() * 2.0  # one extern mm, the relu and the product fused into one C++ kernel

    compiled = torch.compile(scaled_relu, fullgraph=True)
    a, b = torch.randn(16, 16), torch.randn(16, 16)
    with inductor_kernel_events():
        counts, = count_calls([lambda: compiled(a, b), lambda: compiled(a, b)])  # the first compiles
    ops = counts.ops()
    assert ops["aten.mm"] == 1
    kernels = [op for op in ops if op.startswith("inductor.")]
    assert len(kernels) == 1 and ops[kernels[0]] == 1, dict(ops)
    assert counts.total() == 2


def _layer_bf16(shape: str) -> dict:
    flags = [*SHAPES[shape], *PRECISIONS["bf16"]]
    two, one = (summary(count_our_step(common_flags(layers) + flags)) for layers in (2, 1))
    return per_layer(two, one, 1)


def test_a_dense_layer_launches_at_most_what_it_did_and_a_llama_layer_under_megatrons():
    gpt2, llama = _layer_bf16("gpt2"), _layer_bf16("llama")
    # every micro-batch the same (nothing cached per iteration in a dense bf16 layer), the optimizer's not per layer
    for layer in (gpt2, llama):
        assert layer["micro_batch_1"] == layer["micro_batch_2"]
        assert layer["outside"] == 0
    assert gpt2["micro_batch_2"]["total"] == GPT2_BF16 <= GPT2_CEILING
    assert llama["micro_batch_2"]["total"] == LLAMA_BF16 <= LLAMA_CEILING
