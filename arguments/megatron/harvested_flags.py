"""The harvested Megatron-LM / Megatron-DeepSpeed / DeepSpeed flags that are not ours, as argparse entries.

arguments/megatron/flags_harvested.json holds every option string those programs define, with its argparse
shape in each source (scripts/tools/harvest_megatron_flags.py). Each one that is not our own flag or an alias
of one is classified in arguments/megatron/flag_classes.py; `add_harvested` gives each of those an argparse
entry shaped as Megatron's parser shapes it (a switch, one value, a list; int, float or text; its
choices), so `--data-impl mmap` takes its value exactly as Megatron's parser would and nothing is
left for "unrecognized arguments". `resolve_harvested` then says what the given ones do: accepted with
no effect (with the reason), or refused in one line with what to use instead.

Each entry's dest is its option string (`--data-impl`) and its default is argparse.SUPPRESS, so the
parsed namespace holds only the flags that were given.
"""

from __future__ import annotations

import argparse
import json
import math
from functools import lru_cache
from pathlib import Path
from typing import Any, Mapping, Optional

from arguments.megatron.flag_classes import AT_VALUE, AT_VALUE_CLASS, CLASS_OF, NO_EFFECT_CLASS
from arguments.option_table import option_table

DATA_FILE = Path(__file__).with_name("flags_harvested.json")

ZERO_ARGUMENT_ACTIONS = {"store_true", "store_false", "store_const", "BooleanOptionalAction", "count",
                         "append_const"}


@lru_cache(maxsize=1)
def harvested() -> dict:
    """The data file: {"sources": [...], "unavailable": [...], "flags": {option: {"sources", "shapes"}}}."""
    return json.loads(DATA_FILE.read_text(encoding="utf-8"))


def harvested_options() -> list[str]:
    return list(harvested()["flags"])


def _count_range(shape: dict) -> tuple[float, float]:
    """How many values a shape takes, as (least, most)."""
    if shape["action"] in ZERO_ARGUMENT_ACTIONS:
        return (0, 0)
    nargs = shape.get("nargs")
    return {None: (1, 1), "?": (0, 1), "*": (0, math.inf), "+": (1, math.inf)}.get(
        nargs, (nargs, nargs) if isinstance(nargs, int) else (0, math.inf))


def _nargs(least: float, most: float) -> Any:
    if (least, most) == (1, 1):
        return None
    if least == most:
        return int(least)
    if most == 1:
        return "?"
    return "*" if least == 0 else "+"


def _value_type(shapes: list[dict]):
    types = {shape.get("type") for shape in shapes}
    if types <= {"int"}:
        return int
    if types <= {"int", "float"}:
        return float
    return str


def argparse_shape(option: str) -> dict[str, Any]:
    """The add_argument keywords that accept whatever any source's parser accepts for `option`."""
    shapes = harvested()["flags"][option]["shapes"]
    ranges = [_count_range(shape) for shape in shapes]
    least, most = min(r[0] for r in ranges), max(r[1] for r in ranges)
    if most == 0:
        return {"action": "store_true"}
    valued = [shape for shape in shapes if shape["action"] not in ZERO_ARGUMENT_ACTIONS]
    kind = _value_type(valued)
    keywords: dict[str, Any] = {"type": kind, "metavar": "VALUE"}
    nargs = _nargs(least, most)
    if nargs is not None:
        keywords["nargs"] = nargs
    if nargs == "?":
        keywords["const"] = True  # given bare, as a switch
    if all(isinstance(shape.get("choices"), list) for shape in valued):
        choices = []
        for shape in valued:
            for choice in shape["choices"]:
                if choice is not None and kind(choice) not in choices:
                    choices.append(kind(choice))
        keywords["choices"] = choices
        keywords["metavar"] = "{" + ",".join(map(str, choices)) + "}"
    return keywords


def classified_options() -> list[str]:
    """The harvested options that arguments/megatron/flag_classes.py classifies (not ours, nor aliases)."""
    return [option for option in harvested_options() if option in CLASS_OF]


def add_harvested(parser: argparse.ArgumentParser) -> tuple[str, ...]:
    """An argparse entry for every classified harvested flag that the parser lacks; their dests."""
    group = parser.add_argument_group(
        "Megatron-LM, Megatron-DeepSpeed and DeepSpeed flags that are not settings here",
        "Every other flag those programs define is accepted with no effect on the math (said once at the "
        "start, with the reason) or refused in one line naming what to use (arguments/megatron/flag_classes.py; "
        "--print-config shows what each given one does).")
    dests = []
    for option in classified_options():
        if option in option_table(parser):
            continue
        option_table(parser).add(group, option, dest=option, default=argparse.SUPPRESS, help=argparse.SUPPRESS,
                                 **argparse_shape(option))
        dests.append(option)
    return tuple(dests)


def show_given(option: str, value: Any) -> str:
    """`--data-impl mmap`, `--num-experts 1 1`, `--log-timers-to-tensorboard`."""
    if value is True:
        return option
    if isinstance(value, list):
        return " ".join([option, *map(str, value)])
    return f"{option} {value}"


def resolve_harvested(given: Mapping[str, Any], settings: Optional[Mapping[str, Any]]
                      ) -> tuple[list[tuple[str, str]], list[str]]:
    """(accepted: [(the flag as given, why it has no effect)], refused: [one clause each]). `settings`:
    the resolved settings, or None before they are known (a value that must match one is then accepted)."""
    accepted, refused = [], []
    for option, value in given.items():
        kind, reason = CLASS_OF[option]
        shown = show_given(option, value)
        if kind == AT_VALUE_CLASS:
            at_value = AT_VALUE[option]
            if at_value.accepts(value, settings):
                accepted.append((shown, at_value.no_effect))
            else:
                refused.append(f"{shown}: {at_value.refused}")
        elif kind == NO_EFFECT_CLASS:
            accepted.append((shown, reason))
        else:
            refused.append(f"{shown}: {reason}")
    return accepted, refused
