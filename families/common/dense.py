"""What the dense families share: the record each family's config.py fills (DenseFamily: Llama's core plus its `fixed`,
`read` and `write` settings and its weights' names), and sliding windows and rotary scalings as transformers writes
them. The export takes a model to a family only where it fits.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Optional

from base.errors import ConfigError
from base.options import setting_value
from families.common.features import flag_for, uncarried
from families.common.fields import (
    LLAMA3_FIXED,
    LLAMA_FIELDS,
    NAMES,
    PLAIN_BLOCKS,
    Field,
    FolderValue,
    HFConfig,
    RopeConfig,
    llama_shape_settings,
    llama_shaped,
)
from gpt.model_config import ModelConfig

SLIDING, FULL = "sliding_attention", "full_attention"  # transformers' layer_types
LAYER_TYPES = Field("layer_types", NAMES, None, nullable=True)
# Llama's own keys the other families do not have
LLAMA_ONLY = ("attention_bias", "mlp_bias", "pretraining_tp")
# The settings of Llama's blocks every dense family starts from; windows and rotary scaling are each family's.
WINDOWS = ("window_size", "window_attn_skip_freq")
LLAMA_BLOCKS = {**{name: value for name, value in PLAIN_BLOCKS.items()
                   if name not in (*WINDOWS, "rotary_seq_len_interpolation_factor")},
                "normalization": "RMSNorm", "swiglu": True, "position_embedding_type": "rope", "rotary_percent": 1.0,
                "rotary_interleaved": False, "add_bias_linear": False, "add_qkv_bias": False, "qk_layernorm": False,
                "attention_output_gate": False, "multi_latent_attention": False}
NO_WINDOW = {name: None for name in WINDOWS}  # a family with no sliding window


@dataclass(frozen=True)
class DenseFamily:
    """One transformers family: config.json in and out, and its weights' names. `fixed`: settings every folder has;
    `needs(model)`: what else the model must be."""
    model_type: str
    architectures: tuple[str, ...]  # (the ForCausalLM class, the bare model's)
    config_class: str  # transformers' config class
    fields: tuple[Field, ...]
    read: Callable[[HFConfig], dict[str, FolderValue]]
    write: Callable[[ModelConfig], dict]
    fixed: dict[str, Any]
    # (ours inside a block, theirs inside a layer) for tensors that move as they are.
    layer_names: tuple[tuple[str, str], ...]
    needs: Callable[[ModelConfig], dict[str, bool]] = lambda model: {}
    carries: tuple[str, ...] = ()
    typed: Callable[[dict, dict, Path, dict], HFConfig] = lambda values, raw, path, fields: dense_typed(
        values, raw, path, fields)
    fused_qkv: Optional[str] = None  # Phi-3's self_attn.qkv_proj: [q; k; v] rows
    fused_gate_up: Optional[str] = None  # Phi-3's mlp.gate_up_proj: [gate; up] rows
    # The key holding the model in a multimodal folder (text_config), else None.
    section: Optional[str] = None

    @property
    def architecture(self) -> str:
        return self.architectures[0]

    def misfits(self, model: ModelConfig) -> list[str]:
        """The flags `model` would need to be this family (empty: it is one)."""
        needs = {flag_for(name, value): setting_value(model, name) != value for name, value in self.fixed.items()}
        needs.update({f"no --num-experts ({self.architecture} has no experts)": model.moe is not None,
                      f"no --mtp-num-layers ({self.architecture} has no MTP layers)": bool(model.mtp.num_layers),
                      **rope_needs(model), **self.needs(model)})
        needs.update({need: True for need in uncarried(model, (*self.fixed, *self.carries))})
        return [need for need, missing in needs.items() if missing]


def dense_typed(values: dict, raw: dict, path: Path, fields: dict, heads_divide_hidden: bool = False) -> HFConfig:
    """Llama's rules between fields for a family without Llama's bias keys. `heads_divide_hidden`: its config class
    refuses a hidden_size the heads do not divide."""
    return llama_shaped({"attention_bias": False, "mlp_bias": False, **values}, raw, path, fields,
                        heads_divide_hidden=heads_divide_hidden)


def core_fields(*extra: Field, drop: tuple[str, ...] = (), **defaults: Any) -> tuple[Field, ...]:
    """LLAMA_FIELDS without Llama's own keys (and `drop`), with the family's `defaults`, then its `extra` fields."""
    fields = []
    for spec in LLAMA_FIELDS:
        if spec.key in LLAMA_ONLY or spec.key in drop:
            continue
        fields.append(dataclasses.replace(spec, default=defaults.pop(spec.key)) if spec.key in defaults else spec)
    if defaults:
        raise ValueError(f"defaults for keys Llama's table has not: {sorted(defaults)}")
    return (*fields, *extra)


def check_buildable(config: HFConfig, architecture: str, bias_key: bool = False) -> None:
    """A Llama-shaped family's MLP is SwiGLU; with `bias_key`, an attention_bias over q, k, v and o without the MLP is
    refused."""
    problems = []
    if config.activation != "silu":
        problems.append(f"hidden_act {config.activation!r} (its MLP is SwiGLU, silu's)")
    if bias_key and config.values.get("attention_bias"):
        problems.append("attention_bias true (a bias on q, k, v and o without the MLP's is not built here)")
    if problems:
        raise ConfigError(f"{config.path}: this {architecture} cannot be represented here: {'; '.join(problems)}")


def without_derived_head_dim(keys: dict, model: ModelConfig) -> dict:
    """The config.json keys without head_dim where it is hidden / heads (for classes with no head_dim)."""
    if model.head_dim * model.num_attention_heads == model.hidden_size:
        keys = {key: value for key, value in keys.items() if key != "head_dim"}
    return keys


def fixed_settings(fixed: dict[str, Any], model_type: str) -> dict[str, FolderValue]:
    return {name: FolderValue(value, f"model_type {model_type}") for name, value in fixed.items()}


def core_settings(config: HFConfig, model_type: str, rotary: bool = True,
                  partial_rotary: bool = False) -> dict[str, FolderValue]:
    """Llama's shape settings of a `model_type` folder, and its rotary positions where `rotary`; a partial_rotary_factor
    other than 1 is refused unless `partial_rotary` (Phi-3)."""
    if rotary and not partial_rotary and config.rope.partial_rotary_factor != 1.0:
        raise ConfigError(f"{config.path}: {rope_key(config)} partial_rotary_factor "
                          f"{config.rope.partial_rotary_factor!r}: {model_type}'s rotary embedding here turns every "
                          f"dim of each head")
    settings = {**llama_shape_settings(config), "hf_model_type": FolderValue(model_type, "model_type")}
    return {**settings, **(rotary_settings(config.rope, config) if rotary else {})}


def rope_key(config: HFConfig) -> str:
    return "rope_scaling" if config.fields.get("rope_scaling") else "rope_parameters"


def rotary_settings(rope: RopeConfig, config: HFConfig, where: str = "") -> dict[str, FolderValue]:
    """A rope_parameters object as our rotary settings: theta, and default, Llama 3 or linear scaling; another type is
    refused."""
    key = where or rope_key(config)
    if rope.rope_type not in ("default", "llama3", "linear"):
        alias = " (transformers' older name for 'longrope')" if rope.rope_type == "su" else ""
        longrope = " for this family (Phi-3's is)" if rope.rope_type in ("su", "longrope") else ""
        raise ConfigError(f"{config.path}: {key} rope_type {rope.rope_type!r}{alias} is not built here{longrope} "
                          f"(default, Llama 3's 'llama3' and 'linear' are)")
    if rope.rope_type == "llama3":
        wrong = [f"{key} {name} {getattr(rope, name)!r} (Megatron-LM's Llama 3 scaling fixes it at {value})"
                 for name, value in LLAMA3_FIXED.items() if getattr(rope, name) != value]
        if wrong:
            raise ConfigError(f"{config.path}: {'; '.join(wrong)}")
    v = FolderValue
    theta_from = f"{key}.rope_theta" if "rope_theta" in (_at(config.fields, key) or {}) else "rope_theta"
    return {"rotary_base": v(rope.theta, theta_from),
            "use_rope_scaling": v(rope.rope_type == "llama3", f"{key}.rope_type"),
            "rope_scaling_factor": v(rope.factor if rope.rope_type == "llama3" else 8.0, f"{key}.factor"),
            "rotary_seq_len_interpolation_factor": v(rope.factor if rope.rope_type == "linear" else None,
                                                     f"{key}.factor")}


def _at(fields: dict, key: str):
    value = fields
    for part in key.split("."):
        value = value.get(part) if isinstance(value, dict) else None
    return value


def rope_parameters(model: ModelConfig, base: Optional[float] = None, scaled: bool = True) -> dict:
    """transformers' rope_parameters for our rotary settings (`base` replaces --rotary-base; `scaled` False leaves
    scalings out)."""
    parameters = {"rope_type": "default", "rope_theta": model.positions.rotary_base if base is None else base}
    if scaled and model.positions.use_rope_scaling:
        parameters.update(rope_type="llama3", factor=model.positions.rope_scaling_factor, **LLAMA3_FIXED)
    elif scaled and model.positions.rotary_seq_len_interpolation_factor is not None:
        parameters.update(rope_type="linear", factor=model.positions.rotary_seq_len_interpolation_factor)
    return parameters


def rope_needs(model: ModelConfig) -> dict[str, bool]:
    return {"no --use-rope-scaling with --rotary-seq-len-interpolation-factor (transformers' rope has one type)":
            model.positions.use_rope_scaling and model.positions.rotary_seq_len_interpolation_factor is not None}


def core_write(model: ModelConfig) -> dict:
    """The config.json keys of Llama's core for `model`."""
    return dict(vocab_size=model.vocab_size, hidden_size=model.hidden_size, intermediate_size=model.ffn_size,
                num_hidden_layers=model.num_layers, num_attention_heads=model.num_attention_heads,
                num_key_value_heads=model.attention.query_groups(model.num_attention_heads),
                head_dim=model.head_dim, max_position_embeddings=model.max_position_embeddings,
                rms_norm_eps=model.norms.layernorm_epsilon, rope_parameters=rope_parameters(model), hidden_act="silu",
                tie_word_embeddings=not model.output.untie_embeddings_and_output_weights,
                attention_dropout=model.attention.attention_dropout, initializer_range=model.init_method_std)


