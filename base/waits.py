"""The longest wait a setting may ask for: a year.

Every timeout, interval and delay a run takes in seconds ends in a wait somewhere (time.sleep, an Event's wait, a
socket's timeout, c10d's timedelta in milliseconds), and each of those has its own ceiling: time.sleep refuses
beyond time_t ("timestamp out of range"), a socket's timeout beyond a C int of milliseconds, a timedelta beyond
999999999 days. A wait of a year is already no wait at all for a training run, so a setting is refused above it, in
one line naming the flag, before any work, instead of failing in whichever thread first waits on it.
"""

from __future__ import annotations

import math

LONGEST_WAIT_S = 365 * 24 * 3600
LONGEST_WAIT_TEXT = f"{LONGEST_WAIT_S} s (a year)"


def is_wait(seconds: float, zero_allowed: bool = True) -> bool:
    """A finite number of seconds from 0 (or above 0) up to a year."""
    return isinstance(seconds, (int, float)) and math.isfinite(seconds) and \
        (0 <= seconds if zero_allowed else 0 < seconds) and seconds <= LONGEST_WAIT_S
