"""OLMoE's weights (transformers' OlmoeForCausalLM; families/olmoe/config.py reads its config.json): Llama's layer
names with self_attn.q_norm / k_norm over the whole projections (our attention.q_layernorm / k_layernorm under
--qk-layernorm-over-projection), mlp.gate (the router) and mlp.experts.<e>.{gate,up,down}_proj in every layer."""

from __future__ import annotations

from typing import Optional

from families.common.export_config import common_fields
from families.common.features import carried_fields
from families.common.layout import (
    FamilyWeights,
    attention_names,
    by_layer_names,
    llama_block_misfits,
    moe_names,
)
from families.olmoe.config import CARRIES
from gpt.model_config import ModelConfig

MODEL_TYPE, ARCHITECTURE = "olmoe", "OlmoeForCausalLM"


def claims(config: ModelConfig) -> bool:
    return config.moe is not None and config.attention.qk_layernorm_over_projection


def misfits(config: ModelConfig) -> list[str]:
    found = llama_block_misfits(config, {
        "swiglu": True, "position_embedding_type": "rope", "rotary_percent": 1.0, "use_rope_scaling": False,
        "qk_layernorm": True, "qk_layernorm_over_projection": True, "add_bias_linear": False, "add_qkv_bias": False,
        "multi_latent_attention": False, "moe_router_score_function": "softmax",
        "moe_router_topk_scaling_factor": (lambda v: not v, "no --moe-router-topk-scaling-factor"),
        "moe_router_num_groups": None, "moe_router_enable_expert_bias": False,
        "moe_shared_expert_intermediate_size": None, "window_size": None}, carries=CARRIES)
    if not all(config.moe_layers()):
        found.append("an MoE layer in every layer (OLMoE has no dense layers)")
    return found


def hf_config(config: ModelConfig, eod_token_id: Optional[int] = None):
    from transformers import OlmoeConfig

    moe = config.moe
    fields = common_fields(config, eod_token_id)
    return OlmoeConfig(**fields, intermediate_size=moe.ffn_hidden_size, num_experts=moe.num_experts,
                       num_experts_per_tok=moe.router_topk, norm_topk_prob=not moe.router_pre_softmax,
                       attention_bias=False, router_aux_loss_coef=moe.aux_loss_coeff, **carried_fields(config, CARRIES))


def _layer_names(config: ModelConfig, layer: int) -> list[tuple[str, str]]:
    return attention_names(config) + moe_names(config, layer)


to_hf, from_hf = by_layer_names(_layer_names)


WEIGHTS = FamilyWeights(MODEL_TYPE, ARCHITECTURE, claims, misfits, hf_config, to_hf, from_hf)
