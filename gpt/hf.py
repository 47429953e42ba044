"""Weight mapping between `GPTModel` (at TP=1) and transformers' `GPT2LMHeadModel`.

Two differences in layout, besides the names:
- transformers' GPT-2 uses `Conv1D`, whose weight is the transpose of a Linear's ([in, out]).
- its fused QKV orders output features [q | k | v], each head by head; ours orders them head by head,
  [head][q, k, v], so that a contiguous tensor-parallel slice holds whole heads.
Our vocabulary may be padded; transformers' is the tokenizer's exact size.
"""

from __future__ import annotations

import torch

from gpt.config import ModelConfig

ACTIVATION_TO_HF = {"gelu_tanh": "gelu_new", "gelu": "gelu"}


def hf_config(config: ModelConfig):
    """A transformers GPT2Config describing the same network (dropouts as configured)."""
    from transformers import GPT2Config

    return GPT2Config(
        vocab_size=config.vocab_size, n_positions=config.max_position_embeddings, n_embd=config.hidden_size,
        n_layer=config.num_layers, n_head=config.num_attention_heads, n_inner=config.ffn_size,
        activation_function=ACTIVATION_TO_HF[config.activation], layer_norm_epsilon=config.layernorm_epsilon,
        resid_pdrop=config.hidden_dropout, embd_pdrop=config.hidden_dropout,
        attn_pdrop=config.attention_dropout, initializer_range=config.init_method_std, tie_word_embeddings=True)


def _qkv_ours_to_hf(tensor: torch.Tensor, heads: int) -> torch.Tensor:
    """[heads*3*d, ...] in [head][qkv][d] order -> [3*heads*d, ...] in [qkv][head][d] order."""
    rest = tensor.shape[1:]
    return tensor.reshape(heads, 3, -1, *rest).transpose(0, 1).reshape(-1, *rest)


def _qkv_hf_to_ours(tensor: torch.Tensor, heads: int) -> torch.Tensor:
    rest = tensor.shape[1:]
    return tensor.reshape(3, heads, -1, *rest).transpose(0, 1).reshape(-1, *rest)


# How each tensor moves: "same" as is, "linear" transposed (Linear <-> Conv1D), "qkv_weight" and
# "qkv_bias" re-ordered between our per-head layout and transformers' [q | k | v] layout.
def _name_table(config: ModelConfig) -> list[tuple[str, str, str]]:
    """(our name, transformers' name, how it converts) for every tensor except the token embedding."""
    table = [("position_embeddings.weight", "transformer.wpe.weight", "same"),
             ("final_layernorm.weight", "transformer.ln_f.weight", "same"),
             ("final_layernorm.bias", "transformer.ln_f.bias", "same")]
    for i in range(config.num_layers):
        ours, hf = f"blocks.{i}.", f"transformer.h.{i}."
        table += [
            (ours + "input_layernorm.weight", hf + "ln_1.weight", "same"),
            (ours + "input_layernorm.bias", hf + "ln_1.bias", "same"),
            (ours + "attention.query_key_value.weight", hf + "attn.c_attn.weight", "qkv_weight"),
            (ours + "attention.query_key_value.bias", hf + "attn.c_attn.bias", "qkv_bias"),
            (ours + "attention.dense.weight", hf + "attn.c_proj.weight", "linear"),
            (ours + "attention.dense.bias", hf + "attn.c_proj.bias", "same"),
            (ours + "post_attention_layernorm.weight", hf + "ln_2.weight", "same"),
            (ours + "post_attention_layernorm.bias", hf + "ln_2.bias", "same"),
            (ours + "mlp.dense_h_to_4h.weight", hf + "mlp.c_fc.weight", "linear"),
            (ours + "mlp.dense_h_to_4h.bias", hf + "mlp.c_fc.bias", "same"),
            (ours + "mlp.dense_4h_to_h.weight", hf + "mlp.c_proj.weight", "linear"),
            (ours + "mlp.dense_4h_to_h.bias", hf + "mlp.c_proj.bias", "same"),
        ]
    return table


def _to_hf(tensor: torch.Tensor, how: str, heads: int) -> torch.Tensor:
    if how == "qkv_weight":
        return _qkv_ours_to_hf(tensor, heads).t()
    if how == "qkv_bias":
        return _qkv_ours_to_hf(tensor, heads)
    return tensor.t() if how == "linear" else tensor


def _from_hf(tensor: torch.Tensor, how: str, heads: int) -> torch.Tensor:
    if how == "qkv_weight":
        return _qkv_hf_to_ours(tensor.t(), heads)
    if how == "qkv_bias":
        return _qkv_hf_to_ours(tensor, heads)
    return tensor.t() if how == "linear" else tensor


def to_hf_state_dict(state_dict: dict[str, torch.Tensor], config: ModelConfig) -> dict[str, torch.Tensor]:
    heads = config.num_attention_heads
    out = {"transformer.wte.weight": state_dict["word_embeddings.weight"][: config.vocab_size]}
    for ours, hf, how in _name_table(config):
        out[hf] = _to_hf(state_dict[ours], how, heads)
    out["lm_head.weight"] = out["transformer.wte.weight"]
    return {name: tensor.contiguous() for name, tensor in out.items()}


def from_hf_state_dict(hf_state: dict[str, torch.Tensor], config: ModelConfig,
                       padded_vocab_size: int) -> dict[str, torch.Tensor]:
    """The inverse of `to_hf_state_dict`; padding rows of the vocabulary are zeros."""
    heads = config.num_attention_heads
    wte = hf_state["transformer.wte.weight"]
    padding = wte.new_zeros(padded_vocab_size - wte.shape[0], wte.shape[1])
    out = {"word_embeddings.weight": torch.cat([wte, padding])}
    for ours, hf, how in _name_table(config):
        out[ours] = _from_hf(hf_state[hf], how, heads)
    return {name: tensor.contiguous() for name, tensor in out.items()}
