"""The dense families' config.json field tables (families/): each default is transformers' own (the
config class's dataclass default, transformers 5), the windows and rotary each family derives are the layer_types
and rope_parameters transformers derives from the same file, and a field that changes the math and is not built
is refused in one line naming it."""

from __future__ import annotations

import dataclasses
import json

import pytest

from arguments.hf_config import read_hf_config
from arguments.hf_folder import architecture_settings
from base.errors import ConfigError
from families.registry import FAMILIES

SINGLE_MODEL_FAMILIES = sorted(name for name, family in FAMILIES.items() if family.section is None)


@pytest.mark.parametrize("model_type", SINGLE_MODEL_FAMILIES)
def test_every_default_is_transformers(model_type):
    import transformers

    family = FAMILIES[model_type]
    theirs = {field.name: field.default for field in dataclasses.fields(getattr(transformers, family.config_class))}
    read_here = {spec.key: spec.default for spec in family.fields}
    # keys an older file carries that transformers moves elsewhere (rope_theta, rope_scaling, Phi-3's top-level
    # partial_rotary_factor, Gemma 3's rope_local_base_freq and sliding_window_pattern) have no dataclass field
    # (the token ids are checked for their kind only: the run's tokenizer decides them)
    compared = {key: default for key, default in read_here.items()
                if key in theirs and key not in ("bos_token_id", "eos_token_id", "pad_token_id")}
    assert len(compared) >= 10, sorted(compared)
    for key, default in compared.items():
        if key == "rope_parameters":
            continue  # None there too; the family's rotary is read from it (below)
        assert default == theirs[key], (model_type, key, default, theirs[key])


def _folder(tmp_path, model_type: str, **fields):
    (tmp_path / "config.json").write_text(json.dumps({"model_type": model_type, "num_hidden_layers": 12, **fields}))
    return tmp_path


@pytest.mark.parametrize("model_type, fields", [
    ("gemma2", {}), ("gemma3_text", {}), ("gemma3_text", {"sliding_window_pattern": 4}),
    ("qwen2", {"use_sliding_window": True, "max_window_layers": 5, "sliding_window": 64}),
    ("qwen3", {"layer_types": ["full_attention"] * 6 + ["sliding_attention"] * 6, "use_sliding_window": True}),
    ("mistral", {"sliding_window": 32}), ("phi3", {"sliding_window": 2047}),
])
def test_the_windowed_layers_are_transformers_layer_types(tmp_path, model_type, fields):
    from transformers import AutoConfig

    folder = _folder(tmp_path, model_type, **fields)
    model = architecture_settings(read_hf_config(folder))
    theirs = AutoConfig.from_pretrained(str(folder))
    window = theirs.sliding_window
    kinds = getattr(theirs, "layer_types", None) or ["sliding_attention" if window else "full_attention"] * 12
    from gpt.attention_window import layer_windows

    ours = layer_windows(model["window_size"].value, model["window_attn_skip_freq"].value, 12)
    assert ours == tuple(window - 1 if kind == "sliding_attention" and window else None for kind in kinds)


def test_gemma3s_rotary_is_transformers_per_kind_of_layer(tmp_path):
    """The older file's rope_theta, rope_scaling and rope_local_base_freq as Gemma3TextConfig moves them into
    rope_parameters (convert_rope_params_to_dict): the full layers' theta and linear factor, the sliding layers'
    base."""
    from transformers import AutoConfig

    folder = _folder(tmp_path, "gemma3_text", rope_theta=1e6, rope_local_base_freq=1e4,
                     rope_scaling={"factor": 8.0, "rope_type": "linear"})
    ours = architecture_settings(read_hf_config(folder))
    theirs = AutoConfig.from_pretrained(str(folder)).rope_parameters
    assert ours["rotary_base"].value == theirs["full_attention"]["rope_theta"] == 1e6
    assert ours["rotary_seq_len_interpolation_factor"].value == theirs["full_attention"]["factor"] == 8.0
    assert ours["local_rotary_base"].value == theirs["sliding_attention"]["rope_theta"] == 1e4


def test_phi_3_mini_128ks_longrope_is_transformers_cos_and_sin_on_both_sides_of_its_original_context(tmp_path):
    """The released Phi-3-mini-128k config.json ('su' scaling) read here: our cos and sin (gpt/longrope.py, from the
    settings the folder gives) equal Phi3RotaryEmbedding's, bitwise, at 4096 positions (the original context: short
    factors) and 4097 (long factors), attention factor included. transformers 5 raises a KeyError on the 'su' file
    itself (Phi3Config standardizes rope_parameters before renaming 'su' to 'longrope', so the original context is
    never moved in): it is given the same file with 'longrope' written, which reads the same here."""
    import torch
    from transformers import AutoConfig
    from transformers.models.phi3.modeling_phi3 import Phi3RotaryEmbedding

    from gpt.model_config import ModelConfig
    from tests.checkpoint.test_released_hf_configs import FIXTURES

    folder = FIXTURES / "phi-3-mini-128k-instruct"
    settings = {name: given.value for name, given in architecture_settings(read_hf_config(folder)).items()}
    renamed = json.loads((folder / "config.json").read_text())
    assert renamed["rope_scaling"]["type"] == "su"
    renamed["rope_scaling"]["type"] = "longrope"
    (tmp_path / "config.json").write_text(json.dumps(renamed))
    assert {name: given.value for name, given in architecture_settings(read_hf_config(tmp_path)).items()} == settings
    model = ModelConfig.of(**settings, seq_length=64)
    model.validate()
    theirs = Phi3RotaryEmbedding(AutoConfig.from_pretrained(str(tmp_path)))
    for length in (4096, 4097):
        cos, sin = theirs(torch.zeros(1, dtype=torch.float32), torch.arange(length)[None])
        ours = model.longrope.angles(length, model.head_dim, model.positions.rotary_base, torch.device("cpu"))
        assert model.longrope.factors_for(length) == (settings["longrope_long_factor"] if length > 4096 else
                                                      settings["longrope_short_factor"])
        assert torch.equal(ours[0], cos[0]) and torch.equal(ours[1], sin[0]), length
    assert model.longrope.attention_factor == theirs.attention_scaling != 1.0


