"""GPT-2's weights between our GPTModel and transformers' GPT2LMHeadModel, and the GPT2Config the export writes. Its
Conv1D weights are a Linear's transpose, and its fused QKV is [q | k | v] where ours is per head, so a TP slice holds
whole heads.
"""

from __future__ import annotations

from typing import Optional

import torch

from base.errors import ConfigError
from families.common.llama_shaped import beyond_llama
from families.gpt2.config import ACTIVATION_FROM_HF, HF_ATTENTION_OPTIONS  # noqa: F401 - read from here too
from gpt.model_config import ModelConfig

# Causal-mask buffers older transformers saved with the weights; not weights.
BUFFER_SUFFIXES = (".attn.bias", ".attn.masked_bias")
# transformers' "relu2" is square(relu(x)), which GPT2MLP takes: --squared-relu exports as it.
ACTIVATION_TO_HF = {"gelu_tanh": "gelu_new", "gelu": "gelu", "squared_relu": "relu2"}


def gpt2_misfits(config: ModelConfig) -> list[str]:
    """The flags by which `config` differs from GPT-2's blocks."""
    default = ModelConfig()
    features = {"--normalization RMSNorm": config.norms.normalization != default.norms.normalization,
                "--swiglu": config.mlp.swiglu,
                f"--position-embedding-type {config.positions.position_embedding_type}":
                    config.positions.position_embedding_type != default.positions.position_embedding_type,
                "--num-query-groups": config.attention.num_query_groups not in (None, config.num_attention_heads),
                "--untie-embeddings-and-output-weights": config.output.untie_embeddings_and_output_weights,
                "--disable-bias-linear": not config.add_bias_linear, "--add-qkv-bias": config.attention.add_qkv_bias,
                "--qk-layernorm": config.attention.qk_layernorm,
                "--xielu": config.mlp.activation == "xielu",
                f"--kv-channels {config.head_dim}": config.head_dim * config.num_attention_heads != config.hidden_size,
                "--attention-output-gate": config.attention.attention_output_gate,
                "--multi-latent-attention": config.mla.multi_latent_attention,
                f"--num-experts {_counts(config.experts.num_experts)}": config.moe is not None,
                **{need.removeprefix("no "): on for need, on in beyond_llama(config).items()}}
    return [flag for flag, differs in features.items() if differs]


def _counts(num_experts) -> str:
    """--num-experts as typed: one count, or a Megatron-DeepSpeed list of one per MoE layer."""
    return " ".join(map(str, num_experts)) if isinstance(num_experts, tuple) else str(num_experts)


def check_gpt2_shaped(config: ModelConfig, what: str) -> None:
    """A Llama-shaped model is refused in one line naming what differs, not a KeyError halfway."""
    differing = gpt2_misfits(config)
    if differing:
        raise ConfigError(f"{what} reads GPT-2-shaped models only; this one has {', '.join(differing)}")


def check_dense(config: ModelConfig, what: str) -> None:
    """A GPT2LMHeadModel holds no experts (Mixtral and Qwen2-MoE folders go through families/common/llama_shaped.py)."""
    if config.moe is not None:
        raise ConfigError(f"{what} of a GPT2LMHeadModel has no experts for --num-experts {_counts(config.experts.num_experts)}: "
                          f"experts come from a MixtralForCausalLM or Qwen2MoeForCausalLM folder")


def hf_config(config: ModelConfig, eod_token_id: Optional[int] = None):
    """A transformers GPT2Config describing the same network; BOS/EOS are our end-of-document id (GPT-2's 50256 may lie
    outside a smaller vocabulary)."""
    from transformers import GPT2Config

    return GPT2Config(
        bos_token_id=eod_token_id, eos_token_id=eod_token_id,
        vocab_size=config.vocab_size, n_positions=config.max_position_embeddings, n_embd=config.hidden_size,
        n_layer=config.num_layers, n_head=config.num_attention_heads, n_inner=config.ffn_size,
        activation_function=ACTIVATION_TO_HF[config.mlp.activation], layer_norm_epsilon=config.norms.layernorm_epsilon,
        resid_pdrop=config.hidden_dropout, embd_pdrop=config.hidden_dropout,
        attn_pdrop=config.attention.attention_dropout, initializer_range=config.init_method_std, tie_word_embeddings=True)


