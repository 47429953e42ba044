"""Which fields of a Megatron-LM checkpoint's exported config.json its run's args give: a field whose settings the args
all gave is the run's, `SAME_FOR_EVERY_RUN` fields no flag changes, and any other is named in one line with the value
written, never defaulted silently.
"""

from __future__ import annotations

import json

# The run's end-of-document id (a NullTokenizer's), our BOS and EOS.
END_OF_DOCUMENT = "end_of_document_id"
# config.json field -> the settings (their flat names) it is computed from
FROM_SETTINGS = {
    "bos_token_id": (END_OF_DOCUMENT,), "eos_token_id": (END_OF_DOCUMENT,),
    "vocab_size": ("vocab_size",), "hidden_size": ("hidden_size",), "n_embd": ("hidden_size",),
    "num_hidden_layers": ("num_layers",), "n_layer": ("num_layers",),
    "num_attention_heads": ("num_attention_heads",), "n_head": ("num_attention_heads",),
    "num_key_value_heads": ("num_attention_heads", "num_query_groups"),
    "head_dim": ("kv_channels", "hidden_size", "num_attention_heads"),
    # a dense MLP's width (Mixtral's is its experts')
    "intermediate_size": ("ffn_hidden_size", "hidden_size", "swiglu", "moe_ffn_hidden_size"),
    "n_inner": ("ffn_hidden_size", "hidden_size", "swiglu"),
    "moe_intermediate_size": ("moe_ffn_hidden_size",),
    "max_position_embeddings": ("max_position_embeddings",), "n_positions": ("max_position_embeddings",),
    "rms_norm_eps": ("layernorm_epsilon",), "layer_norm_epsilon": ("layernorm_epsilon",),
    "attention_dropout": ("attention_dropout",), "attn_pdrop": ("attention_dropout",),
    # Megatron-Core's embedding dropout is --hidden-dropout too
    "resid_pdrop": ("hidden_dropout",), "embd_pdrop": ("hidden_dropout",),
    "initializer_range": ("init_method_std",),
    "tie_word_embeddings": ("untie_embeddings_and_output_weights",),
    "activation_function": ("activation", "swiglu"), "hidden_act": ("activation", "swiglu"),
    "attention_bias": ("add_bias_linear", "add_qkv_bias"), "qkv_bias": ("add_bias_linear", "add_qkv_bias"),
    "mlp_bias": ("add_bias_linear",),
    "num_local_experts": ("num_experts",), "num_experts": ("num_experts",), "n_routed_experts": ("num_experts",),
    "num_experts_per_tok": ("moe_router_topk",), "router_aux_loss_coef": ("moe_aux_loss_coeff",),
    "shared_expert_intermediate_size": ("moe_shared_expert_intermediate_size",),
    "shared_intermediate_size": ("moe_shared_expert_intermediate_size",),
    # 1/sqrt(head_dim): Megatron-LM has no --softmax-scale
    "attention_multiplier": ("kv_channels", "hidden_size", "num_attention_heads"),
    "norm_topk_prob": ("moe_router_pre_softmax",), "mlp_only_layers": ("moe_layer_freq", "num_layers"),
    "first_k_dense_replace": ("moe_layer_freq", "num_layers"), "n_group": ("moe_router_num_groups",),
    "topk_group": ("moe_router_group_topk",), "routed_scaling_factor": ("moe_router_topk_scaling_factor",),
    "n_shared_experts": ("moe_shared_expert_intermediate_size", "moe_ffn_hidden_size"),
    "num_nextn_predict_layers": ("mtp_num_layers",),
    "q_lora_rank": ("q_lora_rank",), "kv_lora_rank": ("kv_lora_rank",), "v_head_dim": ("v_head_dim",),
    "qk_head_dim": ("qk_head_dim", "qk_pos_emb_head_dim"), "qk_nope_head_dim": ("qk_head_dim",),
    "qk_rope_head_dim": ("qk_pos_emb_head_dim",), "use_qk_norm": ("qk_layernorm",),
    "sliding_window": ("window_size",), "use_sliding_window": ("window_size",),
    "layer_types": ("window_size", "window_attn_skip_freq", "num_layers"),
    "max_window_layers": ("window_size", "window_attn_skip_freq", "num_layers"),
    "_sliding_window_pattern": ("window_size", "window_attn_skip_freq"),
    "attn_logit_softcapping": ("attn_logit_softcapping",), "final_logit_softcapping": ("final_logit_softcapping",),
    "query_pre_attn_scalar": ("softmax_scale", "kv_channels"),
    "hidden_activation": ("activation", "swiglu", "gated_linear_unit"),
    "swiglu_alpha": ("quick_geglu",), "swiglu_limit": ("activation_func_clamp_value",),
    "original_max_position_embeddings": ("longrope_original_max_position_embeddings", "max_position_embeddings"),
    "rope_parameters.rope_type": ("position_embedding_type", "use_rope_scaling"),
    "rope_parameters.rope_theta": ("rotary_base",),
    "rope_parameters.factor": ("rope_scaling_factor", "rotary_scaling_factor", "longrope_factor"),
    "rope_parameters.partial_rotary_factor": ("rotary_percent",),
    "rope_parameters.beta_fast": ("yarn_beta_fast",), "rope_parameters.beta_slow": ("yarn_beta_slow",),
    "rope_parameters.original_max_position_embeddings": ("yarn_original_max_position_embeddings",),
    "rope_parameters.truncate": ("yarn_correction_range_round_to_int",),
    "rope_parameters.mscale": ("mscale",), "rope_parameters.mscale_all_dim": ("mscale_all_dim",),
    "rope_parameters.short_factor": ("longrope_short_factor",),
    "rope_parameters.long_factor": ("longrope_long_factor",),
    "rope_parameters.attention_factor": ("longrope_attention_factor",),
    "rope_parameters.full_attention": ("rotary_base", "rotary_seq_len_interpolation_factor"),
    "rope_parameters.sliding_attention": ("local_rotary_base",),
}
# Fields no Megatron-LM flag changes, each with why its value is the run's.
SAME_FOR_EVERY_RUN = {
    "architectures": "the class the blocks fit", "model_type": "the class the blocks fit",
    "transformers_version": "the writer's", "dtype": "the export's --dtype",
    "rope_interleave": "Megatron-Core's MLA's (gpt/mla.py de-interleaves the rope dims as it does)",
    "use_bidirectional_attention": "a GPT's (causal)",
    "scale_attn_weights": "Megatron-Core's", "scale_attn_by_inverse_layer_idx": "Megatron-Core's",
    "add_cross_attention": "a GPT's", "reorder_and_upcast_attn": "no function", "pretraining_tp": "no function",
    "decoder_sparse_step": "the layer pattern's (mlp_only_layers)",
    # GraniteMoeShared's scalings Megatron-Core does not apply
    "embedding_multiplier": "Megatron-Core's (unscaled)", "residual_multiplier": "Megatron-Core's (unscaled)",
    "logits_scaling": "Megatron-Core's (unscaled)",
}
# Megatron-Core's Llama 3 scaling takes only the factor from a flag.
LLAMA3_FIXED = ("rope_parameters.low_freq_factor", "rope_parameters.high_freq_factor",
                "rope_parameters.original_max_position_embeddings")

