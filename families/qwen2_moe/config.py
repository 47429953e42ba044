"""Qwen2-MoE's config.json (transformers' Qwen2MoeForCausalLM): Llama's blocks with q/k/v biases and a gated shared
expert beside the routed ones."""

from __future__ import annotations

import dataclasses

from base.errors import ConfigError
from families.common.fields import (
    BOOLEAN,
    LAYER_INDICES,
    LLAMA_FIELDS,
    NON_NEGATIVE_NUMBER,
    POSITIVE_INT,
    POSITIVE_NUMBER,
    Field,
    FolderValue,
    HFConfig,
    llama_shaped,
)
from families.common.reader import FamilyReader, llama_settings

# Qwen2MoeConfig's fields: q/k/v biases and a gated shared expert.
QWEN2_MOE_FIELDS = (
    *(spec for spec in LLAMA_FIELDS if spec.key not in ("attention_bias", "mlp_bias", "pretraining_tp",
                                                        "intermediate_size", "rms_norm_eps")),
    Field("intermediate_size", POSITIVE_INT, 22016),
    Field("rms_norm_eps", POSITIVE_NUMBER, 1e-6),
    Field("qkv_bias", BOOLEAN, True),
    Field("num_experts", POSITIVE_INT, 60),
    Field("num_experts_per_tok", POSITIVE_INT, 4),
    Field("moe_intermediate_size", POSITIVE_INT, 1408),
    Field("shared_expert_intermediate_size", POSITIVE_INT, 5632),
    Field("norm_topk_prob", BOOLEAN, False),
    Field("decoder_sparse_step", POSITIVE_INT, 1),
    Field("mlp_only_layers", LAYER_INDICES, None, nullable=True),
    Field("output_router_logits", BOOLEAN, False),
    Field("router_aux_loss_coef", NON_NEGATIVE_NUMBER, 0.001),
    Field("use_sliding_window", BOOLEAN, False),
)



def read(values, raw, path, fields) -> HFConfig:
    values = {**values, "attention_bias": False, "mlp_bias": False}
    layers = values["num_hidden_layers"]
    dense = set(values["mlp_only_layers"] or ())
    # Qwen2MoeDecoderLayer's rule for an MoE block.
    moe_layers = tuple(i not in dense and (i + 1) % values["decoder_sparse_step"] == 0 for i in range(layers))
    return dataclasses.replace(llama_shaped(values, raw, path, fields, heads_divide_hidden=False),
                               family="qwen2_moe",
                               num_experts=values["num_experts"], experts_per_token=values["num_experts_per_tok"],
                               moe_ffn_hidden_size=values["moe_intermediate_size"],
                               shared_expert_size=values["shared_expert_intermediate_size"],
                               norm_topk_prob=values["norm_topk_prob"], qkv_bias=values["qkv_bias"],
                               moe_layers=moe_layers)


def settings(config: HFConfig) -> dict[str, FolderValue]:
    """Qwen2MoeForCausalLM: q/k/v biases, and MoE layers with a sigmoid-gated shared expert (--moe-shared-expert-gate)
    and a softmax top k renormalized only with norm_topk_prob; dense layers become --moe-layer-freq's list."""
    fields = config.fields
    if fields.get("use_sliding_window"):
        raise ConfigError(f"{config.path}: this Qwen2MoeForCausalLM cannot be represented here: use_sliding_window "
                          f"true (attention here sees the whole sequence)")
    # its sliding_window is read only under use_sliding_window
    llama = llama_settings(dataclasses.replace(config, fields={k: v for k, v in fields.items() if k != "sliding_window"}))
    v = FolderValue
    pattern = config.moe_layers
    freq = 1 if all(pattern) else "[" + ",".join(str(int(moe)) for moe in pattern) + "]"
    return {**llama, "add_bias_linear": v(False, "model_type qwen2_moe"), "add_qkv_bias": v(config.qkv_bias, "qkv_bias"),
            "num_experts": v(config.num_experts, "num_experts"),
            "moe_router_topk": v(config.experts_per_token, "num_experts_per_tok"),
            "moe_ffn_hidden_size": v(config.moe_ffn_hidden_size, "moe_intermediate_size"),
            "moe_router_pre_softmax": v(not config.norm_topk_prob, "norm_topk_prob"),
            "moe_shared_expert_intermediate_size": v(config.shared_expert_size, "shared_expert_intermediate_size"),
            "moe_shared_expert_gate": v(True, "model_type qwen2_moe"),
            "moe_layer_freq": v(freq, "decoder_sparse_step, mlp_only_layers")}



READER = FamilyReader("qwen2_moe", ("Qwen2MoeForCausalLM", "Qwen2MoeModel"), QWEN2_MOE_FIELDS, read, settings)
