"""Qwen2 and Qwen2.5 (transformers' models/qwen2/, Qwen2ForCausalLM): Llama's blocks with a bias on q, k and v alone
(Qwen2Attention: q_proj, k_proj, v_proj bias=True, o_proj bias=False: --add-qkv-bias --disable-bias-linear), and,
with use_sliding_window, a window on the layers from max_window_layers on (Qwen2Config.__post_init__'s
layer_types: `sliding_attention if self.sliding_window is not None and i >= self.max_window_layers`; its
sliding_window is None without use_sliding_window)."""

from __future__ import annotations

from families.common.dense import (
    LAYER_TYPES,
    LLAMA_BLOCKS,
    SLIDING,
    DenseFamily,
    check_buildable,
    checked_layer_types,
    core_fields,
    core_settings,
    core_write,
    fixed_settings,
    layer_types_of,
    sliding_window_of,
    window_settings,
    without_derived_head_dim,
)
from families.common.fields import BOOLEAN, INTEGER, POSITIVE_INT, Field, FolderValue, HFConfig
from gpt.model_config import ModelConfig

MODEL_TYPE = "qwen2"
# Qwen2's and Qwen3's window keys (Qwen2Config, Qwen3Config)
SLIDING_FIELDS = (Field("use_sliding_window", BOOLEAN, False), Field("sliding_window", POSITIVE_INT, 4096, nullable=True),
                  Field("max_window_layers", INTEGER, 28), LAYER_TYPES)
# Qwen2Config's defaults (transformers/models/qwen2/configuration_qwen2.py); it has no head_dim, attention_bias,
# mlp_bias or pretraining_tp (Qwen2Attention reads a head_dim the file gives)
FIELDS = core_fields(*SLIDING_FIELDS, vocab_size=151936, intermediate_size=22016, num_key_value_heads=32,
                     max_position_embeddings=32768)
FIXED = {**LLAMA_BLOCKS, "add_qkv_bias": True}


def windowed_layers(config: HFConfig) -> tuple[tuple[bool, ...], object]:
    """(which layers have the window, transformers' sliding_window) as Qwen2Config.__post_init__ and
    Qwen2Attention take them (`self.sliding_window = config.sliding_window if layer_types[i] == "sliding_attention"
    else None`)."""
    values = config.values
    window = values["sliding_window"] if values["use_sliding_window"] else None
    kinds = checked_layer_types(config)
    if kinds is None:
        kinds = [SLIDING if window is not None and layer >= values["max_window_layers"] else "full_attention"
                 for layer in range(config.num_layers)]
    return tuple(kind == SLIDING and window is not None for kind in kinds), window


def qwen_window_settings(config: HFConfig) -> dict[str, FolderValue]:
    windowed, window = windowed_layers(config)
    return window_settings(window, windowed, "use_sliding_window, sliding_window, max_window_layers, layer_types")


def read(config: HFConfig) -> dict[str, FolderValue]:
    check_buildable(config, "Qwen2ForCausalLM")
    return {**core_settings(config, MODEL_TYPE), **fixed_settings(FIXED, MODEL_TYPE), **qwen_window_settings(config)}


def qwen_window_write(model: ModelConfig) -> dict:
    """Qwen2's and Qwen3's window keys for our windows: use_sliding_window, and the layer_types of each layer (any
    pattern; transformers reads layer_types when given)."""
    window = sliding_window_of(model)
    return dict(use_sliding_window=window is not None, sliding_window=window, max_window_layers=model.num_layers,
                layer_types=layer_types_of(model))


def write(model: ModelConfig) -> dict:
    keys = {**core_write(model), **qwen_window_write(model)}
    return without_derived_head_dim(keys, model)


FAMILY = DenseFamily(
    model_type=MODEL_TYPE, architectures=("Qwen2ForCausalLM", "Qwen2Model"), config_class="Qwen2Config",
    fields=FIELDS, read=read, write=write, fixed=FIXED,
    layer_names=(("input_layernorm.weight", "input_layernorm.weight"),
                 ("post_attention_layernorm.weight", "post_attention_layernorm.weight")))
