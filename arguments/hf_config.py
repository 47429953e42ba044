"""A Hugging Face folder's config.json, read and checked here before transformers sees any of it.

transformers 5 checks a config with huggingface_hub's strict dataclasses: a wrongly typed field
(`"num_hidden_layers": "2"`, `"hidden_size": null`) ends in a StrictDataclassFieldValidationError
traceback, and what it does not check (a negative size, `"rms_norm_eps": NaN`, any GPT-2 field, which
we compare without handing the dict to transformers) reaches our comparisons or the model as nonsense.
`read_hf_config` reads the file, picks the family by `model_type` (else by `architectures`), checks
every field in the family's table below wherever the file has it, then the rules between fields that
transformers or our model need, and returns an `HFConfig`: the architecture in typed fields
(transformers' default where a key is left out) and the file's object for transformers, its float
fields as floats (transformers 5 refuses `"rms_norm_eps": 1`). Every refusal is one ConfigError line
naming the file, the field, its value as written and what it must be.

JSON as Python reads it: `true` is also an int in Python, but not a valid layer count; `2.0` is a float,
not an integer (transformers refuses it too); NaN and Infinity parse, and are no size or epsilon.
"""

from __future__ import annotations

import dataclasses
import json
import os
from pathlib import Path

from arguments.hf_families import FAMILIES as REGISTERED
from arguments.hf_families import FAMILY_READERS
from arguments.hf_families.quantized_release import quantization_note
from arguments.hf_fields import (  # noqa: F401 - HFConfig and RopeConfig are this reader's result, named here too
    BOOLEAN,
    INTEGER,
    LAYER_INDICES,
    LLAMA_FIELDS,
    MISSING,
    NAME,
    NAMES,
    NON_NEGATIVE_NUMBER,
    OBJECT,
    POSITIVE_INT,
    POSITIVE_NUMBER,
    PROBABILITY,
    TOKEN_ID_FIELDS,
    Field,
    HFConfig,
    RopeConfig,
    checked_field,
    llama_shaped,
    read_json_object,
    shown,
    wrong_value,
)
from base.errors import ConfigError

CONFIG_FILE = "config.json"


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

# MixtralConfig's (transformers/models/mixtral/configuration_mixtral.py): a Llama's blocks with a mixture of
# experts in place of the MLP (issue 51); it has no attention_bias, mlp_bias or pretraining_tp.
MIXTRAL_FIELDS = (
    *(spec for spec in LLAMA_FIELDS if spec.key not in ("attention_bias", "mlp_bias", "pretraining_tp",
                                                        "intermediate_size", "rope_theta")),
    Field("intermediate_size", POSITIVE_INT, 14336),
    Field("rope_theta", POSITIVE_NUMBER, 1e6),
    Field("num_local_experts", POSITIVE_INT, 8),
    Field("num_experts_per_tok", POSITIVE_INT, 2),
    Field("output_router_logits", BOOLEAN, False),
    Field("router_aux_loss_coef", NON_NEGATIVE_NUMBER, 0.001),
    Field("router_jitter_noise", NON_NEGATIVE_NUMBER, 0.0),
    Field("sliding_window", POSITIVE_INT, None, nullable=True),
)


# Qwen2MoeConfig's (transformers/models/qwen2_moe/configuration_qwen2_moe.py): Llama's blocks with a bias on q, k, v
# only (qkv_bias), and an MoE layer with a gated shared expert at every decoder_sparse_step-th layer not in
# mlp_only_layers.
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

