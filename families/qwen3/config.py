"""Qwen3 (transformers' models/qwen3/, Qwen3ForCausalLM): Qwen2's blocks and windows without the q/k/v biases, with
RMSNorms over each query and key head before rotary (Qwen3Attention's q_norm, k_norm: --qk-layernorm) and an
explicit head_dim (Qwen3Config's default 128, whatever hidden / heads is: --kv-channels). attention_bias would put
a bias on q, k, v and o with none in the MLP, which --disable-bias-linear / --add-qkv-bias cannot say: refused."""

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
# Qwen3Config's defaults (transformers/models/qwen3/configuration_qwen3.py)
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
