"""GraniteMoeShared's weights: Llama's attention names; block_sparse_moe's router and fused experts (input_linear
[E, 2 x ffn, hidden], gate rows first; output_linear) and shared_mlp's. Canonical names hold one expert each (EP reads
its own); `pack` fuses them."""

from __future__ import annotations

import re
from typing import Optional

import torch

from base.errors import ConfigError
from families.common.export_config import common_fields
from families.common.layout import (
    FamilyWeights,
    attention_names,
    by_layer_names,
    canonical_names,
    llama_block_misfits,
    swiglu_names,
)
from gpt.model_config import ModelConfig

MODEL_TYPE, ARCHITECTURE = "granitemoeshared", "GraniteMoeSharedForCausalLM"
CARRIES = ("softmax_scale",)  # attention_multiplier
_EXPERT = re.compile(r"^(model\.layers\.\d+\.block_sparse_moe\.)experts\.(\d+)\.(gate_proj|up_proj|down_proj)\.weight$")
_SHARED = re.compile(r"^(model\.layers\.\d+\.shared_mlp\.)(gate_proj|up_proj|down_proj)\.weight$")
# the file's fused names (transformers' in-memory names beside them) -> what each holds
_FUSED = re.compile(r"^(model\.layers\.\d+\.)(block_sparse_moe\.input_linear\.weight|block_sparse_moe\.experts\."
                    r"gate_up_proj|block_sparse_moe\.output_linear\.weight|block_sparse_moe\.experts\.down_proj|"
                    r"shared_mlp\.input_linear\.weight|shared_mlp\.output_linear\.weight)$")


def claims(config: ModelConfig) -> bool:
    """An MoE model of Llama's attention with a softmax router and an ungated shared expert."""
    moe = config.moe
    return (moe is not None and not config.mla.multi_latent_attention and moe.router_score_function == "softmax"
            and moe.shared_expert_intermediate_size is not None and not moe.shared_expert_gate)


def misfits(config: ModelConfig) -> list[str]:
    found = llama_block_misfits(config, {
        "swiglu": True, "position_embedding_type": "rope", "rotary_percent": 1.0, "qk_layernorm": False,
        "add_bias_linear": False, "add_qkv_bias": False, "multi_latent_attention": False,
        "moe_router_score_function": "softmax",
        "moe_router_pre_softmax": (lambda v: not v, "no --moe-router-pre-softmax (its router takes a softmax over "
                                                    "the top k)"),
        "moe_router_topk_scaling_factor": (lambda v: not v, "no --moe-router-topk-scaling-factor"),
        "moe_router_num_groups": None, "moe_router_enable_expert_bias": False, "moe_shared_expert_gate": False,
        "window_size": None}, carries=CARRIES)
    if config.moe is not None and not all(config.moe_layers()):
        found.append("an MoE layer in every layer (GraniteMoeShared has no dense layers)")
    return found


def hf_config(config: ModelConfig, eod_token_id: Optional[int] = None):
    from transformers import GraniteMoeSharedConfig

    moe, scale = config.moe, config.attention.softmax_scale
    # its attention scales scores by attention_multiplier itself; the other three multipliers stay 1
    return GraniteMoeSharedConfig(**common_fields(config, eod_token_id), head_dim=config.head_dim,
                                  intermediate_size=moe.ffn_hidden_size, num_local_experts=moe.num_experts,
                                  num_experts_per_tok=moe.router_topk,
                                  shared_intermediate_size=moe.shared_expert_intermediate_size,
                                  attention_multiplier=config.head_dim ** -0.5 if scale is None else scale,
                                  embedding_multiplier=1.0, residual_multiplier=1.0, logits_scaling=1.0,
                                  attention_bias=False, router_aux_loss_coef=moe.aux_loss_coeff)


def _layer_names(config: ModelConfig, layer: int) -> list[tuple[str, str]]:
    moe = config.moe_of(layer)
    names = attention_names(config) + [("mlp.router.weight", "block_sparse_moe.router.layer.weight")]
    for expert in range(moe.num_experts):
        names += swiglu_names(f"mlp.experts.{expert}", f"block_sparse_moe.experts.{expert}")
    return names + swiglu_names("mlp.shared_experts", "shared_mlp")


to_hf, from_hf = by_layer_names(_layer_names)


def pack(tensors: dict) -> dict:
    """The per-expert SwiGLU weights fused as the file holds them, in expert order, and the shared MLP's gate and up."""
    out, experts, shared = {}, {}, {}
    for name, tensor in tensors.items():
        expert, one = _EXPERT.match(name), _SHARED.match(name)
        if expert is not None:
            experts.setdefault(expert.group(1), {}).setdefault(expert.group(3), {})[int(expert.group(2))] = tensor
        elif one is not None:
            shared.setdefault(one.group(1), {})[one.group(2)] = tensor
        else:
            out[name] = tensor
    for prefix, parts in experts.items():
        count = len(parts["down_proj"])
        if any(sorted(by_expert) != list(range(count)) for by_expert in parts.values()):
            raise ConfigError(f"{prefix}experts: not every expert is here: the export needs them all")
        out[prefix + "input_linear.weight"] = torch.stack(
            [torch.cat((parts["gate_proj"][e], parts["up_proj"][e])) for e in range(count)])
        out[prefix + "output_linear.weight"] = torch.stack([parts["down_proj"][e] for e in range(count)])
    for prefix, parts in shared.items():
        out[prefix + "input_linear.weight"] = torch.cat((parts["gate_proj"], parts["up_proj"]))
        out[prefix + "output_linear.weight"] = parts["down_proj"]
    return out


def unpack(tensors: dict, num_layers: int) -> dict:
    """A file's fused experts and shared MLP (or transformers' in-memory names for them) as one tensor per expert and
    projection; the rest as layout.canonical_names makes them."""
    split = {}
    for name, tensor in tensors.items():
        full = name if name.startswith(("model.", "lm_head.")) else "model." + name
        full = full.replace(".block_sparse_moe.router.weight", ".block_sparse_moe.router.layer.weight")
        match = _FUSED.match(full)
        if match is None:
            split[full] = tensor
            continue
        layer, what = match.groups()
        if what.startswith("shared_mlp.input"):
            split[layer + "shared_mlp.gate_proj.weight"], split[layer + "shared_mlp.up_proj.weight"] = \
                tensor.chunk(2, dim=0)
        elif what.startswith("shared_mlp"):
            split[layer + "shared_mlp.down_proj.weight"] = tensor
        else:
            for e in range(tensor.shape[0]):
                prefix = f"{layer}block_sparse_moe.experts.{e}."
                if "input" in what or "gate_up" in what:  # gate rows first, as its forward chunks them
                    split[prefix + "gate_proj.weight"], split[prefix + "up_proj.weight"] = tensor[e].chunk(2, dim=0)
                else:
                    split[prefix + "down_proj.weight"] = tensor[e]
    return canonical_names(split, num_layers)


WEIGHTS = FamilyWeights(MODEL_TYPE, ARCHITECTURE, claims, misfits, hf_config, to_hf, from_hf, pack=pack,
                        unpack=unpack, read_whole="its experts are saved fused (block_sparse_moe.input_linear "
                                                  "[experts, 2 x ffn, hidden]), split in memory")
