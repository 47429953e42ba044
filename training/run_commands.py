"""The flags each launch was given, one JSON line a launch beside its metrics file (FILE.commands.jsonl), so that
training/plot.py labels runs by the flags that tell them apart."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Optional

from arguments.config_sources import FLAG


def commands_file(metrics_file: str | Path) -> Path:
    """metrics.jsonl -> metrics.commands.jsonl, beside it."""
    path = Path(metrics_file)
    return path.with_name(f"{path.stem if path.suffix else path.name}.commands.jsonl")


def given_flags(config) -> list[str]:
    """The settings given on the command line, as typed with their values."""
    flags = []
    for settings in config.to_dict().values():
        for name, value in settings.items():
            source = config.sources.get(name)
            if source is None or source.kind != FLAG:
                continue
            shown = " ".join(map(str, value)) if isinstance(value, (list, tuple)) else str(value)
            flags.append(source.origin if value is True else f"{source.origin} {shown}")
    return flags


def record_command(metrics_file: str | Path, identity: dict[str, str], flags: list[str]) -> None:
    with open(commands_file(metrics_file), "a", encoding="utf-8") as f:
        f.write(json.dumps({**identity, "flags": flags}) + "\n")


def read_commands(metrics_file: str | Path) -> dict[Optional[str], list[str]]:
    """run_id -> the flags of its first launch."""
    path, found = commands_file(metrics_file), {}
    if not path.is_file():
        return found
    for line in path.read_text(encoding="utf-8", errors="replace").splitlines():
        try:
            record = json.loads(line)
        except json.JSONDecodeError:
            continue  # a launch killed while writing its line
        if isinstance(record, dict) and isinstance(record.get("flags"), list):
            found.setdefault(record.get("run_id"), [str(flag) for flag in record["flags"]])
    return found


def distinguishing_flags(commands: list[Optional[list[str]]]) -> list[Optional[str]]:
    """For each run, its flags not shared by every run, joined; None where unknown or none."""
    known = [set(flags) for flags in commands if flags is not None]
    shared = set.intersection(*known) if known else set()
    labels = []
    for flags in commands:
        own = [flag for flag in flags or [] if flag not in shared]
        labels.append(" ".join(own) if flags is not None and own and len(known) > 1 else None)
    return labels
