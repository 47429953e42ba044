"""A DeepSpeed JSON key's verdict (honoured as flags, no effect, unsupported) and the builders of the
classifiers that give it; a bad value is an error at once (a typo, not a feature we lack)."""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from typing import Any, Callable, Optional

from arguments.deepspeed.precedence import Precedence
from base.errors import ConfigError

HONOURED, NO_EFFECT, UNSUPPORTED = "honoured", "no effect", "unsupported"


@dataclass(frozen=True)
class Verdict:
    key: str
    kind: str
    flags: tuple[str, ...] = ()  # HONOURED: the equivalent command-line flags (none: the value is what runs)
    why: str = ""               # HONOURED without flags: what runs; NO_EFFECT: why the math is the same;
                                # UNSUPPORTED: the reason or the alternative


Classifier = Callable[[str, Any], list[Verdict]]


def show(value: Any) -> str:
    text = json.dumps(value)
    return text + ' (the HF Trainer fills in "auto"; write the value here)' if value == "auto" else text


def number(key: str, value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise ConfigError(f"{key} must be a number, got {show(value)}")
    return value


def whole_number(key: str, value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or \
            (isinstance(value, float) and not value.is_integer()):
        raise ConfigError(f"{key} must be a whole number (5e8 is fine, 1.5 is not), got {show(value)}")
    return int(value)


def boolean(key: str, value: Any) -> bool:
    if not isinstance(value, bool):
        raise ConfigError(f"{key} must be true or false, got {show(value)}")
    return value


def block(key: str, value: Any) -> dict:
    if not isinstance(value, dict):
        raise ConfigError(f'"{key}" must be an object, got {show(value)}')
    return value


def to_flag(flag: str, kind: str = "number", wins: Optional[Precedence] = None) -> Classifier:
    """Honoured: the value becomes `flag` (kind: "number", "count" (a whole number), "bool" (the flag or
    its --no- form), "optional_count" (null: no flag)); `wins` is the key's precedence beside that flag
    (arguments/deepspeed/precedence.py)."""
    def classify(key: str, value: Any) -> list[Verdict]:
        if kind == "bool":
            flags = (flag,) if boolean(key, value) else ("--no-" + flag[2:],)
        elif kind == "optional_count":
            flags = () if value is None else (flag, str(whole_number(key, value)))
        elif kind == "count":
            flags = (flag, str(whole_number(key, value)))
        else:
            flags = (flag, repr(float(number(key, value))))
        return [Verdict(key, HONOURED, flags)]
    classify.precedence = wins
    return classify


def wins(precedence: dict[str, Precedence]) -> Callable[[Classifier], Classifier]:
    """Declares, on a block's classifier, the precedence of each key it turns into flags."""
    def declare(classify: Classifier) -> Classifier:
        classify.precedence = precedence
        return classify
    return declare


def no_effect(why: str) -> Classifier:
    return lambda key, value: [Verdict(key, NO_EFFECT, why=why)]


def unsupported(why: str) -> Classifier:
    return lambda key, value: [Verdict(key, UNSUPPORTED, why=why)]


def only_if(accepted: Callable[[Any], bool], why_accepted: str, why_not: str) -> Classifier:
    """No effect for the values we already behave as (`accepted`), unsupported for the others."""
    return lambda key, value: [Verdict(key, NO_EFFECT, why=why_accepted) if accepted(value)
                               else Verdict(key, UNSUPPORTED, why=why_not)]


def when_disabled(why_not: str) -> Classifier:
    """A feature block: accepted while it is switched off ("enabled": false, DeepSpeed's default for
    these blocks), unsupported when it is on."""
    return only_if(lambda value: isinstance(value, dict) and value.get("enabled", False) is False,
                   "the block is disabled", why_not)

