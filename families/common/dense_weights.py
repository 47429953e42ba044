"""The weights of the dense families between our GPTModel and their transformers classes: Llama's layout with each
family's names (Phi-3 fuses qkv_proj and gate_up_proj; a multimodal Gemma 3's language model is read under its own
names). Gemma's norms store the gain less one on both sides.
"""

from __future__ import annotations

from typing import Optional

import torch

from families.common.dense import DenseFamily
from families.common.llama_shaped import BUFFER_SUFFIXES, ends_from_hf, ends_to_hf, fused_qkv, split_qkv
from gpt.model_config import ModelConfig

# A multimodal Gemma 3's language model (prefix by transformers version), and the parts that are not it.
LANGUAGE_MODEL_PREFIXES = (("model.language_model.", "model."), ("language_model.model.", "model."),
                           ("language_model.lm_head.", "lm_head."))
NOT_THE_LANGUAGE_MODEL = ("model.vision_tower.", "vision_tower.", "model.multi_modal_projector.",
                          "multi_modal_projector.")


def canonical_names(tensors: dict[str, torch.Tensor], family: DenseFamily) -> dict[str, torch.Tensor]:
    """Names as the family's ForCausalLM has them (`model.` added; Gemma 3's language model only); rotary buffers
    dropped."""
    out = {}
    for name, tensor in tensors.items():
        if name.endswith(BUFFER_SUFFIXES) or name.startswith(NOT_THE_LANGUAGE_MODEL):
            continue
        for prefix, ours in LANGUAGE_MODEL_PREFIXES if family.section is not None else ():
            if name.startswith(prefix):
                name = ours + name[len(prefix):]
                break
        if not name.startswith(("model.", "lm_head.")):
            name = "model." + name
        out[name] = tensor
    return out


def _linear_kinds(model: ModelConfig) -> tuple[str, ...]:
    return ("weight", "bias") if model.add_bias_linear else ("weight",)


def _qkv_kinds(model: ModelConfig) -> tuple[str, ...]:
    return ("weight", "bias") if model.attention.qkv_bias(model.add_bias_linear) else ("weight",)


def _mlp_names(family: DenseFamily) -> tuple[tuple[str, str], ...]:
    names = (("mlp.dense_4h_to_h", "mlp.down_proj"),)
    if family.fused_gate_up is None:
        names += (("mlp.dense_h_to_4h_gate", "mlp.gate_proj"), ("mlp.dense_h_to_4h_up", "mlp.up_proj"))
    return (("attention.dense", "self_attn.o_proj"), *names)


def to_hf(state_dict: dict[str, torch.Tensor], model: ModelConfig, family: DenseFamily) -> dict[str, torch.Tensor]:
    """Our whole (TP 1 layout) state dict under the family's names; a tied model has no lm_head."""
    out = ends_to_hf(state_dict, model)
    for i in range(model.num_layers):
        ours, theirs = f"blocks.{i}.", f"model.layers.{i}."
        for kind in _qkv_kinds(model):
            q, k, v = split_qkv(state_dict[ours + "attention.query_key_value." + kind], model)
            if family.fused_qkv is not None:
                out[theirs + family.fused_qkv + "." + kind] = torch.cat([q, k, v])
            else:
                out.update({theirs + f"self_attn.{name}_proj." + kind: part for name, part in zip("qkv", (q, k, v))})
        for kind in _linear_kinds(model):
            out.update({theirs + their_name + "." + kind: state_dict[ours + our_name + "." + kind]
                        for our_name, their_name in _mlp_names(family)})
            if family.fused_gate_up is not None:
                gate, up = (state_dict[ours + f"mlp.dense_h_to_4h_{part}." + kind] for part in ("gate", "up"))
                out[theirs + family.fused_gate_up + "." + kind] = torch.cat([gate, up])
        out.update({theirs + their_name: state_dict[ours + our_name] for our_name, their_name in family.layer_names})
    return {name: tensor.contiguous() for name, tensor in out.items()}


def from_hf(hf_state: dict[str, torch.Tensor], model: ModelConfig, padded_vocab_size: int,
            family: DenseFamily) -> dict[str, torch.Tensor]:
    """The inverse of `to_hf`; padding rows are zeros."""
    out = ends_from_hf(hf_state, model, padded_vocab_size)
    d = model.head_dim
    q_rows, kv_rows = model.num_attention_heads * d, model.attention.query_groups(model.num_attention_heads) * d
    for i in range(model.num_layers):
        ours, theirs = f"blocks.{i}.", f"model.layers.{i}."
        for kind in _qkv_kinds(model):
            if family.fused_qkv is not None:
                q, k, v = hf_state[theirs + family.fused_qkv + "." + kind].split([q_rows, kv_rows, kv_rows])
            else:
                q, k, v = (hf_state[theirs + f"self_attn.{name}_proj." + kind] for name in "qkv")
            out[ours + "attention.query_key_value." + kind] = fused_qkv(q, k, v, model)
        for kind in _linear_kinds(model):
            out.update({ours + our_name + "." + kind: hf_state[theirs + their_name + "." + kind]
                        for our_name, their_name in _mlp_names(family)})
            if family.fused_gate_up is not None:
                gate, up = hf_state[theirs + family.fused_gate_up + "." + kind].chunk(2)
                out[ours + "mlp.dense_h_to_4h_gate." + kind], out[ours + "mlp.dense_h_to_4h_up." + kind] = gate, up
        out.update({ours + our_name: hf_state[theirs + their_name] for our_name, their_name in family.layer_names})
    return {name: tensor.contiguous() for name, tensor in out.items()}


def tensor_shapes(model: ModelConfig, family: DenseFamily) -> dict[str, tuple[int, ...]]:
    """The shape of every weight of the family's ForCausalLM for `model`: `to_hf` of a meta state dict."""
    from gpt.model import GPTModel
    from parallel.state import ParallelState

    meta = GPTModel(model, ParallelState(device=torch.device("meta"))).state_dict()
    return {name: tuple(tensor.shape) for name, tensor in to_hf(meta, model, family).items()}


def hf_config(model: ModelConfig, family: DenseFamily, eod_token_id: Optional[int] = None):
    """The family's transformers config describing `model`; BOS and EOS are our end-of-document id."""
    import transformers

    config = getattr(transformers, family.config_class)(**family.write(model), bos_token_id=eod_token_id,
                                                        eos_token_id=eod_token_id, pad_token_id=None)
    config.architectures = [family.architecture]
    return config
