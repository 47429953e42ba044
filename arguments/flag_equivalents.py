"""An unknown flag answered with the closest known name, only for a close spelling (`--num-layer`, `--hidden_size`) or a
name cut short at a hyphen (`--lr-decay`). Every unknown flag is listed in one error line, so a ported script needs one
edit round."""

from __future__ import annotations

import argparse
import difflib

from arguments.option_table import option_table
from base.errors import ConfigError

# Above it two names are one misspelled; flags sharing words (--data-impl and --data-path, 0.73) stay below.
CUTOFF = 0.8


def same_name(flag: str, known: list[str]) -> str | None:
    """The known flag `flag` spells with `_` for `-` or the other way round, or None."""
    normalized = {option.replace("_", "-"): option for option in known}
    return normalized.get(flag.replace("_", "-"))


def nearest_flag(flag: str, known: list[str]) -> str | None:
    spelled = same_name(flag, known)
    if spelled:
        return spelled
    nearest = difflib.get_close_matches(flag, known, n=1, cutoff=CUTOFF)
    return nearest[0] if nearest else None


def takes(action: argparse.Action, value: str | None) -> bool:
    """Whether `action`'s flag could be given `value` (None: nothing typed after it)."""
    if value is None:
        return True
    if action.nargs == 0 or (action.choices is not None and value not in action.choices):
        return False
    if action.type is None or action.type is str:
        return True
    try:  # argparse's type functions convert a string and nothing else
        action.type(value)
    except (ValueError, TypeError, argparse.ArgumentTypeError, ConfigError):
        return False
    return True


def flags_begun_by(flag: str, value: str | None, parser: argparse.ArgumentParser) -> list[str]:
    """The flags whose name is `flag` and more after a hyphen, one spelling each, that could take `value`."""
    table = option_table(parser)
    stem = flag.replace("_", "-") + "-"
    found: dict[int, str] = {}
    for option in table.options():
        action = table.action_for(option)
        if option.replace("_", "-").startswith(stem) and id(action) not in found and takes(action, value):
            found[id(action)] = option
    return list(found.values())


def typed_value(tokens: list[str], at: int) -> str | None:
    """What was typed as the value of the flag at tokens[at]: after its `=`, or the next word unless a flag."""
    if "=" in tokens[at]:
        return tokens[at].split("=", 1)[1]
    following = tokens[at + 1] if at + 1 < len(tokens) else None
    return None if following is None or following.startswith("-") else following


def unknown_flags_message(tokens: list[str], parser: argparse.ArgumentParser) -> str:
    """'unrecognized arguments: --x 1 --y' followed by a hint for each unknown flag."""
    known = [option for option in option_table(parser).options() if option.startswith("--")]
    hints = []
    for at, token in enumerate(tokens):
        flag = token.split("=", 1)[0]
        if not flag.startswith("-"):
            continue
        # a name cut short first: `--tensor-model` is --tensor-model-parallel-size's, though spelled near --test-mode
        spelled = same_name(flag, known)
        begun = flags_begun_by(flag, typed_value(tokens, at), parser) if not spelled else []
        nearest = spelled or (nearest_flag(flag, known) if not begun else None)
        if begun:
            listed = begun[0] if len(begun) == 1 else f"one of {', '.join(begun[:-1])} or {begun[-1]}"
            hints.append(f"{flag}: did you mean {listed}?")
        elif nearest:
            hints.append(f"{flag}: did you mean {nearest}?")
        else:
            hints.append(f"{flag}: no flag of that name or near it (python pretrain_gpt.py --help lists them)")
    return f"unrecognized arguments: {' '.join(tokens)}" + (f" ({'; '.join(hints)})" if hints else "")
