"""Under a DeepSpeed JSON, the JSON's `gradient_clipping` alone is the gradient-norm clip, as in the real pair, where
Megatron-DeepSpeed hands DeepSpeed its bare optimizer. Where the key is left out DeepSpeed's default of the launch's
generation applies (1.0 since v0.19.3, 0 before), and a --clip-grad that loses is named in one warning line."""

from __future__ import annotations

from typing import Any, Optional

from arguments.config_sources import FLAG, JSON, Source, show_value
from arguments.deepspeed.client_objects import JSON_SCHEDULER_GENERATIONS
from arguments.deepspeed.keys import precedence_of

# DeepSpeed's GRADIENT_CLIPPING_DEFAULT: 1.0 since v0.19.3, 0.0 (no clipping) before.
DEEPSPEED_GRADIENT_CLIPPING_DEFAULT = 1.0
DEEPSPEED_GRADIENT_CLIPPING_SINCE = "v0.19.3"
OLD_DEEPSPEED_GRADIENT_CLIPPING_DEFAULT = 0.0
# DeepSpeedExamples' forks ran with a DeepSpeed older than v0.19.3.
OLD_DEEPSPEED_GENERATIONS = JSON_SCHEDULER_GENERATIONS


def deepspeed_gradient_clipping_default(generation: Optional[str]) -> tuple[float, str]:
    """(DeepSpeed's gradient_clipping default for a launch of `generation`, how the lines name it)."""
    if generation in OLD_DEEPSPEED_GENERATIONS:
        return OLD_DEEPSPEED_GRADIENT_CLIPPING_DEFAULT, (
            f"the default 0 (no clipping) of the DeepSpeed {generation} ran with (before "
            f"{DEEPSPEED_GRADIENT_CLIPPING_SINCE}; {show_value(DEEPSPEED_GRADIENT_CLIPPING_DEFAULT)} since)")
    return DEEPSPEED_GRADIENT_CLIPPING_DEFAULT, (
        f"DeepSpeed's default {show_value(DEEPSPEED_GRADIENT_CLIPPING_DEFAULT)} (since "
        f"{DEEPSPEED_GRADIENT_CLIPPING_SINCE}; 0 (no clipping) before)")


def apply_json_clipping(translation, settings: dict[str, Any], sources: dict[str, Source],
                        typed: dict[str, str], generation: Optional[str] = None) -> tuple[Optional[str], Optional[str]]:
    """Under a JSON, clip_grad is its gradient_clipping or DeepSpeed's default for `generation`, whatever a flag, preset
    or Megatron's default said. Returns (the warning for a flag that loses, the start-up line where an older DeepSpeed's
    default runs), each None when there is none."""
    if translation is None:
        return None, None
    source = sources["clip_grad"]
    if (source.kind == JSON and source.origin.endswith(": gradient_clipping")
            or source.agrees_with.startswith("gradient_clipping ")):  # the JSON set it (a flag may agree)
        return None, None
    value, default = deepspeed_gradient_clipping_default(generation)
    note = None
    if value != DEEPSPEED_GRADIENT_CLIPPING_DEFAULT:
        note = (f"> {translation.source} sets no gradient_clipping: gradients are not clipped, {default}, as in "
                f"that fork's real run (set gradient_clipping in the JSON to clip)")
    if source.kind == FLAG and settings["clip_grad"] == value:
        sources["clip_grad"] = Source(FLAG, source.origin, note=source.note,
                                      agrees_with=f"{default} for gradient_clipping, left out of {translation.source}")
        return None, note
    lost = None
    if source.kind == FLAG:
        lost = f"{typed.get('clip_grad', '--clip-grad')} {show_value(settings['clip_grad'])}"
    settings["clip_grad"] = value
    sources["clip_grad"] = Source(JSON, f"{translation.source}: gradient_clipping", note=f"left out: {default}",
                                  overrides=f"{lost} on the command line not used" if lost else "")
    if lost is None:
        return None, note
    runs = f"clips at {default}" if value else f"does not clip, {default}"
    return (f"warning: {lost} not used: {translation.source} sets no gradient_clipping, so DeepSpeed {runs} "
            f"(set gradient_clipping in the JSON to change it), as in Megatron-DeepSpeed, "
            f"{precedence_of('gradient_clipping').why}"), None