# ApertusConfig's (transformers/models/apertus/configuration_apertus.py): swiss-ai's Apertus, a Llama with xIELU
# (hidden_act "xielu") in an ungated MLP, per-head q/k RMSNorms, no mlp_bias or head_dim; its default rope is
# Llama 3's scaling at theta 12e6 (APERTUS_DEFAULT_ROPE).
APERTUS_FIELDS = (
    *(spec for spec in LLAMA_FIELDS if spec.key not in ("vocab_size", "intermediate_size", "head_dim", "hidden_act",
                                                        "max_position_embeddings", "rms_norm_eps", "mlp_bias",
                                                        "pretraining_tp", "rope_theta")),
    Field("vocab_size", POSITIVE_INT, 131072),
    Field("intermediate_size", POSITIVE_INT, 14336),
    Field("hidden_act", NAME, "xielu"),
    Field("max_position_embeddings", POSITIVE_INT, 65536),
    Field("rms_norm_eps", POSITIVE_NUMBER, 1e-5),
    Field("rope_theta", POSITIVE_NUMBER, 12000000.0),
)
APERTUS_DEFAULT_ROPE = {"rope_type": "llama3", "rope_theta": 12000000.0, "factor": 8.0, "low_freq_factor": 1.0,
                        "high_freq_factor": 4.0, "original_max_position_embeddings": 8192}

# ---- reading ------------------------------------------------------------------------------------

def read_hf_config(hf_dir: str | os.PathLike) -> HFConfig:
    """The folder's config.json, checked field by field, then across fields."""
    hf_dir = Path(hf_dir)
    if not hf_dir.is_dir():
        raise ConfigError(f"{hf_dir}: no such Hugging Face model folder")
    path = hf_dir / CONFIG_FILE
    return check_hf_config_json(read_json_object(path), path)


def check_hf_config_json(raw: dict, path: str | os.PathLike = CONFIG_FILE) -> HFConfig:
    """`raw` (a config.json's object) checked; `path` names it in every error. A quantization_config is checked
    and said for every family (`_quantization`)."""
    path = Path(path)
    return _quantization(_checked(raw, path), raw, path)


def _quantization(config: HFConfig, raw: dict, path: Path) -> HFConfig:
    """A quantization_config says how a release stores its weights (arguments/hf_families/quantized_release.py):
    the families that declare it (GPT-OSS, DeepSeek-V3) check and name it; in any other folder (a Llama or GPT-2
    quantized by GPTQ, AWQ, bitsandbytes...) it was passed over in silence, and one that is not an object failed
    only once transformers read it, after the data was prepared. Now: an object (or null), named in one start-up
    line."""
    if "quantization_config" in config.values:  # the family's own field and note
        return config
    block = raw.get("quantization_config")
    if block is None:
        return config
    if not OBJECT.accepts(block):
        raise ConfigError(wrong_value(path, "quantization_config", block, OBJECT, nullable=True))
    architectures = raw.get("architectures")
    name = architectures[0] if isinstance(architectures, list) and architectures and \
        isinstance(architectures[0], str) else f"model_type {config.family}"
    return dataclasses.replace(config, notes=config.notes + quantization_note(path, block, name))


