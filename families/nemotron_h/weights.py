"""NemotronH's weights (transformers' NemotronHForCausalLM): one layer per pattern symbol, each a norm and its mixer
(Mamba, attention, MLP or MoE); a block here is one or two of those layers. The file names them backbone.*,
transformers' memory model.*.
"""

from __future__ import annotations

from typing import Optional

import torch

from families.common.features import flag_for, uncarried
from families.common.layout import EXPERT_BIAS, FamilyWeights, canonical_names, needs
from families.common.llama_shaped import fused_qkv, padded_rows, split_qkv
from families.common.moe import GROUP_SCORE_EXPERTS
from families.nemotron_h.config import NO_CLAMP
from gpt.hybrid_pattern import ATTENTION, MAMBA, MIXERS, MLP, MLPS, MOE, PIPE, parse_hybrid_pattern
from gpt.mamba_settings import MambaSettings
from gpt.model_config import ModelConfig

MODEL_TYPE, ARCHITECTURE = "nemotron_h", "NemotronHForCausalLM"
LAYER_TYPES = {MAMBA: "linear_attention", ATTENTION: "full_attention", MLP: "mlp", MOE: "moe"}
IN_PROJ, CONV = ("z", "x", "B", "C", "dt"), ("x", "B", "C")


def _pattern_blocks(config: ModelConfig):
    pattern = parse_hybrid_pattern(config.hybrid_layer_pattern)
    return pattern.blocks, pattern.layer_offsets()


def claims(config: ModelConfig) -> bool:
    """A pattern with Mamba layers, or one-part blocks with attention as the only mixer: NemotronH claims first."""
    if config.hybrid_layer_pattern is None:
        return False
    blocks, _ = _pattern_blocks(config)
    return any(block[0] == MAMBA for block in blocks) or \
        any(len(block) == 1 for block in blocks) and all(block[0] in (ATTENTION, MLP, MOE, MAMBA) for block in blocks)


def misfits(config: ModelConfig) -> list[str]:
    wanted = {"normalization": "RMSNorm", "swiglu": False, "activation": "squared_relu",
              "position_embedding_type": "none", "add_bias_linear": False, "add_qkv_bias": False,
              "qk_layernorm": False, "attention_output_gate": False, "multi_latent_attention": False,
              "untie_embeddings_and_output_weights": True}
    found = needs(config, wanted) + uncarried(config, wanted)
    blocks, _ = _pattern_blocks(config)
    others = sorted({symbol for block in blocks for symbol in block if symbol not in LAYER_TYPES})
    if others:
        found.append(f"--hybrid-layer-pattern of `M`, `*`, `-` and `E` layers alone (not {', '.join(others)})")
    if config.moe is not None:
        found += _moe_misfits(config)
    if any(block[0] == MAMBA for block in blocks) and config.norms.layernorm_epsilon != MambaSettings.NORM_EPSILON:
        found.append(f"{flag_for('layernorm_epsilon', MambaSettings.NORM_EPSILON)} (NemotronH's one "
                     f"layer_norm_epsilon is also its Mamba norms')")
    if config.mtp.num_layers:
        found.append("no --mtp-num-layers (NemotronHForCausalLM has no multi-token prediction layers)")
    return found


def _moe_misfits(config: ModelConfig) -> list[str]:
    """NemotronHMoE: DeepSeek-V3's router and an ungated shared expert, in every `E` layer alike."""
    moe = config.moe
    found = needs(config, {
        "moe_router_score_function": "sigmoid", "moe_router_enable_expert_bias": True,
        "moe_shared_expert_gate": False,
        "moe_shared_expert_intermediate_size": (lambda v: v is not None, "--moe-shared-expert-intermediate-size "
                                                "(NemotronH's MoE always has a shared expert)")})
    groups, group_topk = moe.router_num_groups, moe.router_group_topk
    if groups and group_topk and group_topk < groups and moe.router_topk != GROUP_SCORE_EXPERTS * group_topk:
        found.append(f"--moe-router-topk {GROUP_SCORE_EXPERTS} x --moe-router-group-topk (transformers scores a group "
                     f"by its {GROUP_SCORE_EXPERTS} best experts)")
    return found + [phrase for phrase, bad in (
        ("--moe-gating megatron (DeepSpeed-MoE's capacity and sampling are not theirs)",
         moe.deepspeed.gating != "megatron"),
        ("one --num-experts for every MoE layer", config.experts.per_layer),
        ("--mlp-type standard", moe.deepspeed.use_residual),
        ("no --moe-expert-capacity-factor (transformers drops no token)", moe.expert_capacity_factor is not None),
    ) if bad]


