"""DeepSeek-V3's weights: MLA's projections and latent norms under their names (gpt/mla.py lays out heads as
DeepseekV3Attention does), the router with its correction bias, experts and shared experts, dense MLPs first, and MTP
layers as the release's model.layers.<num_layers + k>.
"""

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
from gpt.hybrid_pattern import MLA
from gpt.layer_spec import mixer_symbols
from gpt.model_config import ModelConfig

MODEL_TYPE, ARCHITECTURE = "deepseek_v3", "DeepseekV3ForCausalLM"
MLA_NAMES = (("attention.linear_q_down_proj.weight", "self_attn.q_a_proj.weight"),
             ("attention.q_layernorm.weight", "self_attn.q_a_layernorm.weight"),
             ("attention.linear_q_up_proj.weight", "self_attn.q_b_proj.weight"),
             ("attention.linear_kv_down_proj.weight", "self_attn.kv_a_proj_with_mqa.weight"),
             ("attention.kv_layernorm.weight", "self_attn.kv_a_layernorm.weight"),
             ("attention.linear_kv_up_proj.weight", "self_attn.kv_b_proj.weight"),
             ("attention.linear_proj.weight", "self_attn.o_proj.weight"))
LATENT_NORM_EPS = 1e-6  # DeepseekV3RMSNorm's default, at which its latent norms run


def claims(config: ModelConfig) -> bool:
    """A model whose every layer is multi-latent attention, MoE or dense."""
    return set(mixer_symbols(config)) == {MLA}


def misfits(config: ModelConfig) -> list[str]:
    moe = config.moe
    router = {} if moe is None else {"moe_router_score_function": "sigmoid", "moe_router_enable_expert_bias": True,
                                     "moe_shared_expert_gate": False}
    found = llama_block_misfits(config, {
        "swiglu": True, "qk_layernorm": True, "add_bias_linear": False, "multi_latent_attention": True,
        "q_lora_rank": (lambda v: v is not None, "--q-lora-rank (under --qk-layernorm a query without it is normed "
                                                 "before linear_q_proj, DeepseekV3's q_proj is not)"),
        **router, "window_size": None,
        "layernorm_epsilon": (lambda v: v == LATENT_NORM_EPS, f"--norm-epsilon {LATENT_NORM_EPS} (DeepseekV3's "
                                                              f"latent norms run at it)")}, drops_mtp=True)
    if moe is None:
        return found
    found += first_dense_misfits(config)
    if moe.router_topk == 1:
        found.append("--moe-router-topk above 1 (DeepseekV3's norm_topk_prob renormalizes one expert's score to 1)")
    group_topk = moe.router_group_topk
    if group_topk and moe.router_topk // group_topk != 2:
        found.append("--moe-router-topk / --moe-router-group-topk 2 (DeepseekV3 scores a group by its 2 best experts)")
    return found


def hf_config(config: ModelConfig, eod_token_id: Optional[int] = None):
    from transformers import DeepseekV3Config

    if config.moe is None:  # every layer dense: no expert is built past first_k_dense_replace
        return DeepseekV3Config(**_fields(config, eod_token_id), intermediate_size=config.ffn_size,
                                moe_intermediate_size=config.ffn_size, n_routed_experts=1, n_shared_experts=0,
                                num_experts_per_tok=1, norm_topk_prob=False, n_group=1, topk_group=1,
                                first_k_dense_replace=config.num_layers,
                                **_mla_fields(config))
    moe, shared = config.moe, config.moe.shared_expert_intermediate_size
    if shared is not None and shared % moe.ffn_hidden_size:
        from base.errors import ConfigError

        raise ConfigError(f"--moe-shared-expert-intermediate-size {shared} is not a multiple of the experts' "
                          f"{moe.ffn_hidden_size}: DeepseekV3Config gives the shared expert n_shared_experts x "
                          f"moe_intermediate_size", flags=("--moe-shared-expert-intermediate-size",))
    return DeepseekV3Config(**_fields(config, eod_token_id), intermediate_size=config.ffn_size,
                            moe_intermediate_size=moe.ffn_hidden_size, n_routed_experts=moe.num_experts,
                            n_shared_experts=(shared or 0) // moe.ffn_hidden_size, num_experts_per_tok=moe.router_topk,
                            n_group=_groups(moe), topk_group=moe.router_group_topk or 1,
                            routed_scaling_factor=moe.router_topk_scaling_factor or 1.0, norm_topk_prob=True,
                            first_k_dense_replace=first_dense_count(config), **_mla_fields(config))


