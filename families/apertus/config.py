"""Apertus's config.json (transformers' ApertusForCausalLM, swiss-ai's): a Llama with xIELU in an ungated MLP and
per-head q/k RMSNorms."""

from __future__ import annotations

import dataclasses

from base.errors import ConfigError
from families.common.fields import (
    LLAMA_FIELDS,
    NAME,
    POSITIVE_INT,
    POSITIVE_NUMBER,
    Field,
    FolderValue,
    HFConfig,
    llama_shaped,
)
from families.common.reader import FamilyReader, llama_settings

# ApertusConfig's fields; its default rope is Llama 3's scaling at theta 12e6.
APERTUS_FIELDS = (
    *(spec for spec in LLAMA_FIELDS if spec.key not in ("vocab_size", "intermediate_size", "head_dim", "hidden_act",
                                                        "max_position_embeddings", "rms_norm_eps", "mlp_bias",
                                                        "pretraining_tp", "rope_theta")),
    Field("vocab_size", POSITIVE_INT, 131072),
    Field("intermediate_size", POSITIVE_INT, 14336),
    Field("hidden_act", NAME, "xielu"),
    Field("max_position_embeddings", POSITIVE_INT, 65536),
    Field("rms_norm_eps", POSITIVE_NUMBER, 1e-5),
    Field("rope_theta", POSITIVE_NUMBER, 12000000.0),
)
APERTUS_DEFAULT_ROPE = {"rope_type": "llama3", "rope_theta": 12000000.0, "factor": 8.0, "low_freq_factor": 1.0,
                        "high_freq_factor": 4.0, "original_max_position_embeddings": 8192}


def read(values, raw, path, fields) -> HFConfig:
    values = {**values, "head_dim": None, "mlp_bias": False}
    if not any(isinstance(raw.get(key), dict) for key in ("rope_parameters", "rope_scaling")):
        raw = {**raw, "rope_parameters": APERTUS_DEFAULT_ROPE}  # ApertusConfig's default
    return dataclasses.replace(llama_shaped(values, raw, path, fields, heads_divide_hidden=False),
                               family="apertus")


def settings(config: HFConfig) -> dict[str, FolderValue]:
    """ApertusForCausalLM (transformers/models/apertus/modeling_apertus.py): Llama's attention with q_norm and k_norm
    (--qk-layernorm), an MLP down_proj(xielu(up_proj(x))) without biases (--xielu, --disable-bias-linear)."""
    problems = []
    if config.activation != "xielu":
        problems.append(f"hidden_act {config.activation!r} (Apertus's MLP here is xIELU's)")
    if config.attention_bias:
        problems.append("attention_bias true (its MLP has no bias, and --disable-bias-linear drops both here)")
    if problems:
        raise ConfigError(f"{config.path}: this ApertusForCausalLM cannot be represented here: {'; '.join(problems)}")
    # Llama's rules for everything else; its hidden_act check is Apertus's above
    settings = llama_settings(dataclasses.replace(config, activation="silu"))
    v = FolderValue
    return {**settings, "activation": v("xielu", "hidden_act"), "swiglu": v(False, "hidden_act"),
            "qk_layernorm": v(True, "model_type apertus"), "normalization": v("RMSNorm", "model_type apertus"),
            "position_embedding_type": v("rope", "model_type apertus")}



READER = FamilyReader("apertus", ("ApertusForCausalLM", "ApertusModel"), APERTUS_FIELDS, read, settings)
