"""Megatron's one-part hybrid layers (gpt/hybrid_pattern.py): a mixer not followed by an MLP symbol, or an MLP not
after a mixer, is a block of that half alone, with only that half's norm and parameters, and passes the residual
stream through the other half untouched."""

from __future__ import annotations

import pytest
import torch

from arguments.parser import parse_config
from gpt.hybrid_pattern import parse_hybrid_pattern
from gpt.layer_spec import layer_specs
from gpt.model import build_gpt_model
from parallel.state import ParallelState

SMALL = ["--hidden-size", "32", "--num-attention-heads", "4", "--seq-length", "16", "--max-position-embeddings", "16",
         "--vocab-size", "64", "--hidden-dropout", "0", "--attention-dropout", "0"]


def test_a_mixer_pairs_only_with_the_mlp_right_after_it():
    pattern = parse_hybrid_pattern("*--*|+-")
    assert pattern.blocks == ("*-", "-", "*", "+-")
    assert (pattern.mixers(), pattern.mlps()) == (("*", None, "*", "+"), ("-", "-", None, "-"))
    assert (pattern.layer_offsets(), pattern.megatron_layers) == ((0, 2, 3, 4), 6)


def test_one_part_blocks_hold_their_half_and_skip_the_other():
    config = parse_config(["--hybrid-layer-pattern", "*--*", *SMALL]).model
    assert [(spec.mixer, spec.mlp) for spec in layer_specs(config)] == [("*", "-"), (None, "-"), ("*", None)]
    # Megatron's hybrid output projections: init_method_std / sqrt(its 4 layers, one residual branch each), where
    # the GPT rule over 3 blocks would say sqrt(6)
    assert config.output_init_std == pytest.approx(0.02 / 2)
    model = build_gpt_model(config, ParallelState(device=torch.device("cpu")), seed=3).eval()
    names = {name.split(".")[2] for name, _ in model.named_parameters() if name.startswith("blocks.1.")}
    assert names == {"post_attention_layernorm", "mlp"}
    names = {name.split(".")[2] for name, _ in model.named_parameters() if name.startswith("blocks.2.")}
    assert names == {"input_layernorm", "attention"}

    tokens = torch.randint(0, 64, (2, 16), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        hidden = model.blocks[0](model.embed(tokens))
        mlp_block, mixer_block = model.blocks[1], model.blocks[2]
        hidden = hidden + mlp_block.mlp(mlp_block.post_attention_layernorm(hidden))
        hidden = hidden + mixer_block.attention(mixer_block.input_layernorm(hidden))
        assert torch.equal(model.final_layernorm(hidden), model.hidden_states(tokens))
