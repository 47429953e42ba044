"""What every Hugging Face family's config.json reader builds on: the kinds a field may hold, a field's row (kind,
transformers' default, nullability), Llama's table, the one-line check of a field, the typed result `HFConfig`, and the
rules Llama-shaped fields share. JSON is read strictly: `true` is no count, `2.0` no integer.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Optional

from base.errors import ConfigError

MISSING = object()


def is_int(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_finite(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


@dataclass(frozen=True)
class Kind:
    """What a field must be: `words` completes "it must be ..."; `floating` fields reach transformers as floats."""
    words: str
    accepts: Callable[[Any], bool]
    integer: bool = False
    floating: bool = False


POSITIVE_INT = Kind("a positive integer", lambda v: is_int(v) and v > 0, integer=True)
INTEGER = Kind("an integer", is_int, integer=True)
TOKEN_IDS = Kind("an integer or a list of integers",
                 lambda v: is_int(v) or (isinstance(v, list) and all(is_int(i) for i in v)), integer=True)
POSITIVE_NUMBER = Kind("a positive finite number", lambda v: _is_finite(v) and v > 0, floating=True)
NON_NEGATIVE_NUMBER = Kind("a finite number >= 0", lambda v: _is_finite(v) and v >= 0, floating=True)
PROBABILITY = Kind("a number from 0 to 1", lambda v: _is_finite(v) and 0 <= v <= 1, floating=True)
ROTARY_FRACTION = Kind("a number above 0 and at most 1", lambda v: _is_finite(v) and 0 < v <= 1, floating=True)
BOOLEAN = Kind("true or false", lambda v: isinstance(v, bool))
NAME = Kind("a non-empty string", lambda v: isinstance(v, str) and v != "")
NAMES = Kind("a list of strings", lambda v: isinstance(v, list) and all(isinstance(i, str) for i in v))
OBJECT = Kind("a JSON object", lambda v: isinstance(v, dict))
NUMBERS = Kind("a list of finite numbers", lambda v: isinstance(v, list) and all(_is_finite(i) for i in v))


@dataclass(frozen=True)
class Field:
    """A config.json key we read: its kind, nullability, transformers' default, and its other names (GPT2Config's
    attribute_map)."""
    key: str
    kind: Kind
    default: Any
    nullable: bool = False
    aliases: tuple[str, ...] = ()


# Token ids are not read here (the tokenizer decides), but LlamaConfig checks them strictly.
TOKEN_ID_FIELDS = (Field("bos_token_id", INTEGER, None, nullable=True),
                    Field("pad_token_id", INTEGER, None, nullable=True),
                    Field("eos_token_id", TOKEN_IDS, None, nullable=True))

# LlamaConfig's fields and defaults; rope_theta and rope_scaling are pre-transformers-5 names.
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
    *TOKEN_ID_FIELDS,
    Field("id2label", OBJECT, None, nullable=True),  # transformers calls .items() on them
    Field("label2id", OBJECT, None, nullable=True),
)

LAYER_INDICES = Kind("a list of integers", lambda v: isinstance(v, list) and all(is_int(i) for i in v))

# The keys of a rope_parameters (or rope_scaling) object a Llama reads.
ROPE_FIELDS = (
    Field("rope_type", NAME, "default"),
    Field("type", NAME, "default"),  # rope_type's name before transformers 4.45
    Field("rope_theta", POSITIVE_NUMBER, None),
    Field("factor", POSITIVE_NUMBER, None),
    Field("low_freq_factor", POSITIVE_NUMBER, None),
    Field("high_freq_factor", POSITIVE_NUMBER, None),
    Field("original_max_position_embeddings", POSITIVE_INT, None),
    Field("partial_rotary_factor", ROTARY_FRACTION, None),
    Field("beta_fast", POSITIVE_NUMBER, None),
    Field("beta_slow", POSITIVE_NUMBER, None),
    Field("mscale", NON_NEGATIVE_NUMBER, None),
    Field("mscale_all_dim", NON_NEGATIVE_NUMBER, None),
    Field("attention_factor", POSITIVE_NUMBER, None),
    Field("truncate", BOOLEAN, None),
    Field("short_factor", NUMBERS, None),
    Field("long_factor", NUMBERS, None),
)


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
    # YaRN's: None where left out (transformers' defaults apply).
    beta_fast: Optional[float] = None
    beta_slow: Optional[float] = None
    mscale: Optional[float] = None
    mscale_all_dim: Optional[float] = None
    attention_factor: Optional[float] = None
    truncate: Optional[bool] = None
    short_factor: Optional[tuple[float, ...]] = None
    long_factor: Optional[tuple[float, ...]] = None


@dataclass(frozen=True)
class HFConfig:
    """A checked config.json: the architecture in our terms, and `fields`, the object as transformers is to be handed
    it."""
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
    # Every field of the family's table as checked (defaults filled in).
    values: dict = field(default_factory=dict, repr=False, compare=False)
    notes: tuple[str, ...] = ()


def read_json_object(path: Path, what: str = "a Hugging Face model folder needs its config.json") -> dict:
    """A JSON file holding one object, else a ConfigError naming the file."""
    try:
        value = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise ConfigError(f"{path}: missing; {what}") from None
    except (OSError, UnicodeDecodeError, json.JSONDecodeError, RecursionError) as error:
        raise ConfigError(f"{path}: unreadable or not JSON ({error})") from None
    if not isinstance(value, dict):
        raise ConfigError(f"{path}: expected a JSON object, found {shown(value)}")
    return value


def checked_field(raw: dict, spec: Field, path: Path, fields: dict, prefix: str = ""):
    """The field's value (its default when left out), checked; a floating field's number is made a float in `fields`. An
    alias is checked under the name the file uses."""
    value = MISSING
    for key in (spec.key, *spec.aliases):
        if key not in raw:
            continue
        written = raw[key]
        if not ((written is None and spec.nullable) or (written is not None and spec.kind.accepts(written))):
            raise ConfigError(wrong_value(path, prefix + key, written, spec.kind, spec.nullable))
        if spec.kind.floating and written is not None:
            written = float(written)
            fields[key] = written
        if value is MISSING:
            value = written
    return spec.default if value is MISSING else value


def wrong_value(path: Path, key: str, value, kind: Kind, nullable: bool) -> str:
    hint = ""
    if kind.integer and isinstance(value, float) and value.is_integer():
        hint = f" (written without a decimal point: {int(value)}, not {value!r})"
    return f"{path}: {key} is {shown(value)}; it must be {kind.words}{' or null' if nullable else ''}{hint}"


def shown(value) -> str:
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


def llama_shaped(values: dict, raw: dict, path: Path, fields: dict, heads_divide_hidden: bool = True) -> HFConfig:
    """Llama's rules between fields. `heads_divide_hidden`: the config class refuses a hidden_size the heads do not
    divide (LlamaConfig, Gemma 2/3); others take head_dim."""
    hidden, heads = values["hidden_size"], values["num_attention_heads"]
    if heads_divide_hidden and hidden % heads:
        # LlamaConfig.validate_architecture
        raise ConfigError(f"{path}: hidden_size {hidden} is not a multiple of num_attention_heads {heads}; "
                          f"transformers' LlamaConfig requires it")
    groups = values["num_key_value_heads"] or heads
    if heads % groups:
        raise ConfigError(f"{path}: num_attention_heads {heads} is not a multiple of num_key_value_heads {groups}; "
                          f"each key/value head serves an equal group of query heads")
    head_dim = values["head_dim"] or hidden // heads
    if head_dim % 2:
        # transformers refuses an odd rotary dimension too; the rotation pairs each head's halves.
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
        initializer_range=float(values["initializer_range"]), rope=rope_config(values, raw, path), fields=fields)


def rope_config(values: dict, raw: dict, path: Path) -> RopeConfig:
    """rope_parameters, or an older file's rope_scaling, both checked; rope_theta from inside it, else the top level's.
    """
    for key in ("rope_parameters", "rope_scaling"):
        if isinstance(raw.get(key), dict):
            for spec in ROPE_FIELDS:
                checked_field(raw[key], spec, path, {}, prefix=f"{key}.")
    return rope_object(raw.get("rope_scaling") or raw.get("rope_parameters") or {}, values["rope_theta"])


def rope_object(rope: dict, default_theta: float, path: Optional[Path] = None, key: str = "") -> RopeConfig:
    """One rope_parameters object as a RopeConfig, checked where `path` names the file; its rope_theta, else
    `default_theta`."""
    if path is not None:
        for spec in ROPE_FIELDS:
            checked_field(rope, spec, path, {}, prefix=f"{key}.")
    rope_type = rope.get("rope_type", rope.get("type", "default"))
    theta = rope.get("rope_theta", default_theta)
    return RopeConfig(rope_type=rope_type, theta=float(theta), factor=_float_or_none(rope.get("factor")),
                      low_freq_factor=_float_or_none(rope.get("low_freq_factor")),
                      high_freq_factor=_float_or_none(rope.get("high_freq_factor")),
                      original_max_position_embeddings=rope.get("original_max_position_embeddings"),
                      partial_rotary_factor=float(rope.get("partial_rotary_factor", 1.0)),
                      **{name: _float_or_none(rope.get(name)) for name in ("beta_fast", "beta_slow", "mscale",
                                                                         "mscale_all_dim", "attention_factor")},
                      truncate=rope.get("truncate"), short_factor=_floats_or_none(rope.get("short_factor")),
                      long_factor=_floats_or_none(rope.get("long_factor")))


def _float_or_none(value) -> Optional[float]:
    return None if value is None else float(value)


def _floats_or_none(values) -> Optional[tuple[float, ...]]:
    return None if values is None else tuple(float(value) for value in values)


# Llama 3's rope scaling as Megatron-LM fixes it beside --rope-scaling-factor.
LLAMA3_FIXED = {"low_freq_factor": 1.0, "high_freq_factor": 4.0, "original_max_position_embeddings": 8192}


@dataclass(frozen=True)
class FolderValue:
    """A setting's value in the folder, and what in the folder gives it (a config.json key, a file)."""
    value: Any
    key: str


