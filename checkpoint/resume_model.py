"""A resume continues the model that was trained: its head count and every block setting equal the checkpoint's. Most
(rotary base, epsilon, query groups at equal rows) change no parameter shape, so the load's shape check alone would
train another function; --finetune may change them.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

from base.errors import ConfigError
from base.options import flag_of_setting, setting_names, setting_value
from gpt.attention_settings import AttentionSettings
from gpt.mlp import MLPSettings
from gpt.model_config import ModelConfig
from gpt.moe.settings import moe_layer_pattern
from gpt.norms import NormSettings
from gpt.positions import LONGROPE_SETTINGS, PositionSettings

ROTARY_SETTINGS = ("rotary_base", "rotary_percent", "use_rope_scaling", "rope_scaling_factor", "rotary_interleaved")
# The MoE structure and routing; loss coefficients and capacity are training settings a resume may change.
MOE_COMPARED = ("num_experts", "moe_layer_freq", "moe_ffn_hidden_size", "moe_router_topk", "moe_router_score_function",
                "moe_router_pre_softmax", "moe_router_topk_scaling_factor", "moe_router_num_groups",
                "moe_router_group_topk", "moe_shared_expert_intermediate_size", "moe_shared_expert_gate",
                "moe_gating", "topk", "expert_interval", "mlp_type")  # the last four: DeepSpeed-MoE's
# Multi-latent attention: whether it replaces attention, its sizes and its rotary positions.
MLA_COMPARED = ("multi_latent_attention", "q_lora_rank", "kv_lora_rank", "qk_head_dim", "qk_pos_emb_head_dim",
                "v_head_dim", "rope_type", "rotary_scaling_factor", "mscale", "mscale_all_dim")
YARN_SETTINGS = ("rotary_scaling_factor", "mscale", "mscale_all_dim", "yarn_original_max_position_embeddings",
                 "yarn_beta_fast", "yarn_beta_slow", "yarn_correction_range_round_to_int")
# The depth, width and head count first, as Megatron-LM's check_checkpoint_args: one line, not dozens of shapes.
SHAPE_FIRST = ("num_layers", "hidden_size", "num_attention_heads")
# Every block setting but the attention's kernel choices and dropout.
NOT_COMPARED = (*AttentionSettings.NOT_THE_MATH, "attention_dropout")
BLOCK_COMPARED = tuple(name for kind in (NormSettings, MLPSettings, PositionSettings, AttentionSettings)
                       for name in setting_names(kind) if name not in NOT_COMPARED)
COMPARED = tuple(dict.fromkeys((*SHAPE_FIRST, *BLOCK_COMPARED, "untie_embeddings_and_output_weights", "add_bias_linear",
                                "scale_embeddings_by_sqrt_hidden", "final_logit_softcapping", *MOE_COMPARED,
                                *MLA_COMPARED, "max_position_embeddings")))
# Read, not compared: what a compared setting's default derives from.
DEFAULTS_FROM = ("ffn_hidden_size",)


def _compared_values(model: dict) -> dict:
    """The settings as the built model reads them: a missing one is its default, and a resolved default equals the unset
    flag."""
    defaults = ModelConfig()
    values = {name: model.get(name, setting_value(defaults, name)) for name in COMPARED}
    yarn = values["position_embedding_type"] == "yarn" and not values["multi_latent_attention"]
    if values["multi_latent_attention"]:
        values["rope_type"] = values["rope_type"] or "yarn"  # None is MLA's default, YaRN
    else:
        for name in MLA_COMPARED[1:]:
            if not (yarn and name in YARN_SETTINGS):
                values.pop(name)
    if not yarn:
        for name in YARN_SETTINGS[3:]:
            values.pop(name)
    longrope = values["position_embedding_type"] == "longrope"
    if not longrope:
        for name in LONGROPE_SETTINGS:
            values.pop(name)
    if not (longrope and values["longrope_attention_factor"] is None):
        values.pop("max_position_embeddings")
    if values["position_embedding_type"] not in ("rope", "yarn", "longrope"):
        for name in ROTARY_SETTINGS:
            if not (values["multi_latent_attention"] and name == "rotary_base"):
                values.pop(name)
    elif not values["use_rope_scaling"]:
        values.pop("rope_scaling_factor")
    # a per-layer list (the window's sides, LongRoPE's factors) as the recorded JSON keeps it
    for name in ("num_experts", "window_size", "longrope_short_factor", "longrope_long_factor"):
        if isinstance(values.get(name), list):
            values[name] = tuple(values[name])
    if not values["num_experts"] or values["num_experts"] == 1:  # a dense model: the MoE settings are not read
        for name in MOE_COMPARED:
            values.pop(name)
    else:
        values["moe_layer_freq"] = _layer_freq(values["moe_layer_freq"], values["num_layers"])
        if values["moe_ffn_hidden_size"] is None:  # as the experts are built (MoESettings.for_layer)
            values["moe_ffn_hidden_size"] = _dense_ffn_size(model, defaults)
    if values["num_query_groups"] is None:
        values["num_query_groups"] = values["num_attention_heads"]
    return values


def _dense_ffn_size(model: dict, defaults: ModelConfig) -> int:
    """The dense MLP's width a record implies (--ffn-hidden-size, else Megatron-LM's default), which an unset
    --moe-ffn-hidden-size means."""
    mlp = dataclasses.replace(defaults.mlp, swiglu=bool(model.get("swiglu", defaults.mlp.swiglu)))
    return mlp.ffn_size(model.get("hidden_size", defaults.hidden_size), model.get("ffn_hidden_size"))


def _layer_freq(freq, num_layers: int):
    """Which layers hold experts, one way however typed: the int N, else one 0/1 per layer."""
    pattern = moe_layer_pattern(freq, num_layers)
    every = next((n for n in range(1, num_layers + 1) if pattern == moe_layer_pattern(n, num_layers)), None)
    return every if every is not None else tuple(map(int, pattern))


def _show(value) -> str:
    if isinstance(value, bool):
        return "on" if value else "off"
    if isinstance(value, tuple):  # a per-layer --num-experts, as typed
        return " ".join(map(str, value))
    return str(value)


def _flag_and_value(name: str, value) -> tuple[str, str]:
    if name == "add_bias_linear":  # typed as Megatron-LM's --disable-bias-linear
        return "--disable-bias-linear", _show(not value)
    if name == "window_size" and value is not None:  # typed LEFT,RIGHT
        return "--window-size", ",".join(map(str, value))
    return flag_of_setting(ModelConfig, name), _show(value)


def model_differences(saved_model: dict, model: ModelConfig) -> list[str]:
    """Each block setting that differs: the flag, this run's value and the checkpoint's."""
    typed = {name: setting_value(model, name) for name in (*COMPARED, *DEFAULTS_FROM)}
    saved, ours = _compared_values(saved_model), _compared_values(typed)
    unsaid = set()
    unsaid.update(name for name in SHAPE_FIRST if name not in saved_model)  # absent from a plain DeepSpeed record
    if typed["num_query_groups"] is None and saved_model.get("num_query_groups") is None:
        unsaid.add("num_query_groups")  # plain multi-head attention on both sides: its groups are the heads
    differences = []
    for name in ours:
        if name in saved and name not in unsaid and ours[name] != saved[name]:
            flag, mine = _flag_and_value(name, ours[name])
            differences.append(f"{flag} {mine} (the checkpoint's: {_flag_and_value(name, saved[name])[1]})")
    return differences


def check_resume_model(metadata: dict, model: ModelConfig, iteration_dir: Path) -> None:
    """Raise ConfigError, in one line, naming every block setting that differs from the checkpoint's."""
    differences = model_differences((metadata.get("config") or {}).get("model") or {}, model)
    if differences:
        raise ConfigError(f"resuming {iteration_dir} with {'; '.join(differences)}: the model would not be the one "
                          f"trained. Pass the checkpoint's settings, or --finetune to start a new run from its weights")
