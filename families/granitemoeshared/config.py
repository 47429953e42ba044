"""GraniteMoeShared's config.json (transformers' GraniteMoeSharedForCausalLM): Llama's attention, a softmax over the
top k logits, an ungated shared MLP. attention_multiplier is --softmax-scale; the other multipliers are read only at 1.
"""

from __future__ import annotations

import math
from pathlib import Path

from base.errors import ConfigError
from families.common.fields import (
    BOOLEAN,
    INTEGER,
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

MODEL_TYPE = "granitemoeshared"
ARCHITECTURES = ("GraniteMoeSharedForCausalLM", "GraniteMoeSharedModel")
# the multipliers whose identity is 1.0, with what the blocks here do in their place
UNSCALED = {"embedding_multiplier": "the embeddings here are not scaled",
            "residual_multiplier": "each block's branches join the residual unscaled",
            "logits_scaling": "the logits here are not divided"}

# GraniteMoeSharedConfig's fields and defaults (head_dim is no field of it, but its attention reads one given)
FIELDS = (
    *(spec for spec in LLAMA_FIELDS if spec.key not in ("mlp_bias", "pretraining_tp")),
    Field("embedding_multiplier", POSITIVE_NUMBER, 1.0),
    Field("residual_multiplier", POSITIVE_NUMBER, 1.0),
    Field("logits_scaling", POSITIVE_NUMBER, 1.0),
    Field("attention_multiplier", POSITIVE_NUMBER, 1.0),
    Field("num_local_experts", POSITIVE_INT, 8),
    Field("num_experts_per_tok", POSITIVE_INT, 2),
    Field("shared_intermediate_size", INTEGER, 0),
    Field("output_router_logits", BOOLEAN, False),
    Field("router_aux_loss_coef", NON_NEGATIVE_NUMBER, 0.001),
)


def read(values: dict, raw: dict, path: Path, fields: dict) -> HFConfig:
    config = llama_shaped({**values, "mlp_bias": values["attention_bias"]}, raw, path, fields,
                          heads_divide_hidden=False)
    return moe_config(config, MODEL_TYPE, experts=values["num_local_experts"], topk=values["num_experts_per_tok"],
                      moe_ffn=values["intermediate_size"], layers=(True,) * values["num_hidden_layers"],
                      norm_topk_prob=True, values=values, shared=values["shared_intermediate_size"] or None)


def attention_scale(multiplier: float, head_dim: int):
    """--softmax-scale for attention_multiplier: None (Megatron's default) where it is 1/sqrt(head_dim), to fp32's
    precision."""
    return None if math.isclose(multiplier, head_dim ** -0.5, rel_tol=1e-7) else multiplier


def settings(config: HFConfig) -> dict[str, FolderValue]:
    values, v = config.values, FolderValue
    problems = [f"{key} {values[key]!r} ({why})" for key, why in UNSCALED.items() if values[key] != 1.0]
    if values["shared_intermediate_size"] < 0:
        problems.append(f"shared_intermediate_size {values['shared_intermediate_size']} (a width is at least 0)")
    if values["attention_bias"]:
        problems.append("attention_bias true (--add-bias-linear would add biases to the experts and router too)")
    if problems:
        raise ConfigError(f"{config.path}: this {ARCHITECTURES[0]} cannot be represented here: {'; '.join(problems)}")
    return {**llama_settings(config),
            "add_bias_linear": v(False, "attention_bias"), "add_qkv_bias": v(False, "attention_bias"),
            "softmax_scale": v(attention_scale(values["attention_multiplier"], config.head_dim),
                               "attention_multiplier"),
            "num_experts": v(config.num_experts, "num_local_experts"),
            "moe_router_topk": v(config.experts_per_token, "num_experts_per_tok"),
            "moe_ffn_hidden_size": v(config.moe_ffn_hidden_size, "intermediate_size"),
            # GraniteMoeSharedTopKRouter: a softmax over the top k logits
            "moe_router_pre_softmax": v(False, f"model_type {MODEL_TYPE}"),
            "moe_shared_expert_intermediate_size": v(config.shared_expert_size, "shared_intermediate_size"),
            "moe_shared_expert_gate": v(False, f"model_type {MODEL_TYPE} (its shared MLP has no gate)")}


READER = FamilyReader(MODEL_TYPE, ARCHITECTURES, FIELDS, read, settings)
