"""The transformers config fields every MoE family's export writes the same way (families/<name>/weights.py):
sizes, norms, rotary positions, the output layer's tie, and our end-of-document id as BOS and EOS."""

from __future__ import annotations

from typing import Optional

from families.common.layout import rope_parameters
from gpt.model_config import ModelConfig


def common_fields(config: ModelConfig, eod_token_id: Optional[int]) -> dict:
    return dict(bos_token_id=eod_token_id, eos_token_id=eod_token_id, pad_token_id=None,
                vocab_size=config.vocab_size, hidden_size=config.hidden_size, num_hidden_layers=config.num_layers,
                num_attention_heads=config.num_attention_heads,
                num_key_value_heads=config.attention.query_groups(config.num_attention_heads),
                max_position_embeddings=config.max_position_embeddings, rms_norm_eps=config.norms.layernorm_epsilon,
                rope_parameters=rope_parameters(config), hidden_act="silu",
                tie_word_embeddings=not config.output.untie_embeddings_and_output_weights,
                attention_dropout=config.attention.attention_dropout, initializer_range=config.init_method_std)
