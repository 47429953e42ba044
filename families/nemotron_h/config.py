"""NemotronH's config.json (transformers' NemotronHForCausalLM): its layer pattern uses Megatron's own symbols, so it is
--hybrid-layer-pattern as written (Mamba-2, position-free attention, relu2 MLPs, DeepSeek-routed relu2 experts). What
our blocks cannot compute is refused in one line.
"""

from __future__ import annotations

import math
from pathlib import Path

import torch

from base.errors import ConfigError
from families.common.fields import (
    BOOLEAN,
    INTEGER,
    NAME,
    NAMES,
    NON_NEGATIVE_NUMBER,
    POSITIVE_INT,
    POSITIVE_NUMBER,
    PROBABILITY,
    TOKEN_ID_FIELDS,
    Field,
    FolderValue,
    HFConfig,
    Kind,
)
from families.common.moe import sigmoid_router_settings
from families.common.reader import FamilyReader
from gpt.hybrid_pattern import MAMBA, MOE, parse_hybrid_pattern
from gpt.mamba_settings import MambaSettings

MODEL_TYPE = "nemotron_h"
ARCHITECTURES = ("NemotronHForCausalLM", "NemotronHModel")
SYMBOLS = {"linear_attention": "M", "full_attention": "*", "mlp": "-", "moe": "E"}  # NemotronHConfig._pattern_to_list
DEFAULT_LAYERS = ["linear_attention", "moe", "full_attention", "mlp"]  # NemotronHConfig's, with neither key
# transformers clamps dt at time_step_min, Megatron's MambaMixer does not: fp32's smallest normal clamps no visible dt.
NO_CLAMP = float(torch.finfo(torch.float32).tiny)
PATTERN = Kind("a string of M, *, - and E", lambda v: isinstance(v, str) and v != "" and set(v) <= set("M*-E"))

# NemotronHConfig's fields and defaults, under the older names it still reads.
FIELDS = (
    Field("vocab_size", POSITIVE_INT, 131072),
    Field("hidden_size", POSITIVE_INT, 4096),
    Field("layers_block_type", NAMES, None, nullable=True, aliases=("layer_types",)),
    Field("hybrid_override_pattern", PATTERN, None, nullable=True),
    Field("tie_word_embeddings", BOOLEAN, False),
    Field("num_attention_heads", POSITIVE_INT, 32),
    Field("num_key_value_heads", POSITIVE_INT, 8, nullable=True),
    Field("head_dim", POSITIVE_INT, 128),
    Field("max_position_embeddings", POSITIVE_INT, 4096),
    Field("attention_bias", BOOLEAN, False),
    Field("attention_dropout", PROBABILITY, 0.0),
    Field("intermediate_size", POSITIVE_INT, 21504),
    Field("mlp_hidden_act", NAME, "relu2"),
    Field("mlp_bias", BOOLEAN, False),
    Field("ssm_state_size", POSITIVE_INT, 128),
    Field("mamba_num_heads", POSITIVE_INT, 128),
    Field("mamba_head_dim", POSITIVE_INT, 64),
    Field("mamba_hidden_act", NAME, "silu"),
    Field("n_groups", POSITIVE_INT, 8, aliases=("mamba_n_groups",)),
    Field("conv_kernel", POSITIVE_INT, 4, aliases=("mamba_d_conv",)),
    Field("chunk_size", POSITIVE_INT, 128, aliases=("mamba_chunk_size",)),
    Field("time_step_min", NON_NEGATIVE_NUMBER, 0.001, aliases=("mamba_dt_min",)),
    Field("use_conv_bias", BOOLEAN, True, aliases=("mamba_conv_bias",)),
    Field("use_bias", BOOLEAN, False),
    Field("n_routed_experts", POSITIVE_INT, 8, aliases=("num_local_experts",)),
    Field("num_experts_per_tok", POSITIVE_INT, 2),
    Field("moe_intermediate_size", POSITIVE_INT, 7688),
    Field("moe_shared_expert_intermediate_size", POSITIVE_INT, 7688),
    Field("moe_latent_size", POSITIVE_INT, None, nullable=True),
    Field("n_group", POSITIVE_INT, 1),
    Field("topk_group", POSITIVE_INT, 1),
    Field("norm_topk_prob", BOOLEAN, True),
    Field("routed_scaling_factor", POSITIVE_NUMBER, 1.0),
    Field("num_nextn_predict_layers", INTEGER, 0),
    Field("initializer_range", PROBABILITY, 0.02),
    Field("layer_norm_epsilon", POSITIVE_NUMBER, 1e-5),
    Field("residual_in_fp32", BOOLEAN, False),
    *TOKEN_ID_FIELDS,
)