def _moe_fields(config: ModelConfig) -> dict:
    moe = config.moe
    if moe is None:
        return {}
    return dict(n_routed_experts=moe.num_experts, num_experts_per_tok=moe.router_topk,
                moe_intermediate_size=moe.ffn_hidden_size,
                moe_shared_expert_intermediate_size=moe.shared_expert_intermediate_size,
                n_group=moe.router_num_groups or 1, topk_group=moe.router_group_topk or 1,
                norm_topk_prob=moe.router_topk > 1, routed_scaling_factor=moe.router_topk_scaling_factor or 1.0)


def hf_config(config: ModelConfig, eod_token_id: Optional[int] = None):
    from transformers import NemotronHConfig

    mamba = config.mamba
    return NemotronHConfig(
        vocab_size=config.vocab_size, hidden_size=config.hidden_size,
        layers_block_type=[LAYER_TYPES[symbol] for symbol in config.hybrid_layer_pattern if symbol != PIPE],
        num_attention_heads=config.num_attention_heads,
        num_key_value_heads=config.attention.query_groups(config.num_attention_heads), head_dim=config.head_dim,
        intermediate_size=config.ffn_size, mlp_hidden_act="relu2", mlp_bias=False, attention_bias=False,
        max_position_embeddings=config.max_position_embeddings, attention_dropout=config.attention.attention_dropout,
        ssm_state_size=mamba.mamba_state_dim, mamba_num_heads=mamba.heads(config.hidden_size),
        mamba_head_dim=mamba.mamba_head_dim, n_groups=mamba.mamba_num_groups, conv_kernel=MambaSettings.CONV_WIDTH,
        chunk_size=MambaSettings.CHUNK_SIZE, use_conv_bias=True, use_bias=False, time_step_min=NO_CLAMP,
        time_step_max=MambaSettings.DT_MAX, time_step_floor=MambaSettings.DT_INIT_FLOOR,
        layer_norm_epsilon=config.norms.layernorm_epsilon, tie_word_embeddings=False,
        initializer_range=config.init_method_std, bos_token_id=eod_token_id, eos_token_id=eod_token_id,
        pad_token_id=None, **_moe_fields(config))


def _sizes(config: ModelConfig) -> dict[str, int]:
    """The rows of each part of in_proj and the conv (whole, before any TP split)."""
    mamba = config.mamba
    heads = mamba.heads(config.hidden_size)
    bc = mamba.mamba_num_groups * mamba.mamba_state_dim
    return {"z": heads * mamba.mamba_head_dim, "x": heads * mamba.mamba_head_dim, "B": bc, "C": bc, "dt": heads}


def _layers(config: ModelConfig):
    """(block, our prefix, its mixer's layer prefix or None, its MLP's layer prefix or None), per block."""
    blocks, offsets = _pattern_blocks(config)
    for k, (block, offset) in enumerate(zip(blocks, offsets)):
        mixer = offset if block[0] in MIXERS else None
        mlp = offset + (mixer is not None) if block[-1] in MLPS else None
        yield (block, f"blocks.{k}.", None if mixer is None else f"model.layers.{mixer}.",
               None if mlp is None else f"model.layers.{mlp}.")


MAMBA_SAME = ("dt_bias", "A_log", "D", "norm.weight", "out_proj.weight")
MLP_SAME = (("mlp.dense_h_to_4h.weight", "mixer.up_proj.weight"),
            ("mlp.dense_4h_to_h.weight", "mixer.down_proj.weight"))


def _mlp_names(config: ModelConfig, block: str) -> list[tuple[str, str]]:
    """(ours inside the block, theirs inside the layer) of its MLP: dense, or an `E` layer's router, bias, experts and
    shared expert."""
    if block[-1] != MOE:
        return list(MLP_SAME)
    names = [("mlp.router.weight", "mixer.gate.weight"), (EXPERT_BIAS, "mixer.gate.e_score_correction_bias")]
    for prefix, theirs in [*((f"mlp.experts.{e}", f"mixer.experts.{e}") for e in range(config.moe.num_experts)),
                           ("mlp.shared_experts", "mixer.shared_experts")]:
        names += [(f"{prefix}.dense_h_to_4h.weight", f"{theirs}.up_proj.weight"),
                  (f"{prefix}.dense_4h_to_h.weight", f"{theirs}.down_proj.weight")]
    return names


