"""OLMoE (transformers' OlmoeForCausalLM) as Megatron-Core's flags: Llama's blocks with RMSNorms over the whole q and k
projections (--qk-layernorm-over-projection) and softmax-routed SwiGLU experts in every layer (top k renormalized only
with norm_topk_prob); clip_qkv is --clip-qkv.
"""

from __future__ import annotations

from pathlib import Path

from base.errors import ConfigError
from families.common.features import carried_settings
from families.common.fields import (
    BOOLEAN,
    LLAMA_FIELDS,
    NON_NEGATIVE_NUMBER,
    POSITIVE_INT,
    POSITIVE_NUMBER,
    Field,
    HFConfig,
    llama_shaped,
)
from families.common.moe import moe_config
from families.common.reader import FamilyReader, FolderValue, llama_settings

MODEL_TYPE = "olmoe"
ARCHITECTURES = ("OlmoeForCausalLM", "OlmoeModel")
CARRIES = ("clip_qkv",)

FIELDS = (
    *(spec for spec in LLAMA_FIELDS if spec.key not in ("vocab_size", "hidden_size", "intermediate_size",
                                                        "num_hidden_layers", "num_attention_heads",
                                                        "max_position_embeddings", "rms_norm_eps", "mlp_bias",
                                                        "pretraining_tp")),
    Field("vocab_size", POSITIVE_INT, 50304),
    Field("hidden_size", POSITIVE_INT, 2048),
    Field("intermediate_size", POSITIVE_INT, 2048),
    Field("num_hidden_layers", POSITIVE_INT, 16),
    Field("num_attention_heads", POSITIVE_INT, 16),
    Field("max_position_embeddings", POSITIVE_INT, 4096),
    Field("rms_norm_eps", POSITIVE_NUMBER, 1e-5),
    Field("clip_qkv", POSITIVE_NUMBER, None, nullable=True),
    Field("num_experts_per_tok", POSITIVE_INT, 8),
    Field("num_experts", POSITIVE_INT, 64, aliases=("num_local_experts",)),
    Field("norm_topk_prob", BOOLEAN, False),
    Field("output_router_logits", BOOLEAN, False),
    Field("router_aux_loss_coef", NON_NEGATIVE_NUMBER, 0.01),
)


def read(values: dict, raw: dict, path: Path, fields: dict) -> HFConfig:
    config = llama_shaped({**values, "mlp_bias": values["attention_bias"]}, raw, path, fields,
                          heads_divide_hidden=False)
    return moe_config(config, MODEL_TYPE, experts=values["num_experts"], topk=values["num_experts_per_tok"],
                      moe_ffn=values["intermediate_size"], layers=(True,) * values["num_hidden_layers"],
                      norm_topk_prob=values["norm_topk_prob"], values=values)


def settings(config: HFConfig) -> dict[str, FolderValue]:
    values, v = config.values, FolderValue
    problems = []
    if values["attention_bias"]:
        problems.append("attention_bias true (--add-bias-linear would add biases to the experts and router too)")
    if problems:
        raise ConfigError(f"{config.path}: this {ARCHITECTURES[0]} cannot be represented here: {'; '.join(problems)}")
    return {**llama_settings(config),
            "add_bias_linear": v(False, "attention_bias"), "add_qkv_bias": v(False, "attention_bias"),
            "qk_layernorm": v(True, f"model_type {MODEL_TYPE} (q_norm, k_norm)"),
            "qk_layernorm_over_projection": v(True, f"model_type {MODEL_TYPE} (q_norm over hidden_size, k_norm over "
                                                    f"the key projection)"),
            **carried_settings(values, CARRIES),
            "num_experts": v(config.num_experts, "num_experts"),
            "moe_router_topk": v(config.experts_per_token, "num_experts_per_tok"),
            "moe_ffn_hidden_size": v(config.moe_ffn_hidden_size, "intermediate_size"),
            "moe_router_pre_softmax": v(not config.norm_topk_prob, "norm_topk_prob")}


READER = FamilyReader(MODEL_TYPE, ARCHITECTURES, FIELDS, read, settings)
