"""NemotronH's weights (transformers' NemotronHForCausalLM; families/nemotron_h/config.py reads its config.json):
one layer per pattern symbol, model.layers.<j>.norm before its mixer, which is the Mamba mixer (in_proj rows
[z, x, B, C, dt] and conv1d rows [x, B, C], our parts in order), the attention (q, k, v, o_proj) or the MLP
(up_proj, down_proj). A block here is one or two of those layers (gpt/hybrid_pattern.py layer_offsets). The file
names them backbone.* (save_pretrained's), transformers in memory model.*."""

from __future__ import annotations

from typing import Optional

import torch

from families.common.features import flag_for, uncarried
from families.common.layout import FamilyWeights, canonical_names, needs
from families.common.llama_shaped import fused_qkv, padded_rows, split_qkv
from families.nemotron_h.config import NO_CLAMP
from gpt.hybrid_pattern import ATTENTION, MAMBA, MIXERS, MLP, MLPS, PIPE, parse_hybrid_pattern
from gpt.mamba_settings import MambaSettings
from gpt.model_config import ModelConfig

MODEL_TYPE, ARCHITECTURE = "nemotron_h", "NemotronHForCausalLM"
LAYER_TYPES = {MAMBA: "linear_attention", ATTENTION: "full_attention", MLP: "mlp"}
IN_PROJ, CONV = ("z", "x", "B", "C", "dt"), ("x", "B", "C")


def _pattern_blocks(config: ModelConfig):
    pattern = parse_hybrid_pattern(config.hybrid_layer_pattern)
    return pattern.blocks, pattern.layer_offsets()


def claims(config: ModelConfig) -> bool:
    """A pattern with Mamba (`M`) layers, or with one-part attention or MLP blocks and no other mixer."""
    if config.hybrid_layer_pattern is None:
        return False
    blocks, _ = _pattern_blocks(config)
    return any(block[0] == MAMBA for block in blocks) or \
        any(len(block) == 1 for block in blocks) and all(block[0] in (ATTENTION, MLP, MAMBA) for block in blocks)


def misfits(config: ModelConfig) -> list[str]:
    wanted = {"normalization": "RMSNorm", "swiglu": False, "activation": "squared_relu",
              "position_embedding_type": "none", "add_bias_linear": False, "add_qkv_bias": False,
              "qk_layernorm": False, "attention_output_gate": False, "multi_latent_attention": False,
              "untie_embeddings_and_output_weights": True}
    found = needs(config, wanted) + uncarried(config, wanted)
    blocks, _ = _pattern_blocks(config)
    others = sorted({symbol for block in blocks for symbol in block if symbol not in LAYER_TYPES})
    if others:
        found.append(f"--hybrid-layer-pattern of `M`, `*` and `-` layers alone (not {', '.join(others)})")
    if any(block[0] == MAMBA for block in blocks) and config.norms.layernorm_epsilon != MambaSettings.NORM_EPSILON:
        found.append(f"{flag_for('layernorm_epsilon', MambaSettings.NORM_EPSILON)} (NemotronH's one "
                     f"layer_norm_epsilon is also its Mamba norms')")
    if config.mtp.num_layers:
        found.append("no --mtp-num-layers (NemotronHForCausalLM has no multi-token prediction layers)")
    return found


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
        pad_token_id=None)


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
MLP_SAME = (("mlp.dense_h_to_4h.weight", "mixer.up_proj.weight"), ("mlp.dense_4h_to_h.weight", "mixer.down_proj.weight"))


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
                        mixer + "mixer.v_proj.weight": v, mixer + "mixer.o_proj.weight": state[ours + "attention.dense.weight"]})
        if mlp is not None:
            out[mlp + "norm.weight"] = state[ours + "post_attention_layernorm.weight"]
            out.update({mlp + theirs: state[ours + our] for our, theirs in MLP_SAME})
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
            out.update({ours + our: hf_state[mlp + theirs] for our, theirs in MLP_SAME})
    return {name: tensor.contiguous() for name, tensor in out.items()}


def pack(tensors: dict) -> dict:
    """transformers' in-memory names as save_pretrained writes them (model.* is backbone.*)."""
    return {("backbone." + name[len("model."):] if name.startswith("model.") else name): t
            for name, t in tensors.items()}


def unpack(tensors: dict, num_layers: int) -> dict:
    """A file's names (backbone.*, or model.*) as transformers holds them; a release's MTP layers (mtp.*), which
    NemotronHForCausalLM does not load, dropped."""
    renamed = {("model." + name[len("backbone."):] if name.startswith("backbone.") else name): t
               for name, t in tensors.items() if not name.startswith("mtp.")}
    return canonical_names(renamed, num_layers)


WEIGHTS = FamilyWeights(MODEL_TYPE, ARCHITECTURE, claims, misfits, hf_config, to_hf, from_hf, pack=pack,
                        unpack=unpack, whole_because="its Mamba conv1d weights are [rows, 1, width], split by part "
                                                    "(more than moving rows of a 2-D tensor)",
                        holds_hybrid_blocks=True)
