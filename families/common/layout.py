"""What the MoE families' weight mappings share: their record (`FamilyWeights`), a Llama-shaped layer's names on both
sides, the loop over layers both ways, shapes from our own meta model through the same mapping, and a folder's names
made canonical (fused experts split, MTP layers dropped as transformers drops them).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, Callable, Optional

import torch

from base.errors import ConfigError
from base.options import setting_value
from families.common.features import flag_for, uncarried
from families.common.llama_shaped import ends_from_hf, ends_to_hf, fused_qkv, split_qkv
from gpt.model_config import ModelConfig

EXPERT_BIAS = "mlp.router.expert_bias"
# Tensors of quantized releases (fp8 scales, MXFP4 blocks).
QUANTIZED_SUFFIXES = ("_scale_inv", "_blocks", "_scales")


@dataclass(frozen=True)
class FamilyWeights:
    """One family's weights as checkpoint/hf/folders.py takes them: `claims` and `misfits` decide the export,
    `hf_config`, `to_hf` / `from_hf` map both ways, and `pack` / `unpack` turn canonical names into the file's and back.
    """
    model_type: str
    architecture: str
    claims: Callable[[ModelConfig], bool]
    misfits: Callable[[ModelConfig], list[str]]
    hf_config: Callable[[ModelConfig, Optional[int]], Any]
    to_hf: Callable[[dict, ModelConfig], dict]
    from_hf: Callable[[dict, ModelConfig, int], dict]
    pack: Callable[[dict], dict] = lambda tensors: tensors
    unpack: Optional[Callable[[dict, int], dict]] = None
    # transformers runs no MTP layer and drops a release's: the export writes them anyway, said in one line.
    drops_mtp: bool = False
    # Norms whose family tensor is the gain itself, shifted under --apply-layernorm-1p.
    gain_norms: tuple[str, ...] = ("layernorm.weight",)
    read_whole: Optional[str] = None
    # Its class holds a pattern's Mamba layers and one-part blocks.
    holds_hybrid_blocks: bool = False


def needs(config: ModelConfig, wanted: dict[str, Any]) -> list[str]:
    """The flags that would give `config` each wanted setting it lacks; a wanted value may be (predicate, its phrase).
    """
    found = []
    for name, want in wanted.items():
        value = setting_value(config, name)
        if isinstance(want, tuple):
            test, phrase = want
            if not test(value):
                found.append(phrase)
        elif value != want:
            found.append(flag_for(name, want))
    return found


def llama_block_misfits(config: ModelConfig, wanted: dict[str, Any], carries: tuple[str, ...] = (),
                        drops_mtp: bool = False) -> list[str]:
    """What keeps `config` from being a Llama-shaped MoE family: RMSNorm, SwiGLU and halves-rotary everywhere, the
    family's `wanted`, no uncarried feature, Megatron-Core's dropless router with one expert count, and no MTP unless
    `drops_mtp`."""
    wanted = {"normalization": "RMSNorm", "rotary_interleaved": False,
              "no_rope_freq": (lambda value: not value, "no --no-rope-freq"),
              "activation": (lambda value: value in ("gelu", "gelu_tanh"), "no --activation other than SwiGLU's"),
              **wanted}
    found = needs(config, wanted) + uncarried(config, (*wanted, *carries))
    if config.moe is not None:
        moe = config.moe
        found += [phrase for phrase, bad in (
            ("--moe-gating megatron (DeepSpeed-MoE's capacity and sampling are not theirs)", moe.deepspeed.gating != "megatron"),
            ("one --num-experts for every MoE layer", config.experts.per_layer),
            ("--mlp-type standard", moe.deepspeed.use_residual),
            ("no --moe-expert-capacity-factor (transformers drops no token)", moe.expert_capacity_factor is not None),
        ) if bad]
    if config.mtp.num_layers and not drops_mtp:
        found.append("no --mtp-num-layers (transformers' model has no multi-token prediction layers)")
    return found


def dense_layers(config: ModelConfig) -> list[int]:
    return [i for i, moe in enumerate(config.moe_layers()) if not moe]


def first_dense_misfits(config: ModelConfig) -> list[str]:
    """DeepSeek's rule: dense layers only before the first MoE layer (first_k_dense_replace)."""
    pattern = config.moe_layers()
    k = pattern.index(True) if True in pattern else len(pattern)
    return [] if all(pattern[k:]) else ["--moe-layer-freq with dense layers only before the first MoE layer "
                                        "(first_k_dense_replace)"]


