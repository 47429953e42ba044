"""Phi-3 (transformers' Phi3ForCausalLM): Llama's blocks with fused qkv_proj and gate_up_proj, one sliding window over
every layer, partial rotary (--rotary-percent) and, for the long-context models, LongRoPE with its factor lists, its
context the top-level original_max_position_embeddings (as transformers 4 read an 'su' file).
"""

from __future__ import annotations

import dataclasses

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
    rope_key,
    sliding_window_of,
    window_settings,
    without_derived_head_dim,
)
from families.common.fields import POSITIVE_INT, PROBABILITY, ROTARY_FRACTION, Field, FolderValue, HFConfig
from gpt.model_config import ModelConfig
from gpt.positions import LONGROPE_SETTINGS

MODEL_TYPE = "phi3"
# Phi3Config's defaults; a top-level partial_rotary_factor is an older file's place for it.
FIELDS = core_fields(
    Field("sliding_window", POSITIVE_INT, None, nullable=True),
    Field("original_max_position_embeddings", POSITIVE_INT, 4096), Field("resid_pdrop", PROBABILITY, 0.0),
    Field("embd_pdrop", PROBABILITY, 0.0), Field("partial_rotary_factor", ROTARY_FRACTION, None, nullable=True),
    vocab_size=32064, hidden_size=3072, intermediate_size=8192, max_position_embeddings=4096,
    rms_norm_eps=1e-5)
FIXED = {name: value for name, value in LLAMA_BLOCKS.items() if name not in ("rotary_percent", "position_embedding_type")}
# Phi3Config reads "su" and "yarn" as "longrope".
LONGROPE_NAMES = ("longrope", "su", "yarn")
POSITIONS = ("rope", "longrope")  # --position-embedding-type a Phi3ForCausalLM has


def read(config: HFConfig) -> dict[str, FolderValue]:
    check_buildable(config, "Phi3ForCausalLM")
    rope = config.rope
    if rope.rope_type not in ("default", *LONGROPE_NAMES):
        raise ConfigError(f"{config.path}: {rope_key(config)} rope_type {rope.rope_type!r}: Phi3Config takes "
                          f"'default' or 'longrope' (its validate_rope; 'su' and 'yarn' are read as 'longrope')")
    longrope = rope.rope_type in LONGROPE_NAMES
    plain = dataclasses.replace(config, rope=dataclasses.replace(rope, rope_type="default")) if longrope else config
    factor, key = rope.partial_rotary_factor, "rope_parameters.partial_rotary_factor"
    if config.values["partial_rotary_factor"] is not None and "partial_rotary_factor" not in \
            (config.fields.get("rope_parameters") or {}):
        factor, key = float(config.values["partial_rotary_factor"]), "partial_rotary_factor"
    return {**core_settings(plain, MODEL_TYPE, partial_rotary=True), **fixed_settings(FIXED, MODEL_TYPE),
            "rotary_percent": FolderValue(factor, key), **position_settings(config, longrope),
            **window_settings(config.values["sliding_window"], (True,) * config.num_layers, "sliding_window")}


def position_settings(config: HFConfig, longrope: bool) -> dict[str, FolderValue]:
    """Plain rotary, or LongRoPE with the file's factors, the top-level original context, and its factor and
    attention_factor where given."""
    v, rope, key = FolderValue, config.rope, rope_key(config)
    if not longrope:
        return {"position_embedding_type": v("rope", f"{key}.rope_type"),
                **{name: v(None, f"{key}.rope_type") for name in LONGROPE_SETTINGS}}
    missing = [name for name in ("short_factor", "long_factor") if getattr(rope, name) is None]
    if missing:  # _compute_longrope_parameters indexes both
        raise ConfigError(f"{config.path}: {key} rope_type {rope.rope_type!r} needs {' and '.join(missing)} "
                          f"(LongRoPE's factor per rotary frequency)")
    original = "original_max_position_embeddings" if "original_max_position_embeddings" in config.fields else \
        "original_max_position_embeddings (Phi3Config's default)"
    return {"position_embedding_type": v("longrope", f"{key}.rope_type {rope.rope_type!r}"),
            "longrope_short_factor": v(rope.short_factor, f"{key}.short_factor"),
            "longrope_long_factor": v(rope.long_factor, f"{key}.long_factor"),
            "longrope_original_max_position_embeddings": v(config.values["original_max_position_embeddings"], original),
            "longrope_factor": v(rope.factor, f"{key}.factor"),
            "longrope_attention_factor": v(rope.attention_factor, f"{key}.attention_factor")}


def write(model: ModelConfig) -> dict:
    keys = {**core_write(model), "sliding_window": sliding_window_of(model), "resid_pdrop": model.hidden_dropout,
            "embd_pdrop": model.hidden_dropout}
    keys = without_derived_head_dim(keys, model)
    keys["rope_parameters"] = {**keys["rope_parameters"], "partial_rotary_factor": model.positions.rotary_percent}
    if model.positions.position_embedding_type == "longrope":
        original = model.positions.longrope_original_max_position_embeddings
        keys["original_max_position_embeddings"] = original  # the top level's is the one Phi3Config reads
        keys["rope_parameters"].update(
            rope_type="longrope", short_factor=list(model.positions.longrope_short_factor),
            long_factor=list(model.positions.longrope_long_factor), original_max_position_embeddings=original,
            **{name: value for name, value in (("factor", model.positions.longrope_factor),
                                               ("attention_factor", model.positions.longrope_attention_factor))
               if value is not None})
    return keys


def needs(model: ModelConfig) -> dict[str, bool]:
    return {**every_layer_or_none_windowed(model, "Phi3ForCausalLM"),
            "--position-embedding-type rope or longrope": model.positions.position_embedding_type not in POSITIONS}


FAMILY = DenseFamily(
    model_type=MODEL_TYPE, architectures=("Phi3ForCausalLM", "Phi3Model"), config_class="Phi3Config",
    fields=FIELDS, read=read, write=write, fixed=FIXED,
    needs=needs,
    layer_names=(("input_layernorm.weight", "input_layernorm.weight"),
                 ("post_attention_layernorm.weight", "post_attention_layernorm.weight")),
    fused_qkv="self_attn.qkv_proj", fused_gate_up="mlp.gate_up_proj")
