"""Qwen3-MoE's weights (transformers' Qwen3MoeForCausalLM; families/qwen3_moe/config.py reads its config.json):
Llama's layer names with self_attn.q_norm / k_norm (our attention.q_layernorm / k_layernorm, one gain per head
width), and in an MoE layer mlp.gate (the router) and mlp.experts.<e>.{gate,up,down}_proj."""

from __future__ import annotations

from typing import Optional

from families.common.export_config import common_fields
from families.common.layout import (
    FamilyWeights,
    attention_names,
    by_layer_names,
    dense_layers,
    layer_mlp_names,
    llama_block_misfits,
)
from gpt.model_config import ModelConfig

MODEL_TYPE, ARCHITECTURE = "qwen3_moe", "Qwen3MoeForCausalLM"


def claims(config: ModelConfig) -> bool:
    """An MoE model with per-head query/key norms and a softmax router without a shared expert."""
    moe = config.moe
    return (moe is not None and config.attention.qk_layernorm and not config.mla.multi_latent_attention
            and moe.router_score_function == "softmax" and moe.shared_expert_intermediate_size is None)


def misfits(config: ModelConfig) -> list[str]:
    found = llama_block_misfits(config, {
        "swiglu": True, "position_embedding_type": "rope", "rotary_percent": 1.0, "use_rope_scaling": False,
        "qk_layernorm": True, "add_bias_linear": False, "add_qkv_bias": False, "multi_latent_attention": False,
        "moe_router_score_function": "softmax", "moe_router_topk_scaling_factor": (lambda v: not v, "no "
                                                                                   "--moe-router-topk-scaling-factor"),
        "moe_router_num_groups": None, "moe_router_enable_expert_bias": False,
        "moe_shared_expert_intermediate_size": None, "window_size": None})
    return found


def hf_config(config: ModelConfig, eod_token_id: Optional[int] = None):
    from transformers import Qwen3MoeConfig

    moe = config.moe
    return Qwen3MoeConfig(**common_fields(config, eod_token_id), head_dim=config.head_dim,
                          intermediate_size=config.ffn_size, moe_intermediate_size=moe.ffn_hidden_size,
                          num_experts=moe.num_experts, num_experts_per_tok=moe.router_topk,
                          norm_topk_prob=not moe.router_pre_softmax, decoder_sparse_step=1,
                          mlp_only_layers=dense_layers(config), attention_bias=False, use_sliding_window=False,
                          router_aux_loss_coef=moe.aux_loss_coeff)


def _layer_names(config: ModelConfig, layer: int) -> list[tuple[str, str]]:
    return attention_names(config) + layer_mlp_names(config, layer)


to_hf, from_hf = by_layer_names(_layer_names)


WEIGHTS = FamilyWeights(MODEL_TYPE, ARCHITECTURE, claims, misfits, hf_config, to_hf, from_hf)
