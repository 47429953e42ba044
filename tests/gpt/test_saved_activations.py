"""What a block keeps for backward, and that keeping less changed no bit.

Under --recompute-modules layernorm a block's RMSNorms keep only their input (gpt/norms.py rms_norm, their fp32 work
run again in backward: gpt/recomputed.py); the gated MLP keeps only its gate and up projections (gpt/glu.py
GatedActivation, whose own backward makes the activation again); rotary casts its angles once for q and k, for every
layer (gpt/rotary.py RotaryCache). The plain formulation, autograd through gpt/norms.py rms_norm_math and
GatedActivation.math, is put back here by monkeypatching those two, and outputs and every gradient are compared with
torch.equal.

The figure is computed from the shapes, by what each op keeps (SavedTensorMeter, zero/activations.py: a storage
counted once, parameters not at all). Per token of a Llama-shaped block in bf16, hidden h, K and V together kv wide,
MLP width f: each norm's input (h) and output (h, which the next linear keeps), q and the attention's output (h
each, the output projection keeping a view of the latter), K and V (kv), the gate and up projections and their
product (f each): 2 x (6h + kv + 3f) bytes, what planner/layout_search.py counts for Megatron-Core's blocks, plus
SDPA's fp32 log-sum-exp per head and one bf16 cos and sin [seq, head dim]. Without the norms' recompute (the
default, as Megatron-Core's) each norm keeps, besides, its fp32 per-token rsqrt (4: gpt/rms_norm_backward.py, as
Transformer Engine's rsigma); autograd through its ops (put back here) its fp32 copy of its input and its cast normed
values in place of the input (4h + 2h - 2h bytes) too; the plain activation the gate's activation (2f); and, before
the rotary cast (not put back here), a cos and a sin for k apart from q's.
"""

from __future__ import annotations

import functools

import pytest
import torch

import gpt.gate_up_gemm
import gpt.norms
from base.options import replace_settings
from gpt.glu import GatedActivation
from gpt.mlp import activation_function
from gpt.model import build_gpt_model
from gpt.model_config import ModelConfig
from parallel.state import ParallelState
from zero.activations import SavedTensorMeter

CPU = ParallelState(device=torch.device("cpu"))
# the block docs/planning.md measured: hidden 256, 8 heads in 2 query groups, ffn 896
LLAMA = ModelConfig.of(num_layers=1, hidden_size=256, num_attention_heads=8, num_query_groups=2, ffn_hidden_size=896,
                    seq_length=128, max_position_embeddings=128, vocab_size=300, normalization="RMSNorm",
                    swiglu=True, position_embedding_type="rope", untie_embeddings_and_output_weights=True,
                    add_bias_linear=False, attention_dropout=0.0, hidden_dropout=0.0)
BATCH = 2


@pytest.fixture
def plain(monkeypatch):
    """The plain formulation: autograd through the whole norm and activation, keeping what their ops keep (gate and up
    as one GEMM, gpt/gate_up_gemm.py, the same GEMM and GatedActivation.math under autograd: one_gemm_math)."""
    def put_back():
        monkeypatch.setattr(gpt.norms, "rms_norm", gpt.norms.rms_norm_math)
        monkeypatch.setattr(gpt.norms, "rms_norm_keeping_input", gpt.norms.rms_norm_math)
        monkeypatch.setattr(GatedActivation, "__call__", GatedActivation.math)
        monkeypatch.setattr(gpt.gate_up_gemm, "one_gemm", gpt.gate_up_gemm.one_gemm_math)
    return put_back


def _block_saved_bytes(dtype: torch.dtype, config: ModelConfig = LLAMA) -> int:
    model = build_gpt_model(config, CPU, seed=3, dtype=dtype)
    hidden = torch.randn(BATCH, LLAMA.seq_length, LLAMA.hidden_size, generator=torch.Generator().manual_seed(0)
                         ).to(dtype).requires_grad_()
    meter = SavedTensorMeter(torch.device("cpu"))
    with meter.hooks():
        output = model.blocks[0](hidden)
        saved = meter.live["device"]
    del output
    return saved


