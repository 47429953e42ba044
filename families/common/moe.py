"""What the MoE families share: which layers hold experts, the DeepSeek-style router (sigmoid scores, correction bias,
group-limited top-k, scaling) as Megatron-Core's flags, and the MTP layers a folder holds that transformers drops.
"""

from __future__ import annotations

import dataclasses

from families.common.fields import HFConfig
from families.common.reader import FolderValue

# transformers scores a group by its two best experts; Megatron-Core's group_limited_topk sums topk / group_topk best.
GROUP_SCORE_EXPERTS = 2


def layer_freq(pattern: tuple[bool, ...]) -> int | str:
    """--moe-layer-freq for a per-layer pattern: 1 when every layer holds experts, else its list of 0s and 1s."""
    return 1 if all(pattern) else "[" + ",".join(str(int(moe)) for moe in pattern) + "]"


def sparse_step_layers(layers: int, step: int, dense: list | None) -> tuple[bool, ...]:
    """Qwen's rule: an MoE block at layer i when i is not in mlp_only_layers and (i + 1) % decoder_sparse_step == 0."""
    dense = set(dense or ())
    return tuple(i not in dense and (i + 1) % step == 0 for i in range(layers))


def first_dense_layers(layers: int, first_k_dense: int) -> tuple[bool, ...]:
    """DeepSeek's rule: dense MLPs in the first first_k_dense_replace layers, experts in the rest."""
    return tuple(i >= first_k_dense for i in range(layers))


def moe_config(config: HFConfig, family: str, *, experts: int, topk: int, moe_ffn: int, layers: tuple[bool, ...],
               norm_topk_prob: bool, values: dict, shared: int | None = None, notes: tuple[str, ...] = ()
               ) -> HFConfig:
    """`config` (a Llama-shaped reading) as the MoE family it is, with every field's checked value (`values`)."""
    return dataclasses.replace(config, family=family, num_experts=experts, experts_per_token=topk,
                               moe_ffn_hidden_size=moe_ffn, shared_expert_size=shared, norm_topk_prob=norm_topk_prob,
                               moe_layers=layers, values=values, notes=notes)


def without_fields(config: HFConfig, *keys: str) -> HFConfig:
    """`config` with `keys` left out of the file's object, for a rule that reads them where this family does not."""
    return dataclasses.replace(config, fields={key: value for key, value in config.fields.items() if key not in keys})


def mtp_note(path, num_layers: int, count: int, key: str, class_name: str) -> tuple[str, ...]:
    """A folder's MTP layers (num_nextn_predict_layers) have no place in transformers' model: the run leaves them out,
    said once."""
    if not count:
        return ()
    return (f"> {path}: {key} {count}: {class_name} has no multi-token prediction layers (transformers drops "
            f"model.layers.{num_layers}.* on load); the run trains the model without them and the folder's "
            f"weights for them are not read",)


def sigmoid_router_settings(config: HFConfig, problems: list[str]) -> dict[str, FolderValue]:
    """The DeepSeek-style router as Megatron-Core's flags: sigmoid scores in fp32, the correction bias as expert bias,
    group-limited top-k, renormalized and scaled by routed_scaling_factor. Problems go to `problems`."""
    values, v = config.values, FolderValue
    topk, groups, group_topk = values["num_experts_per_tok"], values["n_group"], values["topk_group"]
    experts = config.num_experts
    if not values["norm_topk_prob"] and topk > 1:
        problems.append("norm_topk_prob false (Megatron-Core's sigmoid router renormalizes the top k's scores)")
    if values["norm_topk_prob"] and topk == 1:
        problems.append("norm_topk_prob true with num_experts_per_tok 1 (Megatron-Core's sigmoid router keeps one "
                        "expert's score as it is)")
    if experts % groups or not 1 <= group_topk <= groups:
        problems.append(f"n_group {groups} with topk_group {group_topk} and {experts} experts (the groups must divide "
                        f"the experts and topk_group be at most n_group)")
    elif group_topk < groups and (topk % group_topk or topk // group_topk != GROUP_SCORE_EXPERTS):
        problems.append(f"num_experts_per_tok {topk} over topk_group {group_topk} groups (transformers scores a group "
                        f"by its {GROUP_SCORE_EXPERTS} best experts, Megatron-Core by its num_experts_per_tok / "
                        f"topk_group best: they agree only at {GROUP_SCORE_EXPERTS})")
    if group_topk < groups and experts // groups < GROUP_SCORE_EXPERTS:
        problems.append(f"n_group {groups} leaves fewer than {GROUP_SCORE_EXPERTS} experts per group")
    scaling = values["routed_scaling_factor"]
    settings = {"moe_router_score_function": v("sigmoid", f"model_type {config.family}"),
                "moe_router_dtype": v("fp32", f"model_type {config.family} (its router computes in fp32)"),
                "moe_router_enable_expert_bias": v(True, f"model_type {config.family} (e_score_correction_bias)"),
                "moe_router_topk_scaling_factor": v(None if scaling == 1.0 else float(scaling),
                                                    "routed_scaling_factor"),
                "moe_router_pre_softmax": v(False, "norm_topk_prob")}
    if group_topk < groups:  # all groups chosen is plain top-k
        settings["moe_router_num_groups"] = v(groups, "n_group")
        settings["moe_router_group_topk"] = v(group_topk, "topk_group")
    return settings
