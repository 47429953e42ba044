"""How long this process has run, from the kernel's record of its start, so torch's import counts too."""

from __future__ import annotations

import os
import time

_IMPORTED_AT = time.monotonic()


def seconds_since_process_start() -> float:
    try:
        with open("/proc/self/stat") as file:
            # after the command's closing parenthesis, field 3 (state) onward: starttime is field 22
            start_ticks = int(file.read().rsplit(")", 1)[1].split()[19])
        with open("/proc/uptime") as file:
            uptime_s = float(file.read().split()[0])
        return max(uptime_s - start_ticks / os.sysconf("SC_CLK_TCK"), 0.0)
    except (OSError, ValueError, IndexError):
        return time.monotonic() - _IMPORTED_AT