# Block settings the families read as off (--apply-layernorm-1p is handled by the gain shift instead).
PLAIN_BLOCKS = {"qk_l2_norm": False, "no_rope_freq": None, "qk_layernorm_over_projection": False, "window_size": None,
                "window_attn_skip_freq": None, "sublayer_norms": "input", "gated_linear_unit": False,
                "scale_embeddings_by_sqrt_hidden": False, "softmax_scale": None, "attn_logit_softcapping": None,
                "final_logit_softcapping": None, "local_rotary_base": None, "rotary_seq_len_interpolation_factor": None}


def llama_shape_settings(config: HFConfig) -> dict[str, FolderValue]:
    """The shape settings a Llama-shaped folder gives, each with the key it comes from."""
    v, fields = FolderValue, config.fields
    return {
        "num_layers": v(config.num_layers, "num_hidden_layers"), "hidden_size": v(config.hidden_size, "hidden_size"),
        "num_attention_heads": v(config.num_attention_heads, "num_attention_heads"),
        "kv_channels": v(config.head_dim, "head_dim" if fields.get("head_dim") else
                         "hidden_size / num_attention_heads"),
        "ffn_hidden_size": v(config.ffn_hidden_size, "intermediate_size"),
        "num_query_groups": v(config.num_key_value_heads, "num_key_value_heads" if fields.get("num_key_value_heads")
                              else "num_attention_heads (no num_key_value_heads)"),
        "max_position_embeddings": v(config.max_position_embeddings, "max_position_embeddings"),
        "layernorm_epsilon": v(config.norm_epsilon, "rms_norm_eps"),
        "untie_embeddings_and_output_weights": v(not config.tie_word_embeddings, "tie_word_embeddings")}
