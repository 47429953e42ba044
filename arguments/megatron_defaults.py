"""Where a Megatron launch leaves a setting out: the value it gets here, said beside Megatron's own.

A launch that sets the model from flags (`--num-layers`, `--hidden-size`, `--num-attention-heads` on
the command line or in the JSON) and names no preset is a Megatron-style script. Whatever it leaves
out comes from the default preset (`tiny`) or from our defaults, and several of those differ from
Megatron-LM's (its --min-lr is 0, no warmup unless asked, --log-interval 100, --adam-beta2 0.999,
--weight-decay 0.01, a linear decay ...). We keep ours, and never silently: `megatron_default_note`
is one line at the start naming each such value, where it came from, and Megatron's default, which
comes from Megatron's own argument files (arguments/megatron_flags_harvested.json, by source). The choice
to keep ours rather than switch to Megatron's: the same command line then trains the same model
whether or not it happens to name the model, and the line says exactly what to pass to get Megatron's.
"""

from __future__ import annotations

import argparse
import math
from typing import Any, Optional

from arguments.config_sources import DEFAULT, FLAG, JSON, PRESET, Source

# Megatron-LM's argument files, newest first (its current file leaves some defaults to dataclasses).
DEFAULT_SOURCES = ("megatron-lm", "megatron-lm-core_v0.15.0", "megatron-lm-23.04", "megatron-lm-v2.6")
MODEL_SETTINGS = ("num_layers", "hidden_size", "num_attention_heads")


def megatron_default(option: str, harvested_flags: dict) -> tuple[bool, Any]:
    """(found, Megatron's literal default for `option`) from the newest source that states one."""
    defaults = harvested_flags.get(option, {}).get("defaults", {})
    for source in DEFAULT_SOURCES:
        if source in defaults:
            return True, defaults[source]
    return False, None


def _differs(ours: Any, theirs: Any) -> bool:
    if ours in (None, "") and theirs in (None, ""):
        return False
    if isinstance(ours, str) and isinstance(theirs, str):
        return ours.replace(" ", "") != theirs.replace(" ", "")  # "969,30,1" is "969, 30, 1"
    if isinstance(ours, bool) or isinstance(theirs, bool) or not isinstance(ours, (int, float)) \
            or not isinstance(theirs, (int, float)):
        return ours != theirs
    return not math.isclose(float(ours), float(theirs), rel_tol=1e-12, abs_tol=0.0)


def megatron_default_note(parser: argparse.ArgumentParser, settings: dict[str, Any], sources: dict[str, Source],
                          preset_given: bool, harvested_flags: dict) -> Optional[str]:
    """The start line, or None when the launch is not Megatron-style or nothing differs."""
    if preset_given or not any(sources[name].kind in (FLAG, JSON) for name in MODEL_SETTINGS):
        return None
    differences = []
    for action in parser._actions:
        if action.dest not in settings or not action.option_strings or isinstance(action, argparse._StoreConstAction) \
                or sources[action.dest].kind not in (DEFAULT, PRESET):
            continue
        option = action.option_strings[0]
        found, theirs = megatron_default(option, harvested_flags)
        literal = found and theirs is not None and not isinstance(theirs, dict)  # {"expr": ...}: not a literal
        if literal and _differs(settings[action.dest], theirs):
            where = "ours" if sources[action.dest].kind == DEFAULT else sources[action.dest].describe()
            differences.append(f"{option} {settings[action.dest]} ({where}; Megatron-LM: {theirs})")
    # Megatron has no --activation: its GeLU is the exact (erf) one unless --openai-gelu asks for tanh's.
    if sources["activation"].kind in (DEFAULT, PRESET) and settings["activation"] != "gelu":
        where = "ours" if sources["activation"].kind == DEFAULT else sources["activation"].describe()
        differences.append(f"--activation {settings['activation']} ({where}; Megatron-LM: the exact GeLU, "
                           f"--activation gelu, unless --openai-gelu)")
    if not differences:
        return None
    return ("> this launch sets the model from flags and leaves these out; they come from here, not from "
            "Megatron-LM's defaults (pass them to choose): " + ", ".join(differences))