def to_hf(state: dict, config: ModelConfig) -> dict:
    """Our whole state under transformers' in-memory names (an output layer tied to the embedding is misfits')."""
    vocab = config.vocab_size
    out = {"model.embeddings.weight": state["word_embeddings.weight"][:vocab],
           "model.norm_f.weight": state["final_layernorm.weight"],
           "lm_head.weight": state["output_layer.weight"][:vocab]}
    for block, ours, mixer, mlp in _layers(config):
        if mixer is not None:
            out[mixer + "norm.weight"] = state[ours + "input_layernorm.weight"]
        if block[0] == MAMBA:
            prefix = ours + "attention."
            out[mixer + "mixer.in_proj.weight"] = torch.cat([state[f"{prefix}in_proj.{p}_weight"] for p in IN_PROJ])
            for kind in ("weight", "bias"):
                out[mixer + f"mixer.conv1d.{kind}"] = torch.cat([state[f"{prefix}conv1d.{p}_{kind}"] for p in CONV])
            out.update({mixer + "mixer." + name: state[prefix + name] for name in MAMBA_SAME})
        elif block[0] == ATTENTION:
            q, k, v = split_qkv(state[ours + "attention.query_key_value.weight"], config)
            out.update({mixer + "mixer.q_proj.weight": q, mixer + "mixer.k_proj.weight": k,
                        mixer + "mixer.v_proj.weight": v,
                        mixer + "mixer.o_proj.weight": state[ours + "attention.dense.weight"]})
        if mlp is not None:
            out[mlp + "norm.weight"] = state[ours + "post_attention_layernorm.weight"]
            out.update({mlp + theirs: state[ours + our] for our, theirs in _mlp_names(config, block)
                        if ours + our in state})
    return {name: tensor.contiguous() for name, tensor in out.items()}


def from_hf(hf_state: dict, config: ModelConfig, padded_vocab: int) -> dict:
    """The inverse of `to_hf`: the vocabulary's padding rows zeros."""
    out = {"word_embeddings.weight": padded_rows(hf_state["model.embeddings.weight"], padded_vocab),
           "final_layernorm.weight": hf_state["model.norm_f.weight"],
           "output_layer.weight": padded_rows(hf_state["lm_head.weight"], padded_vocab)}
    sizes = _sizes(config)
    for block, ours, mixer, mlp in _layers(config):
        if mixer is not None:
            out[ours + "input_layernorm.weight"] = hf_state[mixer + "norm.weight"]
        if block[0] == MAMBA:
            prefix = ours + "attention."
            parts = hf_state[mixer + "mixer.in_proj.weight"].split([sizes[p] for p in IN_PROJ])
            out.update({f"{prefix}in_proj.{p}_weight": part for p, part in zip(IN_PROJ, parts)})
            for kind in ("weight", "bias"):
                parts = hf_state[mixer + f"mixer.conv1d.{kind}"].split([sizes[p] for p in CONV])
                out.update({f"{prefix}conv1d.{p}_{kind}": part for p, part in zip(CONV, parts)})
            out.update({prefix + name: hf_state[mixer + "mixer." + name] for name in MAMBA_SAME})
        elif block[0] == ATTENTION:
            out[ours + "attention.query_key_value.weight"] = fused_qkv(
                *(hf_state[mixer + f"mixer.{p}_proj.weight"] for p in "qkv"), config)
            out[ours + "attention.dense.weight"] = hf_state[mixer + "mixer.o_proj.weight"]
        if mlp is not None:
            out[ours + "post_attention_layernorm.weight"] = hf_state[mlp + "norm.weight"]
            out.update({ours + our: hf_state[mlp + theirs] for our, theirs in _mlp_names(config, block)
                        if mlp + theirs in hf_state})
    return {name: tensor.contiguous() for name, tensor in out.items()}


def pack(tensors: dict) -> dict:
    """transformers' in-memory names as save_pretrained writes them (model.* is backbone.*)."""
    return {("backbone." + name[len("model."):] if name.startswith("model.") else name): t
            for name, t in tensors.items()}


def unpack(tensors: dict, num_layers: int) -> dict:
    """A file's names as transformers holds them; a release's MTP layers (not loaded by transformers) dropped."""
    renamed = {}
    for name, tensor in tensors.items():
        if name.startswith("mtp."):
            continue
        name = "model." + name[len("backbone."):] if name.startswith("backbone.") else name
        if name.endswith((".mixer.experts.up_proj", ".mixer.experts.down_proj")) and tensor.dim() == 3:
            prefix, kind = name.rsplit(".", 1)  # transformers' in-memory experts [E, out, in], one per expert here
            renamed.update({f"{prefix}.{e}.{kind}.weight": tensor[e] for e in range(tensor.shape[0])})
        else:
            renamed[name] = tensor
    return canonical_names(renamed, num_layers)


WEIGHTS = FamilyWeights(MODEL_TYPE, ARCHITECTURE, claims, misfits, hf_config, to_hf, from_hf, pack=pack,
                        unpack=unpack, read_whole="its Mamba conv1d weights are [rows, 1, width], split by part "
                                                  "(more than moving rows of a 2-D tensor)",
                        holds_hybrid_blocks=True)