def _shapes():
    h, f, s = LLAMA.hidden_size, LLAMA.ffn_hidden_size, LLAMA.seq_length
    heads, head_dim = LLAMA.num_attention_heads, LLAMA.hidden_size // LLAMA.num_attention_heads
    kv = 2 * LLAMA.attention.num_query_groups * head_dim
    return BATCH * s, h, f, kv, heads, head_dim, s


def test_a_llama_block_keeps_what_megatrons_blocks_keep(plain):
    tokens, h, f, kv, heads, head_dim, seq = _shapes()
    bf16 = 2
    lse = BATCH * heads * seq * 4
    rotary = 2 * seq * head_dim * bf16
    expected = tokens * bf16 * (6 * h + kv + 3 * f) + lse + rotary
    recomputed = replace_settings(LLAMA, recompute_modules=("layernorm",))
    assert _block_saved_bytes(torch.bfloat16, recomputed) == expected == 2_252_800
    rsqrt_kept = expected + tokens * 2 * 4
    assert _block_saved_bytes(torch.bfloat16) == rsqrt_kept == 2_254_848
    plain()
    before = expected + tokens * 2 * (4 * h + 4) + tokens * bf16 * f  # the norms' fp32 copies and normed values
    assert _block_saved_bytes(torch.bfloat16) == _block_saved_bytes(torch.bfloat16, recomputed) == before == 3_237_888
    # and the parent commit's (2e60db1) rotary copies for k besides: 3,254,272, 1.44x


def _logits_and_gradients(config: ModelConfig, dtype: torch.dtype):
    model = build_gpt_model(config, CPU, seed=5, dtype=dtype)
    tokens = torch.randint(0, config.vocab_size, (BATCH, config.seq_length), generator=torch.Generator().manual_seed(1))
    logits = model(tokens)
    logits.float().square().mean().backward()
    return logits.detach(), {name: param.grad for name, param in model.named_parameters()}


SMALL = replace_settings(LLAMA, num_layers=2, hidden_size=64, num_attention_heads=4, ffn_hidden_size=160,
                         seq_length=32, max_position_embeddings=32, recompute_modules=("layernorm",))
VARIANTS = {
    "llama": SMALL,
    # the norms keeping their input and rsqrt (gpt/rms_norm_backward.py), plain and zero-centered
    "llama-rsqrt-kept": replace_settings(SMALL, recompute_modules=()),
    "norm-1p-rsqrt-kept": replace_settings(SMALL, recompute_modules=(), apply_layernorm_1p=True),
    # Gemma's zero-centered gains on every norm, the per-head query and key norms
    "norm-1p-qk-layernorm": replace_settings(SMALL, apply_layernorm_1p=True, qk_layernorm=True),
    # GPT-OSS's gated activation: quick GeLU, the clamp, the offset on the linear half
    "quick-clamp-offset": replace_settings(SMALL, swiglu=False, quick_geglu=True, activation_func_clamp_value=0.05,
                                              glu_linear_offset=1.0),
    "geglu": replace_settings(SMALL, swiglu=False, gated_linear_unit=True, activation="gelu_tanh"),
    "moe": replace_settings(SMALL, num_experts=4, moe_router_topk=2),
}


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("variant", list(VARIANTS))
def test_keeping_less_changes_no_bit(variant, dtype, plain):
    logits, grads = _logits_and_gradients(VARIANTS[variant], dtype)
    plain()
    plain_logits, plain_grads = _logits_and_gradients(VARIANTS[variant], dtype)
    assert torch.equal(logits, plain_logits)
    assert grads.keys() == plain_grads.keys()
    for name, grad in grads.items():
        assert torch.equal(grad, plain_grads[name]), name


def _function_and_gradients(function, *inputs, grad_seed: int = 9):
    inputs = [tensor.detach().requires_grad_() for tensor in inputs]
    output = function(*inputs)
    grad = torch.randn(output.shape, generator=torch.Generator().manual_seed(grad_seed)).to(output.dtype)
    return output.detach(), torch.autograd.grad(output, inputs, grad)


