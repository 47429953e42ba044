"""Mistral (transformers' MistralForCausalLM): Llama's blocks with one sliding_window over every layer (default 4096;
null is none), its W keys counting the query: --window-size W-1,0.
"""

from __future__ import annotations

from base.errors import ConfigError
from families.common.dense import (
    LLAMA_BLOCKS,
    DenseFamily,
    check_buildable,
    core_fields,
    core_settings,
    core_write,
    every_layer_or_none_windowed,
    fixed_settings,
    sliding_window_of,
    window_settings,
)
from families.common.fields import POSITIVE_INT, Field, FolderValue, HFConfig
from gpt.model_config import ModelConfig

MODEL_TYPE = "mistral"
# MistralConfig's defaults (transformers/models/mistral/configuration_mistral.py)
FIELDS = core_fields(Field("sliding_window", POSITIVE_INT, 4096, nullable=True), intermediate_size=14336,
                     num_key_value_heads=8, max_position_embeddings=131072)
FIXED = dict(LLAMA_BLOCKS)


def read(config: HFConfig) -> dict[str, FolderValue]:
    check_buildable(config, "MistralForCausalLM")
    if config.fields.get("layer_types") is not None:
        raise ConfigError(f"{config.path}: layer_types in a MistralForCausalLM: transformers' Mistral gives every "
                          f"layer its one sliding_window and does not read them")
    window = config.values["sliding_window"]
    return {**core_settings(config, MODEL_TYPE), **fixed_settings(FIXED, MODEL_TYPE),
            **window_settings(window, (True,) * config.num_layers, "sliding_window")}


def write(model: ModelConfig) -> dict:
    return {**core_write(model), "sliding_window": sliding_window_of(model)}


FAMILY = DenseFamily(
    model_type=MODEL_TYPE, architectures=("MistralForCausalLM", "MistralModel"), config_class="MistralConfig",
    fields=FIELDS, read=read, write=write, fixed=FIXED,
    needs=lambda model: every_layer_or_none_windowed(model, "MistralForCausalLM"),
    layer_names=(("input_layernorm.weight", "input_layernorm.weight"),
                 ("post_attention_layernorm.weight", "post_attention_layernorm.weight")))
