"""Where each setting's value came from: default, preset, Hugging Face folder, DeepSpeed JSON or flag. Each layer's
flags are parsed alone into a namespace pre-filled with a marker; argparse fills defaults only for names a namespace
lacks, so whatever no longer holds the marker was set by that layer."""

from __future__ import annotations

import argparse
import re
from dataclasses import dataclass
from typing import Any, Iterable

from arguments.option_table import option_table
from base.errors import ConfigError

DEFAULT, PRESET, JSON, FLAG = "default", "preset", "json", "flag"
# --init-from-hf's layer; its origin is "DIR/config.json: key".
FOLDER = "folder"
# Megatron's defaults under a launch naming no preset: a PRESET-kind source, standing where a preset would.
MEGATRON_DEFAULTS = "Megatron-LM's default (arguments/megatron/flags_harvested.json)"


@dataclass(frozen=True)
class Source:
    kind: str
    origin: str = ""  # the preset's path, "file.json: key", or the option as typed
    note: str = ""  # how a Megatron flag derived it
    agrees_with: str = ""  # a JSON key that gave the flag's value
    overrides: str = ""  # the side it won over, and why

    def describe(self) -> str:
        if self.kind == DEFAULT:
            return "default"
        if self.kind == PRESET:
            return self.origin if self.origin == MEGATRON_DEFAULTS else f"preset {self.origin}"
        text = self.origin if self.kind in (JSON, FOLDER) else f"{self.origin} (command line)"
        if self.note:
            text += f": {self.note}"
        if self.agrees_with:
            text += f"; the same as {self.agrees_with}"
        if self.overrides:
            text += f"; {self.overrides}"
        return text


class _Unset:
    def __repr__(self) -> str:
        return "<unset>"


UNSET = _Unset()


def values_set_by(parser: argparse.ArgumentParser, argv: list[str]) -> dict[str, Any]:
    namespace = argparse.Namespace(**{dest: UNSET for dest in option_table(parser).dests()})
    parser.parse_args(argv, namespace)
    return {dest: value for dest, value in vars(namespace).items() if value is not UNSET}


def options_typed(parser: argparse.ArgumentParser, argv: Iterable[str]) -> dict[str, str]:
    """{dest: the option typed for it (the last, which wins)}."""
    return {dest: options[-1] for dest, options in every_option_typed(parser, argv).items()}


def every_option_typed(parser: argparse.ArgumentParser, argv: Iterable[str]) -> dict[str, list[str]]:
    """{dest: the options typed for it, in order}: several where two spellings set one setting."""
    typed: dict[str, list[str]] = {}
    for token in argv:
        option = token.split("=", 1)[0]
        action = option_table(parser).action_for(option) if token.startswith("--") else None
        if action is not None:
            typed.setdefault(action.dest, []).append(option)
    return typed


def in_the_typed_spelling(error: ConfigError, parser: argparse.ArgumentParser, typed: dict[str, str]) -> ConfigError:
    """`error` naming each flag as the user typed it (an alias such as --recompute-num-layers for
    --checkpoint-num-layers)."""
    message, flags = str(error), []
    for flag in error.flags:
        action = option_table(parser).action_for(flag)
        spelled = typed.get(action.dest) if action is not None else None
        if spelled is not None and spelled != flag and spelled in action.option_strings:
            message = re.sub(re.escape(flag) + r"(?![\w-])", spelled, message)
            flag = spelled
        flags.append(flag)
    return ConfigError(message, flags=tuple(flags))


def name_inherited_values(error: ConfigError, parser: argparse.ArgumentParser, sources: dict[str, Source],
                          value_of) -> ConfigError:
    """`error` with a clause for each of its flags whose value the user did not type (a preset, folder, JSON or another
    program's flag gave it), saying where it came from. `value_of(dest)` gives the value in force."""
    clauses = []
    for flag in error.flags:
        action = option_table(parser).action_for(flag)
        source = sources.get(action.dest) if action is not None else None
        derived = source is not None and source.kind == FLAG and bool(source.note)
        if source is None or not (source.kind in (PRESET, JSON, FOLDER) or derived):
            continue
        value = f"{flag} {show_value(value_of(action.dest))}"
        if derived:
            clauses.append(f"{value} comes from {source.origin}: {source.note}")
            continue
        if source.kind == FOLDER:
            clauses.append(f"{value} comes from {source.origin}" + (f" ({source.note})" if source.note else ""))
            continue
        where = f"the preset {source.origin}" if source.kind == PRESET else source.origin
        clauses.append(f"{value} comes from {where}; set it on the command line to change it")
    if not clauses:
        return error
    return ConfigError(f"{error} ({'; '.join(clauses)})", flags=error.flags)


def show_value(value: Any) -> str:
    """A value as typed on a command line: lists space-separated."""
    if isinstance(value, (list, tuple)):
        return " ".join(map(str, value)) if value else "[]"
    return str(value)