def _random(*shape, dtype, seed):
    return (torch.randn(*shape, generator=torch.Generator().manual_seed(seed)) * 3).to(dtype)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16], ids=["fp32", "bf16", "fp16"])
@pytest.mark.parametrize("zero_centered", [False, True])
@pytest.mark.parametrize("keeping", ["input", "input-and-rsqrt"])
def test_rms_norm_equals_the_plain_one_bit_for_bit(dtype, zero_centered, keeping):
    """Also on a transposed input (--qk-layernorm's heads, a view of the QKV projection)."""
    hidden = _random(3, 5, 16, 8, dtype=dtype, seed=1).transpose(1, 2)
    weight = _random(8, dtype=dtype, seed=2)
    kept = gpt.norms.rms_norm if keeping == "input" else gpt.norms.rms_norm_keeping_input
    norm = functools.partial(kept, eps=1e-5, zero_centered=zero_centered)
    reference = functools.partial(gpt.norms.rms_norm_math, eps=1e-5, zero_centered=zero_centered)
    output, grads = _function_and_gradients(norm, hidden, weight)
    plain_output, plain_grads = _function_and_gradients(reference, hidden, weight)
    assert torch.equal(output, plain_output)
    for grad, plain_grad in zip(grads, plain_grads):
        assert grad.dtype == plain_grad.dtype and torch.equal(grad, plain_grad)


GLUS = {
    "swiglu": GatedActivation(),
    "quick": GatedActivation(quick=True),
    "quick-clamp-offset": GatedActivation(quick=True, clamp=1.5, offset=1.0),
    "swiglu-clamp": GatedActivation(clamp=1.0),
    "gelu": GatedActivation(activation=functools.partial(activation_function, "gelu")),
    "gelu-tanh-offset": GatedActivation(offset=0.5, activation=functools.partial(activation_function, "gelu_tanh")),
}


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("glu", list(GLUS))
def test_the_gated_activation_equals_the_plain_one_bit_for_bit(glu, dtype):
    gate, linear = _random(4, 7, 24, dtype=dtype, seed=3), _random(4, 7, 24, dtype=dtype, seed=4)
    activation = GLUS[glu]
    output, grads = _function_and_gradients(activation, gate, linear)
    plain_output, plain_grads = _function_and_gradients(activation.math, gate, linear)
    assert torch.equal(output, plain_output)
    for grad, plain_grad in zip(grads, plain_grads):
        assert torch.equal(grad, plain_grad)


def test_only_the_inputs_needing_a_gradient_get_one():
    """A frozen gain (or input) gets None, as autograd gives; no grad mode runs the plain call, keeping nothing."""
    hidden, weight = _random(2, 8, dtype=torch.bfloat16, seed=5), _random(8, dtype=torch.bfloat16, seed=6)
    hidden.requires_grad_()
    output = gpt.norms.rms_norm(hidden, weight, 1e-5)
    (grad,) = torch.autograd.grad(output.sum(), [hidden])
    plain = gpt.norms.rms_norm_math(hidden, weight, 1e-5)
    assert torch.equal(grad, torch.autograd.grad(plain.sum(), [hidden])[0])
    with torch.no_grad():
        assert gpt.norms.rms_norm(hidden, weight, 1e-5).grad_fn is None


def test_a_meta_block_runs_forward_and_backward():
    """The planner's dry run builds and runs the model on the meta device: the recompute runs there too."""
    from gpt.model import GPTModel

    model = GPTModel(replace_settings(VARIANTS["norm-1p-qk-layernorm"], num_experts=4), ParallelState(
        device=torch.device("meta")))
    tokens = torch.zeros(BATCH, SMALL.seq_length, dtype=torch.int64, device="meta")
    model(tokens).float().square().mean().backward()
    assert all(param.grad is not None and param.grad.is_meta for param in model.parameters())