@pytest.mark.parametrize("rope_type, top_level", [("longrope", {"original_max_position_embeddings": 16}),
                                                   ("yarn", {"original_max_position_embeddings": 16}), ("longrope", {})])
def test_a_phi3_longrope_is_read_as_phi3config_reads_it(tmp_path, rope_type, top_level):
    """Phi3Config reads rope_type 'yarn' as 'longrope', and the top-level original_max_position_embeddings (its
    default 4096 where the file has none) over the one inside rope_scaling."""
    from transformers import AutoConfig

    rope = {"rope_type": rope_type, "short_factor": [1.5] * 48, "long_factor": [3.0] * 48,
            "original_max_position_embeddings": 8, "attention_factor": 1.25}
    folder = _folder(tmp_path, "phi3", max_position_embeddings=64, rope_scaling=rope, **top_level)
    ours = architecture_settings(read_hf_config(folder))
    theirs = AutoConfig.from_pretrained(str(folder)).rope_parameters
    assert ours["position_embedding_type"].value == theirs["rope_type"] == "longrope"
    assert ours["longrope_original_max_position_embeddings"].value == theirs["original_max_position_embeddings"] \
        == top_level.get("original_max_position_embeddings", 4096)
    assert list(ours["longrope_short_factor"].value) == theirs["short_factor"]
    assert list(ours["longrope_long_factor"].value) == theirs["long_factor"]
    assert ours["longrope_attention_factor"].value == theirs["attention_factor"] == 1.25


@pytest.mark.parametrize("model_type, fields, words", [
    ("qwen3", {"attention_bias": True}, "attention_bias true"),
    ("olmo2", {"attention_bias": True}, "attention_bias true"),
    ("gemma2", {"use_bidirectional_attention": True}, "use_bidirectional_attention true"),
    ("gemma2", {"hidden_activation": "relu"}, "hidden_activation 'relu'"),
    ("phi3", {"rope_scaling": {"type": "longrope", "short_factor": [1.0] * 64}}, "'longrope' needs long_factor"),
    ("phi3", {"rope_scaling": {"rope_type": "linear", "factor": 2.0}}, "Phi3Config takes 'default' or 'longrope'"),
    ("mistral", {"rope_scaling": {"rope_type": "longrope", "long_factor": [1.0] * 64, "short_factor": [1.0] * 64}},
     "rope_type 'longrope' is not built here for this family (Phi-3's is)"),
    ("qwen2", {"layer_types": ["chunked_attention"] * 12}, "layer_types holds 'chunked_attention'"),
    ("mistral", {"rope_parameters": {"rope_type": "default", "partial_rotary_factor": 0.5}},
     "partial_rotary_factor 0.5"),
    ("gemma3_text", {"query_pre_attn_scalar": 168.0}, "query_pre_attn_scalar is 168.0; it must be a positive integer"),
])
def test_a_field_that_changes_the_math_and_is_not_built_is_refused_in_one_line(tmp_path, model_type, fields, words):
    with pytest.raises(ConfigError) as error:
        architecture_settings(read_hf_config(_folder(tmp_path, model_type, **fields)))
    assert words in str(error.value) and "\n" not in str(error.value), str(error.value)


# the families read before issue 63's modules (arguments/hf_config.py) and the MoE ones (FAMILY_READERS) beside them
# (Apertus's reader leaves a head_dim key out, which ApertusAttention's getattr would take: not compared here)
READ_ELSEWHERE = ["llama", "mixtral", "qwen2_moe", "qwen3_moe", "olmoe", "glm4_moe", "gpt_oss",
                  "granitemoeshared"]


@pytest.mark.parametrize("model_type", SINGLE_MODEL_FAMILIES + READ_ELSEWHERE)
@pytest.mark.parametrize("head_dim", [16, None])
def test_heads_that_do_not_divide_hidden_are_read_where_transformers_reads_them(tmp_path, model_type, head_dim):
    """hidden_size 64 over 6 heads (GLM-4.5-Air's 4096 over 96 heads of 128, in small): Llama's and Gemma 2's and
    3's config classes refuse it (validate_architecture), and so does the read here, in one line; the others take
    head_dim, else hidden_size // heads (each attention's `getattr(config, "head_dim", None) or hidden // heads`), and
    so do we, as --kv-channels."""
    from transformers import AutoConfig

    folder = _folder(tmp_path, model_type, hidden_size=64, num_attention_heads=6, num_key_value_heads=2,
                     **({"head_dim": head_dim} if head_dim else {}))
    try:
        theirs = AutoConfig.from_pretrained(str(folder))
    except Exception:  # transformers' strict dataclass validation
        with pytest.raises(ConfigError, match="hidden_size 64 is not a multiple of num_attention_heads 6"):
            read_hf_config(folder)
        assert model_type in ("llama", "gemma2", "gemma3_text")
        return
    width = architecture_settings(read_hf_config(folder))["kv_channels"]
    assert getattr(width, "value", width) == (getattr(theirs, "head_dim", None) or 64 // 6)
