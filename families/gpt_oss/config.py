"""GPT-OSS (transformers' GptOssForCausalLM) as Megatron-Core's flags: biased GQA with learned sinks, sliding windows by
layer_types and YaRN positions; a softmax top-k router over experts computing clamped quick-GeGLU with (up + 1). A
quantization_config (MXFP4 experts) is named at the start.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

from base.errors import ConfigError
from families.common.fields import (
    BOOLEAN,
    LLAMA_FIELDS,
    NAMES,
    NON_NEGATIVE_NUMBER,
    OBJECT,
    POSITIVE_INT,
    POSITIVE_NUMBER,
    Field,
    HFConfig,
    llama_shaped,
)
from families.common.moe import layer_freq, moe_config
from families.common.quantized_release import quantization_note
from families.common.reader import FamilyReader, FolderValue, llama_settings

MODEL_TYPE = "gpt_oss"
ARCHITECTURES = ("GptOssForCausalLM", "GptOssModel")
QUICK_GELU_ALPHA = 1.702  # megatron/core/activations.py quick_gelu
DEFAULT_ROPE = {"rope_type": "yarn", "rope_theta": 150000.0, "factor": 32.0, "beta_fast": 32.0, "beta_slow": 1.0,
                "original_max_position_embeddings": 4096, "truncate": False}
SLIDING, FULL = "sliding_attention", "full_attention"

FIELDS = (
    *(spec for spec in LLAMA_FIELDS if spec.key not in ("vocab_size", "hidden_size", "intermediate_size",
                                                        "num_hidden_layers", "num_attention_heads",
                                                        "num_key_value_heads", "head_dim", "max_position_embeddings",
                                                        "rms_norm_eps", "attention_bias", "mlp_bias", "pretraining_tp")),
    Field("num_hidden_layers", POSITIVE_INT, 36),
    Field("num_local_experts", POSITIVE_INT, 128, aliases=("num_experts",)),
    Field("vocab_size", POSITIVE_INT, 201088),
    Field("hidden_size", POSITIVE_INT, 2880),
    Field("intermediate_size", POSITIVE_INT, 2880),
    Field("head_dim", POSITIVE_INT, 64),
    Field("num_attention_heads", POSITIVE_INT, 64),
    Field("num_key_value_heads", POSITIVE_INT, 8),
    Field("sliding_window", POSITIVE_INT, 128, nullable=True),
    Field("max_position_embeddings", POSITIVE_INT, 131072),
    Field("rms_norm_eps", POSITIVE_NUMBER, 1e-5),
    Field("num_experts_per_tok", POSITIVE_INT, 4),
    Field("swiglu_alpha", POSITIVE_NUMBER, QUICK_GELU_ALPHA),
    Field("swiglu_limit", POSITIVE_NUMBER, 7.0),
    Field("router_aux_loss_coef", NON_NEGATIVE_NUMBER, 0.001),
    Field("output_router_logits", BOOLEAN, False),
    Field("layer_types", NAMES, None, nullable=True),
    Field("attention_bias", BOOLEAN, True),
    Field("quantization_config", OBJECT, None, nullable=True),
)


def read(values: dict, raw: dict, path: Path, fields: dict) -> HFConfig:
    layers = values["num_hidden_layers"]
    layer_types = values["layer_types"]
    if layer_types is None:  # GptOssConfig.__post_init__: sliding, full, sliding, ...
        layer_types = [SLIDING if (i + 1) % 2 else FULL for i in range(layers)]
    if len(layer_types) != layers or set(layer_types) - {SLIDING, FULL}:
        raise ConfigError(f"{path}: layer_types must give one of {SLIDING!r} or {FULL!r} for each of the "
                          f"num_hidden_layers {layers} layers")
    if not any(isinstance(raw.get(key), dict) for key in ("rope_parameters", "rope_scaling")):
        raw = {**raw, "rope_parameters": DEFAULT_ROPE}
    config = llama_shaped({**values, "mlp_bias": values["attention_bias"]}, raw, path, fields,
                          heads_divide_hidden=False)
    return moe_config(config, MODEL_TYPE, experts=values["num_local_experts"], topk=values["num_experts_per_tok"],
                      moe_ffn=values["intermediate_size"], layers=(True,) * layers, norm_topk_prob=True,
                      values={**values, "layer_types": tuple(layer_types)},
                      notes=quantization_note(path, values["quantization_config"], ARCHITECTURES[0]))


def settings(config: HFConfig) -> dict[str, FolderValue]:
    values, v, rope = config.values, FolderValue, config.rope
    problems = []
    if not values["attention_bias"]:
        problems.append("attention_bias false (the router and experts keep their biases, and --disable-bias-linear "
                        "would drop those too)")
    if values["swiglu_alpha"] != QUICK_GELU_ALPHA:
        problems.append(f"swiglu_alpha {values['swiglu_alpha']!r} (--quick-geglu's quick_gelu fixes it at "
                        f"{QUICK_GELU_ALPHA})")
    rope_settings = _rope_settings(rope, config.max_position_embeddings, problems)
    if problems:
        raise ConfigError(f"{config.path}: this {ARCHITECTURES[0]} cannot be represented here: {'; '.join(problems)}")
    plain = dataclasses.replace(config, activation="silu", rope=dataclasses.replace(rope, rope_type="default"),
                                fields={key: value for key, value in config.fields.items() if key != "sliding_window"})
    llama = llama_settings(plain)
    llama.pop("use_rope_scaling")
    sliding = tuple(kind == SLIDING for kind in values["layer_types"])
    window = values["sliding_window"]
    windows = {}
    if window is not None and any(sliding):
        windows["window_size"] = v((window - 1, 0), "sliding_window (transformers' window counts the query itself)")
        if not all(sliding):
            windows["window_attn_skip_freq"] = v(layer_freq(sliding), "layer_types")
    return {**llama, **rope_settings, **windows,
            "swiglu": v(False, f"model_type {MODEL_TYPE}"), "quick_geglu": v(True, f"model_type {MODEL_TYPE}"),
            "glu_linear_offset": v(1.0, f"model_type {MODEL_TYPE} (GptOssExperts: (up + 1))"),
            "activation_func_clamp_value": v(float(values["swiglu_limit"]), "swiglu_limit"),
            "softmax_type": v("learnable", f"model_type {MODEL_TYPE} (self_attn.sinks)"),
            "add_bias_linear": v(True, "attention_bias"), "add_qkv_bias": v(False, "attention_bias"),
            "num_experts": v(config.num_experts, "num_local_experts"),
            "moe_router_topk": v(config.experts_per_token, "num_experts_per_tok"),
            "moe_ffn_hidden_size": v(config.moe_ffn_hidden_size, "intermediate_size"),
            "moe_router_pre_softmax": v(False, f"model_type {MODEL_TYPE} (a softmax over the top k)")}


def _rope_settings(rope, max_positions: int, problems: list[str]) -> dict[str, FolderValue]:
    """Plain rotary or YaRN, with transformers' mscale concentration (Megatron's --mscale 1 --mscale-all-dim 0 by
    default)."""
    v = FolderValue
    if rope.rope_type == "default":
        return {"position_embedding_type": v("rope", "rope_parameters.rope_type")}
    if rope.rope_type != "yarn" or rope.factor is None:
        problems.append(f"rope_parameters rope_type {rope.rope_type!r} (GPT-OSS here takes the default rope or yarn "
                        f"with its factor)")
        return {}
    if rope.attention_factor is not None:
        problems.append("rope_parameters attention_factor (YaRN here computes it from factor and the mscales)")
    if rope.mscale and rope.mscale_all_dim:
        mscale, mscale_all_dim = rope.mscale, rope.mscale_all_dim
    else:
        mscale, mscale_all_dim = 1.0, 0.0
    return {"position_embedding_type": v("yarn", "rope_parameters.rope_type"),
            "rotary_scaling_factor": v(rope.factor, "rope_parameters.factor"),
            "yarn_original_max_position_embeddings": v(rope.original_max_position_embeddings or max_positions,
                                                       "rope_parameters.original_max_position_embeddings"),
            "yarn_beta_fast": v(rope.beta_fast or 32.0, "rope_parameters.beta_fast"),
            "yarn_beta_slow": v(rope.beta_slow or 1.0, "rope_parameters.beta_slow"),
            "yarn_correction_range_round_to_int": v(rope.truncate is not False, "rope_parameters.truncate"),
            "mscale": v(mscale, "rope_parameters.mscale"), "mscale_all_dim": v(mscale_all_dim,
                                                                               "rope_parameters.mscale_all_dim")}


READER = FamilyReader(MODEL_TYPE, ARCHITECTURES, FIELDS, read, settings)
