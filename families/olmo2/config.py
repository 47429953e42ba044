"""OLMo 2 (transformers' Olmo2ForCausalLM): Llama's projections with RMSNorms over the whole q and k projections and
norms on each sublayer's output inside the residual branch (--sublayer-norms output); attention_bias is refused.
"""

from __future__ import annotations

from families.common.dense import (
    LLAMA_BLOCKS,
    NO_WINDOW,
    DenseFamily,
    check_buildable,
    core_fields,
    core_settings,
    core_write,
    fixed_settings,
    without_derived_head_dim,
)
from families.common.fields import BOOLEAN, Field, FolderValue, HFConfig
from gpt.model_config import ModelConfig

MODEL_TYPE = "olmo2"
FIELDS = core_fields(Field("attention_bias", BOOLEAN, False), vocab_size=50304, intermediate_size=11008,
                     rms_norm_eps=1e-5)
FIXED = {**LLAMA_BLOCKS, **NO_WINDOW, "qk_layernorm": True, "qk_layernorm_over_projection": True, "sublayer_norms": "output"}


def read(config: HFConfig) -> dict[str, FolderValue]:
    check_buildable(config, "Olmo2ForCausalLM", bias_key=True)
    return {**core_settings(config, MODEL_TYPE), **fixed_settings(FIXED, MODEL_TYPE)}


def write(model: ModelConfig) -> dict:
    return without_derived_head_dim({**core_write(model), "attention_bias": False}, model)


FAMILY = DenseFamily(
    model_type=MODEL_TYPE, architectures=("Olmo2ForCausalLM", "Olmo2Model"), config_class="Olmo2Config",
    fields=FIELDS, read=read, write=write, fixed=FIXED,
    layer_names=(("attention_output_layernorm.weight", "post_attention_layernorm.weight"),
                 ("mlp_output_layernorm.weight", "post_feedforward_layernorm.weight"),
                 ("attention.q_layernorm.weight", "self_attn.q_norm.weight"),
                 ("attention.k_layernorm.weight", "self_attn.k_norm.weight")))
