"""Where each setting's value came from: its default, the YAML preset, a Hugging Face folder, the DeepSpeed
JSON, or a flag.

Settings are parsed in layers, preset < folder (--init-from-hf) < JSON < command line (arguments/parser.py). To know which layer
set a setting, each layer's flags are parsed alone into a namespace pre-filled with a marker:
argparse fills in defaults only for names a namespace lacks, so whatever no longer holds the marker
was set by that layer. The JSON layer is parsed key by key, so a setting knows its key.

The sources serve three ends: `--print-config` shows them, and where the JSON and a flag set one
setting differently, which side won and why; the precedence between the JSON and the command line
(arguments/parser.py) reads them; and an error about a value the user did not type (a preset's
`min_lr`) names where that value came from.
"""

from __future__ import annotations

import argparse
import re
from dataclasses import dataclass
from typing import Any, Iterable

from arguments.option_table import option_table
from base.errors import ConfigError

DEFAULT, PRESET, JSON, FLAG = "default", "preset", "json", "flag"
# A Hugging Face folder's config.json or tokenizer (--init-from-hf DIR, arguments/hf_folder.py): a layer
# between the preset and the DeepSpeed JSON and command line; its origin is "DIR/config.json: key".
FOLDER = "folder"
# The layer under a Megatron launch that names no preset (arguments/megatron/defaults.py): a PRESET-kind
# source, since it sits where a preset would, named as what it is.
MEGATRON_DEFAULTS = "Megatron-LM's default (arguments/megatron/flags_harvested.json)"


@dataclass(frozen=True)
class Source:
    kind: str           # DEFAULT, PRESET, FOLDER, JSON or FLAG
    origin: str = ""    # the preset's path; "DIR/config.json: key"; "file.json: key"; the option as typed
    note: str = ""      # for a setting a Megatron flag derived (arguments/megatron/flags.py): how
    agrees_with: str = ""  # a JSON key that gave the same value as the flag that won
    overrides: str = ""    # the other side it won over, and why (arguments/deepspeed/precedence.py)

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
    """{dest: value} for every dest that `argv` alone sets."""
    namespace = argparse.Namespace(**{dest: UNSET for dest in option_table(parser).dests()})
    parser.parse_args(argv, namespace)
    return {dest: value for dest, value in vars(namespace).items() if value is not UNSET}


def options_typed(parser: argparse.ArgumentParser, argv: Iterable[str]) -> dict[str, str]:
    """{dest: the option string the user typed for it (the last one, which wins)}."""
    return {dest: options[-1] for dest, options in every_option_typed(parser, argv).items()}


def every_option_typed(parser: argparse.ArgumentParser, argv: Iterable[str]) -> dict[str, list[str]]:
    """{dest: the option strings the user typed for it, in order}: several where two spellings set one setting
    (`--use-flash-attn ... --attention-backend auto`), of which the last wins."""
    typed: dict[str, list[str]] = {}
    for token in argv:
        option = token.split("=", 1)[0]
        action = option_table(parser).action_for(option) if token.startswith("--") else None
        if action is not None:
            typed.setdefault(action.dest, []).append(option)
    return typed


def in_the_typed_spelling(error: ConfigError, parser: argparse.ArgumentParser, typed: dict[str, str]) -> ConfigError:
    """`error` naming each flag it is about as the user typed it: a check names a setting by its first option string
    (--checkpoint-num-layers), the user may have typed an alias of it (--recompute-num-layers)."""
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
    """`error`, with a clause for each flag it is about (`error.flags`) whose value was not typed on the
    command line but came from a preset, a Hugging Face folder, the DeepSpeed JSON or another program's flag that means it
    (`--use-megatron-fsdp` is ZeRO stage 3): an error about a value the user never wrote must say where it
    came from. `value_of(dest)` gives the value in force."""
    clauses = []
    for flag in error.flags:
        action = option_table(parser).action_for(flag)
        source = sources.get(action.dest) if action is not None else None
        derived = source is not None and source.kind == FLAG and bool(source.note)  # a Megatron flag's meaning
        if source is None or not (source.kind in (PRESET, JSON, FOLDER) or derived):
            continue
        value = f"{flag} {show_value(value_of(action.dest))}"
        if derived:
            clauses.append(f"{value} comes from {source.origin}: {source.note}")
            continue
        if source.kind == FOLDER:  # the folder is the model: a flag cannot change it
            clauses.append(f"{value} comes from {source.origin}" + (f" ({source.note})" if source.note else ""))
            continue
        where = f"the preset {source.origin}" if source.kind == PRESET else source.origin
        clauses.append(f"{value} comes from {where}; set it on the command line to change it")
    if not clauses:
        return error
    return ConfigError(f"{error} ({'; '.join(clauses)})", flags=error.flags)


def show_value(value: Any) -> str:
    """A setting's value as it is typed on a command line: lists space-separated."""
    if isinstance(value, (list, tuple)):
        return " ".join(map(str, value)) if value else "[]"
    return str(value)