def _pattern(values: dict, path: Path) -> str:
    """The layers as Megatron's symbols: layers_block_type, else hybrid_override_pattern, else the default."""
    layers = values["layers_block_type"]
    if layers is None:
        return values["hybrid_override_pattern"] or "".join(SYMBOLS[name] for name in DEFAULT_LAYERS)
    unknown = sorted(set(layers) - set(SYMBOLS))
    if unknown or not layers:
        raise ConfigError(f"{path}: layers_block_type {layers!r} must be a non-empty list of "
                          f"{', '.join(map(repr, SYMBOLS))}")
    return "".join(SYMBOLS[name] for name in layers)


def read(values: dict, raw: dict, path: Path, fields: dict) -> HFConfig:
    pattern = _pattern(values, path)
    values = {**values, "pattern": pattern}
    heads = values["num_attention_heads"]
    kv_heads = values["num_key_value_heads"] or heads
    if heads % kv_heads:
        raise ConfigError(f"{path}: num_key_value_heads {kv_heads} does not divide num_attention_heads {heads}")
    return HFConfig(path=path, family=MODEL_TYPE, vocab_size=values["vocab_size"], hidden_size=values["hidden_size"],
                    num_layers=len(pattern), num_attention_heads=heads, num_key_value_heads=kv_heads,
                    head_dim=values["head_dim"], ffn_hidden_size=values["intermediate_size"],
                    max_position_embeddings=values["max_position_embeddings"],
                    norm_epsilon=float(values["layer_norm_epsilon"]), activation=values["mlp_hidden_act"],
                    tie_word_embeddings=values["tie_word_embeddings"], attention_bias=values["attention_bias"],
                    mlp_bias=values["mlp_bias"], initializer_range=float(values["initializer_range"]), rope=None,
                    fields=fields, values=values, notes=_notes(values, path),
                    **(dict(num_experts=values["n_routed_experts"], experts_per_token=values["num_experts_per_tok"],
                            moe_ffn_hidden_size=values["moe_intermediate_size"],
                            shared_expert_size=values["moe_shared_expert_intermediate_size"],
                            norm_topk_prob=values["norm_topk_prob"],
                            moe_layers=parse_hybrid_pattern(pattern).moe_layers()) if MOE in pattern else {}))


def _notes(values: dict, path: Path) -> tuple[str, ...]:
    """What the folder says that the run computes otherwise or not at all, one start-up line each."""
    notes, mamba = [], MAMBA in values["pattern"]
    if mamba and values["time_step_min"] > NO_CLAMP:
        notes.append(f"> {path}: time_step_min {values['time_step_min']:g}: transformers' NemotronH clamps each Mamba "
                     f"dt from below at it; the `M` layers here do not, as Megatron-Core's MambaMixer (dt_limit "
                     f"(0, inf))")
    if mamba and values["chunk_size"] != MambaSettings.CHUNK_SIZE:
        notes.append(f"> {path}: chunk_size {values['chunk_size']}: the Mamba scan here runs chunks of "
                     f"{MambaSettings.CHUNK_SIZE} (Megatron's); the chunk changes only the rounding")
    if values["num_nextn_predict_layers"]:
        notes.append(f"> {path}: num_nextn_predict_layers {values['num_nextn_predict_layers']}: NemotronHForCausalLM "
                     f"has no multi-token prediction layers; their weights (mtp.*) are not read")
    unread = [f"{key} {str(values[key]).lower()}" for key in ("attention_bias", "tie_word_embeddings",
                                                                 "residual_in_fp32") if values[key]]
    if unread:
        notes.append(f"> {path}: {', '.join(unread)}: read by no part of transformers' NemotronH model (its "
                     f"attention has no biases, its lm_head is a weight of its own), nor here")
    return tuple(notes)


