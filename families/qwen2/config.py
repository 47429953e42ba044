"""Qwen2 and Qwen2.5 (transformers' Qwen2ForCausalLM): Llama's blocks with biases on q, k and v alone, and with
use_sliding_window a window on the layers from max_window_layers on.
"""

from __future__ import annotations

from families.common.dense import (
    LLAMA_BLOCKS,
    DenseFamily,
    check_buildable,
    core_fields,
    core_settings,
    core_write,
    fixed_settings,
    without_derived_head_dim,
)
from families.common.fields import FolderValue, HFConfig
from families.common.qwen_windows import SLIDING_FIELDS, qwen_window_settings, qwen_window_write
from gpt.model_config import ModelConfig

MODEL_TYPE = "qwen2"
# Qwen2Config's defaults; it has no head_dim key, but Qwen2Attention reads one the file gives.
FIELDS = core_fields(*SLIDING_FIELDS, vocab_size=151936, intermediate_size=22016, num_key_value_heads=32,
                     max_position_embeddings=32768)
FIXED = {**LLAMA_BLOCKS, "add_qkv_bias": True}


def read(config: HFConfig) -> dict[str, FolderValue]:
    check_buildable(config, "Qwen2ForCausalLM")
    return {**core_settings(config, MODEL_TYPE), **fixed_settings(FIXED, MODEL_TYPE), **qwen_window_settings(config)}


def write(model: ModelConfig) -> dict:
    keys = {**core_write(model), **qwen_window_write(model)}
    return without_derived_head_dim(keys, model)


FAMILY = DenseFamily(
    model_type=MODEL_TYPE, architectures=("Qwen2ForCausalLM", "Qwen2Model"), config_class="Qwen2Config",
    fields=FIELDS, read=read, write=write, fixed=FIXED,
    layer_names=(("input_layernorm.weight", "input_layernorm.weight"),
                 ("post_attention_layernorm.weight", "post_attention_layernorm.weight")))
