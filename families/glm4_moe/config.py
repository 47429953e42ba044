"""GLM-4.5 (transformers' Glm4MoeForCausalLM) as Megatron-Core's flags: Llama's attention with q/k/v biases, optional
per-head q/k norms and partial rotary (default 0.5), dense MLPs in the first layers, then DeepSeek-V3's router over
SwiGLU experts and a shared expert. MTP layers are dropped as transformers drops them.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

from base.errors import ConfigError
from families.common.fields import (
    BOOLEAN,
    INTEGER,
    LLAMA_FIELDS,
    NON_NEGATIVE_NUMBER,
    POSITIVE_INT,
    POSITIVE_NUMBER,
    ROTARY_FRACTION,
    Field,
    HFConfig,
    llama_shaped,
)
from families.common.moe import (
    first_dense_layers,
    layer_freq,
    moe_config,
    mtp_note,
    sigmoid_router_settings,
)
from families.common.reader import FamilyReader, FolderValue, llama_settings

MODEL_TYPE = "glm4_moe"
ARCHITECTURES = ("Glm4MoeForCausalLM", "Glm4MoeModel")
DEFAULT_PARTIAL_ROTARY = 0.5  # Glm4MoeConfig.__post_init__: kwargs.setdefault("partial_rotary_factor", 0.5)

FIELDS = (
    *(spec for spec in LLAMA_FIELDS if spec.key not in ("vocab_size", "hidden_size", "intermediate_size",
                                                        "num_hidden_layers", "num_attention_heads",
                                                        "num_key_value_heads", "max_position_embeddings",
                                                        "rms_norm_eps", "mlp_bias", "pretraining_tp")),
    Field("vocab_size", POSITIVE_INT, 151552),
    Field("hidden_size", POSITIVE_INT, 4096),
    Field("intermediate_size", POSITIVE_INT, 10944),
    Field("num_hidden_layers", POSITIVE_INT, 46),
    Field("num_attention_heads", POSITIVE_INT, 96),
    Field("num_key_value_heads", POSITIVE_INT, 8, nullable=True),
    Field("max_position_embeddings", POSITIVE_INT, 131072),
    Field("rms_norm_eps", POSITIVE_NUMBER, 1e-5),
    Field("partial_rotary_factor", ROTARY_FRACTION, None, nullable=True),
    Field("moe_intermediate_size", POSITIVE_INT, 1408),
    Field("num_experts_per_tok", POSITIVE_INT, 8),
    Field("n_shared_experts", INTEGER, 1, nullable=True),
    Field("n_routed_experts", POSITIVE_INT, 128, aliases=("num_local_experts",)),
    Field("routed_scaling_factor", POSITIVE_NUMBER, 1.0),
    Field("n_group", POSITIVE_INT, 1),
    Field("topk_group", POSITIVE_INT, 1),
    Field("first_k_dense_replace", INTEGER, 1),
    Field("norm_topk_prob", BOOLEAN, True),
    Field("use_qk_norm", BOOLEAN, False),
    Field("num_nextn_predict_layers", INTEGER, 1, aliases=("num_mtp_layers",)),
    Field("output_router_logits", BOOLEAN, False),
    Field("router_aux_loss_coef", NON_NEGATIVE_NUMBER, 0.0001),
)


def read(values: dict, raw: dict, path: Path, fields: dict) -> HFConfig:
    layers = first_dense_layers(values["num_hidden_layers"], values["first_k_dense_replace"])
    config = llama_shaped({**values, "mlp_bias": values["attention_bias"]}, raw, path, fields,
                          heads_divide_hidden=False)
    # The top level's partial_rotary_factor, else its default.
    if "partial_rotary_factor" not in (raw.get("rope_scaling") or raw.get("rope_parameters") or {}):
        partial = values["partial_rotary_factor"]
        config = dataclasses.replace(config, rope=dataclasses.replace(
            config.rope, partial_rotary_factor=float(partial if partial is not None else DEFAULT_PARTIAL_ROTARY)))
    shared = values["moe_intermediate_size"] * values["n_shared_experts"] if values["n_shared_experts"] else None
    return moe_config(config, MODEL_TYPE, experts=values["n_routed_experts"], topk=values["num_experts_per_tok"],
                      moe_ffn=values["moe_intermediate_size"], layers=layers, norm_topk_prob=values["norm_topk_prob"],
                      values=values, shared=shared,
                      notes=mtp_note(path, values["num_hidden_layers"], values["num_nextn_predict_layers"],
                                     "num_nextn_predict_layers", ARCHITECTURES[0]))


def settings(config: HFConfig) -> dict[str, FolderValue]:
    values, v = config.values, FolderValue
    problems = []
    router = sigmoid_router_settings(config, problems)
    if problems:
        raise ConfigError(f"{config.path}: this {ARCHITECTURES[0]} cannot be represented here: {'; '.join(problems)}")
    partial = config.rope.partial_rotary_factor
    llama = llama_settings(dataclasses.replace(config, rope=dataclasses.replace(config.rope, partial_rotary_factor=1.0)))
    return {**llama, **router,
            "rotary_percent": v(partial, "partial_rotary_factor"),
            "add_bias_linear": v(False, f"model_type {MODEL_TYPE} (o_proj and the MLPs have no bias)"),
            "add_qkv_bias": v(values["attention_bias"], "attention_bias"),
            "qk_layernorm": v(values["use_qk_norm"], "use_qk_norm"),
            "num_experts": v(config.num_experts, "n_routed_experts"),
            "moe_router_topk": v(config.experts_per_token, "num_experts_per_tok"),
            "moe_ffn_hidden_size": v(config.moe_ffn_hidden_size, "moe_intermediate_size"),
            "moe_shared_expert_intermediate_size": v(config.shared_expert_size,
                                                     "n_shared_experts x moe_intermediate_size"),
            "moe_layer_freq": v(layer_freq(config.moe_layers), "first_k_dense_replace")}


READER = FamilyReader(MODEL_TYPE, ARCHITECTURES, FIELDS, read, settings)
