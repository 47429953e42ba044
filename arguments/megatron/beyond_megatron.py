"""The model settings Megatron-LM has no flag for (Gemma's soft-capping, OLMoE's clip_qkv, Phi-3's LongRoPE, the
z-loss of llm-jp's fork, ...): Megatron-LM's loop would resume a torch_dist save of a model using one without it,
so such a run saves this project's format, said at start-up (arguments/config.py megatron_format_unwritten).

A setting is Megatron-LM's when one of its option strings (flag, aliases, constant flags) is in one of Megatron-LM's
argument files (arguments/megatron/flags_harvested.json, DEFAULT_SOURCES): read from the harvest, so a new knob
needs no entry here."""

from __future__ import annotations

from base.options import aliases, consts, flag_of, option_fields, option_strings, setting_value
from gpt.attention_settings import AttentionSettings
from gpt.model_config import ModelConfig

# how the model is computed or written, not what: a Megatron-LM resume without them computes the same model
NOT_THE_MATH = ("hf_model_type", "fp8_guard", "fp8_guard_saturation_threshold", "fp8_fused_casts",
                *AttentionSettings.NOT_THE_MATH)
# --activation: Megatron-LM spells its values as switches (--squared-relu; GPT-2's tanh GeLU is its default with
# --bias-gelu-fusion: checkpoint/torch_dist/args.py); xIELU is swiss-ai's fork's alone
SPELLED_AS_SWITCHES = {"activation": ("xielu",)}


def settings_beyond_megatron(model: ModelConfig, harvested_flags: dict, sources: tuple[str, ...]) -> list[str]:
    """The flags of `model`'s settings that differ from their defaults and that no Megatron-LM argument file of
    `sources` defines (`harvested_flags`: the harvest's {option: entry})."""
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
