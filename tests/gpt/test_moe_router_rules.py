"""Megatron's two MoE launch rules read as its code has them (issue 114 item 6).

github:NVIDIA/Megatron-LM at core_v0.19.0:
- megatron/core/transformer/transformer_config.py lines 2338-2356: every group check sits under
  `if self.moe_router_group_topk:`; only a group top-k without `moe_router_num_groups` raises ("When using group
  limited routing, moe_router_num_groups must be specified."). A group count alone passes, and
  moe/moe_utils.py line 812 (`if group_topk:`) routes without groups then.
- megatron/training/arguments.py lines 326-345 (moe_freq_type) keeps `--moe-layer-freq -1` as the int -1, and
  megatron/core/models/gpt/gpt_layer_specs.py lines 647-650 place an MoE layer at each i with `i % N == 0`: Python's
  `%`, so -1 makes every layer MoE and -N places what N does; 0 is a ZeroDivisionError there.
"""

from __future__ import annotations

import pytest
import torch

from arguments.bounds import _moe_layers_and_experts
from arguments.parser import parse_config
from base.errors import ConfigError
from checkpoint.torch_dist.writer import _per_layer
from families.registry import family_weights
from gpt.model import build_gpt_model
from gpt.model_config import ModelConfig
from gpt.moe.settings import moe_layer_pattern
from parallel.state import ParallelState

SINGLE = ParallelState(device=torch.device("cpu"))
TINY = ["--num-layers", "4", "--hidden-size", "16", "--num-attention-heads", "2", "--seq-length", "8",
        "--max-position-embeddings", "8", "--vocab-size", "64", "--num-experts", "4", "--moe-router-topk", "2"]


def tiny_moe(**moe) -> ModelConfig:
    return ModelConfig.of(num_layers=2, hidden_size=16, num_attention_heads=2, seq_length=8, max_position_embeddings=8,
                          vocab_size=64, hidden_dropout=0.0, attention_dropout=0.0, num_experts=4, **moe)


def test_a_group_count_without_a_group_topk_is_taken_and_routes_as_without_it():
    grouped = tiny_moe(moe_router_num_groups=2)
    grouped.validate()
    plain = tiny_moe()
    tokens = torch.randint(0, 64, (2, 8), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        expected = build_gpt_model(plain, SINGLE, seed=3)(tokens, tokens)
        torch.testing.assert_close(build_gpt_model(grouped, SINGLE, seed=3)(tokens, tokens), expected,
                                   rtol=0, atol=0)
    launch = [*TINY, "--swiglu", "--normalization", "RMSNorm", "--ffn-hidden-size", "32"]
    assert parse_config([*launch, "--moe-router-num-groups", "2"]).model.moe.router_num_groups == 2
    # exported, transformers' router must not group either (its n_group groups by itself)
    hf_config = family_weights()["glm4_moe"].hf_config
    assert hf_config(parse_config([*launch, "--moe-router-num-groups", "2"]).model).n_group == 1
    assert hf_config(parse_config([*launch, "--moe-router-num-groups", "2", "--moe-router-group-topk", "1"]
                                  ).model).n_group == 2


def test_a_group_topk_without_a_group_count_is_refused_in_one_line():
    with pytest.raises(ConfigError, match="--moe-router-group-topk .* needs --moe-router-num-groups") as refused:
        tiny_moe(moe_router_group_topk=1).validate()
    assert "\n" not in str(refused.value)


def test_layer_freq_minus_one_makes_every_layer_moe_and_minus_n_places_as_n():
    assert moe_layer_pattern("-1", 4) == (True,) * 4
    assert moe_layer_pattern("-2", 5) == moe_layer_pattern("2", 5) == (True, False, True, False, True)
    config = parse_config([*TINY, "--moe-layer-freq", "-1"])
    assert config.model.experts.layer_freq == -1
    names = {name for name, _ in build_gpt_model(config.model, SINGLE, seed=1).named_parameters()}
    every = parse_config([*TINY, "--moe-layer-freq", "1"]).model
    assert names == {name for name, _ in build_gpt_model(every, SINGLE, seed=1).named_parameters()}
    assert _moe_layers_and_experts(config.model) == (4, 4)
    assert _moe_layers_and_experts(parse_config([*TINY, "--moe-layer-freq", "-3"]).model) == (2, 4)
    # TransformerBlock.sharded_state_dict (transformer_block.py 736-740): all-MoE -1 stacks its layers in one key
    assert not _per_layer(config) and _per_layer(parse_config([*TINY, "--moe-layer-freq", "-2"]))


def test_layer_freq_zero_is_refused_in_one_line():
    with pytest.raises(ConfigError, match="--moe-layer-freq 0 places no layer") as refused:
        parse_config([*TINY, "--moe-layer-freq", "0"])
    assert "\n" not in str(refused.value).strip()
