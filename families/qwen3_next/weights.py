"""Qwen3-Next's weights (transformers' Qwen3NextForCausalLM): linear_attn's in_proj_qkvz and in_proj_ba are per key
head, its conv1d channels [q | k | v] where ours are per head, its gated norm stores the gain; self_attn's q_proj holds
[query | gate] per head.
"""

from __future__ import annotations

from typing import Optional

import torch

from families.common.export_config import common_fields
from families.common.layout import FamilyWeights, dense_layers, llama_block_misfits, moe_names, swiglu_names
from families.common.llama_shaped import ends_from_hf, ends_to_hf
from gpt.hybrid_pattern import ATTENTION, GDN
from gpt.layer_spec import mixer_symbols
from gpt.model_config import ModelConfig

MODEL_TYPE, ARCHITECTURE = "qwen3_next", "Qwen3NextForCausalLM"
LAYER_TYPES = {GDN: "linear_attention", ATTENTION: "full_attention"}
# Block features Qwen3-Next holds beyond those misfits pins.
CARRIES = ("qk_layernorm", "attention_output_gate")
GDN_SAME = (("dt_bias", "dt_bias"), ("A_log", "A_log"), ("out_norm.weight", "norm.weight"),
            ("out_proj.weight", "out_proj.weight"))


def claims(config: ModelConfig) -> bool:
    """Gated DeltaNet layers or gated attention: Qwen3-Next's, which no other family here has."""
    return GDN in mixer_symbols(config) or config.attention.attention_output_gate


def misfits(config: ModelConfig) -> list[str]:
    mixers = set(mixer_symbols(config))
    wanted = {"swiglu": True, "position_embedding_type": "rope", "use_rope_scaling": False,
              "add_bias_linear": False, "add_qkv_bias": False, "multi_latent_attention": False,
              "apply_layernorm_1p": True, "window_size": None}
    if ATTENTION in mixers:
        wanted.update(qk_layernorm=True, attention_output_gate=True)
    if config.moe is not None:
        wanted.update({"moe_router_score_function": "softmax", "moe_router_num_groups": None,
                       "moe_router_enable_expert_bias": False, "moe_shared_expert_gate": True,
                       "moe_router_topk_scaling_factor": (lambda v: not v, "no --moe-router-topk-scaling-factor"),
                       "moe_shared_expert_intermediate_size": (
                           lambda v: v is not None, "--moe-shared-expert-intermediate-size (Qwen3-Next's MoE "
                                                    "layers have a shared expert)")})
    found = llama_block_misfits(config, wanted, carries=CARRIES)
    if not mixers <= set(LAYER_TYPES):
        found.append("a --hybrid-layer-pattern of `G` (Gated DeltaNet) and `*` (attention) layers alone")
    return found


def hf_config(config: ModelConfig, eod_token_id: Optional[int] = None):
    from transformers import Qwen3NextConfig

    fields = common_fields(config, eod_token_id)
    # written even at 1.0: Qwen3NextConfig's default is 0.25
    fields["rope_parameters"] = {**fields["rope_parameters"], "partial_rotary_factor": config.positions.rotary_percent}
    gdn, moe = config.gdn, config.moe
    experts = {} if moe is None else dict(
        moe_intermediate_size=moe.ffn_hidden_size, shared_expert_intermediate_size=moe.shared_expert_intermediate_size,
        num_experts=moe.num_experts, num_experts_per_tok=moe.router_topk, norm_topk_prob=not moe.router_pre_softmax,
        router_aux_loss_coef=moe.aux_loss_coeff)
    return Qwen3NextConfig(**fields, head_dim=config.head_dim, intermediate_size=config.ffn_size,
                           layer_types=[LAYER_TYPES[symbol] for symbol in mixer_symbols(config)],
                           linear_conv_kernel_dim=gdn.linear_conv_kernel_dim,
                           linear_key_head_dim=gdn.linear_key_head_dim, linear_value_head_dim=gdn.linear_value_head_dim,
                           linear_num_key_heads=gdn.linear_num_key_heads,
                           linear_num_value_heads=gdn.linear_num_value_heads, decoder_sparse_step=1,
                           mlp_only_layers=dense_layers(config), attention_bias=False, **experts)


def _layer_names(config: ModelConfig, layer: int, mixer: str) -> list[tuple[str, str]]:
    """(ours inside a block, theirs inside a layer) of the tensors that keep their layout."""
    names = [("input_layernorm.weight", "input_layernorm.weight"),
             ("post_attention_layernorm.weight", "post_attention_layernorm.weight")]
    if mixer == GDN:
        names += [(f"attention.{our}", f"linear_attn.{their}") for our, their in GDN_SAME]
    else:
        names += [("attention.dense.weight", "self_attn.o_proj.weight"),
                  ("attention.q_layernorm.weight", "self_attn.q_norm.weight"),
                  ("attention.k_layernorm.weight", "self_attn.k_norm.weight")]
    if not config.moe_layers()[layer]:
        return names + swiglu_names("mlp", "mlp")
    return names + moe_names(config, layer, shared="mlp.shared_expert") + \
        [("mlp.shared_experts.gate_weight", "mlp.shared_expert_gate.weight")]


def _gdn_sizes(config: ModelConfig) -> tuple[int, int, int, int]:
    """(key heads, key head dims, each key head's value dims, its value heads)."""
    gdn = config.gdn
    group = gdn.linear_num_value_heads // gdn.linear_num_key_heads
    return gdn.linear_num_key_heads, gdn.linear_key_head_dim, group * gdn.linear_value_head_dim, group


