"""--position-embedding-type longrope (gpt/longrope.py): its settings from the command line, what it is not built
with (one line each), and a resume that would change them. Its math against transformers' is
tests/checkpoint/test_hf_dense_families.py (a tiny Phi-3 folder, losses on both sides of the original context) and
tests/checkpoint/test_hf_family_tables.py (the released Phi-3-mini-128k's cos and sin)."""

from __future__ import annotations

import dataclasses
import json
import math

import pytest

from base.errors import ConfigError
from base.options import replace_settings, setting_values
from gpt.model_config import ModelConfig

# hidden 64 over 4 heads: 16 dims a head, 8 rotary frequencies
LONGROPE = dict(vocab_size=64, hidden_size=64, num_attention_heads=4, seq_length=32, max_position_embeddings=64,
                position_embedding_type="longrope", longrope_short_factor=(1.0,) * 8,
                longrope_long_factor=tuple(float(i + 1) for i in range(8)),
                longrope_original_max_position_embeddings=16)


def test_the_flags_set_it_and_the_default_attention_factor_is_transformers():
    from arguments.parser import parse_arguments

    factors = ",".join(str(i + 1) for i in range(8))
    model = parse_arguments(["--num-layers", "2", "--hidden-size", "64", "--num-attention-heads", "4",
                             "--seq-length", "32", "--max-position-embeddings", "64",
                             "--position-embedding-type", "longrope", "--longrope-short-factor", "1,1,1,1,1,1,1,1",
                             "--longrope-long-factor", factors,
                             "--longrope-original-max-position-embeddings", "16"]).config.model
    assert model.positions.longrope_long_factor == tuple(float(i + 1) for i in range(8))
    # _compute_longrope_parameters: factor = max_position_embeddings / original = 4
    assert model.longrope.attention_factor == math.sqrt(1 + math.log(4) / math.log(16))
    assert model.longrope.factors_for(16) == (1.0,) * 8 and model.longrope.factors_for(17)[-1] == 8.0
    explicit = replace_settings(model, longrope_factor=2.0)
    assert explicit.longrope.attention_factor == math.sqrt(1 + math.log(2) / math.log(16))
    assert replace_settings(model, longrope_attention_factor=1.5).longrope.attention_factor == 1.5


@pytest.mark.parametrize("settings, named", [
    (dict(longrope_short_factor=(1.0,) * 7), "--longrope-short-factor has 7 factors; LongRoPE takes one positive "
                                             "factor per rotary frequency, 8 here"),
    (dict(longrope_original_max_position_embeddings=None), "needs --longrope-original-max-position-embeddings"),
    (dict(rotary_interleaved=True), "--position-embedding-type longrope with --rotary-interleaved is not implemented"),
    (dict(use_rope_scaling=True), "--position-embedding-type longrope with --use-rope-scaling is not implemented"),
    (dict(position_embedding_type="rope"), "--longrope-short-factor, --longrope-long-factor, "
                                           "--longrope-original-max-position-embeddings set LongRoPE, which only"),
    (dict(multi_latent_attention=True), "--multi-latent-attention with --position-embedding-type longrope"),
])
def test_what_longrope_is_not_built_with_is_refused_in_one_line(settings, named):
    with pytest.raises(ConfigError) as error:
        ModelConfig.of(**{**LONGROPE, **settings}).validate()
    assert named in str(error.value) and "\n" not in str(error.value), str(error.value)


def test_a_resume_that_changes_the_factors_or_the_positions_they_read_is_named():
    """The recorded config keeps the factors as JSON lists; the same factors are no difference, other ones are, and
    so is --max-position-embeddings where it sets the attention factor."""
    from checkpoint.resume_model import model_differences
    from checkpoint.schema import recorded_model

    model = ModelConfig.of(**LONGROPE)
    recorded = json.loads(json.dumps(setting_values(model)))
    assert model_differences(recorded, model) == []
    assert recorded_model(recorded).longrope == model.longrope
    longer = replace_settings(model, longrope_long_factor=(2.0,) * 8)
    assert [line.split()[0] for line in model_differences(recorded, longer)] == ["--longrope-long-factor"]
    wider = dataclasses.replace(model, max_position_embeddings=128)
    assert [line.split()[0] for line in model_differences(recorded, wider)] == ["--max-position-embeddings"]
    given = replace_settings(wider, longrope_attention_factor=1.2)
    assert [line.split()[0] for line in model_differences({**recorded, "longrope_attention_factor": 1.2}, given)] == []


@pytest.mark.parametrize("seq_length, which", [(16, "within the original context (16), so every position takes the "
                                                    "short factors"),
                                               (17, "longer than the original context (16), so every position takes "
                                                    "the long factors")])
def test_the_start_says_which_factors_the_sequence_takes(seq_length, which):
    from arguments.config import PretrainConfig
    from training.run_settings import longrope_notes

    config = PretrainConfig()
    config = dataclasses.replace(config, model=ModelConfig.of(**{**LONGROPE, "seq_length": seq_length}))
    (note,) = longrope_notes(config.model)
    assert which in note and "\n" not in note
    assert longrope_notes(ModelConfig.of(vocab_size=64)) == ()
