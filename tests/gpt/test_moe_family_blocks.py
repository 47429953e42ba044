"""The block features the MoE families need, each against its spec, and their refusals (issue 63):

- attention sinks (gpt/attention_sinks.py) equal Megatron-Core's SoftmaxOne (megatron/core/fusions/fused_softmax.py,
  SoftmaxOne.forward: the sink appended as a column of the scores, dropped after the softmax), copied below as the
  reference, with grouped-query heads and with a mask, outputs and gradients;
- the gated activation (gpt/glu.py) equals transformers' GptOssExperts._apply_gate (models/gpt_oss/modeling_gpt_oss.py),
  interleaved halves and all, and Megatron-Core's MLP.glu with its clamp and offset;
- YaRN positions for attention other than MLA (gpt/rotary.py yarn_angles) equal transformers' _compute_yarn_parameters
  (GPT-OSS's rope, truncate false) and its cos/sin scaling;
- the flags' refusals, one line each naming the flags."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from base.errors import ConfigError
from gpt.attention_sinks import attention_with_sinks
from gpt.glu import GatedActivation
from gpt.model_config import ModelConfig
from gpt.rotary import yarn_angles


def softmax_one(scores: torch.Tensor, sinks: torch.Tensor) -> torch.Tensor:
    """Megatron-Core's SoftmaxOne.forward (fused_softmax.py)."""
    sink = sinks.reshape(1, -1, 1, 1).expand(scores.size(0), -1, scores.size(2), -1)
    return torch.softmax(torch.cat([scores, sink], dim=-1), dim=-1)[..., :-1]