def gdn_to_hf(in_proj: torch.Tensor, conv: torch.Tensor, config: ModelConfig) -> dict[str, torch.Tensor]:
    heads, dk, dv, group = _gdn_sizes(config)
    rest_in, rest_conv = in_proj.shape[1:], conv.shape[1:]
    qkvz, ba = in_proj.reshape(heads, -1, *rest_in).split([2 * dk + 2 * dv, 2 * group], dim=1)
    q, k, v = conv.reshape(heads, -1, *rest_conv).split([dk, dk, dv], dim=1)
    return {"in_proj_qkvz.weight": qkvz.reshape(-1, *rest_in), "in_proj_ba.weight": ba.reshape(-1, *rest_in),
            "conv1d.weight": torch.cat([part.reshape(-1, *rest_conv) for part in (q, k, v)])}


def gdn_from_hf(qkvz: torch.Tensor, ba: torch.Tensor, conv: torch.Tensor, config: ModelConfig
                ) -> dict[str, torch.Tensor]:
    heads, dk, dv, _ = _gdn_sizes(config)
    rest_in, rest_conv = qkvz.shape[1:], conv.shape[1:]
    in_proj = torch.cat([qkvz.reshape(heads, -1, *rest_in), ba.reshape(heads, -1, *rest_in)], dim=1)
    q, k, v = (part.reshape(heads, -1, *rest_conv) for part in conv.split([heads * dk, heads * dk, heads * dv]))
    return {"in_proj.weight": in_proj.reshape(-1, *rest_in),
            "conv1d.weight": torch.cat([q, k, v], dim=1).reshape(-1, *rest_conv)}


def _attention_sizes(config: ModelConfig) -> tuple[int, int, int]:
    heads, d = config.num_attention_heads, config.head_dim
    groups = config.attention.query_groups(heads)
    return groups, heads // groups, d


def attention_to_hf(qkv: torch.Tensor, config: ModelConfig) -> dict[str, torch.Tensor]:
    groups, per_group, d = _attention_sizes(config)
    rest = qkv.shape[1:]
    qkv = qkv.reshape(groups, 2 * per_group + 2, d, *rest)
    query, gate = qkv[:, :per_group], qkv[:, per_group:2 * per_group]
    return {"q_proj.weight": torch.stack([query, gate], dim=2).reshape(-1, *rest),
            "k_proj.weight": qkv[:, 2 * per_group].reshape(-1, *rest),
            "v_proj.weight": qkv[:, 2 * per_group + 1].reshape(-1, *rest)}


def attention_from_hf(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, config: ModelConfig) -> torch.Tensor:
    groups, per_group, d = _attention_sizes(config)
    rest = q.shape[1:]
    query_gate = q.reshape(groups, per_group, 2, d, *rest)
    return torch.cat([query_gate[:, :, 0], query_gate[:, :, 1], k.reshape(groups, 1, d, *rest),
                      v.reshape(groups, 1, d, *rest)], dim=1).reshape(-1, *rest)


def to_hf(state: dict, config: ModelConfig) -> dict:
    out = ends_to_hf(state, config)
    for i, mixer in enumerate(mixer_symbols(config)):
        ours, theirs = f"blocks.{i}.", f"model.layers.{i}."
        out.update({theirs + their: state[ours + our] for our, their in _layer_names(config, i, mixer)
                    if ours + our in state})
        if mixer == GDN:
            parts = gdn_to_hf(state[ours + "attention.in_proj.weight"], state[ours + "attention.conv1d.weight"], config)
            out.update({f"{theirs}linear_attn.{name}": part for name, part in parts.items()})
        else:
            parts = attention_to_hf(state[ours + "attention.query_key_value.weight"], config)
            out.update({f"{theirs}self_attn.{name}": part for name, part in parts.items()})
    return {name: tensor.contiguous() for name, tensor in out.items()}


def from_hf(hf_state: dict, config: ModelConfig, padded_vocab: int) -> dict:
    """The inverse of `to_hf`; a tensor `hf_state` lacks (another EP rank's expert) is left out."""
    out = ends_from_hf(hf_state, config, padded_vocab)
    for i, mixer in enumerate(mixer_symbols(config)):
        ours, theirs = f"blocks.{i}.", f"model.layers.{i}."
        out.update({ours + our: hf_state[theirs + their] for our, their in _layer_names(config, i, mixer)
                    if theirs + their in hf_state})
        if mixer == GDN:
            parts = gdn_from_hf(*(hf_state[f"{theirs}linear_attn.{name}.weight"]
                                  for name in ("in_proj_qkvz", "in_proj_ba", "conv1d")), config)
            out.update({f"{ours}attention.{name}": part for name, part in parts.items()})
        else:
            out[ours + "attention.query_key_value.weight"] = attention_from_hf(
                *(hf_state[f"{theirs}self_attn.{p}_proj.weight"] for p in "qkv"), config)
    return {name: tensor.contiguous() for name, tensor in out.items()}


WEIGHTS = FamilyWeights(MODEL_TYPE, ARCHITECTURE, claims, misfits, hf_config, to_hf, from_hf,
                        gain_norms=("attention.out_norm.weight",),
                        read_whole="its Gated DeltaNet conv1d weights are [channels, 1, width]: more than rows")
