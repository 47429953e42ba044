"""Qwen3-Next's config.json (transformers' Qwen3NextForCausalLM) as one --hybrid-layer-pattern: Gated DeltaNet (`G`) or
gated attention (`*`) layers, each followed by MoE with a gated shared expert (`E`) or a dense MLP (`-`); its RMSNorm
scales by 1 + weight.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

from base.errors import ConfigError
from families.common.fields import (
    BOOLEAN,
    LAYER_INDICES,
    LLAMA_FIELDS,
    NAMES,
    NON_NEGATIVE_NUMBER,
    POSITIVE_INT,
    ROTARY_FRACTION,
    Field,
    HFConfig,
    llama_shaped,
)
from families.common.moe import moe_config, sparse_step_layers, without_fields
from families.common.reader import FamilyReader, FolderValue, llama_settings
from gpt.hybrid_pattern import ATTENTION, GDN, MLP, MOE

MODEL_TYPE = "qwen3_next"
ARCHITECTURES = ("Qwen3NextForCausalLM", "Qwen3NextModel")
LAYER_TYPES = {"linear_attention": GDN, "full_attention": ATTENTION}
DEFAULT_PARTIAL_ROTARY = 0.25  # Qwen3NextConfig.__post_init__: kwargs.setdefault("partial_rotary_factor", 0.25)
DEFAULT_FULL_ATTENTION_INTERVAL = 4  # its layer_types without the field: every 4th layer full attention
GDN_SIZES = ("linear_conv_kernel_dim", "linear_key_head_dim", "linear_value_head_dim", "linear_num_key_heads",
             "linear_num_value_heads")

# Qwen3NextConfig's fields and defaults; attention_bias covers q, k, v and o.
FIELDS = (
    *(spec for spec in LLAMA_FIELDS if spec.key not in ("vocab_size", "hidden_size", "intermediate_size",
                                                        "num_hidden_layers", "num_attention_heads",
                                                        "num_key_value_heads", "head_dim", "mlp_bias",
                                                        "pretraining_tp", "max_position_embeddings")),
    Field("vocab_size", POSITIVE_INT, 151936),
    Field("hidden_size", POSITIVE_INT, 2048),
    Field("intermediate_size", POSITIVE_INT, 5632),
    Field("num_hidden_layers", POSITIVE_INT, 48),
    Field("num_attention_heads", POSITIVE_INT, 16),
    Field("num_key_value_heads", POSITIVE_INT, 2, nullable=True),
    Field("head_dim", POSITIVE_INT, 256),
    Field("max_position_embeddings", POSITIVE_INT, 32768),
    Field("partial_rotary_factor", ROTARY_FRACTION, None, nullable=True),  # older files' top-level key
    Field("linear_conv_kernel_dim", POSITIVE_INT, 4),
    Field("linear_key_head_dim", POSITIVE_INT, 128),
    Field("linear_value_head_dim", POSITIVE_INT, 128),
    Field("linear_num_key_heads", POSITIVE_INT, 16),
    Field("linear_num_value_heads", POSITIVE_INT, 32),
    Field("layer_types", NAMES, None, nullable=True),
    Field("full_attention_interval", POSITIVE_INT, DEFAULT_FULL_ATTENTION_INTERVAL),  # read without layer_types
    Field("decoder_sparse_step", POSITIVE_INT, 1),
    Field("moe_intermediate_size", POSITIVE_INT, 512),
    Field("shared_expert_intermediate_size", POSITIVE_INT, 512),
    Field("num_experts_per_tok", POSITIVE_INT, 10),
    Field("num_experts", POSITIVE_INT, 512),
    Field("norm_topk_prob", BOOLEAN, True),
    Field("output_router_logits", BOOLEAN, False),
    Field("router_aux_loss_coef", NON_NEGATIVE_NUMBER, 0.001),
    Field("mlp_only_layers", LAYER_INDICES, None, nullable=True),
)


def layer_pattern(values: dict, path: Path, moe_layers: tuple[bool, ...]) -> str:
    """The --hybrid-layer-pattern of the file's layers: each layer's mixer (layer_types, else every
    full_attention_interval-th layer full attention) and its MLP."""
    layers = values["num_hidden_layers"]
    types = values["layer_types"]
    if types is None:
        interval = values["full_attention_interval"]
        types = ["linear_attention" if (i + 1) % interval else "full_attention" for i in range(layers)]
    unknown = sorted(set(types) - set(LAYER_TYPES))
    if unknown or len(types) != layers:
        raise ConfigError(f"{path}: layer_types must name one of {', '.join(LAYER_TYPES)} for each of the "
                          f"{layers} layers (num_hidden_layers), found {len(types)} entries"
                          f"{': ' + ', '.join(unknown) if unknown else ''}")
    return "".join(LAYER_TYPES[kind] + (MOE if moe else MLP) for kind, moe in zip(types, moe_layers))


def read(values: dict, raw: dict, path: Path, fields: dict) -> HFConfig:
    layers = sparse_step_layers(values["num_hidden_layers"], values["decoder_sparse_step"], values["mlp_only_layers"])
    config = llama_shaped({**values, "mlp_bias": values["attention_bias"]}, raw, path, fields,
                          heads_divide_hidden=False)
    # rope_parameters' partial_rotary_factor, else the top level's (transformers moves it inside), else its default
    if "partial_rotary_factor" not in (raw.get("rope_scaling") or raw.get("rope_parameters") or {}):
        partial = values["partial_rotary_factor"]
        config = dataclasses.replace(config, rope=dataclasses.replace(
            config.rope, partial_rotary_factor=float(partial if partial is not None else DEFAULT_PARTIAL_ROTARY)))
    values = {**values, "hybrid_layer_pattern": layer_pattern(values, path, layers)}
    return moe_config(config, MODEL_TYPE, experts=values["num_experts"], topk=values["num_experts_per_tok"],
                      moe_ffn=values["moe_intermediate_size"], layers=layers, norm_topk_prob=values["norm_topk_prob"],
                      values=values, shared=values["shared_expert_intermediate_size"])


def settings(config: HFConfig) -> dict[str, FolderValue]:
    values, v = config.values, FolderValue
    if values["attention_bias"]:
        raise ConfigError(f"{config.path}: this {ARCHITECTURES[0]} cannot be represented here: attention_bias true "
                          f"(--add-bias-linear would add biases to the experts and router too)")
    partial = config.rope.partial_rotary_factor
    # llama_settings' other rules, the partial rotation aside (--rotary-percent takes it)
    plain = without_fields(dataclasses.replace(
        config, rope=dataclasses.replace(config.rope, partial_rotary_factor=1.0)), "sliding_window")
    pattern = values["hybrid_layer_pattern"]
    found = {**llama_settings(plain),
             "rotary_percent": v(partial, "partial_rotary_factor"),
             "add_bias_linear": v(False, "attention_bias"), "add_qkv_bias": v(False, "attention_bias"),
             "qk_layernorm": v(True, f"model_type {MODEL_TYPE} (q_norm, k_norm over each head)"),
             "attention_output_gate": v(True, f"model_type {MODEL_TYPE} (q_proj gives each head's output gate)"),
             "apply_layernorm_1p": v(True, f"model_type {MODEL_TYPE} (its RMSNorm scales by 1 + weight)"),
             "hybrid_layer_pattern": v(pattern, "layer_types, decoder_sparse_step, mlp_only_layers"),
             **{name: v(values[name], name) for name in GDN_SIZES}}
    if MOE in pattern:
        found.update({
            "num_experts": v(config.num_experts, "num_experts"),
            "moe_router_topk": v(config.experts_per_token, "num_experts_per_tok"),
            "moe_ffn_hidden_size": v(config.moe_ffn_hidden_size, "moe_intermediate_size"),
            "moe_router_pre_softmax": v(not config.norm_topk_prob, "norm_topk_prob"),
            "moe_shared_expert_intermediate_size": v(config.shared_expert_size, "shared_expert_intermediate_size"),
            "moe_shared_expert_gate": v(True, f"model_type {MODEL_TYPE} (shared_expert_gate)")})
    return found


READER = FamilyReader(MODEL_TYPE, ARCHITECTURES, FIELDS, read, settings)
