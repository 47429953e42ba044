"""Qwen3-MoE (transformers' Qwen3MoeForCausalLM): Llama's blocks with per-head q/k RMSNorms, an explicit head_dim, and
softmax-routed SwiGLU experts (top k renormalized only with norm_topk_prob, else --moe-router-pre-softmax) in every
decoder_sparse_step-th layer, no shared expert.
"""

from __future__ import annotations

from pathlib import Path

from base.errors import ConfigError
from families.common.fields import (
    BOOLEAN,
    LAYER_INDICES,
    LLAMA_FIELDS,
    NON_NEGATIVE_NUMBER,
    POSITIVE_INT,
    Field,
    HFConfig,
    llama_shaped,
)
from families.common.moe import layer_freq, moe_config, sparse_step_layers, without_fields
from families.common.reader import FamilyReader, FolderValue, llama_settings

MODEL_TYPE = "qwen3_moe"
ARCHITECTURES = ("Qwen3MoeForCausalLM", "Qwen3MoeModel")

# Qwen3MoeConfig's fields and defaults; num_experts is saved as num_local_experts.
FIELDS = (
    *(spec for spec in LLAMA_FIELDS if spec.key not in ("vocab_size", "hidden_size", "intermediate_size",
                                                        "num_hidden_layers", "num_key_value_heads", "mlp_bias",
                                                        "pretraining_tp", "max_position_embeddings")),
    Field("vocab_size", POSITIVE_INT, 151936),
    Field("hidden_size", POSITIVE_INT, 2048),
    Field("intermediate_size", POSITIVE_INT, 6144),
    Field("num_hidden_layers", POSITIVE_INT, 24),
    Field("num_key_value_heads", POSITIVE_INT, 4, nullable=True),
    Field("max_position_embeddings", POSITIVE_INT, 32768),
    Field("use_sliding_window", BOOLEAN, False),
    Field("sliding_window", POSITIVE_INT, 4096, nullable=True),
    Field("max_window_layers", POSITIVE_INT, 28),  # read only under use_sliding_window (older files carry it)
    Field("decoder_sparse_step", POSITIVE_INT, 1),
    Field("moe_intermediate_size", POSITIVE_INT, 768),
    Field("num_experts_per_tok", POSITIVE_INT, 8),
    Field("num_experts", POSITIVE_INT, 128, aliases=("num_local_experts",)),
    Field("norm_topk_prob", BOOLEAN, False),
    Field("output_router_logits", BOOLEAN, False),
    Field("router_aux_loss_coef", NON_NEGATIVE_NUMBER, 0.001),
    Field("mlp_only_layers", LAYER_INDICES, None, nullable=True),
)


def read(values: dict, raw: dict, path: Path, fields: dict) -> HFConfig:
    layers = sparse_step_layers(values["num_hidden_layers"], values["decoder_sparse_step"], values["mlp_only_layers"])
    config = llama_shaped({**values, "mlp_bias": values["attention_bias"]}, raw, path, fields,
                          heads_divide_hidden=False)
    return moe_config(config, MODEL_TYPE, experts=values["num_experts"], topk=values["num_experts_per_tok"],
                      moe_ffn=values["moe_intermediate_size"], layers=layers, norm_topk_prob=values["norm_topk_prob"],
                      values=values)


def settings(config: HFConfig) -> dict[str, FolderValue]:
    values, v = config.values, FolderValue
    problems = []
    if values["use_sliding_window"]:
        problems.append("use_sliding_window true (attention here sees the whole sequence)")
    if values["attention_bias"]:
        problems.append("attention_bias true (--add-bias-linear would add biases to the experts and router too)")
    if problems:
        raise ConfigError(f"{config.path}: this {ARCHITECTURES[0]} cannot be represented here: {'; '.join(problems)}")
    return {**llama_settings(without_fields(config, "sliding_window", "use_sliding_window")),
            "add_bias_linear": v(False, "attention_bias"), "add_qkv_bias": v(False, "attention_bias"),
            "qk_layernorm": v(True, f"model_type {MODEL_TYPE} (q_norm, k_norm over each head)"),
            "num_experts": v(config.num_experts, "num_experts"),
            "moe_router_topk": v(config.experts_per_token, "num_experts_per_tok"),
            "moe_ffn_hidden_size": v(config.moe_ffn_hidden_size, "moe_intermediate_size"),
            "moe_router_pre_softmax": v(not config.norm_topk_prob, "norm_topk_prob"),
            "moe_layer_freq": v(layer_freq(config.moe_layers), "decoder_sparse_step, mlp_only_layers")}


READER = FamilyReader(MODEL_TYPE, ARCHITECTURES, FIELDS, read, settings)