def _fields(config: ModelConfig, eod_token_id: Optional[int]) -> dict:
    fields = common_fields(config, eod_token_id)
    fields["num_key_value_heads"] = config.num_attention_heads
    fields["rope_parameters"] = _rope(config)
    return fields


def _mla_fields(config: ModelConfig) -> dict:
    return dict(q_lora_rank=config.mla.q_lora_rank, kv_lora_rank=config.mla.kv_lora_rank,
                qk_nope_head_dim=config.mla.qk_head_dim, qk_rope_head_dim=config.mla.qk_pos_emb_head_dim,
                v_head_dim=config.mla.v_head_dim, rope_interleave=True, attention_bias=False,
                num_nextn_predict_layers=config.mtp.num_layers)


def _rope(config: ModelConfig) -> dict:
    """gpt/mla.py's rotary positions: plain (--rope-type rope) or MLA's YaRN with its fixed betas and original length."""
    if config.mla.rope_type == "rope" or config.positions.rotary_scaling_factor == 1.0:
        return {"rope_type": "default", "rope_theta": config.positions.rotary_base}
    from gpt.mla import MLA_YARN_BETA_FAST, MLA_YARN_BETA_SLOW, MLA_YARN_ORIGINAL_MAX_POSITIONS

    return {"rope_type": "yarn", "rope_theta": config.positions.rotary_base, "factor": config.positions.rotary_scaling_factor,
            "mscale": config.positions.mscale, "mscale_all_dim": config.positions.mscale_all_dim, "beta_fast": MLA_YARN_BETA_FAST,
            "beta_slow": MLA_YARN_BETA_SLOW, "original_max_position_embeddings": MLA_YARN_ORIGINAL_MAX_POSITIONS}


MTP_NAMES = (("enorm.weight", "enorm.weight"), ("hnorm.weight", "hnorm.weight"), ("eh_proj.weight", "eh_proj.weight"),
             ("final_layernorm.weight", "shared_head.norm.weight"))


def _layer_names(config: ModelConfig, layer: int) -> list[tuple[str, str]]:
    return attention_names(config)[:2] + list(MLA_NAMES) + layer_mlp_names(config, layer)


decoder_to_hf, from_hf = by_layer_names(_layer_names, fused_qkv_names=False)


def to_hf(state: dict, config: ModelConfig) -> dict:
    """The decoder's tensors, then each MTP layer as the release holds it (with its own embedding and head copies),
    which transformers does not load."""
    out = decoder_to_hf(state, config)
    last = config.num_layers - 1  # an MTP layer is of the decoder's last layer's kind (gpt/mtp.py)
    for k in range(config.mtp.num_layers):
        ours, theirs = f"mtp_layers.{k}.", f"model.layers.{config.num_layers + k}."
        names = [*MTP_NAMES, *((f"transformer_layer.{our}", their) for our, their in _layer_names(config, last))]
        out.update({theirs + their: state[ours + our].contiguous() for our, their in names if ours + our in state})
        out[theirs + "embed_tokens.weight"] = out["model.embed_tokens.weight"].clone()
        out[theirs + "shared_head.head.weight"] = out.get("lm_head.weight", out["model.embed_tokens.weight"]).clone()
    return out


WEIGHTS = FamilyWeights(MODEL_TYPE, ARCHITECTURE, claims, misfits, hf_config, to_hf, from_hf, drops_mtp=True)


def _groups(moe) -> int:
    """n_group: the routing groups, 1 without a group top-k."""
    return (moe.router_num_groups or 1) if moe.router_group_topk else 1
