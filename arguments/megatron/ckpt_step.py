"""Megatron-LM's --ckpt-step N: load iteration N of --load instead of the one its tracker file names, i.e. --load
DIR/iter_000000N here; 0 changes nothing. An N the folder does not hold is refused, listing those it does."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any, Callable


def resolve_ckpt_step(given: dict[str, Any], settings: dict[str, Any], change: Callable, resolved) -> None:
    """--ckpt-step N as --load's iteration directory; without --load, one refusal."""
    step = given.get("ckpt_step")
    if not step:
        return
    if not settings.get("load"):
        resolved.refused.append(f"--ckpt-step {step} names an iteration of --load's checkpoints: add --load DIR")
        return
    load = Path(settings["load"])
    held = sorted(int(path.name[len("iter_"):]) for path in load.glob("iter_*")
                  if path.is_dir() and re.fullmatch(r"iter_\d{7}", path.name)) if load.is_dir() else []
    if step not in held:  # never a fresh start in its place
        holds = f"it holds {', '.join(map(str, held))}" if held else \
            ("it holds none" if load.is_dir() else "it does not exist")
        resolved.refused.append(f"--ckpt-step {step}: {load} holds no iteration {step} ({holds}); Megatron-LM fails "
                                f"to load it too")
        return
    change("load", str(load / f"iter_{step:07d}"), "ckpt_step",
           f"--load {settings['load']} --ckpt-step {step}: that iteration's directory, as Megatron-LM loads it")
