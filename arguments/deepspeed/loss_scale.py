"""Under a DeepSpeed JSON whose fp16 block is enabled, that block alone governs loss scaling: DeepSpeed's engine builds
the scaler from it, each key left out taking DeepSpeed's default, and Megatron-DeepSpeed never reads the scaler flags. A
flag that asked for something else is named in one warning line."""

from __future__ import annotations

from typing import Any, Optional

from arguments.config_sources import FLAG, JSON, Source, show_value
from arguments.deepspeed.keys import precedence_of

# setting -> (the fp16 key that sets it, DeepSpeed's value when the key is left out)
DEEPSPEED_SCALER_DEFAULTS: dict[str, tuple[str, Any]] = {
    "loss_scale": ("fp16.loss_scale", None),  # 0: dynamic
    "initial_loss_scale": ("fp16.initial_scale_power", 2.0 ** 16),
    "loss_scale_window": ("fp16.loss_scale_window", 1000),
    "hysteresis": ("fp16.hysteresis", 2),
    "min_loss_scale": ("fp16.min_loss_scale", 1.0),
}
SCALER_FLAGS = {"loss_scale": "--loss-scale", "initial_loss_scale": "--initial-loss-scale",
                "loss_scale_window": "--loss-scale-window", "hysteresis": "--hysteresis",
                "min_loss_scale": "--min-loss-scale"}


def json_enables_fp16(translation) -> bool:
    return translation is not None and any(setting.key == "fp16.enabled" and "--fp16" in setting.flags
                                           for setting in translation.settings)


def apply_json_loss_scaling(translation, settings: dict[str, Any], sources: dict[str, Source],
                            typed: dict[str, str]) -> Optional[str]:
    """Each scaler setting the enabled fp16 block leaves out takes DeepSpeed's default, whatever a flag, preset or
    Megatron's default said; returns the warning for the flags that lose, or None."""
    if not json_enables_fp16(translation):
        return None
    why = precedence_of("fp16.loss_scale").why
    ignored = []
    for dest, (key, deepspeed_default) in DEEPSPEED_SCALER_DEFAULTS.items():
        if sources[dest].kind == JSON:
            continue  # the JSON set it; a flag beside it already lost
        if sources[dest].kind == FLAG and settings[dest] != deepspeed_default:
            ignored.append(f"{typed.get(dest, SCALER_FLAGS[dest])} {show_value(settings[dest])}")
        shown = "0 (dynamic scaling)" if dest == "loss_scale" else show_value(deepspeed_default)
        settings[dest] = deepspeed_default
        sources[dest] = Source(JSON, f"{translation.source}: {key}", note=f"left out: DeepSpeed's default {shown}")
    if not ignored:
        return None
    dynamic = "dynamic" if settings["loss_scale"] is None else f"static {show_value(settings['loss_scale'])}"
    return (f"warning: {', '.join(ignored)} not used: the fp16 block of {translation.source} governs loss "
            f"scaling ({dynamic}, DeepSpeed's defaults for the keys it leaves out), as in Megatron-DeepSpeed, {why}")
