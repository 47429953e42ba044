"""GLM-4.5's weights (transformers' Glm4MoeForCausalLM; families/glm4_moe/config.py reads its config.json):
Llama's layer names with q, k and v biases (--add-qkv-bias; o_proj has none), self_attn.q_norm / k_norm under
use_qk_norm, and DeepSeek-V3's MoE layer names (mlp.gate with e_score_correction_bias, mlp.experts.<e>,
mlp.shared_experts); dense MLPs in the first layers."""

from __future__ import annotations

from typing import Optional

from families.common.export_config import common_fields
from families.common.layout import (
    FamilyWeights,
    attention_names,
    by_layer_names,
    first_dense_count,
    first_dense_misfits,
    layer_mlp_names,
    llama_block_misfits,
)
from gpt.model_config import ModelConfig

MODEL_TYPE, ARCHITECTURE = "glm4_moe", "Glm4MoeForCausalLM"


def claims(config: ModelConfig) -> bool:
    """An MoE model of Llama's attention with DeepSeek's sigmoid router."""
    return (config.moe is not None and not config.mla.multi_latent_attention
            and config.moe.router_score_function == "sigmoid")


# the block features Glm4Moe holds beyond those misfits pins: attention_bias (q, k, v) and use_qk_norm
CARRIES = ("add_qkv_bias", "qk_layernorm")


def misfits(config: ModelConfig) -> list[str]:
    moe = config.moe
    found = llama_block_misfits(config, {
        "swiglu": True, "position_embedding_type": "rope", "use_rope_scaling": False, "add_bias_linear": False,
        "moe_router_score_function": "sigmoid", "moe_router_enable_expert_bias": True,
        "moe_shared_expert_gate": False, "window_size": None}, carries=CARRIES)
    found += first_dense_misfits(config)
    if moe.router_topk == 1:
        found.append("--moe-router-topk above 1 (Glm4Moe's norm_topk_prob renormalizes one expert's score to 1)")
    if moe.router_group_topk and moe.router_topk // moe.router_group_topk != 2:
        found.append("--moe-router-topk / --moe-router-group-topk 2 (Glm4Moe scores a group by its 2 best experts)")
    shared = moe.shared_expert_intermediate_size
    if shared is not None and shared % moe.ffn_hidden_size:
        found.append("--moe-shared-expert-intermediate-size a multiple of --moe-ffn-hidden-size (n_shared_experts)")
    return found


def hf_config(config: ModelConfig, eod_token_id: Optional[int] = None):
    from transformers import Glm4MoeConfig

    moe, shared = config.moe, config.moe.shared_expert_intermediate_size
    fields = common_fields(config, eod_token_id)
    fields["rope_parameters"] = {**fields["rope_parameters"], "partial_rotary_factor": config.positions.rotary_percent}
    return Glm4MoeConfig(**fields, head_dim=config.head_dim, intermediate_size=config.ffn_size,
                         moe_intermediate_size=moe.ffn_hidden_size, n_routed_experts=moe.num_experts,
                         n_shared_experts=(shared or 0) // moe.ffn_hidden_size, num_experts_per_tok=moe.router_topk,
                         n_group=_groups(moe), topk_group=moe.router_group_topk or 1,
                         routed_scaling_factor=moe.router_topk_scaling_factor or 1.0, norm_topk_prob=True,
                         first_k_dense_replace=first_dense_count(config), attention_bias=config.attention.add_qkv_bias,
                         use_qk_norm=config.attention.qk_layernorm, num_nextn_predict_layers=0)


def _layer_names(config: ModelConfig, layer: int) -> list[tuple[str, str]]:
    return attention_names(config, o_bias=False) + layer_mlp_names(config, layer)


to_hf, from_hf = by_layer_names(_layer_names)


WEIGHTS = FamilyWeights(MODEL_TYPE, ARCHITECTURE, claims, misfits, hf_config, to_hf, from_hf)


def _groups(moe) -> int:
    """n_group: the routing groups, 1 without a group top-k (a group count alone does not group Megatron-Core's
    router, and transformers' would group by it)."""
    return (moe.router_num_groups or 1) if moe.router_group_topk else 1