def first_dense_count(config: ModelConfig) -> int:
    pattern = config.moe_layers()
    return pattern.index(True) if True in pattern else len(pattern)


def rope_parameters(config: ModelConfig) -> dict:
    """transformers' rope_parameters for our rotary settings (plain, Llama 3's, or YaRN with mscale and mscale_all_dim
    only together)."""
    from families.common.llama_shaped import rope_parameters as llama_rope

    if config.positions.position_embedding_type == "yarn":
        parameters = {"rope_type": "yarn", "rope_theta": config.positions.rotary_base, "factor": config.positions.rotary_scaling_factor,
                      "beta_fast": config.positions.yarn_beta_fast, "beta_slow": config.positions.yarn_beta_slow,
                      "original_max_position_embeddings": config.positions.yarn_original_max_position_embeddings,
                      "truncate": config.positions.yarn_correction_range_round_to_int}
        if config.positions.mscale_all_dim:
            parameters.update(mscale=config.positions.mscale, mscale_all_dim=config.positions.mscale_all_dim)
        return parameters
    parameters = llama_rope(config)
    if config.positions.rotary_percent != 1.0:
        parameters["partial_rotary_factor"] = config.positions.rotary_percent
    return parameters


def attention_names(config: ModelConfig, o_bias: Optional[bool] = None) -> list[tuple[str, str]]:
    """(ours inside a block, theirs inside a layer) for an attention's tensors besides q, k, v, and its two norms."""
    names = [("input_layernorm.weight", "input_layernorm.weight"),
             ("post_attention_layernorm.weight", "post_attention_layernorm.weight"),
             ("attention.dense.weight", "self_attn.o_proj.weight")]
    if config.add_bias_linear if o_bias is None else o_bias:
        names.append(("attention.dense.bias", "self_attn.o_proj.bias"))
    if config.attention.qk_layernorm:
        names += [("attention.q_layernorm.weight", "self_attn.q_norm.weight"),
                  ("attention.k_layernorm.weight", "self_attn.k_norm.weight")]
    return names


SWIGLU = (("dense_h_to_4h_gate", "gate_proj"), ("dense_h_to_4h_up", "up_proj"), ("dense_4h_to_h", "down_proj"))


def swiglu_names(ours: str, theirs: str) -> list[tuple[str, str]]:
    """A SwiGLU MLP's three weights under `ours` and `theirs` (prefixes inside the layer)."""
    return [(f"{ours}.{our}.weight", f"{theirs}.{their}.weight") for our, their in SWIGLU]


def moe_names(config: ModelConfig, layer: int, router: str = "mlp.gate", shared: str = "mlp.shared_experts"
              ) -> list[tuple[str, str]]:
    """A DeepSeek- or Qwen-style MoE layer's tensors: router (and correction bias), each expert's SwiGLU, the shared
    expert."""
    moe = config.moe_of(layer)
    names = [("mlp.router.weight", f"{router}.weight")]
    if moe.router_enable_expert_bias:
        names.append((EXPERT_BIAS, f"{router}.e_score_correction_bias"))
    for expert in range(moe.num_experts):
        names += swiglu_names(f"mlp.experts.{expert}", f"mlp.experts.{expert}")
    if moe.shared_expert_intermediate_size is not None:
        names += swiglu_names("mlp.shared_experts", shared)
    return names


def layer_mlp_names(config: ModelConfig, layer: int) -> list[tuple[str, str]]:
    """A dense layer's SwiGLU, or the MoE layer's tensors (moe_names)."""
    return moe_names(config, layer) if config.moe_layers()[layer] else swiglu_names("mlp", "mlp")


def to_hf_layers(state: dict, config: ModelConfig, layer_names: Callable[[int], list[tuple[str, str]]],
                 fused_qkv_names: bool = True) -> dict[str, torch.Tensor]:
    """Our state under the family's names: the ends (padding rows cut), each layer's `layer_names(i)`, and q, k, v from
    our fused QKV."""
    out = ends_to_hf(state, config)
    for i in range(config.num_layers):
        ours, theirs = f"blocks.{i}.", f"model.layers.{i}."
        out.update({theirs + their: state[ours + our] for our, their in layer_names(i) if ours + our in state})
        if fused_qkv_names:
            for kind in ("weight", "bias") if config.attention.qkv_bias(config.add_bias_linear) else ("weight",):
                parts = split_qkv(state[ours + "attention.query_key_value." + kind], config)
                out.update({theirs + f"self_attn.{p}_proj.{kind}": part for p, part in zip("qkv", parts)})
    return {name: tensor.contiguous() for name, tensor in out.items()}


