"""Gemma 3 (transformers' Gemma3ForCausalLM, model_type gemma3_text): Gemma 2's blocks without soft-capping, with
per-head q/k RMSNorms, five sliding layers to each full one, and a rotary base per kind of layer (--local-rotary-base
for the sliding ones). A multimodal folder's text_config is read as this model; its vision tower is not.
"""

from __future__ import annotations

from base.errors import ConfigError
from families.common.dense import (
    FULL,
    SLIDING,
    DenseFamily,
    core_settings,
    fixed_settings,
    rope_parameters,
    rotary_settings,
)
from families.common.fields import POSITIVE_INT, POSITIVE_NUMBER, Field, FolderValue, HFConfig, rope_object
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
from gpt.model_config import ModelConfig

MODEL_TYPE = "gemma3_text"
# Gemma3TextConfig's defaults; default_theta is 1e6 for full layers, 1e4 for sliding ones.
FIELDS = gemma_fields(Field("sliding_window", POSITIVE_INT, 4096, nullable=True),
                      Field("final_logit_softcapping", POSITIVE_NUMBER, None, nullable=True),
                      Field("attn_logit_softcapping", POSITIVE_NUMBER, None, nullable=True),
                      Field("rope_local_base_freq", POSITIVE_NUMBER, 10000.0),
                      Field("sliding_window_pattern", POSITIVE_INT, 6),
                      vocab_size=262208, hidden_size=2304, intermediate_size=9216, num_hidden_layers=26,
                      num_attention_heads=8, num_key_value_heads=4, head_dim=256, max_position_embeddings=131072,
                      tie_word_embeddings=True, rope_theta=1000000.0, bidirectional_default=False)
FIXED = {name: value for name, value in GEMMA_BLOCKS.items()
         if name not in ("softmax_scale", "attn_logit_softcapping", "final_logit_softcapping", "local_rotary_base")}
FIXED["qk_layernorm"] = True
QK_NORMS = (("attention.q_layernorm.weight", "self_attn.q_norm.weight"),
            ("attention.k_layernorm.weight", "self_attn.k_norm.weight"))


def _rotary(config: HFConfig) -> dict[str, FolderValue]:
    """Each kind of layer's rope_parameters as Gemma3TextConfig.convert_rope_params_to_dict builds them."""
    fields, values = config.fields, config.values
    per_kind = fields.get("rope_parameters")
    if isinstance(per_kind, dict) and set(per_kind) <= {FULL, SLIDING} and per_kind:
        full, sliding = dict(per_kind.get(FULL) or {}), dict(per_kind.get(SLIDING) or {})
        where = "rope_parameters"
    elif per_kind is None:
        full = {"rope_type": "default", **(fields.get("rope_scaling") or {})}
        sliding = {"rope_type": "default", "rope_theta": values["rope_local_base_freq"]}
        where = "rope_scaling"
    else:
        raise ConfigError(f"{config.path}: rope_parameters of a Gemma 3 holds one object per kind of layer "
                          f"({FULL!r}, {SLIDING!r})")
    for kind in (full, sliding):
        if not isinstance(kind, dict):
            raise ConfigError(f"{config.path}: each of {where}'s objects must be a JSON object")
    full_rope = rope_object(full, values["rope_theta"], config.path, f"{where}.{FULL}" if where != "rope_scaling"
                            else where)
    local_rope = rope_object(sliding, values["rope_local_base_freq"], config.path, f"{where}.{SLIDING}")
    if local_rope.rope_type != "default" or local_rope.partial_rotary_factor != 1.0:
        raise ConfigError(f"{config.path}: {where}.{SLIDING} rope_type {local_rope.rope_type!r}: the sliding layers' "
                          f"rotary here is unscaled ('default', every dim)")
    origin = f"{where}.{FULL}" if where != "rope_scaling" else "rope_theta, rope_scaling"
    settings = rotary_settings(full_rope, config, where=origin)
    return {**settings, "local_rotary_base": FolderValue(local_rope.theta, f"{where}.{SLIDING}.rope_theta" if
                                                         where != "rope_scaling" else "rope_local_base_freq")}


def read(config: HFConfig) -> dict[str, FolderValue]:
    pattern = config.fields.get("_sliding_window_pattern", config.values["sliding_window_pattern"])
    if not POSITIVE_INT.accepts(pattern):
        raise ConfigError(f"{config.path}: _sliding_window_pattern is {pattern!r}; it must be a positive integer")
    return {**core_settings(config, MODEL_TYPE, rotary=False), **fixed_settings(FIXED, MODEL_TYPE), **_rotary(config),
            **gemma_settings(config, MODEL_TYPE, pattern=pattern)}


def write(model: ModelConfig) -> dict:
    local = model.positions.local_rotary_base
    return {**gemma_write(model),
            "rope_parameters": {FULL: rope_parameters(model),
                                SLIDING: rope_parameters(model, base=local, scaled=False) if local is not None
                                else rope_parameters(model)}}


FAMILY = DenseFamily(
    model_type=MODEL_TYPE, architectures=("Gemma3ForCausalLM", "Gemma3TextModel"), config_class="Gemma3TextConfig",
    fields=FIELDS, read=read, write=write, fixed=FIXED, needs=gemma_needs, carries=GEMMA_CARRIES,
    typed=gemma_typed, layer_names=(*GEMMA_NORMS, *QK_NORMS))

# The multimodal folder: the same model in its text_config.
MULTIMODAL = DenseFamily(
    model_type="gemma3", architectures=("Gemma3ForConditionalGeneration",), config_class="Gemma3TextConfig",
    fields=FIELDS, read=lambda config: {**read(config), "hf_model_type": FolderValue(MODEL_TYPE, "text_config")},
    write=write, fixed=FIXED, needs=gemma_needs, carries=GEMMA_CARRIES, typed=gemma_typed, layer_names=FAMILY.layer_names,
    section="text_config")
