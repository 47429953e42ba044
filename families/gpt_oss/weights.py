"""GPT-OSS's weights: Llama's attention names with biases, sinks (our softmax_offset), the router, and experts fused as
GptOssExperts saves them (gate_up_proj [E, hidden, 2 x ffn] with gate and up columns interleaved). Canonical names hold
one expert each, so EP keeps a rank's own; `pack` stacks them back.
"""

from __future__ import annotations

import re
from typing import Optional

import torch

from base.errors import ConfigError
from families.common.export_config import common_fields
from families.common.layout import (
    FamilyWeights,
    attention_names,
    canonical_names,
    from_hf_layers,
    llama_block_misfits,
    to_hf_layers,
)
from gpt.model_config import ModelConfig

MODEL_TYPE, ARCHITECTURE = "gpt_oss", "GptOssForCausalLM"
EXPERT_TENSORS = ("gate_up_proj", "gate_up_proj_bias", "down_proj", "down_proj_bias")
_FUSED = re.compile(r"^(model\.layers\.\d+\.mlp\.experts\.)(" + "|".join(EXPERT_TENSORS) + r")$")
_ONE_EXPERT = re.compile(r"^(model\.layers\.\d+\.mlp\.experts\.)(\d+)\.(" + "|".join(EXPERT_TENSORS) + r")$")


def claims(config: ModelConfig) -> bool:
    """Attention sinks or quick-GeGLU: GPT-OSS's, which no other family here has."""
    return config.attention.softmax_type != "vanilla" or config.mlp.quick_geglu


CARRIES = ("add_qkv_bias",)


def misfits(config: ModelConfig) -> list[str]:
    found = llama_block_misfits(config, {
        "quick_geglu": True, "glu_linear_offset": 1.0, "softmax_type": "learnable", "add_bias_linear": True,
        "activation_func_clamp_value": (lambda v: v is not None, "--activation-func-clamp-value (swiglu_limit)"),
        "position_embedding_type": (lambda v: v in ("rope", "yarn"), "--position-embedding-type yarn or rope"),
        "rotary_percent": 1.0, "use_rope_scaling": False, "qk_layernorm": False, "multi_latent_attention": False,
        "moe_router_score_function": "softmax", "moe_router_pre_softmax": False,
        "moe_router_topk_scaling_factor": (lambda v: not v, "no --moe-router-topk-scaling-factor"),
        "moe_router_num_groups": None, "moe_router_enable_expert_bias": False,
        "moe_shared_expert_intermediate_size": None,
        "num_experts": (lambda v: v is not None, "--num-experts (every GPT-OSS layer is an MoE layer)")},
        carries=CARRIES)
    if config.moe is not None and not all(config.moe_layers()):
        found.append("an MoE layer in every layer (GPT-OSS has no dense layers)")
    if config.positions.position_embedding_type == "yarn" and config.positions.mscale != 1.0 and not config.positions.mscale_all_dim:
        found.append("--mscale 1 or --mscale-all-dim (transformers' YaRN reads mscale only beside mscale_all_dim)")
    windows = {window for window in config.attention_windows() if window is not None}
    if len(windows) > 1:
        found.append("one --window-size for the windowed layers")
    return found


def hf_config(config: ModelConfig, eod_token_id: Optional[int] = None):
    from transformers import GptOssConfig

    moe = config.moe
    windows = config.attention_windows()
    window = next((window for window in windows if window is not None), None)
    return GptOssConfig(**common_fields(config, eod_token_id), head_dim=config.head_dim,
                        intermediate_size=moe.ffn_hidden_size, num_local_experts=moe.num_experts,
                        num_experts_per_tok=moe.router_topk, swiglu_limit=config.mlp.activation_func_clamp_value,
                        sliding_window=None if window is None else window + 1, attention_bias=True,
                        layer_types=["full_attention" if window is None else "sliding_attention" for window in windows],
                        router_aux_loss_coef=moe.aux_loss_coeff)


def _layer_names(config: ModelConfig, layer: int) -> list[tuple[str, str]]:
    return attention_names(config) + [("attention.softmax_offset", "self_attn.sinks"),
                                      ("mlp.router.weight", "mlp.router.weight"), ("mlp.router.bias", "mlp.router.bias")]