def _checked(raw: dict, path: Path) -> HFConfig:
    family = _family(raw, path)
    registered, reader = registered_family(family), FAMILY_READERS.get(family)
    if registered is not None and registered.section is not None:  # the model is one object of a larger config
        section = raw.get(registered.section)
        if not OBJECT.accepts(section):
            raise ConfigError(wrong_value(path, registered.section, section, OBJECT, nullable=False))
        raw = section
    own = registered or reader
    table = own.fields if own is not None else \
        {"gpt2": GPT2_FIELDS, "mixtral": MIXTRAL_FIELDS, "qwen2_moe": QWEN2_MOE_FIELDS,
         "apertus": APERTUS_FIELDS}.get(family, LLAMA_FIELDS)
    fields = dict(raw)
    values = {}
    for spec in table:
        values[spec.key] = checked_field(raw, spec, path, fields)
    if registered is not None:  # its module's rules between fields, Llama's beneath them
        return dataclasses.replace(registered.typed(values, raw, path, fields), family=family, values=values)
    if reader is not None:
        return reader.read(values, raw, path, fields)
    if family == "gpt2":
        return _gpt2(values, path, fields)
    if family == "mixtral":
        values = {**values, "attention_bias": False, "mlp_bias": False}
        return dataclasses.replace(llama_shaped(values, raw, path, fields, heads_divide_hidden=False), family="mixtral",
                                   num_experts=values["num_local_experts"],
                                   experts_per_token=values["num_experts_per_tok"])
    if family == "apertus":
        values = {**values, "head_dim": None, "mlp_bias": False}
        if not any(isinstance(raw.get(key), dict) for key in ("rope_parameters", "rope_scaling")):
            raw = {**raw, "rope_parameters": APERTUS_DEFAULT_ROPE}  # ApertusConfig's default
        return dataclasses.replace(llama_shaped(values, raw, path, fields, heads_divide_hidden=False),
                                   family="apertus")
    if family == "qwen2_moe":
        values = {**values, "attention_bias": False, "mlp_bias": False}
        layers = values["num_hidden_layers"]
        dense = set(values["mlp_only_layers"] or ())
        # Qwen2MoeDecoderLayer: an MoE block `if (layer_idx not in config.mlp_only_layers) and
        # (config.num_experts > 0 and (layer_idx + 1) % config.decoder_sparse_step == 0)`
        moe_layers = tuple(i not in dense and (i + 1) % values["decoder_sparse_step"] == 0 for i in range(layers))
        return dataclasses.replace(llama_shaped(values, raw, path, fields, heads_divide_hidden=False),
                                   family="qwen2_moe",
                                   num_experts=values["num_experts"], experts_per_token=values["num_experts_per_tok"],
                                   moe_ffn_hidden_size=values["moe_intermediate_size"],
                                   shared_expert_size=values["shared_expert_intermediate_size"],
                                   norm_topk_prob=values["norm_topk_prob"], qkv_bias=values["qkv_bias"],
                                   moe_layers=moe_layers)
    return llama_shaped(values, raw, path, fields)  # LlamaConfig.validate_architecture: the heads divide hidden


# model_type -> the architectures (config.json's `architectures`) of that family we read; the families of
# arguments/hf_families/ add theirs (families()).
FAMILIES = {"gpt2": ("GPT2LMHeadModel", "GPT2Model"), "llama": ("LlamaForCausalLM", "LlamaModel"),
            "mixtral": ("MixtralForCausalLM", "MixtralModel"), "qwen2_moe": ("Qwen2MoeForCausalLM", "Qwen2MoeModel"),
            "apertus": ("ApertusForCausalLM", "ApertusModel"),
            **{model_type: reader.architectures for model_type, reader in FAMILY_READERS.items()}}


def registered_family(model_type: str):
    """The module-described family (arguments/hf_families/ FAMILIES) of `model_type`, or None."""
    return REGISTERED.get(model_type)


def families() -> dict[str, tuple[str, ...]]:
    """Every model_type read here and its architectures."""
    return {**FAMILIES, **{model_type: family.architectures for model_type, family in REGISTERED.items()}}


def _supported() -> str:
    listed = [f"{model_type!r} ({classes[0]})" for model_type, classes in families().items()]
    return ", ".join(listed[:-1]) + " and " + listed[-1]


def _family(raw: dict, path: Path) -> str:
    architectures = raw.get("architectures")
    if architectures is not None and not NAMES.accepts(architectures):
        raise ConfigError(wrong_value(path, "architectures", architectures, NAMES, nullable=True))
    model_type = raw.get("model_type", MISSING)
    if model_type is MISSING:
        named = {family for family, classes in families().items() for name in architectures or () if name in classes}
        if len(named) == 1:
            return named.pop()
        raise ConfigError(f"{path}: has no model_type, and its architectures ({shown(architectures)}) name no "
                          f"model read here; supported: {_supported()}")
    if not isinstance(model_type, str):
        raise ConfigError(wrong_value(path, "model_type", model_type, NAME, nullable=False))
    if model_type not in families():
        raise ConfigError(f"{path}: model_type {json.dumps(model_type)} is not read here; supported: {_supported()}")
    return model_type


# ---- the rules between fields -------------------------------------------------------------------

def _gpt2(values: dict, path: Path, fields: dict) -> HFConfig:
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