def qkv_ours_to_hf(tensor: torch.Tensor, heads: int) -> torch.Tensor:
    """[heads*3*d, ...] in [head][qkv][d] order -> [3*heads*d, ...] in [qkv][head][d] order."""
    rest = tensor.shape[1:]
    return tensor.reshape(heads, 3, -1, *rest).transpose(0, 1).reshape(-1, *rest)


def qkv_hf_to_ours(tensor: torch.Tensor, heads: int) -> torch.Tensor:
    rest = tensor.shape[1:]
    return tensor.reshape(3, heads, -1, *rest).transpose(0, 1).reshape(-1, *rest)


def name_table(config: ModelConfig) -> list[tuple[str, str, str]]:
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
        return qkv_ours_to_hf(tensor, heads).t()
    if how == "qkv_bias":
        return qkv_ours_to_hf(tensor, heads)
    return tensor.t() if how == "linear" else tensor


def _from_hf(tensor: torch.Tensor, how: str, heads: int) -> torch.Tensor:
    if how == "qkv_weight":
        return qkv_hf_to_ours(tensor.t(), heads)
    if how == "qkv_bias":
        return qkv_hf_to_ours(tensor, heads)
    return tensor.t() if how == "linear" else tensor



def to_hf(state_dict: dict[str, torch.Tensor], config: ModelConfig) -> dict[str, torch.Tensor]:
    """Our whole state dict (gains already shifted) under GPT2LMHeadModel's names."""
    heads = config.num_attention_heads
    out = {"transformer.wte.weight": state_dict["word_embeddings.weight"][: config.vocab_size]}
    for ours, hf, how in name_table(config):
        out[hf] = _to_hf(state_dict[ours], how, heads)
    out["lm_head.weight"] = out["transformer.wte.weight"]
    return {name: tensor.contiguous() for name, tensor in out.items()}


def from_hf_state_dict(hf_state: dict[str, torch.Tensor], config: ModelConfig,
                       padded_vocab_size: int) -> dict[str, torch.Tensor]:
    """The inverse of `to_hf_state_dict`; padding rows of the vocabulary are zeros."""
    check_dense(config, "the Hugging Face import (--init-from-hf)")
    check_gpt2_shaped(config, "the Hugging Face import (--init-from-hf)")
    heads = config.num_attention_heads
    wte = hf_state["transformer.wte.weight"]
    padding = wte.new_zeros(padded_vocab_size - wte.shape[0], wte.shape[1])
    out = {"word_embeddings.weight": torch.cat([wte, padding])}
    for ours, hf, how in name_table(config):
        out[ours] = _from_hf(hf_state[hf], how, heads)
    return {name: tensor.contiguous() for name, tensor in out.items()}


def canonical_names(tensors: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Names as GPT2LMHeadModel has them (`transformer.` added for a GPT2Model file); causal-mask buffers dropped."""
    out = {}
    for name, tensor in tensors.items():
        if name.endswith(BUFFER_SUFFIXES):
            continue
        if not name.startswith(("transformer.", "lm_head.")):
            name = "transformer." + name
        out[name] = tensor
    return out


def tensor_shapes(config: ModelConfig) -> dict[str, tuple[int, ...]]:
    """The shape of every GPT2LMHeadModel weight for `config` (Conv1D weights are [in, out])."""
    h, ffn = config.hidden_size, config.ffn_size
    shapes = {"transformer.wte.weight": (config.vocab_size, h),
              "transformer.wpe.weight": (config.max_position_embeddings, h),
              "transformer.ln_f.weight": (h,), "transformer.ln_f.bias": (h,)}
    for i in range(config.num_layers):
        layer = f"transformer.h.{i}."
        shapes.update({layer + "ln_1.weight": (h,), layer + "ln_1.bias": (h,),
                       layer + "attn.c_attn.weight": (h, 3 * h), layer + "attn.c_attn.bias": (3 * h,),
                       layer + "attn.c_proj.weight": (h, h), layer + "attn.c_proj.bias": (h,),
                       layer + "ln_2.weight": (h,), layer + "ln_2.bias": (h,),
                       layer + "mlp.c_fc.weight": (h, ffn), layer + "mlp.c_fc.bias": (ffn,),
                       layer + "mlp.c_proj.weight": (ffn, h), layer + "mlp.c_proj.bias": (h,)})
    return shapes