@pytest.mark.parametrize("groups, masked", [(4, False), (2, False), (2, True)])
def test_attention_with_sinks_is_softmax_one(groups, masked):
    generator = torch.Generator().manual_seed(0)
    q = torch.randn(2, 4, 7, 6, generator=generator, dtype=torch.float64, requires_grad=True)
    k, v = (torch.randn(2, groups, 7, 6, generator=generator, dtype=torch.float64, requires_grad=True)
            for _ in range(2))
    sinks = torch.randn(4, generator=generator, dtype=torch.float64, requires_grad=True)
    causal = torch.ones(7, 7, dtype=torch.bool).tril()
    mask = (causal & (torch.rand(2, 1, 7, 7, generator=generator) > 0.3)) | torch.eye(7, dtype=torch.bool) \
        if masked else None
    ours = attention_with_sinks(q, k, v, sinks, enable_gqa=groups != 4, attention_mask=mask)
    keys, values = (t.repeat_interleave(4 // groups, dim=1) for t in (k, v))
    scores = (q @ keys.transpose(-2, -1) / math.sqrt(6)).masked_fill(~(causal if mask is None else mask), float("-inf"))
    theirs = softmax_one(scores, sinks) @ values
    torch.testing.assert_close(ours, theirs, rtol=1e-12, atol=1e-12)
    for ours_grad, their_grad in zip(torch.autograd.grad(ours.square().sum(), (q, k, v, sinks)),
                                     torch.autograd.grad(theirs.square().sum(), (q, k, v, sinks))):
        torch.testing.assert_close(ours_grad, their_grad, rtol=1e-10, atol=1e-12)


def test_the_gated_activation_is_gpt_oss_experts_gate():
    from transformers import GptOssConfig
    from transformers.models.gpt_oss.modeling_gpt_oss import GptOssExperts

    experts = GptOssExperts(GptOssConfig(hidden_size=8, intermediate_size=6, num_local_experts=1, swiglu_limit=0.7))
    gate_up = torch.randn(5, 12, generator=torch.Generator().manual_seed(1)) * 2
    theirs = experts._apply_gate(gate_up)
    ours = GatedActivation(quick=True, clamp=0.7, offset=1.0)(gate_up[:, ::2], gate_up[:, 1::2])
    assert torch.equal(ours, theirs)


def test_the_gated_activation_is_megatrons_glu():
    """megatron/core/transformer/mlp.py MLP.forward's glu(x) with quick_gelu (megatron/core/activations.py)."""
    x = torch.randn(4, 10, generator=torch.Generator().manual_seed(2)) * 3

    def megatron_glu(x, clamp, offset):
        x_glu, x_linear = torch.chunk(x, 2, dim=-1)
        x_glu, x_linear = x_glu.clamp(min=None, max=clamp), x_linear.clamp(min=-clamp, max=clamp)
        return x_glu * torch.sigmoid(1.702 * x_glu) * (x_linear + offset)

    assert torch.equal(GatedActivation(True, 1.5, 1.0)(*x.chunk(2, dim=-1)), megatron_glu(x, 1.5, 1.0))
    assert torch.equal(GatedActivation()(*x.chunk(2, dim=-1)), F.silu(x[:, :5]) * x[:, 5:])


@pytest.mark.parametrize("truncate", [False, True])
def test_yarn_angles_are_transformers_yarn(truncate):
    from transformers import GptOssConfig
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    rope = {"rope_type": "yarn", "rope_theta": 150000.0, "factor": 32.0, "beta_fast": 32.0, "beta_slow": 1.0,
            "original_max_position_embeddings": 4096, "truncate": truncate}
    config = GptOssConfig(head_dim=64, rope_parameters=rope)
    inverse, attention_factor = ROPE_INIT_FUNCTIONS["yarn"](config, torch.device("cpu"))
    angles = torch.outer(torch.arange(40, dtype=torch.float32), inverse)
    angles = torch.cat((angles, angles), dim=-1)
    cos, sin = yarn_angles(40, 64, 150000.0, torch.device("cpu"), 32.0, 4096, 32.0, 1.0, truncate, 1.0, 0.0)
    torch.testing.assert_close(cos, angles.cos() * attention_factor, rtol=1e-6, atol=1e-7)
    torch.testing.assert_close(sin, angles.sin() * attention_factor, rtol=1e-6, atol=1e-7)


@pytest.mark.parametrize("settings, named", [
    (dict(quick_geglu=True, swiglu=True), "--quick-geglu with --swiglu"),
    (dict(activation_func_clamp_value=7.0), "--activation-func-clamp-value and --glu-linear-offset act on a gated"),
    (dict(glu_linear_offset=1.0), "--activation-func-clamp-value and --glu-linear-offset act on a gated"),
    (dict(swiglu=True, activation_func_clamp_value=7.0), "clamps the experts' SwiGLU only"),
    (dict(quick_geglu=True, activation_func_clamp_value=-1.0), "must be positive and finite"),
    (dict(softmax_type="sigmoid"), "--softmax-type sigmoid is not one of vanilla, off-by-one, learnable"),
    (dict(position_embedding_type="yarn", rotary_percent=0.5), "--position-embedding-type yarn with --rotary-percent"),
    (dict(position_embedding_type="yarn", rotary_interleaved=True), "yarn with --rotary-interleaved"),
])
def test_a_setting_megatron_refuses_is_refused_in_one_line(settings, named):
    with pytest.raises(ConfigError) as error:
        ModelConfig.of(vocab_size=64, **settings).validate()
    assert named in str(error.value) and "\n" not in str(error.value)


@pytest.mark.parametrize("settings, named", [
    (dict(softmax_type="learnable", attn_logit_softcapping=30.0),
     "--softmax-type learnable with --attn-logit-softcapping is not implemented"),
    (dict(position_embedding_type="yarn", local_rotary_base=10000.0),
     "--position-embedding-type yarn with --local-rotary-base is not implemented"),
    (dict(position_embedding_type="yarn", rotary_seq_len_interpolation_factor=8.0),
     "--position-embedding-type yarn with --rotary-seq-len-interpolation-factor is not implemented"),
    (dict(quick_geglu=True, gated_linear_unit=True, activation="gelu"), "--gated-linear-unit with --quick-geglu"),
])
def test_gpt_oss_and_gemma_blocks_not_built_together_are_refused_in_one_line(settings, named):
    """Where the GPT-OSS blocks meet Gemma's (both branches of issue 63): sinks join SDPA's scores, which cannot be
    soft-capped; YaRN's frequencies are one set for every layer; one gated MLP activation at a time."""
    with pytest.raises(ConfigError) as error:
        ModelConfig.of(vocab_size=64, **settings).validate()
    assert named in str(error.value) and "\n" not in str(error.value)


def test_gated_linear_units_gelu_gate_takes_the_offset_and_clamp_as_megatron_cores_glu():
    """--gated-linear-unit's GeGLU through gpt/glu.py: Megatron-Core's MLP.glu (megatron/core/transformer/mlp.py)
    clamps both halves and adds --glu-linear-offset whatever the gate's activation_func; without them it is
    gelu(gate) * up exactly, as Gemma's MLP computes it."""
    gate, up = torch.randn(4, 6, generator=torch.Generator().manual_seed(1)) * 3, torch.randn(4, 6) * 3
    gelu = GatedActivation(activation=lambda x: F.gelu(x, approximate="tanh"))
    assert torch.equal(gelu(gate, up), F.gelu(gate, approximate="tanh") * up)
    clamped = GatedActivation(clamp=2.0, offset=1.0, activation=F.gelu)
    torch.testing.assert_close(clamped(gate, up), F.gelu(gate.clamp(max=2.0)) * (up.clamp(-2.0, 2.0) + 1.0))
