"""--qk-layernorm --qk-layernorm-over-projection: OLMo 2's (and OLMoE's) q_norm / k_norm over the whole query and
key projections (transformers' models/olmo2/modeling_olmo2.py Olmo2Attention: `self.q_norm(self.q_proj(x))`, an
Olmo2RMSNorm of num_attention_heads x head_dim, `self.k_norm(self.k_proj(x))` of num_key_value_heads x head_dim,
both before the split into heads and before rotary).

Our attention equals transformers' Olmo2Attention on the same weights (grouped-query, 2 groups), and at TP 2 each
rank's output and gradients are the TP 1 model's (its gains split as the QKV rows, the statistics summed over the
TP group in forward and backward), in one 2-rank launch."""

from __future__ import annotations

import pytest
import torch

from base.errors import ConfigError
from base.options import replace_settings
from gpt.model import build_gpt_model
from gpt.model_config import ModelConfig
from parallel.state import ParallelState, destroy, initialize
from tests.distributed import run_distributed
from tests.gpt.test_llama_blocks import LLAMA, check_gradients_are_tp1_slices, tiny_config

SINGLE = ParallelState(device=torch.device("cpu"))


def _config() -> ModelConfig:
    return replace_settings(tiny_config(), **{"qk_layernorm": True, "qk_layernorm_over_projection": True,
                                                 "num_query_groups": 2, **_llama_settings()})


def _llama_settings() -> dict:
    return {name: LLAMA[name] for name in ("normalization", "swiglu", "position_embedding_type",
                                           "untie_embeddings_and_output_weights", "add_bias_linear")}


def _olmo2_attention(ours, config: ModelConfig):
    """transformers' Olmo2Attention and rotary embedding holding block 0's attention weights."""
    from transformers import Olmo2Config
    from transformers.models.olmo2.modeling_olmo2 import Olmo2Attention, Olmo2RotaryEmbedding

    theirs_config = Olmo2Config(hidden_size=config.hidden_size, num_attention_heads=config.num_attention_heads,
                                num_key_value_heads=2, rms_norm_eps=config.norms.layernorm_epsilon, attention_bias=False,
                                max_position_embeddings=config.max_position_embeddings)
    theirs_config._attn_implementation = "eager"
    attention = Olmo2Attention(theirs_config, layer_idx=0).eval()
    heads, d, per_group = config.num_attention_heads, config.head_dim, config.num_attention_heads // 2
    qkv = ours.query_key_value.weight.detach().reshape(2, per_group + 2, d, -1)
    with torch.no_grad():
        attention.q_proj.weight.copy_(qkv[:, :per_group].reshape(heads * d, -1))
        attention.k_proj.weight.copy_(qkv[:, per_group].reshape(2 * d, -1))
        attention.v_proj.weight.copy_(qkv[:, per_group + 1].reshape(2 * d, -1))
        attention.o_proj.weight.copy_(ours.dense.weight)
        # gains away from 1, so that a per-head norm or a wrong feature order would show
        attention.q_norm.weight.copy_(ours.q_layernorm.weight)
        attention.k_norm.weight.copy_(ours.k_layernorm.weight)
    return attention, Olmo2RotaryEmbedding(theirs_config)


def _perturbed_gains(model) -> None:
    generator = torch.Generator().manual_seed(4)
    with torch.no_grad():
        for name, param in model.named_parameters():
            if name.endswith(("q_layernorm.weight", "k_layernorm.weight")):
                param.copy_(1 + 0.3 * torch.randn(param.shape, generator=generator))


def test_attention_equals_transformers_olmo2_attention():
    config = _config()
    model = build_gpt_model(config, SINGLE, seed=3).eval()
    _perturbed_gains(model)
    ours = model.blocks[0].attention
    assert tuple(ours.q_layernorm.weight.shape) == (config.num_attention_heads * config.head_dim,)
    assert tuple(ours.k_layernorm.weight.shape) == (2 * config.head_dim,)
    theirs, rotary = _olmo2_attention(ours, config)
    hidden = torch.randn(2, 16, config.hidden_size, generator=torch.Generator().manual_seed(2))
    positions = torch.arange(16)[None]
    causal = torch.full((16, 16), float("-inf")).triu(1)[None, None]
    with torch.no_grad():
        expected, _ = theirs(hidden, rotary(hidden, positions), attention_mask=causal)
        torch.testing.assert_close(ours(hidden), expected, rtol=0, atol=1e-5)


def test_it_needs_qk_layernorm():
    from arguments.parser import parse_arguments

    with pytest.raises(ConfigError, match="--qk-layernorm-over-projection says where --qk-layernorm"):
        parse_arguments(["--qk-layernorm-over-projection"])


def _tp2(rank, world_size):
    state = initialize("cpu", tensor_parallel_size=2)
    try:
        config = _config()
        reference, ours = (build_gpt_model(config, s, seed=3).eval() for s in (SINGLE, state))
        tokens = torch.randint(0, config.vocab_size, (2, 17), generator=torch.Generator().manual_seed(0))
        with torch.no_grad():
            difference = (ours(tokens[:, :-1]) - reference(tokens[:, :-1])).abs().max().item()
        check_gradients_are_tp1_slices(ours, reference, tokens, state)
        return difference
    finally:
        destroy(state)


def test_tp2_output_and_gradients_are_the_tp1_models():
    assert max(run_distributed(_tp2, 2, timeout=120)) <= 1e-5