def settings(config: HFConfig) -> dict[str, FolderValue]:
    values, v = config.values, FolderValue
    pattern = values["pattern"]
    problems = []
    moe = {}
    if MOE in pattern:
        moe = _moe_settings(config, problems)
    if values["mlp_hidden_act"] != "relu2":
        problems.append(f"mlp_hidden_act {values['mlp_hidden_act']!r} (its MLP here is relu2's: --squared-relu)")
    if values["mlp_bias"]:
        problems.append("mlp_bias true (--add-bias-linear would add biases to attention too)")
    if MAMBA in pattern:
        problems += [phrase for phrase, bad in (
            (f"mamba_hidden_act {values['mamba_hidden_act']!r} (the Mamba conv's activation is SiLU)",
             values["mamba_hidden_act"] != "silu"),
            ("use_bias true (Megatron's MambaMixer has no in_proj or out_proj bias)", values["use_bias"]),
            ("use_conv_bias false (the Mamba conv has a bias)", not values["use_conv_bias"]),
            (f"conv_kernel {values['conv_kernel']} (the Mamba conv is {MambaSettings.CONV_WIDTH} wide)",
             values["conv_kernel"] != MambaSettings.CONV_WIDTH),
            (f"layer_norm_epsilon {values['layer_norm_epsilon']:g} (it is also the Mamba gated norm's, "
             f"{MambaSettings.NORM_EPSILON:g} here as in Megatron's MambaMixer)",
             not math.isclose(values["layer_norm_epsilon"], MambaSettings.NORM_EPSILON))) if bad]
    if problems:
        raise ConfigError(f"{config.path}: this {ARCHITECTURES[0]} cannot be represented here: {'; '.join(problems)}")
    blocks = parse_hybrid_pattern(pattern).num_layers
    kv_key = "num_key_value_heads" if config.fields.get("num_key_value_heads") else "num_attention_heads"
    key = "layers_block_type" if values["layers_block_type"] is not None else "hybrid_override_pattern"
    own = f"model_type {MODEL_TYPE}"
    return {
        "hybrid_layer_pattern": v(pattern, key), "num_layers": v(blocks, f"{key} (its blocks)"),
        "hidden_size": v(config.hidden_size, "hidden_size"),
        "num_attention_heads": v(config.num_attention_heads, "num_attention_heads"),
        "num_query_groups": v(config.num_key_value_heads, kv_key), "kv_channels": v(config.head_dim, "head_dim"),
        "ffn_hidden_size": v(config.ffn_hidden_size, "intermediate_size"),
        "max_position_embeddings": v(config.max_position_embeddings, "max_position_embeddings"),
        "layernorm_epsilon": v(config.norm_epsilon, "layer_norm_epsilon"),
        "untie_embeddings_and_output_weights": v(True, f"{own} (its lm_head is always a weight of its own)"),
        "normalization": v("RMSNorm", own), "swiglu": v(False, "mlp_hidden_act"),
        "activation": v("squared_relu", "mlp_hidden_act"),
        "position_embedding_type": v("none", f"{own} (no positions in its attention)"),
        "add_bias_linear": v(False, "mlp_bias, use_bias"), "add_qkv_bias": v(False, own),
        "qk_layernorm": v(False, own), "attention_output_gate": v(False, own),
        "mamba_state_dim": v(values["ssm_state_size"], "ssm_state_size"),
        "mamba_head_dim": v(values["mamba_head_dim"], "mamba_head_dim"),
        "mamba_num_groups": v(values["n_groups"], "n_groups"),
        "mamba_num_heads": v(values["mamba_num_heads"], "mamba_num_heads"),
        "init_method_std": v(config.initializer_range, "initializer_range"), **moe}


def _moe_settings(config: HFConfig, problems: list[str]) -> dict[str, FolderValue]:
    """An `E` layer: DeepSeek-V3's router over ungated relu2 experts and a shared expert of its own width; latent
    projections are not built."""
    values, v = config.values, FolderValue
    if values["moe_latent_size"] is not None:
        problems.append(f"moe_latent_size {values['moe_latent_size']} (the experts' latent projections are not "
                        f"built)")
    return {**sigmoid_router_settings(config, problems),
            "num_experts": v(config.num_experts, "n_routed_experts"),
            "moe_router_topk": v(config.experts_per_token, "num_experts_per_tok"),
            "moe_ffn_hidden_size": v(config.moe_ffn_hidden_size, "moe_intermediate_size"),
            "moe_shared_expert_intermediate_size": v(config.shared_expert_size,
                                                     "moe_shared_expert_intermediate_size")}


READER = FamilyReader(MODEL_TYPE, ARCHITECTURES, FIELDS, read, settings)
