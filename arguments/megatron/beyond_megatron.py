"""The model settings Megatron-LM has no flag for (Gemma's soft-capping, OLMoE's clip_qkv, ...): Megatron-LM would
resume a torch_dist save of such a model without them, so the run saves this project's format. A setting is
Megatron-LM's when one of its option strings is in Megatron-LM's harvested argument files."""

from __future__ import annotations

from base.options import aliases, consts, flag_of, option_fields, option_strings, setting_value
from gpt.attention_settings import AttentionSettings
from gpt.model_config import ModelConfig

# how the model is computed or written, not what
NOT_THE_MATH = ("hf_model_type", "fp8_guard", "fp8_guard_saturation_threshold", "fp8_fused_casts",
                *AttentionSettings.NOT_THE_MATH)
# Megatron-LM spells --activation's values as switches; xIELU is swiss-ai's fork's alone
SPELLED_AS_SWITCHES = {"activation": ("xielu",)}


def settings_beyond_megatron(model: ModelConfig, harvested_flags: dict, sources: tuple[str, ...]) -> list[str]:
    """The flags of `model`'s non-default settings that no Megatron-LM argument file of `sources` defines."""
    defaults, found = ModelConfig(), []
    for field, _ in option_fields(ModelConfig):
        value = setting_value(model, field.name)
        if field.name in NOT_THE_MATH or value == setting_value(defaults, field.name):
            continue
        if field.name in SPELLED_AS_SWITCHES:
            found += [f"{flag_of(field)} {value}"] if value in SPELLED_AS_SWITCHES[field.name] else []
            continue
        options = (*option_strings(field), *aliases(field), *(option for const in consts(field)
                                                              for option in const.options))
        if not any(set(harvested_flags.get(option, {}).get("sources", ())) & set(sources) for option in options):
            found.append(flag_of(field))
    return found
