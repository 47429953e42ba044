"""Issue 40, lever 1: a head dim the fused CUDA kernels do not take (the paper's 1.5B: 100) is padded to
the next multiple of 8, and the padded attention is the unpadded one.

PyTorch's constraints the selection follows (pytorch/pytorch, aten/src/ATen/native/transformers/cuda/
sdp_utils.cpp):
- check_head_dim_size_mem_efficient: `query_size_last % alignment == 0` with
  minimum_gemm_alignment = max(4, 128 / bits_per_scalar) = 8 for 16-bit inputs on tensor cores;
- check_cudnn_tensor_shapes: `if (d_qk % 8 != 0 || d_v % 8 != 0) ... "head_dim should be a multiple of 8"`,
  and `head_dim_limit` 128 (256 on sm90 with cuDNN >= 9.1);
- check_head_dim_size_flash: equal q/k/v head dims `<= 256` (max_size).
So 8 is the multiple and 256 the largest padded head dim worth asking for.
"""


import pytest
import torch

import gpt.attention_kernel
from arguments.config import ModelConfig
from gpt.attention_padding import attention_at_head_dim, padded_head_dim
from gpt.model import build_gpt_model
from parallel.state import ParallelState


@pytest.mark.parametrize("head_dim, device, backend, enabled, expected", [
    (100, "cuda", "auto", True, 104),      # the paper's 1.5B: 16 heads of 100
    (100, "cuda", "flash", True, 104),
    (100, "cuda", "fused", True, 104),
    (64, "cuda", "auto", True, 64),        # GPT-2 XL's 25 x 64: already taken
    (100, "cuda", "unfused", True, 100),   # the math kernel takes any head dim
    (100, "cuda", "local", True, 100),
    (100, "cuda", "auto", False, 100),     # --no-pad-attention-head-dim
    (100, "cpu", "auto", True, 100),       # CPU math stays as it was
    (252, "cuda", "auto", True, 256),
    (257, "cuda", "auto", True, 257),      # no fused kernel past 256: padding buys nothing
])
def test_which_head_dims_are_padded_and_to_what(head_dim, device, backend, enabled, expected):
    assert padded_head_dim(head_dim, device, backend, enabled) == expected


def test_padded_attention_equals_the_unpadded_one_in_value_and_gradient():
    """fp32 on the math kernel; the padded columns add exact zeros to q.k, so only the summation order
    of the GEMMs differs: rtol 1e-5, atol 1e-6 (fp32 eps is 1.2e-7)."""
    generator = torch.Generator().manual_seed(0)
    inputs = [torch.randn(2, 3, 16, 100, generator=generator, requires_grad=True) for _ in range(3)]
    padded_inputs = [t.detach().clone().requires_grad_() for t in inputs]
    reference = attention_at_head_dim(*inputs, head_dim=100, dropout_p=0.0)
    padded = attention_at_head_dim(*padded_inputs, head_dim=104, dropout_p=0.0)
    assert padded.shape == reference.shape
    torch.testing.assert_close(padded, reference, rtol=1e-5, atol=1e-6)
    weights = torch.randn(reference.shape, generator=generator)
    (reference * weights).sum().backward()
    (padded * weights).sum().backward()
    for plain, pad in zip(inputs, padded_inputs):
        torch.testing.assert_close(pad.grad, plain.grad, rtol=1e-5, atol=1e-6)


def test_the_model_runs_the_padded_path_where_the_selection_says_so(monkeypatch):
    """The model asks the selection on every forward: made to pad on a CPU (as it would on CUDA), the
    loss is the unpadded one, and the padded head dim really reached SDPA."""
    config = ModelConfig.of(num_layers=1, hidden_size=40, num_attention_heads=2, seq_length=8,
                         max_position_embeddings=8, vocab_size=50, hidden_dropout=0.0, attention_dropout=0.0)
    state = ParallelState(device=torch.device("cpu"))
    tokens = torch.randint(0, 50, (2, 9), generator=torch.Generator().manual_seed(1))

    def loss():
        return build_gpt_model(config, state, seed=3)(tokens[:, :-1], tokens[:, 1:]).mean()

    reference = loss()
    seen = []
    real_sdpa = torch.nn.functional.scaled_dot_product_attention

    def recording_sdpa(query, *args, **kwargs):
        seen.append(query.shape[-1])
        return real_sdpa(query, *args, **kwargs)

    monkeypatch.setattr(gpt.attention_kernel, "padded_head_dim", lambda head_dim, *rest: 24)
    monkeypatch.setattr(torch.nn.functional, "scaled_dot_product_attention", recording_sdpa)
    torch.testing.assert_close(loss(), reference, rtol=1e-5, atol=1e-6)
    assert seen == [24]


def test_the_default_pads_nothing_on_a_cpu():
    assert ModelConfig().attention.pad_attention_head_dim
    assert padded_head_dim(ModelConfig.of(hidden_size=100, num_attention_heads=1).head_dim, "cpu", "auto", True) == 100
