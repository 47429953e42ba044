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
import math
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Optional

from base.errors import ConfigError

CONFIG_FILE = "config.json"
_MISSING = object()


# ---- kinds of values ----------------------------------------------------------------------------

def _is_int(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_finite(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


@dataclass(frozen=True)
class Kind:
    """What a field must be: `words` completes "it must be ..."; `floating` fields are handed to
    transformers as floats (an integer written for them is a float of the same value)."""
    words: str
    accepts: Callable[[Any], bool]
    integer: bool = False
    floating: bool = False


POSITIVE_INT = Kind("a positive integer", lambda v: _is_int(v) and v > 0, integer=True)
INTEGER = Kind("an integer", _is_int, integer=True)
TOKEN_IDS = Kind("an integer or a list of integers",
                 lambda v: _is_int(v) or (isinstance(v, list) and all(_is_int(i) for i in v)), integer=True)
POSITIVE_NUMBER = Kind("a positive finite number", lambda v: _is_finite(v) and v > 0, floating=True)
NON_NEGATIVE_NUMBER = Kind("a finite number >= 0", lambda v: _is_finite(v) and v >= 0, floating=True)
PROBABILITY = Kind("a number from 0 to 1", lambda v: _is_finite(v) and 0 <= v <= 1, floating=True)
ROTARY_FRACTION = Kind("a number above 0 and at most 1", lambda v: _is_finite(v) and 0 < v <= 1, floating=True)
BOOLEAN = Kind("true or false", lambda v: isinstance(v, bool))
NAME = Kind("a non-empty string", lambda v: isinstance(v, str) and v != "")
NAMES = Kind("a list of strings", lambda v: isinstance(v, list) and all(isinstance(i, str) for i in v))
OBJECT = Kind("a JSON object", lambda v: isinstance(v, dict))


@dataclass(frozen=True)
class Field:
    """A config.json key we read: its kind, whether null is allowed (where transformers allows it), the
    value transformers assumes when the key is left out, and the other names transformers maps onto it
    (GPT2Config's attribute_map: "hidden_size" is n_embd)."""
    key: str
    kind: Kind
    default: Any
    nullable: bool = False
    aliases: tuple[str, ...] = ()


# Token ids are not read here (the run's tokenizer decides), but LlamaConfig checks them strictly.
_TOKEN_ID_FIELDS = (Field("bos_token_id", INTEGER, None, nullable=True),
                    Field("pad_token_id", INTEGER, None, nullable=True),
                    Field("eos_token_id", TOKEN_IDS, None, nullable=True))

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
    *_TOKEN_ID_FIELDS,
)

# LlamaConfig's fields and defaults (transformers/models/llama/configuration_llama.py); rope_theta and
# rope_scaling are the names files written before transformers 5 use (it moves them into rope_parameters).
LLAMA_FIELDS = (
    Field("vocab_size", POSITIVE_INT, 32000),
    Field("hidden_size", POSITIVE_INT, 4096),
    Field("intermediate_size", POSITIVE_INT, 11008),
    Field("num_hidden_layers", POSITIVE_INT, 32),
    Field("num_attention_heads", POSITIVE_INT, 32),
    Field("num_key_value_heads", POSITIVE_INT, None, nullable=True),  # null: num_attention_heads
    Field("head_dim", POSITIVE_INT, None, nullable=True),  # null: hidden_size / num_attention_heads
    Field("hidden_act", NAME, "silu"),
    Field("max_position_embeddings", POSITIVE_INT, 2048),
    Field("initializer_range", PROBABILITY, 0.02),  # LlamaConfig's interval(min=0.0, max=1.0)
    Field("rms_norm_eps", POSITIVE_NUMBER, 1e-6),
    Field("tie_word_embeddings", BOOLEAN, False),
    Field("attention_bias", BOOLEAN, False),
    Field("mlp_bias", BOOLEAN, False),
    Field("attention_dropout", PROBABILITY, 0.0, nullable=True),
    Field("pretraining_tp", POSITIVE_INT, 1, nullable=True),
    Field("use_cache", BOOLEAN, True),
    Field("rope_theta", POSITIVE_NUMBER, 10000.0),
    Field("rope_parameters", OBJECT, None, nullable=True),
    Field("rope_scaling", OBJECT, None, nullable=True),
    *_TOKEN_ID_FIELDS,
    Field("id2label", OBJECT, None, nullable=True),  # transformers calls .items() on them
    Field("label2id", OBJECT, None, nullable=True),
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

LAYER_INDICES = Kind("a list of integers", lambda v: isinstance(v, list) and all(_is_int(i) for i in v))

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

# The keys of a rope_parameters (or rope_scaling) object that a Llama's rotary embedding reads.
ROPE_FIELDS = (
    Field("rope_type", NAME, "default"),
    Field("type", NAME, "default"),  # rope_type's name before transformers 4.45
    Field("rope_theta", POSITIVE_NUMBER, None),
    Field("factor", POSITIVE_NUMBER, None),
    Field("low_freq_factor", POSITIVE_NUMBER, None),
    Field("high_freq_factor", POSITIVE_NUMBER, None),
    Field("original_max_position_embeddings", POSITIVE_INT, None),
    Field("partial_rotary_factor", ROTARY_FRACTION, None),
)


# ---- the typed result ---------------------------------------------------------------------------

@dataclass(frozen=True)
class RopeConfig:
    """A Llama's rotary embedding as config.json gives it (transformers' rope_parameters)."""
    rope_type: str
    theta: float
    factor: Optional[float] = None
    low_freq_factor: Optional[float] = None
    high_freq_factor: Optional[float] = None
    original_max_position_embeddings: Optional[int] = None
    partial_rotary_factor: float = 1.0


@dataclass(frozen=True)
class HFConfig:
    """A checked config.json: the architecture in our terms, and `fields`, the file's object as
    transformers is to be handed it."""
    path: Path
    family: str  # "gpt2" or "llama"
    vocab_size: int
    hidden_size: int
    num_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    ffn_hidden_size: int
    max_position_embeddings: int
    norm_epsilon: float
    activation: str  # as written: GPT-2's activation_function, Llama's hidden_act
    tie_word_embeddings: bool
    attention_bias: bool
    mlp_bias: bool
    initializer_range: float
    rope: Optional[RopeConfig]  # None for GPT-2 (learned positions)
    fields: dict = field(repr=False, compare=False)
    num_experts: Optional[int] = None  # Mixtral's num_local_experts; None for a dense family
    experts_per_token: Optional[int] = None  # Mixtral's num_experts_per_tok
    moe_ffn_hidden_size: Optional[int] = None  # Qwen2-MoE's moe_intermediate_size (Mixtral's is intermediate_size)
    shared_expert_size: Optional[int] = None  # Qwen2-MoE's gated shared expert
    norm_topk_prob: bool = True  # Mixtral renormalizes the top k; Qwen2-MoE by norm_topk_prob
    qkv_bias: bool = False  # Qwen2's bias on q, k and v alone
    moe_layers: Optional[tuple] = None  # per layer, whether it is an MoE layer (None: every layer)


# ---- reading ------------------------------------------------------------------------------------

def read_json_object(path: Path, what: str = "a Hugging Face model folder needs its config.json") -> dict:
    """A JSON file holding one object; missing, unreadable, not JSON or not an object is a ConfigError
    naming the file."""
    try:
        value = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise ConfigError(f"{path}: missing; {what}") from None
    except (OSError, UnicodeDecodeError, json.JSONDecodeError, RecursionError) as error:
        raise ConfigError(f"{path}: unreadable or not JSON ({error})") from None
    if not isinstance(value, dict):
        raise ConfigError(f"{path}: expected a JSON object, found {_shown(value)}")
    return value


def read_hf_config(hf_dir: str | os.PathLike) -> HFConfig:
    """The folder's config.json, checked field by field, then across fields."""
    hf_dir = Path(hf_dir)
    if not hf_dir.is_dir():
        raise ConfigError(f"{hf_dir}: no such Hugging Face model folder")
    path = hf_dir / CONFIG_FILE
    return check_hf_config_json(read_json_object(path), path)


def check_hf_config_json(raw: dict, path: str | os.PathLike = CONFIG_FILE) -> HFConfig:
    """`raw` (a config.json's object) checked; `path` names it in every error."""
    path = Path(path)
    family = _family(raw, path)
    table = {"gpt2": GPT2_FIELDS, "mixtral": MIXTRAL_FIELDS, "qwen2_moe": QWEN2_MOE_FIELDS,
             "apertus": APERTUS_FIELDS}.get(family, LLAMA_FIELDS)
    fields = dict(raw)
    values = {}
    for spec in table:
        values[spec.key] = _checked(raw, spec, path, fields)
    if family == "gpt2":
        return _gpt2(values, path, fields)
    if family == "mixtral":
        values = {**values, "attention_bias": False, "mlp_bias": False}
        return dataclasses.replace(_llama(values, raw, path, fields), family="mixtral",
                                   num_experts=values["num_local_experts"],
                                   experts_per_token=values["num_experts_per_tok"])
    if family == "apertus":
        values = {**values, "head_dim": None, "mlp_bias": False}
        if not any(isinstance(raw.get(key), dict) for key in ("rope_parameters", "rope_scaling")):
            raw = {**raw, "rope_parameters": APERTUS_DEFAULT_ROPE}  # ApertusConfig's default
        return dataclasses.replace(_llama(values, raw, path, fields), family="apertus")
    if family == "qwen2_moe":
        values = {**values, "attention_bias": False, "mlp_bias": False}
        layers = values["num_hidden_layers"]
        dense = set(values["mlp_only_layers"] or ())
        # Qwen2MoeDecoderLayer: an MoE block `if (layer_idx not in config.mlp_only_layers) and
        # (config.num_experts > 0 and (layer_idx + 1) % config.decoder_sparse_step == 0)`
        moe_layers = tuple(i not in dense and (i + 1) % values["decoder_sparse_step"] == 0 for i in range(layers))
        return dataclasses.replace(_llama(values, raw, path, fields), family="qwen2_moe",
                                   num_experts=values["num_experts"], experts_per_token=values["num_experts_per_tok"],
                                   moe_ffn_hidden_size=values["moe_intermediate_size"],
                                   shared_expert_size=values["shared_expert_intermediate_size"],
                                   norm_topk_prob=values["norm_topk_prob"], qkv_bias=values["qkv_bias"],
                                   moe_layers=moe_layers)
    return _llama(values, raw, path, fields)


# model_type -> the architectures (config.json's `architectures`) of that family we read.
FAMILIES = {"gpt2": ("GPT2LMHeadModel", "GPT2Model"), "llama": ("LlamaForCausalLM", "LlamaModel"),
            "mixtral": ("MixtralForCausalLM", "MixtralModel"), "qwen2_moe": ("Qwen2MoeForCausalLM", "Qwen2MoeModel"),
            "apertus": ("ApertusForCausalLM", "ApertusModel")}


def _supported() -> str:
    return " and ".join(f"{model_type!r} ({classes[0]})" for model_type, classes in FAMILIES.items())


def _family(raw: dict, path: Path) -> str:
    architectures = raw.get("architectures")
    if architectures is not None and not NAMES.accepts(architectures):
        raise ConfigError(_wrong(path, "architectures", architectures, NAMES, nullable=True))
    model_type = raw.get("model_type", _MISSING)
    if model_type is _MISSING:
        named = {family for family, classes in FAMILIES.items() for name in architectures or () if name in classes}
        if len(named) == 1:
            return named.pop()
        raise ConfigError(f"{path}: has no model_type, and its architectures ({_shown(architectures)}) name no "
                          f"model read here; supported: {_supported()}")
    if not isinstance(model_type, str):
        raise ConfigError(_wrong(path, "model_type", model_type, NAME, nullable=False))
    if model_type not in FAMILIES:
        raise ConfigError(f"{path}: model_type {json.dumps(model_type)} is not read here; supported: {_supported()}")
    return model_type


def _checked(raw: dict, spec: Field, path: Path, fields: dict, prefix: str = ""):
    """The field's value (its default when left out) after checking it; a number of a floating field is
    made a float in `fields`. An alias is checked under the name the file uses; the first name present
    gives the value, as the key transformers maps it to comes first."""
    value = _MISSING
    for key in (spec.key, *spec.aliases):
        if key not in raw:
            continue
        written = raw[key]
        if not ((written is None and spec.nullable) or (written is not None and spec.kind.accepts(written))):
            raise ConfigError(_wrong(path, prefix + key, written, spec.kind, spec.nullable))
        if spec.kind.floating and written is not None:
            written = float(written)
            fields[key] = written
        if value is _MISSING:
            value = written
    return spec.default if value is _MISSING else value


def _wrong(path: Path, key: str, value, kind: Kind, nullable: bool) -> str:
    hint = ""
    if kind.integer and isinstance(value, float) and value.is_integer():
        hint = f" (written without a decimal point: {int(value)}, not {value!r})"
    return f"{path}: {key} is {_shown(value)}; it must be {kind.words}{' or null' if nullable else ''}{hint}"


def _shown(value) -> str:
    """A value as config.json writes it, with what JSON type it is where that is the problem."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return f"{'true' if value else 'false'} (a boolean)"
    if isinstance(value, str):
        return f"{_clipped(json.dumps(value))} (a string)"
    if isinstance(value, float) and not math.isfinite(value):
        return "NaN" if math.isnan(value) else ("Infinity" if value > 0 else "-Infinity")
    if isinstance(value, (int, float)):
        return repr(value)
    return f"{_clipped(json.dumps(value))} ({'a list' if isinstance(value, list) else 'an object'})"


def _clipped(text: str, limit: int = 60) -> str:
    return text if len(text) <= limit else text[:limit - 3] + "..."


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


def _llama(values: dict, raw: dict, path: Path, fields: dict) -> HFConfig:
    hidden, heads = values["hidden_size"], values["num_attention_heads"]
    if hidden % heads:
        # LlamaConfig.validate_architecture
        raise ConfigError(f"{path}: hidden_size {hidden} is not a multiple of num_attention_heads {heads}; "
                          f"transformers' LlamaConfig requires it")
    groups = values["num_key_value_heads"] or heads
    if heads % groups:
        raise ConfigError(f"{path}: num_attention_heads {heads} is not a multiple of num_key_value_heads {groups}; "
                          f"each key/value head serves an equal group of query heads")
    head_dim = values["head_dim"] or hidden // heads
    if head_dim % 2:
        # transformers' validate_rope refuses an odd rotary dimension too (it lets test fixtures with
        # head_dim <= 4 through); the rotation here pairs the two halves of each head.
        raise ConfigError(f"{path}: the head dimension {head_dim} ("
                          f"{'head_dim' if values['head_dim'] else 'hidden_size / num_attention_heads'}) is odd; "
                          f"rotary embeddings rotate pairs of dimensions")
    return HFConfig(
        path=path, family="llama", vocab_size=values["vocab_size"], hidden_size=hidden,
        num_layers=values["num_hidden_layers"], num_attention_heads=heads, num_key_value_heads=groups,
        head_dim=head_dim, ffn_hidden_size=values["intermediate_size"],
        max_position_embeddings=values["max_position_embeddings"], norm_epsilon=float(values["rms_norm_eps"]),
        activation=values["hidden_act"], tie_word_embeddings=values["tie_word_embeddings"],
        attention_bias=values["attention_bias"], mlp_bias=values["mlp_bias"],
        initializer_range=float(values["initializer_range"]), rope=_rope(values, raw, path), fields=fields)


def _rope(values: dict, raw: dict, path: Path) -> RopeConfig:
    """rope_parameters, or an older file's rope_scaling (which transformers takes when both are set),
    the keys of both checked; rope_theta from inside it, else the top level's."""
    for key in ("rope_parameters", "rope_scaling"):
        if isinstance(raw.get(key), dict):
            for spec in ROPE_FIELDS:
                _checked(raw[key], spec, path, {}, prefix=f"{key}.")
    rope = raw.get("rope_scaling") or raw.get("rope_parameters") or {}
    rope_type = rope.get("rope_type", rope.get("type", "default"))
    theta = rope.get("rope_theta", values["rope_theta"])
    return RopeConfig(rope_type=rope_type, theta=float(theta), factor=_float_or_none(rope.get("factor")),
                      low_freq_factor=_float_or_none(rope.get("low_freq_factor")),
                      high_freq_factor=_float_or_none(rope.get("high_freq_factor")),
                      original_max_position_embeddings=rope.get("original_max_position_embeddings"),
                      partial_rotary_factor=float(rope.get("partial_rotary_factor", 1.0)))


def _float_or_none(value) -> Optional[float]:
    return None if value is None else float(value)
