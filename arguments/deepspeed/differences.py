"""One short line for each value of a DeepSpeed JSON's `optimizer` or `scheduler` block that the run does not use:
what runs and where it came from, what the JSON says, why, and how to get the JSON's value. The lines are said
last before the first iteration (training/prepare.py), where a learning rate the JSON asked for is looked for."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional

from arguments.config_sources import DEFAULT, FLAG, FOLDER, MEGATRON_DEFAULTS, PRESET, Source, show_value

NOT_READ_UNDER_DEEPSPEED = "not read under --deepspeed, as in Megatron-DeepSpeed"
LINE_LIMIT = 160  # characters: read at a glance


@dataclass(frozen=True)
class UnusedJsonValue:
    dest: str
    option: str
    value: Any                    # the JSON's value, typed as the setting is
    why: str                      # why the run does not use it, a few words
    winner: Optional[str] = None  # the command-line flag that wins over it, where one does


def difference_lines(unused: list[UnusedJsonValue], settings: dict[str, Any], sources: dict[str, Source],
                     json_file: str) -> tuple[str, ...]:
    """A line for each unused value that differs from the one that runs (one per setting, the first said)."""
    lines, said = [], set()
    for item in unused:
        if item.dest in said or item.dest not in settings or settings[item.dest] == item.value:
            continue
        said.add(item.dest)
        where = _where(item.option, sources.get(item.dest))
        fix = (f"drop {item.winner} to use it" if item.winner
               else f"pass {item.option} {show_value(item.value)} to use it")
        line = (f"> {item.dest} {show_value(settings[item.dest])} ({where}) where {Path(json_file).name} says "
                f"{show_value(item.value)}: {item.why}; {fix}")
        lines.append(line if len(line) < LINE_LIMIT else line.removesuffix(" to use it"))
    return tuple(lines)


def _where(option: str, source: Optional[Source]) -> str:
    """The running value's source in a few words: `--lr` (typed), `default`, `Megatron's default`, `preset tiny`."""
    if source is None or source.kind == DEFAULT:
        return "default"
    if source.kind == FLAG:
        return source.origin.split(" ")[0]
    if source.kind == PRESET:
        return "Megatron's default" if source.origin == MEGATRON_DEFAULTS \
            else f"preset {Path(source.origin.split(' ')[0]).stem}"
    if source.kind == FOLDER:
        return source.origin
    return source.origin.split(": ")[-1]  # another key of the JSON
