"""GPT-2's config.json (transformers' GPT2LMHeadModel): its field table, the rule between its fields, the settings it
gives; the activations and attention variants our blocks hold."""

from __future__ import annotations

from pathlib import Path

from base.errors import ConfigError
from families.common.fields import (
    BOOLEAN,
    NAME,
    NON_NEGATIVE_NUMBER,
    POSITIVE_INT,
    POSITIVE_NUMBER,
    PROBABILITY,
    TOKEN_ID_FIELDS,
    Field,
    FolderValue,
    HFConfig,
)
from families.common.reader import FamilyReader

GPT2_ARCHITECTURE = "GPT2LMHeadModel"
# transformers' GPT-2 activation names -> ours ("relu2" is transformers' ReLUSquaredActivation).
ACTIVATION_FROM_HF = {"gelu_new": "gelu_tanh", "gelu_pytorch_tanh": "gelu_tanh", "gelu": "gelu",
                      "relu2": "squared_relu"}
# Their GPT-2 attention variants we do not implement: key -> the value our attention corresponds to.
HF_ATTENTION_OPTIONS = {"scale_attn_weights": True, "scale_attn_by_inverse_layer_idx": False,
                        "add_cross_attention": False, "tie_word_embeddings": True}

# GPT2Config's fields and defaults (transformers/models/gpt2/configuration_gpt2.py); the summary_* ones
# belong to GPT2DoubleHeadsModel's head and are not read.
GPT2_FIELDS = (
    Field("vocab_size", POSITIVE_INT, 50257),
    Field("n_positions", POSITIVE_INT, 1024, aliases=("max_position_embeddings",)),
    Field("n_embd", POSITIVE_INT, 768, aliases=("hidden_size",)),
    Field("n_layer", POSITIVE_INT, 12, aliases=("num_hidden_layers",)),
    Field("n_head", POSITIVE_INT, 12, aliases=("num_attention_heads",)),
    Field("n_inner", POSITIVE_INT, None, nullable=True),  # null: 4 * n_embd
    Field("activation_function", NAME, "gelu_new"),
    Field("resid_pdrop", PROBABILITY, 0.1),
    Field("embd_pdrop", PROBABILITY, 0.1),
    Field("attn_pdrop", PROBABILITY, 0.1),
    Field("layer_norm_epsilon", POSITIVE_NUMBER, 1e-5),
    Field("initializer_range", NON_NEGATIVE_NUMBER, 0.02),
    Field("scale_attn_weights", BOOLEAN, True),
    Field("scale_attn_by_inverse_layer_idx", BOOLEAN, False),
    Field("reorder_and_upcast_attn", BOOLEAN, False),
    Field("add_cross_attention", BOOLEAN, False),
    Field("tie_word_embeddings", BOOLEAN, True),
    Field("use_cache", BOOLEAN, True),
    *TOKEN_ID_FIELDS,
)


def read(values: dict, raw: dict, path: Path, fields: dict) -> HFConfig:
    hidden, heads = values["n_embd"], values["n_head"]
    if hidden % heads:
        # transformers' GPT2Attention: "`embed_dim` must be divisible by num_heads"
        raise ConfigError(f"{path}: n_embd {hidden} is not a multiple of n_head {heads}; each attention head "
                          f"takes an equal slice of the hidden size")
    return HFConfig(
        path=path, family="gpt2", vocab_size=values["vocab_size"], hidden_size=hidden, num_layers=values["n_layer"],
        num_attention_heads=heads, num_key_value_heads=heads, head_dim=hidden // heads,
        ffn_hidden_size=values["n_inner"] or 4 * hidden, max_position_embeddings=values["n_positions"],
        norm_epsilon=float(values["layer_norm_epsilon"]), activation=values["activation_function"],
        tie_word_embeddings=values["tie_word_embeddings"], attention_bias=True, mlp_bias=True,
        initializer_range=float(values["initializer_range"]), rope=None, fields=fields)




def settings(config: HFConfig) -> dict[str, FolderValue]:
    problems = []
    if config.activation not in ACTIVATION_FROM_HF:
        problems.append(f"activation_function {config.activation!r} (supported: {', '.join(ACTIVATION_FROM_HF)})")
    for key, supported in HF_ATTENTION_OPTIONS.items():
        value = config.fields.get(key, supported)
        if value is not None and value != supported:
            problems.append(f"{key} {value!r} (our model supports only {supported!r})")
    if problems:
        raise ConfigError(f"{config.path}: this {GPT2_ARCHITECTURE} cannot be represented here: {'; '.join(problems)}")
    v = FolderValue
    return {"num_layers": v(config.num_layers, "n_layer"), "hidden_size": v(config.hidden_size, "n_embd"),
            "num_attention_heads": v(config.num_attention_heads, "n_head"),
            "kv_channels": v(config.head_dim, "n_embd / n_head"),
            "ffn_hidden_size": v(config.ffn_hidden_size, "n_inner" if config.fields.get("n_inner") else "4 x n_embd"),
            "num_query_groups": v(config.num_key_value_heads, "n_head (one key/value head per query head)"),
            "max_position_embeddings": v(config.max_position_embeddings, "n_positions"),
            "layernorm_epsilon": v(config.norm_epsilon, "layer_norm_epsilon"),
            "activation": v(ACTIVATION_FROM_HF[config.activation], "activation_function"),
            "normalization": v("LayerNorm", "model_type gpt2"), "swiglu": v(False, "model_type gpt2"),
            "position_embedding_type": v("learned_absolute", "model_type gpt2"),
            "untie_embeddings_and_output_weights": v(False, "tie_word_embeddings"),
            "add_bias_linear": v(True, "model_type gpt2"), "add_qkv_bias": v(False, "model_type gpt2"),
            "qk_layernorm": v(False, "model_type gpt2"), "qk_layernorm_over_projection": v(False, "model_type gpt2"),
            "attention_output_gate": v(False, "model_type gpt2")}



READER = FamilyReader("gpt2", ("GPT2LMHeadModel", "GPT2Model"), GPT2_FIELDS, read, settings)
