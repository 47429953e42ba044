"""Phi-3 (transformers' models/phi3/, Phi3ForCausalLM): Llama's blocks with q, k and v in one fused qkv_proj
([q; k; v] rows: Phi3Attention splits it at heads x head_dim and + groups x head_dim) and gate and up in one
gate_up_proj ([gate; up] rows: Phi3MLP's `gate, up_states = up_states.chunk(2, dim=-1)`), one sliding_window over
every layer (default none), rotary positions on the first partial_rotary_factor of each head's dims
(Phi3RotaryEmbedding: `int(head_dim * partial_rotary_factor)`: --rotary-percent), and dropouts on the residual
branches and the embedding (resid_pdrop, embd_pdrop: training regularisation, which --hidden-dropout sets here).
Its long-context rope_type "longrope" (Phi-3-mini-128k; "su" and "yarn" are older names Phi3Config reads as it) is
--position-embedding-type longrope with the --longrope-* settings (gpt/longrope.py): Megatron-LM has no flag for it,
so it is the folder's setting. The context that picks the short or long factors is the top-level
original_max_position_embeddings (Phi3Config's default 4096 where left out), which transformers' standardize_rope_params
puts over any rope_parameters value for a config class that has the attribute, as Phi3Config does. (transformers 5
raises a KeyError on an 'su' file: Phi3Config standardizes before renaming it, so that context never reaches
rope_parameters; transformers 4 read it as LongRoPE with the top-level context, and so does this module.)"""

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
# Phi3Config's defaults (transformers/models/phi3/configuration_phi3.py); partial_rotary_factor at the top level is
# an older file's place for it (transformers moves it into rope_parameters)
FIELDS = core_fields(
    Field("sliding_window", POSITIVE_INT, None, nullable=True),
    Field("original_max_position_embeddings", POSITIVE_INT, 4096), Field("resid_pdrop", PROBABILITY, 0.0),
    Field("embd_pdrop", PROBABILITY, 0.0), Field("partial_rotary_factor", ROTARY_FRACTION, None, nullable=True),
    vocab_size=32064, hidden_size=3072, intermediate_size=8192, max_position_embeddings=4096,
    rms_norm_eps=1e-5)
FIXED = {name: value for name, value in LLAMA_BLOCKS.items() if name not in ("rotary_percent", "position_embedding_type")}
# Phi3Config.convert_rope_params_to_dict: "For backward compatibility if previous version used "su" or "yarn"" it
# sets rope_type "longrope"; validate_rope takes "default" and "longrope" alone
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
    """Plain rotary, or LongRoPE (--position-embedding-type longrope) with the file's factor lists, the top-level
    original context, and its factor and attention_factor where it gives them (transformers derives them where it
    does not: gpt/longrope.py)."""
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
