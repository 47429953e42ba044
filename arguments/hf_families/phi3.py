"""Phi-3 (transformers' models/phi3/, Phi3ForCausalLM): Llama's blocks with q, k and v in one fused qkv_proj
([q; k; v] rows: Phi3Attention splits it at heads x head_dim and + groups x head_dim) and gate and up in one
gate_up_proj ([gate; up] rows: Phi3MLP's `gate, up_states = up_states.chunk(2, dim=-1)`), one sliding_window over
every layer (default none), rotary positions on the first partial_rotary_factor of each head's dims
(Phi3RotaryEmbedding: `int(head_dim * partial_rotary_factor)`: --rotary-percent), and dropouts on the residual
branches and the embedding (resid_pdrop, embd_pdrop: training regularisation, which --hidden-dropout sets here).
Its long-context "longrope" scaling (Phi-3-mini-128k) is not built here: refused."""

from __future__ import annotations

from arguments.hf_families.dense import (
    LLAMA_BLOCKS,
    DenseFamily,
    check_buildable,
    core_fields,
    core_settings,
    core_write,
    every_layer_or_none_windowed,
    fixed_settings,
    sliding_window_of,
    window_settings,
    without_derived_head_dim,
)
from arguments.hf_fields import POSITIVE_INT, PROBABILITY, ROTARY_FRACTION, Field, FolderValue, HFConfig
from gpt.model_config import ModelConfig

MODEL_TYPE = "phi3"
# Phi3Config's defaults (transformers/models/phi3/configuration_phi3.py); partial_rotary_factor at the top level is
# an older file's place for it (transformers moves it into rope_parameters)
FIELDS = core_fields(
    Field("sliding_window", POSITIVE_INT, None, nullable=True),
    Field("original_max_position_embeddings", POSITIVE_INT, 4096), Field("resid_pdrop", PROBABILITY, 0.0),
    Field("embd_pdrop", PROBABILITY, 0.0), Field("partial_rotary_factor", ROTARY_FRACTION, None, nullable=True),
    vocab_size=32064, hidden_size=3072, intermediate_size=8192, max_position_embeddings=4096,
    rms_norm_eps=1e-5)
FIXED = {name: value for name, value in LLAMA_BLOCKS.items() if name != "rotary_percent"}


def read(config: HFConfig) -> dict[str, FolderValue]:
    check_buildable(config, "Phi3ForCausalLM")
    factor, key = config.rope.partial_rotary_factor, "rope_parameters.partial_rotary_factor"
    if config.values["partial_rotary_factor"] is not None and "partial_rotary_factor" not in \
            (config.fields.get("rope_parameters") or {}):
        factor, key = float(config.values["partial_rotary_factor"]), "partial_rotary_factor"
    return {**core_settings(config, MODEL_TYPE, partial_rotary=True), **fixed_settings(FIXED, MODEL_TYPE),
            "rotary_percent": FolderValue(factor, key),
            **window_settings(config.values["sliding_window"], (True,) * config.num_layers, "sliding_window")}


def write(model: ModelConfig) -> dict:
    keys = {**core_write(model), "sliding_window": sliding_window_of(model), "resid_pdrop": model.hidden_dropout,
            "embd_pdrop": model.hidden_dropout}
    keys = without_derived_head_dim(keys, model)
    keys["rope_parameters"] = {**keys["rope_parameters"], "partial_rotary_factor": model.rotary_percent}
    return keys


FAMILY = DenseFamily(
    model_type=MODEL_TYPE, architectures=("Phi3ForCausalLM", "Phi3Model"), config_class="Phi3Config",
    fields=FIELDS, read=read, write=write, fixed=FIXED,
    needs=lambda model: every_layer_or_none_windowed(model, "Phi3ForCausalLM"),
    layer_names=(("input_layernorm.weight", "input_layernorm.weight"),
                 ("post_attention_layernorm.weight", "post_attention_layernorm.weight")),
    fused_qkv="self_attn.qkv_proj", fused_gate_up="mlp.gate_up_proj")