def checked_layer_types(config: HFConfig) -> Optional[list[str]]:
    """config.json's layer_types, each sliding_attention or full_attention, one per layer; None where absent."""
    kinds = config.fields.get("layer_types")
    if kinds is None:
        return None
    wrong = sorted({kind for kind in kinds if kind not in (SLIDING, FULL)})
    if wrong:
        raise ConfigError(f"{config.path}: layer_types holds {', '.join(map(repr, wrong))}: only {SLIDING!r} and "
                          f"{FULL!r} layers are built here")
    if len(kinds) != config.num_layers:
        raise ConfigError(f"{config.path}: layer_types has {len(kinds)} entries for {config.num_layers} layers "
                          f"(num_hidden_layers)")
    return kinds


def window_settings(sliding_window: Optional[int], windowed: tuple[bool, ...], origin: str) -> dict[str, FolderValue]:
    """transformers' sliding_window W over the `windowed` layers as --window-size W-1,0 and --window-attn-skip-freq."""
    v = FolderValue
    if sliding_window is None or not any(windowed):
        return {"window_size": v(None, origin), "window_attn_skip_freq": v(None, origin)}
    return {"window_size": v((sliding_window - 1, 0), f"{origin} (W - 1 keys before the query)"),
            "window_attn_skip_freq": v(skip_frequency(windowed), origin)}


def skip_frequency(windowed: tuple[bool, ...]):
    """--window-attn-skip-freq for a per-layer pattern: None, Megatron's N, or a list expression."""
    if all(windowed):
        return None
    for every in range(2, len(windowed) + 1):
        if all(flag == bool((layer + 1) % every) for layer, flag in enumerate(windowed)):
            return every
    return "[" + ",".join(str(int(flag)) for flag in windowed) + "]"


def sliding_window_of(model: ModelConfig) -> Optional[int]:
    """transformers' sliding_window for our windows: the left side + 1, or None without a window."""
    windows = [window for window in model.attention_windows() if window is not None]
    return windows[0] + 1 if windows else None


def layer_types_of(model: ModelConfig) -> list[str]:
    return [FULL if window is None else SLIDING for window in model.attention_windows()]


def every_layer_or_none_windowed(model: ModelConfig, family: str) -> dict[str, bool]:
    """A family with one sliding_window over every layer (Mistral, Phi-3) cannot hold a window on some layers only."""
    windows = model.attention_windows()
    return {f"a --window-size on every layer or none ({family} has one sliding_window for all)":
            len(set(window is None for window in windows)) > 1}
