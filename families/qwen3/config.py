"""Qwen3 (transformers' Qwen3ForCausalLM): Qwen2's blocks and windows without q/k/v biases, with per-head q/k RMSNorms
and an explicit head_dim (default 128); attention_bias is refused.
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
)
from families.common.fields import BOOLEAN, Field, FolderValue, HFConfig
from families.common.qwen_windows import SLIDING_FIELDS, qwen_window_settings, qwen_window_write
from gpt.model_config import ModelConfig

MODEL_TYPE = "qwen3"
FIELDS = core_fields(*SLIDING_FIELDS, Field("attention_bias", BOOLEAN, False), vocab_size=151936,
                     intermediate_size=22016, num_key_value_heads=32, head_dim=128, max_position_embeddings=32768)
FIXED = {**LLAMA_BLOCKS, "qk_layernorm": True}
QK_NORMS = (("attention.q_layernorm.weight", "self_attn.q_norm.weight"),
            ("attention.k_layernorm.weight", "self_attn.k_norm.weight"))


def read(config: HFConfig) -> dict[str, FolderValue]:
    check_buildable(config, "Qwen3ForCausalLM", bias_key=True)
    return {**core_settings(config, MODEL_TYPE), **fixed_settings(FIXED, MODEL_TYPE), **qwen_window_settings(config)}


def write(model: ModelConfig) -> dict:
    return {**core_write(model), **qwen_window_write(model), "attention_bias": False}


FAMILY = DenseFamily(
    model_type=MODEL_TYPE, architectures=("Qwen3ForCausalLM", "Qwen3Model"), config_class="Qwen3Config",
    fields=FIELDS, read=read, write=write, fixed=FIXED,
    layer_names=(("input_layernorm.weight", "input_layernorm.weight"),
                 ("post_attention_layernorm.weight", "post_attention_layernorm.weight"), *QK_NORMS))