def to_hf(state: dict, config: ModelConfig) -> dict:
    out = to_hf_layers(state, config, lambda i: _layer_names(config, i))
    for layer in range(config.num_layers):
        for expert in range(config.moe.num_experts):
            ours = f"blocks.{layer}.mlp.experts.{expert}."
            if ours + "dense_4h_to_h.weight" not in state:
                continue
            gate, up = state[ours + "dense_h_to_4h_gate.weight"], state[ours + "dense_h_to_4h_up.weight"]
            gate_bias, up_bias = state[ours + "dense_h_to_4h_gate.bias"], state[ours + "dense_h_to_4h_up.bias"]
            theirs = f"model.layers.{layer}.mlp.experts.{expert}."
            out[theirs + "gate_up_proj"] = torch.stack((gate.t(), up.t()), dim=-1).flatten(-2).contiguous()
            out[theirs + "gate_up_proj_bias"] = torch.stack((gate_bias, up_bias), dim=-1).flatten(-2).contiguous()
            out[theirs + "down_proj"] = state[ours + "dense_4h_to_h.weight"].t().contiguous()
            out[theirs + "down_proj_bias"] = state[ours + "dense_4h_to_h.bias"]
    return out


def from_hf(hf_state: dict, config: ModelConfig, padded_vocab: int) -> dict:
    out = from_hf_layers(hf_state, config, padded_vocab, lambda i: _layer_names(config, i))
    for layer in range(config.num_layers):
        for expert in range(config.moe.num_experts):
            theirs = f"model.layers.{layer}.mlp.experts.{expert}."
            if theirs + "gate_up_proj" not in hf_state:  # another expert-parallel rank's expert
                continue
            gate_up, gate_up_bias = hf_state[theirs + "gate_up_proj"], hf_state[theirs + "gate_up_proj_bias"]
            ours = f"blocks.{layer}.mlp.experts.{expert}."
            out[ours + "dense_h_to_4h_gate.weight"] = gate_up[:, 0::2].t().contiguous()
            out[ours + "dense_h_to_4h_up.weight"] = gate_up[:, 1::2].t().contiguous()
            out[ours + "dense_h_to_4h_gate.bias"] = gate_up_bias[0::2].contiguous()
            out[ours + "dense_h_to_4h_up.bias"] = gate_up_bias[1::2].contiguous()
            out[ours + "dense_4h_to_h.weight"] = hf_state[theirs + "down_proj"].t().contiguous()
            out[ours + "dense_4h_to_h.bias"] = hf_state[theirs + "down_proj_bias"]
    return out


def pack(tensors: dict) -> dict:
    """The per-expert tensors stacked into GptOssExperts' fused ones, in expert order."""
    out, experts = {}, {}
    for name, tensor in tensors.items():
        match = _ONE_EXPERT.match(name)
        if match is None:
            out[name] = tensor
        else:
            experts.setdefault(match.group(1) + match.group(3), {})[int(match.group(2))] = tensor
    for name, by_expert in experts.items():
        if sorted(by_expert) != list(range(len(by_expert))):
            raise ConfigError(f"{name}: the experts {sorted(by_expert)} are not all of them: the export needs every "
                              f"expert")
        out[name] = torch.stack([by_expert[e] for e in range(len(by_expert))])
    return out


def unpack(tensors: dict, num_layers: int) -> dict:
    """A GPT-OSS file's fused experts as one tensor each (the rest as layout.canonical_names makes them)."""
    split = {}
    for name, tensor in tensors.items():
        full = name if name.startswith(("model.", "lm_head.")) else "model." + name
        match = _FUSED.match(full)
        if match is None:
            split[name] = tensor
            continue
        split.update({f"{match.group(1)}{e}.{match.group(2)}": tensor[e] for e in range(tensor.shape[0])})
    return canonical_names(split, num_layers)


WEIGHTS = FamilyWeights(MODEL_TYPE, ARCHITECTURE, claims, misfits, hf_config, to_hf, from_hf, pack=pack, unpack=unpack)
