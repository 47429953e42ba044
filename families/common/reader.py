"""How a family with a reader of its own is given (FamilyReader), and a LlamaForCausalLM's settings, which the other
Llama-shaped families start from, each with the config.json key it comes from.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from base.errors import ConfigError
from families.common.fields import LLAMA3_FIXED, Field, FolderValue, HFConfig, llama_shape_settings

LLAMA_ARCHITECTURE = "LlamaForCausalLM"


@dataclass(frozen=True)
class FamilyReader:
    """A family read by its own reader: its model_type, `architectures` (the first is the class it is read and written
    as), its field table, `read` (values -> HFConfig, rules applied) and `settings` (HFConfig -> ModelConfig settings,
    each with its key)."""
    model_type: str
    architectures: tuple[str, ...]
    fields: tuple[Field, ...]
    read: Callable[[dict, dict, Path, dict], HFConfig]
    settings: Callable[[HFConfig], dict[str, "FolderValue"]]


def llama_settings(config: HFConfig) -> dict[str, FolderValue]:
    """The ModelConfig settings of a Llama-shaped folder, each with its key; what our blocks cannot compute is refused
    in one line."""
    rope, fields = config.rope, config.fields
    problems = []
    if config.activation != "silu":
        problems.append(f"hidden_act {config.activation!r} (SwiGLU here is silu's)")
    if rope.rope_type not in ("default", "llama3"):
        problems.append(f"rope_parameters rope_type {rope.rope_type!r} (only 'default' and Llama 3's 'llama3' are "
                        f"built)")
    if rope.rope_type == "llama3":
        problems += [f"rope_parameters {key} {getattr(rope, key)!r} (Megatron-LM's Llama 3 scaling fixes it at "
                     f"{value})" for key, value in LLAMA3_FIXED.items() if getattr(rope, key) != value]
    if rope.partial_rotary_factor != 1.0:
        problems.append(f"rope_parameters partial_rotary_factor {rope.partial_rotary_factor!r}")
    if config.attention_bias != config.mlp_bias:
        problems.append(f"attention_bias {config.attention_bias} with mlp_bias {config.mlp_bias} "
                        f"(--disable-bias-linear drops both here)")
    if fields.get("sliding_window") is not None or fields.get("use_sliding_window"):
        problems.append(f"sliding_window {fields.get('sliding_window')!r} (attention here sees the whole sequence)")
    if fields.get("pretraining_tp") not in (None, 1):
        problems.append(f"pretraining_tp {fields['pretraining_tp']}")
    if problems:
        raise ConfigError(f"{config.path}: this {LLAMA_ARCHITECTURE} cannot be represented here: "
                          f"{'; '.join(problems)}")
    v = FolderValue
    rope_key = "rope_scaling" if fields.get("rope_scaling") else "rope_parameters"
    settings = {
        **llama_shape_settings(config),
        "normalization": v("RMSNorm", "model_type llama"), "swiglu": v(True, "hidden_act"),
        "position_embedding_type": v("rope", "model_type llama"),
        "rotary_base": v(rope.theta, f"{rope_key}.rope_theta" if "rope_theta" in (fields.get(rope_key) or {})
                         else "rope_theta"),
        "rotary_percent": v(1.0, "model_type llama"), "rotary_interleaved": v(False, "model_type llama"),
        "use_rope_scaling": v(rope.rope_type == "llama3", f"{rope_key}.rope_type"),
        "add_bias_linear": v(config.attention_bias, "attention_bias"),
        "add_qkv_bias": v(False, "attention_bias"),
        "qk_layernorm": v(False, "model_type llama"), "qk_layernorm_over_projection": v(False, "model_type llama"),
        "attention_output_gate": v(False, "model_type llama")}
    if rope.rope_type == "llama3":
        settings["rope_scaling_factor"] = v(rope.factor, f"{rope_key}.factor")
    return settings