def from_hf_layers(hf_state: dict, config: ModelConfig, padded_vocab: int,
                   layer_names: Callable[[int], list[tuple[str, str]]], fused_qkv_names: bool = True
                   ) -> dict[str, torch.Tensor]:
    """The inverse of `to_hf_layers`; a tensor `hf_state` lacks (another EP rank's expert) is left out."""
    out = ends_from_hf(hf_state, config, padded_vocab)
    for i in range(config.num_layers):
        ours, theirs = f"blocks.{i}.", f"model.layers.{i}."
        out.update({ours + our: hf_state[theirs + their] for our, their in layer_names(i) if theirs + their in hf_state})
        if fused_qkv_names:
            for kind in ("weight", "bias") if config.attention.qkv_bias(config.add_bias_linear) else ("weight",):
                out[ours + "attention.query_key_value." + kind] = fused_qkv(
                    *(hf_state[theirs + f"self_attn.{p}_proj.{kind}"] for p in "qkv"), config)
    return {name: tensor.contiguous() for name, tensor in out.items()}


def by_layer_names(layer_names: Callable[[ModelConfig, int], list[tuple[str, str]]], fused_qkv_names: bool = True
                   ) -> tuple[Callable[[dict, ModelConfig], dict], Callable[[dict, ModelConfig, int], dict]]:
    """A family's to_hf and from_hf where a layer's tensors are `layer_names(config, i)` as they are."""
    def to_hf(state: dict, config: ModelConfig) -> dict:
        return to_hf_layers(state, config, lambda i: layer_names(config, i), fused_qkv_names)

    def from_hf(hf_state: dict, config: ModelConfig, padded_vocab: int) -> dict:
        return from_hf_layers(hf_state, config, padded_vocab, lambda i: layer_names(config, i), fused_qkv_names)

    return to_hf, from_hf


def tensor_shapes(family: FamilyWeights, config: ModelConfig) -> dict[str, tuple[int, ...]]:
    """Every tensor the family's folder holds for `config`, with its shape, from our meta model through the family's own
    mapping."""
    from gpt.model import GPTModel
    from parallel.state import ParallelState

    model = GPTModel(config, ParallelState(device=torch.device("cpu")))
    state = {name: param for name, param in model.named_parameters()}
    for i, moe in enumerate(config.moe_layers()):
        if moe and config.moe_of(i).router_enable_expert_bias:
            state[f"blocks.{i}.{EXPERT_BIAS}"] = torch.empty(config.moe_of(i).num_experts, device="meta")
    return {name: tuple(tensor.shape) for name, tensor in family.to_hf(state, config).items()}


_LAYER = re.compile(r"^model\.layers\.(\d+)\.")


def canonical_names(tensors: dict[str, torch.Tensor], num_layers: int) -> dict[str, torch.Tensor]:
    """A folder's tensors under the CausalLM class's names: `model.` added, rotary buffers and post-decoder MTP layers
    dropped, fused experts split; quantized weights are refused."""
    quantized = sorted(name for name in tensors if name.endswith(QUANTIZED_SUFFIXES))
    if quantized:
        raise ConfigError(f"the folder's weights are quantized ({quantized[0]}, ...: fp8 or MXFP4 blocks with their "
                          f"scales); --init-from-hf reads bf16/fp16/fp32 weights: dequantize them first (transformers "
                          f"does it loading with the quantization_config's dequantize option)")
    out = {}
    for name, tensor in tensors.items():
        if name.endswith(".rotary_emb.inv_freq"):
            continue
        if not name.startswith(("model.", "lm_head.")):
            name = "model." + name
        layer = _LAYER.match(name)
        if layer is not None and int(layer.group(1)) >= num_layers:
            continue
        if name.endswith(".mlp.experts.gate_up_proj") and tensor.dim() == 3:
            prefix = name[:-len("gate_up_proj")]
            gate, up = tensor.chunk(2, dim=1)
            for e in range(tensor.shape[0]):
                out[f"{prefix}{e}.gate_proj.weight"], out[f"{prefix}{e}.up_proj.weight"] = gate[e], up[e]
        elif name.endswith(".mlp.experts.down_proj") and tensor.dim() == 3:
            prefix = name[:-len("down_proj")]
            out.update({f"{prefix}{e}.down_proj.weight": tensor[e] for e in range(tensor.shape[0])})
        else:
            out[name] = tensor
    return out
