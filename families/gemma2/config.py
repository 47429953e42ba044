"""Gemma 2 (transformers' models/gemma2/, Gemma2ForCausalLM): each block's norms on its sublayers' input and output
(input_layernorm, post_attention_layernorm, pre_feedforward_layernorm, post_feedforward_layernorm: --sublayer-norms
input_and_output), RMSNorms whose gain is 1 + weight in fp32 (Gemma2RMSNorm: --apply-layernorm-1p), a GeGLU MLP of
hidden_activation (gelu_pytorch_tanh: --gated-linear-unit --activation gelu_tanh), the token embeddings times
sqrt(hidden) in their dtype (Gemma2TextScaledWordEmbedding: --scale-embeddings-by-sqrt-hidden), scores scaled by
query_pre_attn_scalar^-0.5 (--softmax-scale) and soft-capped (attn_logit_softcapping: --attn-logit-softcapping),
logits soft-capped (final_logit_softcapping: --final-logit-softcapping), and a sliding window on every other layer
from the first (Gemma2Config's layer_types: `sliding_attention if (i + 1) % 2`). Bidirectional attention and
attention_bias are not built here: refused."""

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
# Gemma2Config's defaults (transformers/models/gemma2/configuration_gemma2.py)
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
