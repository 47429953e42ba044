"""Megatron-LM's --qk-l2-norm (issue 81 item 5), against Megatron-Core's code at d98e8a64 written out here by hand:

- megatron/core/transformer/torch_norm.py, L2Norm._norm: `x_float = x.float(); return (x_float *
  torch.rsqrt(x_float.pow(2).mean(-1, keepdim=True) + self.eps)).type_as(x)`, no parameter;
- megatron/core/transformer/attention.py, SelfAttention.__init__: `if self.config.qk_l2_norm: q_norm_cls =
  submodules.q_layernorm or L2Norm` before `elif self.config.qk_layernorm`, built with hidden_size = the head width
  and eps = config.layernorm_epsilon, and applied to each query and key head before rotary
  (get_query_key_value_tensors);
- megatron/core/models/gpt/gpt_layer_specs.py: "qk_l2_norm is not supported with MLA."
"""

from __future__ import annotations

import pytest
import torch

from arguments.parser import parse_config
from base.errors import ConfigError
from gpt.model import build_gpt_model
from gpt.norms import L2HeadNorm
from parallel.state import ParallelState
from tests.distributed import run_distributed
from tests.gpt.test_llama_blocks import tiny_config, tokens_for, tp2_difference_from_tp1

SINGLE = ParallelState(device=torch.device("cpu"))
LLAMA = dict(normalization="RMSNorm", swiglu=True, position_embedding_type="rope", add_bias_linear=False)


def megatron_l2_norm(x: torch.Tensor, eps: float) -> torch.Tensor:
    x_float = x.float()
    return (x_float * torch.rsqrt(x_float.pow(2).mean(-1, keepdim=True) + eps)).type_as(x)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_the_head_norm_is_megatron_cores_l2norm(dtype):
    heads = (torch.randn(2, 4, 5, 16, generator=torch.Generator().manual_seed(0)) * 3).to(dtype)
    normed = L2HeadNorm(1e-6)(heads)
    assert normed.dtype == dtype and list(L2HeadNorm(1e-6).parameters()) == []
    torch.testing.assert_close(normed, megatron_l2_norm(heads, 1e-6), rtol=0, atol=0)
    torch.testing.assert_close(normed.float().pow(2).mean(-1), torch.ones(2, 4, 5), rtol=0, atol=2e-2)


def test_the_model_equals_one_with_rmsnorm_query_key_norms_at_unit_gains():
    """An L2 norm is RMSNorm with its gain at 1 (--qk-layernorm's gains start at 1): same weights, same losses and
    gradients; without query/key norms the losses differ, so the flag reaches the attention. With both flags the
    L2 norm takes the place of --qk-layernorm's, as in Megatron-Core: no gains."""
    l2 = build_gpt_model(tiny_config(qk_l2_norm=True, **LLAMA), SINGLE, seed=5)
    both = build_gpt_model(tiny_config(qk_l2_norm=True, qk_layernorm=True, **LLAMA), SINGLE, seed=5)
    gains = build_gpt_model(tiny_config(qk_layernorm=True, **LLAMA), SINGLE, seed=5)
    plain = build_gpt_model(tiny_config(**LLAMA), SINGLE, seed=5)
    assert not any("layernorm" in name for name, _ in l2.named_parameters() if "q_" in name or "k_" in name)
    assert dict(both.named_parameters()).keys() == dict(l2.named_parameters()).keys()
    assert all(torch.equal(p, torch.ones_like(p)) for n, p in gains.named_parameters() if "q_layernorm" in n)
    tokens = tokens_for(tiny_config())
    losses = {name: model(tokens[:, :-1], tokens[:, 1:])
              for name, model in (("l2", l2), ("both", both), ("gains", gains), ("plain", plain))}
    torch.testing.assert_close(losses["l2"], losses["gains"], rtol=0, atol=0)
    torch.testing.assert_close(losses["both"], losses["l2"], rtol=0, atol=0)
    assert not torch.allclose(losses["l2"], losses["plain"])
    for model in (l2, gains):
        losses["l2" if model is l2 else "gains"].sum().backward()
    theirs = dict(gains.named_parameters())
    for name, param in l2.named_parameters():
        torch.testing.assert_close(param.grad, theirs[name].grad, rtol=1e-6, atol=1e-7)


def test_at_tp2_each_rank_normalizes_its_own_heads_and_equals_tp1():
    overrides = dict(num_query_groups=2, qk_l2_norm=True, **LLAMA)
    assert all(difference <= 1e-6 for difference in run_distributed(tp2_difference_from_tp1, 2, overrides, timeout=300))


def test_the_flag_sets_the_setting_and_is_refused_where_megatron_has_no_such_norm():
    assert parse_config(["--qk-l2-norm"]).model.attention.qk_l2_norm
    with pytest.raises(ConfigError, match="--qk-l2-norm with --multi-latent-attention is not implemented"):
        tiny_config(qk_l2_norm=True, multi_latent_attention=True).validate()
    with pytest.raises(ConfigError, match="--qk-l2-norm with --qk-layernorm-over-projection is not implemented"):
        tiny_config(qk_l2_norm=True, qk_layernorm=True, qk_layernorm_over_projection=True).validate()


def test_the_hugging_face_export_refuses_it():
    """No LlamaForCausalLM (nor any family exported here) normalizes queries and keys without a gain."""
    from checkpoint.hf.folders import check_convertible

    with pytest.raises(ConfigError, match="no --qk-l2-norm"):
        check_convertible(tiny_config(qk_l2_norm=True, **LLAMA), "the Hugging Face export")
    with pytest.raises(ConfigError, match="no --qk-l2-norm"):
        check_convertible(tiny_config(qk_l2_norm=True, qk_layernorm=True, **LLAMA), "the Hugging Face export")
