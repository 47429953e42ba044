"""DeepSeek-V3 (transformers' DeepseekV3ForCausalLM) as Megatron-Core's flags: multi-latent attention with its latent
norms and YaRN or plain rotary, dense MLPs in the first layers then the DeepSeek router over SwiGLU experts and a shared
expert. MTP layers are dropped as transformers drops them; a quantization_config is named at the start.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

from base.errors import ConfigError
from families.common.fields import (
    BOOLEAN,
    INTEGER,
    LLAMA_FIELDS,
    NAME,
    NON_NEGATIVE_NUMBER,
    OBJECT,
    POSITIVE_INT,
    POSITIVE_NUMBER,
    Field,
    HFConfig,
    llama_shaped,
)
from families.common.moe import (
    first_dense_layers,
    layer_freq,
    moe_config,
    mtp_note,
    sigmoid_router_settings,
)
from families.common.quantized_release import quantization_note
from families.common.reader import FamilyReader, FolderValue, llama_settings

MODEL_TYPE = "deepseek_v3"
ARCHITECTURES = ("DeepseekV3ForCausalLM", "DeepseekV3Model")
LATENT_NORM_EPS = 1e-6
# gpt/mla.py's fixed YaRN parameters (no Megatron flag reaches them).
MLA_YARN = {"beta_fast": 32.0, "beta_slow": 1.0, "original_max_position_embeddings": 4096}

FIELDS = (
    *(spec for spec in LLAMA_FIELDS if spec.key not in ("vocab_size", "hidden_size", "intermediate_size",
                                                        "num_hidden_layers", "num_attention_heads",
                                                        "num_key_value_heads", "max_position_embeddings",
                                                        "mlp_bias", "head_dim")),
    Field("vocab_size", POSITIVE_INT, 129280),
    Field("hidden_size", POSITIVE_INT, 7168),
    Field("intermediate_size", POSITIVE_INT, 18432),
    Field("moe_intermediate_size", POSITIVE_INT, 2048),
    Field("num_hidden_layers", POSITIVE_INT, 61),
    Field("num_attention_heads", POSITIVE_INT, 128),
    Field("num_key_value_heads", POSITIVE_INT, 128, nullable=True),
    Field("n_shared_experts", INTEGER, 1, nullable=True),
    Field("n_routed_experts", POSITIVE_INT, 256, aliases=("num_local_experts",)),
    Field("routed_scaling_factor", POSITIVE_NUMBER, 2.5),
    Field("kv_lora_rank", POSITIVE_INT, 512),
    Field("q_lora_rank", POSITIVE_INT, 1536, nullable=True),
    Field("qk_rope_head_dim", POSITIVE_INT, 64),
    Field("v_head_dim", POSITIVE_INT, 128),
    Field("qk_nope_head_dim", POSITIVE_INT, 128),
    Field("n_group", POSITIVE_INT, 8),
    Field("topk_group", POSITIVE_INT, 4),
    Field("num_experts_per_tok", POSITIVE_INT, 8),
    Field("first_k_dense_replace", INTEGER, 3),
    Field("norm_topk_prob", BOOLEAN, True),
    Field("max_position_embeddings", POSITIVE_INT, 4096),
    Field("rope_interleave", BOOLEAN, True, nullable=True),
    Field("num_nextn_predict_layers", INTEGER, 1, aliases=("num_mtp_layers",)),
    Field("output_router_logits", BOOLEAN, False),
    # Derived by DeepseekV3Config and saved with it.
    Field("head_dim", POSITIVE_INT, None, nullable=True),
    Field("qk_head_dim", POSITIVE_INT, None, nullable=True),
    # the released file's remote-code keys
    Field("moe_layer_freq", POSITIVE_INT, 1),
    Field("topk_method", NAME, "noaux_tc"),
    Field("scoring_func", NAME, "sigmoid"),
    Field("ep_size", POSITIVE_INT, 1),
    Field("aux_loss_alpha", NON_NEGATIVE_NUMBER, 0.001),
    Field("seq_aux", BOOLEAN, True),
    Field("quantization_config", OBJECT, None, nullable=True),
)


def read(values: dict, raw: dict, path: Path, fields: dict) -> HFConfig:
    problems = []
    if values["num_key_value_heads"] not in (None, values["num_attention_heads"]):
        problems.append(f"num_key_value_heads {values['num_key_value_heads']} (multi-latent attention expands one "
                        f"latent into num_attention_heads {values['num_attention_heads']} key and value heads)")
    for key, derived in (("head_dim", values["qk_rope_head_dim"]),
                         ("qk_head_dim", values["qk_nope_head_dim"] + values["qk_rope_head_dim"])):
        if values[key] not in (None, derived):
            problems.append(f"{key} {values[key]} (DeepseekV3Config derives {derived} from the head sizes)")
    if problems:
        raise ConfigError(f"{path}: {'; '.join(problems)}")
    layers = first_dense_layers(values["num_hidden_layers"], values["first_k_dense_replace"])
    # The rope dims are what rotary positions turn.
    config = llama_shaped({**values, "mlp_bias": values["attention_bias"], "head_dim": values["qk_rope_head_dim"],
                           "num_key_value_heads": values["num_attention_heads"]}, raw, path, fields,
                          heads_divide_hidden=False)
    shared = values["moe_intermediate_size"] * values["n_shared_experts"] if values["n_shared_experts"] else None
    return moe_config(config, MODEL_TYPE, experts=values["n_routed_experts"], topk=values["num_experts_per_tok"],
                      moe_ffn=values["moe_intermediate_size"], layers=layers, norm_topk_prob=values["norm_topk_prob"],
                      values=values, shared=shared,
                      notes=mtp_note(path, values["num_hidden_layers"], values["num_nextn_predict_layers"],
                                     "num_nextn_predict_layers", ARCHITECTURES[0])
                      + quantization_note(path, values["quantization_config"], ARCHITECTURES[0]))


def settings(config: HFConfig) -> dict[str, FolderValue]:
    values, v, rope = config.values, FolderValue, config.rope
    problems = []
    if values["attention_bias"]:
        problems.append("attention_bias true (multi-latent attention's projections have no bias here)")
    if values["q_lora_rank"] is None:
        problems.append("q_lora_rank null (with --qk-layernorm and no --q-lora-rank Megatron's multi-latent attention "
                        "norms the hidden state before the query projection, which DeepseekV3Attention does not)")
    if config.norm_epsilon != LATENT_NORM_EPS:
        problems.append(f"rms_norm_eps {config.norm_epsilon!r} (the latent norms run at transformers' fixed "
                        f"{LATENT_NORM_EPS}, and the layer norms at rms_norm_eps: --norm-epsilon sets both here)")
    if values["rope_interleave"] is False:
        problems.append("rope_interleave false (multi-latent attention here rotates the rope dims' interleaved pairs)")
    if values["moe_layer_freq"] != 1:
        problems.append(f"moe_layer_freq {values['moe_layer_freq']} (transformers' DeepseekV3 puts experts in every "
                        f"layer from first_k_dense_replace on)")
    if values["topk_method"] != "noaux_tc":
        problems.append(f"topk_method {values['topk_method']!r} (transformers' DeepseekV3 routes as noaux_tc)")
    if values["scoring_func"] != "sigmoid":
        problems.append(f"scoring_func {values['scoring_func']!r} (transformers' DeepseekV3 scores by sigmoid)")
    rope_settings = _rope_settings(rope, problems)
    router = sigmoid_router_settings(config, problems)
    if problems:
        raise ConfigError(f"{config.path}: this {ARCHITECTURES[0]} cannot be represented here: {'; '.join(problems)}")
    llama = llama_settings(_as_plain_rope(config))
    for name in ("kv_channels", "rotary_percent", "rotary_interleaved", "use_rope_scaling", "num_query_groups"):
        llama.pop(name)
    return {**llama, **rope_settings, **router,
            "add_bias_linear": v(False, "attention_bias"), "add_qkv_bias": v(False, "attention_bias"),
            "multi_latent_attention": v(True, f"model_type {MODEL_TYPE}"),
            "q_lora_rank": v(values["q_lora_rank"], "q_lora_rank"), "kv_lora_rank": v(values["kv_lora_rank"],
                                                                                    "kv_lora_rank"),
            "qk_head_dim": v(values["qk_nope_head_dim"], "qk_nope_head_dim"),
            "qk_pos_emb_head_dim": v(values["qk_rope_head_dim"], "qk_rope_head_dim"),
            "v_head_dim": v(values["v_head_dim"], "v_head_dim"),
            "qk_layernorm": v(True, f"model_type {MODEL_TYPE} (q_a_layernorm, kv_a_layernorm)"),
            "num_experts": v(config.num_experts, "n_routed_experts"),
            "moe_router_topk": v(config.experts_per_token, "num_experts_per_tok"),
            "moe_ffn_hidden_size": v(config.moe_ffn_hidden_size, "moe_intermediate_size"),
            "moe_shared_expert_intermediate_size": v(config.shared_expert_size,
                                                     "n_shared_experts x moe_intermediate_size"),
            "moe_layer_freq": v(layer_freq(config.moe_layers), "first_k_dense_replace")}


def _as_plain_rope(config: HFConfig) -> HFConfig:
    """The config with its rope read as plain, for llama_settings' other rules (the YaRN here is MLA's)."""
    return dataclasses.replace(config, rope=dataclasses.replace(config.rope, rope_type="default"))


def _rope_settings(rope, problems: list[str]) -> dict[str, FolderValue]:
    """MLA's rotary settings: plain, or YaRN with the factor and the two mscales as transformers reads them."""
    v = FolderValue
    if rope.rope_type == "default":
        return {"rope_type": v("rope", "rope_parameters.rope_type"), "rotary_base": v(rope.theta, "rope_theta")}
    if rope.rope_type != "yarn":
        problems.append(f"rope_parameters rope_type {rope.rope_type!r} (multi-latent attention here takes the "
                        f"default rope or yarn)")
        return {}
    for key, fixed in MLA_YARN.items():
        given = getattr(rope, key)
        if given is not None and given != fixed:
            problems.append(f"rope_parameters {key} {given!r} (multi-latent attention's YaRN fixes it at {fixed}, as "
                            f"Megatron-Core's MLATransformerConfig)")
    if rope.truncate is False:
        problems.append("rope_parameters truncate false (multi-latent attention's YaRN rounds its correction range)")
    if rope.factor is None:
        problems.append("rope_parameters factor missing (YaRN's scaling factor)")
        return {}
    if rope.mscale and rope.mscale_all_dim:
        mscale, mscale_all_dim = rope.mscale, rope.mscale_all_dim
    elif rope.mscale_all_dim:
        problems.append("rope_parameters mscale_all_dim without mscale (transformers then scales cos and sin by "
                        "YaRN's default and the softmax by mscale_all_dim's, which no Megatron setting gives)")
        return {}
    else:
        mscale, mscale_all_dim = 1.0, 0.0
    if rope.attention_factor is not None:
        problems.append("rope_parameters attention_factor (multi-latent attention computes YaRN's from factor and "
                        "the mscales)")
    return {"rope_type": v("yarn", "rope_parameters.rope_type"), "rotary_base": v(rope.theta, "rope_theta"),
            "rotary_scaling_factor": v(rope.factor, "rope_parameters.factor"),
            "mscale": v(mscale, "rope_parameters.mscale"), "mscale_all_dim": v(mscale_all_dim,
                                                                               "rope_parameters.mscale_all_dim")}


READER = FamilyReader(MODEL_TYPE, ARCHITECTURES, FIELDS, read, settings)