# MLA YaRN: only the factor comes from a flag.
MLA_YARN_FROM = {"rope_parameters.factor": ("rotary_scaling_factor",)}
MLA_YARN_FIXED = ("rope_parameters.beta_fast", "rope_parameters.beta_slow",
                  "rope_parameters.original_max_position_embeddings")

# Why a field no argument gives has the value written.
NOT_FROM_ARGS = {
    "pad_token_id": "a GPT pads no batch", "use_cache": "transformers' generation switch",
    "output_router_logits": "transformers' switch for its own router loss",
    "router_jitter_noise": "the router here adds no noise; --moe-input-jitter-eps is not read",
    "summary_activation": "GPT-2's sequence-summary head, which a causal LM has not",
}

LACKING = {END_OF_DOCUMENT: "its end-of-document id (its tokenizer's files are not saved with the checkpoint)"}


def _flattened(config: dict) -> dict:
    """config.json's fields, rope_parameters' keys as `rope_parameters.KEY`."""
    fields = {key: value for key, value in config.items() if key != "rope_parameters"}
    for key, value in (config.get("rope_parameters") or {}).items():
        fields[f"rope_parameters.{key}"] = value
    return fields


def unsourced_fields(config: dict, given: frozenset[str]) -> list[str]:
    """One line for each field of `config` that the settings `given` do not determine, with the value written."""
    lines = []
    rope_type = (config.get("rope_parameters") or {}).get("rope_type")
    llama3 = rope_type == "llama3"
    mla_yarn = rope_type == "yarn" and config.get("model_type") == "deepseek_v3"
    for key, value in sorted(_flattened(config).items()):
        if key in SAME_FOR_EVERY_RUN or (llama3 and key in LLAMA3_FIXED) or (mla_yarn and key in MLA_YARN_FIXED):
            continue
        settings = (mla_yarn and MLA_YARN_FROM.get(key)) or FROM_SETTINGS.get(key)
        if settings is None:
            why = NOT_FROM_ARGS.get(key, NOT_FROM_ARGS["summary_activation"] if key.startswith("summary_") else
                                    "no Megatron-LM argument gives it")
        else:
            missing = [name for name in settings if name not in given]
            if not missing:
                continue
            why = f"the run's args do not hold {', '.join(LACKING.get(name, name) for name in missing)}"
        lines.append(f" note: config.json {key} = {json.dumps(value)}: {why}")
    return lines
