"""The longest wait a setting may ask for, a year: each sleep, socket timeout and timedelta has its own ceiling, so a
larger setting is refused up front, naming its flag."""

from __future__ import annotations

import math

LONGEST_WAIT_S = 365 * 24 * 3600
LONGEST_WAIT_TEXT = f"{LONGEST_WAIT_S} s (a year)"


def is_wait(seconds: float, zero_allowed: bool = True) -> bool:
    return isinstance(seconds, (int, float)) and math.isfinite(seconds) and \
        (0 <= seconds if zero_allowed else 0 < seconds) and seconds <= LONGEST_WAIT_S
