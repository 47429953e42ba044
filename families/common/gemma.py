"""What Gemma 2 and Gemma 3 share: their keys beyond Llama's core, their blocks (GeGLU, sandwich norms, gain stored less
one, scaled embeddings), and the rules, settings and keys they read and write alike.
"""

from __future__ import annotations

import math
from typing import Optional

from base.errors import ConfigError
from families.common.dense import (
    LAYER_TYPES,
    LLAMA_BLOCKS,
    SLIDING,
    checked_layer_types,
    core_fields,
    core_write,
    dense_typed,
    layer_types_of,
    sliding_window_of,
    window_settings,
)
from families.common.features import carried_fields, carried_settings
from families.common.fields import BOOLEAN, NAME, POSITIVE_INT, Field, FolderValue, HFConfig
from gpt.model_config import ModelConfig

# transformers' hidden_activation names -> --activation (ACT2FN: gelu_pytorch_tanh and gelu_new are the tanh GeLU)
ACTIVATIONS = {"gelu_pytorch_tanh": "gelu_tanh", "gelu_new": "gelu_tanh", "gelu": "gelu"}
WRITTEN_ACTIVATIONS = {"gelu_tanh": "gelu_pytorch_tanh", "gelu": "gelu"}


def gemma_fields(*extra: Field, bidirectional_default=None, **defaults) -> tuple[Field, ...]:
    """Gemma 2's and Gemma 3's keys: Llama's core with hidden_activation for hidden_act, and theirs."""
    return core_fields(Field("hidden_activation", NAME, "gelu_pytorch_tanh"), Field("attention_bias", BOOLEAN, False),
                       Field("query_pre_attn_scalar", POSITIVE_INT, 256), LAYER_TYPES,
                       Field("use_bidirectional_attention", BOOLEAN, bidirectional_default, nullable=True), *extra,
                       drop=("hidden_act",), **defaults)


# Block features Gemma 2 and 3 hold beyond GEMMA_BLOCKS.
GEMMA_CARRIES = ("softmax_scale", "attn_logit_softcapping", "final_logit_softcapping")
GEMMA_BLOCKS = {**LLAMA_BLOCKS, "swiglu": False, "gated_linear_unit": True, "apply_layernorm_1p": True,
                "sublayer_norms": "input_and_output", "scale_embeddings_by_sqrt_hidden": True}
# (ours in a block, Gemma's in a layer): post_attention_layernorm is on the attention's output.
GEMMA_NORMS = (("input_layernorm.weight", "input_layernorm.weight"),
               ("attention_output_layernorm.weight", "post_attention_layernorm.weight"),
               ("post_attention_layernorm.weight", "pre_feedforward_layernorm.weight"),
               ("mlp_output_layernorm.weight", "post_feedforward_layernorm.weight"))


def gemma_typed(values: dict, raw: dict, path, fields: dict) -> HFConfig:
    """Llama's rules between fields, hidden_activation read as the activation; no MLP bias."""
    return dense_typed({**values, "hidden_act": values["hidden_activation"]}, raw, path, fields,
                       heads_divide_hidden=True)


def gemma_settings(config: HFConfig, model_type: str, pattern: int) -> dict[str, FolderValue]:
    """What Gemma 2 and 3 read alike: the activation, the scale, the soft-capping, the windows (`pattern`: every
    pattern-th layer full, where layer_types is not written)."""
    values, v = config.values, FolderValue
    problems = []
    if config.activation not in ACTIVATIONS:
        problems.append(f"hidden_activation {config.activation!r} (supported: {', '.join(ACTIVATIONS)})")
    if values["attention_bias"]:
        problems.append("attention_bias true (a bias on q, k, v and o without the MLP's is not built here)")
    if values["use_bidirectional_attention"]:
        problems.append("use_bidirectional_attention true (attention here is causal)")
    if problems:
        raise ConfigError(f"{config.path}: this {model_type} model cannot be represented here: {'; '.join(problems)}")
    kinds = checked_layer_types(config) or \
        [SLIDING if (layer + 1) % pattern else "full_attention" for layer in range(config.num_layers)]
    return {"activation": v(ACTIVATIONS[config.activation], "hidden_activation"),
            "softmax_scale": v(values["query_pre_attn_scalar"] ** -0.5, "query_pre_attn_scalar (its ^-0.5)"),
            **carried_settings(values, GEMMA_CARRIES),
            **window_settings(values["sliding_window"], tuple(kind == SLIDING for kind in kinds),
                              "sliding_window, layer_types")}


def query_pre_attn_scalar(model: ModelConfig) -> Optional[int]:
    """Gemma's integer q whose q^-0.5 is the scores' scale, or None where no integer gives --softmax-scale."""
    if model.attention.softmax_scale is None:
        return model.head_dim
    scalar = round(model.attention.softmax_scale ** -2)
    return scalar if scalar > 0 and math.isclose(scalar ** -0.5, model.attention.softmax_scale, rel_tol=1e-12) else None


def gemma_write(model: ModelConfig) -> dict:
    keys = core_write(model)
    keys.pop("hidden_act")
    return {**keys, "hidden_activation": WRITTEN_ACTIVATIONS.get(model.mlp.activation), "attention_bias": False,
            "query_pre_attn_scalar": query_pre_attn_scalar(model), "sliding_window": sliding_window_of(model),
            "layer_types": layer_types_of(model), **carried_fields(model, GEMMA_CARRIES)}


def gemma_needs(model: ModelConfig) -> dict[str, bool]:
    return {"--activation gelu_tanh or gelu (Gemma's GeGLU)": model.mlp.activation not in WRITTEN_ACTIVATIONS,
            "a --softmax-scale of q^-0.5 for an integer q (Gemma's query_pre_attn_scalar)":
                query_pre_attn_scalar(model) is None}
