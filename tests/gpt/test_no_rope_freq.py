"""Megatron-LM's --no-rope-freq (issue 81 item 5: Llama 4's layers without rotary positions), against Megatron-Core
at d98e8a64:

- megatron/core/transformer/transformer_config.py __post_init__: an int N asserts `num_layers % N == 0` and becomes
  `([0] * (N - 1) + [1]) * (num_layers // N)`; a list (megatron/training/arguments.py no_rope_freq_type evaluates
  "([0]*3+[1]*1)*3") must have one entry per layer;
- megatron/core/transformer/attention.py Attention.forward: `no_rope = self.config.no_rope_freq[self.layer_number
  - 1]`, and where set `rotary_pos_emb = None`: that layer's queries and keys are not rotated.
"""

from __future__ import annotations

import pytest
import torch

from arguments.parser import parse_config
from base.errors import ConfigError
from gpt.layer_pattern import no_rope_layers
from gpt.model import build_gpt_model
from parallel.state import ParallelState
from tests.gpt.test_llama_blocks import tiny_config, tokens_for

SINGLE = ParallelState(device=torch.device("cpu"))
ROPE = dict(normalization="RMSNorm", swiglu=True, position_embedding_type="rope", add_bias_linear=False)


def megatron_pattern(every: int, num_layers: int) -> list[int]:
    return ([0] * (every - 1) + [1]) * (num_layers // every)


@pytest.mark.parametrize("every", [1, 2, 4, 8])
def test_an_integer_skips_each_nth_layer_as_megatron_core_expands_it(every):
    assert no_rope_layers(every, 8) == tuple(bool(value) for value in megatron_pattern(every, 8))
    assert no_rope_layers(str(every), 8) == no_rope_layers(every, 8)  # a YAML or recorded value


def test_a_list_expression_gives_each_layer_and_none_skips_nothing():
    assert no_rope_layers("([0]*3+[1]*1)*2", 8) == tuple(bool(value) for value in ([0] * 3 + [1]) * 2)
    assert no_rope_layers(None, 3) == no_rope_layers(0, 3) == (False,) * 3
    with pytest.raises(ConfigError, match="--no-rope-freq 3 must be a divisor of --num-layers 8"):
        no_rope_layers(3, 8)
    with pytest.raises(ConfigError, match="gives 4 values; it needs one 1 .no rotary. or 0 .rotary. per layer, 8"):
        no_rope_layers("[0,0,0,1]", 8)


def test_skipped_layers_attend_without_positions_and_the_others_rotate():
    """Every layer skipped is the model with --position-embedding-type none (the same weights: neither has a
    position table): equal losses. Each 2nd layer skipped differs from both, so each layer reads its own entry."""
    tokens = tokens_for(tiny_config())

    def losses(**overrides):
        model = build_gpt_model(tiny_config(**{**ROPE, **overrides}), SINGLE, seed=7)
        return model(tokens[:, :-1], tokens[:, 1:]), model

    skipped, model = losses(no_rope_freq="[1]*2")
    nope, _ = losses(position_embedding_type="none")
    torch.testing.assert_close(skipped, nope, rtol=0, atol=0)
    second, model = losses(no_rope_freq=2)
    assert [block.attention.positions.rotary for block in model.blocks] == [True, False]
    rope, _ = losses()
    assert not torch.allclose(second, rope) and not torch.allclose(second, nope)


def test_the_flag_parses_as_megatron_reads_it_and_is_refused_where_it_would_not_be_megatrons():
    assert parse_config(["--no-rope-freq", "2"]).model.positions.no_rope_freq == 2
    assert parse_config(["--no-rope-freq", "([0]*3+[1])*1"]).model.positions.no_rope_freq == "([0]*3+[1])*1"
    with pytest.raises(ConfigError, match="--no-rope-freq 3 must be a divisor"):
        parse_config(["--no-rope-freq", "3"])  # the tiny preset's 4 layers
    for other, setting in (("--mtp-num-layers", dict(mtp_num_layers=1)),
                           ("--multi-latent-attention", dict(multi_latent_attention=True))):
        with pytest.raises(ConfigError, match=f"--no-rope-freq with {other} is not implemented"):
            tiny_config(no_rope_freq=2, **setting, **ROPE).validate()
    from checkpoint.hf.folders import check_convertible

    with pytest.raises(ConfigError, match="no --no-rope-freq"):
        check_convertible(tiny_config(no_rope_freq=2, **ROPE), "the Hugging Face export")


@pytest.mark.parametrize("freq", ["4", "([0]*3+[1]*1)*2"])
def test_a_valid_pattern_of_a_deep_model_is_counted_and_planned(freq, capsys):
    """The counting probes (gpt/shape.py's one-block model, the planner's stage GEMMs) are built at another layer count;
    they drop the per-layer pattern rather than check it again (before, every value but 1 was refused at 8 layers,
    the message naming --num-layers 1)."""
    from planner.plan import main as plan

    flags = ["--num-layers", "8", "--hidden-size", "64", "--num-attention-heads", "4", "--seq-length", "32",
             "--max-position-embeddings", "32", "--position-embedding-type", "rope", "--no-rope-freq", freq,
             "--micro-batch-size", "1", "--global-batch-size", "2", "--vocab-size", "128", "--tokenizer-type",
             "NullTokenizer", "--mock-data"]
    assert plan(["dry-run", *flags, "--pipeline-model-parallel-size", "2", "--world-size", "2"]) == 0
    assert "worst stage: 0" in capsys.readouterr().out
    with pytest.raises(ConfigError, match="--no-rope-freq 3 must be a divisor of --num-layers 8"):
        plan(["dry-run", *flags, "--no-rope-freq", "3", "--world-size", "1"])  # the last value wins
