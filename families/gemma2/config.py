"""Gemma 2 (transformers' Gemma2ForCausalLM): sandwich norms (--sublayer-norms input_and_output) whose gain is 1 +
weight, a tanh-GeGLU MLP, scaled embeddings, query_pre_attn_scalar scaling, attention and final-logit soft-capping, and
a sliding window on every other layer. Bidirectional attention and attention_bias are refused.
"""

from __future__ import annotations

from families.common.dense import (
    DenseFamily,
    core_settings,
    fixed_settings,
)
from families.common.fields import POSITIVE_INT, POSITIVE_NUMBER, Field, FolderValue, HFConfig
from families.common.gemma import (
    GEMMA_BLOCKS,
    GEMMA_CARRIES,
    GEMMA_NORMS,
    gemma_fields,
    gemma_needs,
    gemma_settings,
    gemma_typed,
    gemma_write,
)

MODEL_TYPE = "gemma2"
FIELDS = gemma_fields(Field("sliding_window", POSITIVE_INT, 4096, nullable=True),
                      Field("final_logit_softcapping", POSITIVE_NUMBER, 30.0, nullable=True),
                      Field("attn_logit_softcapping", POSITIVE_NUMBER, 50.0, nullable=True),
                      vocab_size=256000, hidden_size=2304, intermediate_size=9216, num_hidden_layers=26,
                      num_attention_heads=8, num_key_value_heads=4, head_dim=256, max_position_embeddings=8192,
                      tie_word_embeddings=True)
FIXED = {name: value for name, value in GEMMA_BLOCKS.items()
         if name not in ("softmax_scale", "attn_logit_softcapping", "final_logit_softcapping")}
def read(config: HFConfig) -> dict[str, FolderValue]:
    return {**core_settings(config, MODEL_TYPE), **fixed_settings(FIXED, MODEL_TYPE),
            **gemma_settings(config, MODEL_TYPE, pattern=2)}


FAMILY = DenseFamily(
    model_type=MODEL_TYPE, architectures=("Gemma2ForCausalLM", "Gemma2Model"), config_class="Gemma2Config",
    fields=FIELDS, read=read, write=gemma_write, fixed=FIXED, needs=gemma_needs, carries=GEMMA_CARRIES,
    typed=gemma_typed, layer_names=GEMMA_NORMS)
