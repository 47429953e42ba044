"""Mixtral's config.json (transformers' MixtralForCausalLM): a Llama's blocks with a mixture of experts."""

from __future__ import annotations

import dataclasses

from base.errors import ConfigError
from families.common.fields import (
    BOOLEAN,
    LLAMA_FIELDS,
    NON_NEGATIVE_NUMBER,
    POSITIVE_INT,
    POSITIVE_NUMBER,
    Field,
    FolderValue,
    HFConfig,
    llama_shaped,
)
from families.common.reader import FamilyReader, llama_settings

# MixtralConfig's fields: no attention_bias, mlp_bias or pretraining_tp.
MIXTRAL_FIELDS = (
    *(spec for spec in LLAMA_FIELDS if spec.key not in ("attention_bias", "mlp_bias", "pretraining_tp",
                                                        "intermediate_size", "rope_theta")),
    Field("intermediate_size", POSITIVE_INT, 14336),
    Field("rope_theta", POSITIVE_NUMBER, 1e6),
    Field("num_local_experts", POSITIVE_INT, 8),
    Field("num_experts_per_tok", POSITIVE_INT, 2),
    Field("output_router_logits", BOOLEAN, False),
    Field("router_aux_loss_coef", NON_NEGATIVE_NUMBER, 0.001),
    Field("router_jitter_noise", NON_NEGATIVE_NUMBER, 0.0),
    Field("sliding_window", POSITIVE_INT, None, nullable=True),
)



def read(values, raw, path, fields) -> HFConfig:
    values = {**values, "attention_bias": False, "mlp_bias": False}
    return dataclasses.replace(llama_shaped(values, raw, path, fields, heads_divide_hidden=False), family="mixtral",
                               num_experts=values["num_local_experts"],
                               experts_per_token=values["num_experts_per_tok"])


def settings(config: HFConfig) -> dict[str, FolderValue]:
    """MixtralForCausalLM: Megatron-Core's MoE layer in every MLP's place (a softmax top k renormalized, Megatron's
    default, over SwiGLU experts). Router jitter is not built; the aux loss coefficient is a training choice."""
    if config.fields.get("router_jitter_noise"):
        raise ConfigError(f"{config.path}: this MixtralForCausalLM cannot be represented here: router_jitter_noise "
                          f"{config.fields['router_jitter_noise']!r} (the router here adds no noise)")
    v = FolderValue
    return {**llama_settings(config), "num_experts": v(config.num_experts, "num_local_experts"),
            "moe_router_topk": v(config.experts_per_token, "num_experts_per_tok"),
            "moe_ffn_hidden_size": v(config.ffn_hidden_size, "intermediate_size")}



READER = FamilyReader("mixtral", ("MixtralForCausalLM", "MixtralModel"), MIXTRAL_FIELDS, read, settings)
