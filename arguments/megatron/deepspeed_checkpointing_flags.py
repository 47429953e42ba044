"""Megatron-DeepSpeed's own activation-checkpointing flags (--partition-activations, --contigious-checkpointing,
--checkpoint-in-cpu, ...) count only under --deepspeed-activation-checkpointing: only then does it hand them to
deepspeed.checkpointing.configure. So a --deepspeed Megatron launch without the switch sets nothing with them."""

from __future__ import annotations

from typing import Any, Callable, Optional

from arguments.config_sources import FLAG, Source

# setting -> Megatron-DeepSpeed's spelling; our own spellings are not theirs
DEEPSPEED_MEGATRON_SPELLINGS = {
    "partition_activations": "--partition-activations",
    "cpu_checkpointing": "--checkpoint-in-cpu",
    "contiguous_checkpointing": "--contigious-checkpointing",
    "synchronize_checkpoint_boundary": "--synchronize-each-layer",
}
SWITCH = "--deepspeed-activation-checkpointing"
_NOT_READ = f"not read without {SWITCH}, as in Megatron-DeepSpeed: off"


def drop_unswitched_checkpointing_flags(settings: dict[str, Any], sources: dict[str, Source],
                                        typed: Callable[[str], Optional[str]], megatron_launch: bool,
                                        deepspeed: bool, deepspeed_activation_checkpointing: bool) -> Optional[str]:
    """Turn off each of those flags a --deepspeed Megatron launch gives without the switch; the one warning line naming
    them, or None."""
    if not megatron_launch or not deepspeed or deepspeed_activation_checkpointing:
        return None
    dropped = []
    for setting, spelling in DEEPSPEED_MEGATRON_SPELLINGS.items():
        if sources[setting].kind != FLAG or typed(setting) != spelling or not settings[setting]:
            continue
        settings[setting] = False
        sources[setting] = Source(FLAG, spelling, note=_NOT_READ)
        dropped.append(spelling)
    if not dropped:
        return None
    them = "them" if len(dropped) > 1 else "it"
    return (f"warning: {', '.join(dropped)} set nothing: Megatron-DeepSpeed (and DeepSpeedExamples' v1.1.5 forks) "
            f"hand {them} to deepspeed.checkpointing.configure only under --deepspeed {SWITCH}, which this launch "
            f"does not pass, and checkpoint with Megatron's own function otherwise (add {SWITCH} to use {them})")
