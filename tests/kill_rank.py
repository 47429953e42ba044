"""pretrain_gpt.py with one rank SIGKILLed after a given iteration: a node that dies mid-run.

    KILL_AT_ITERATION=13 KILL_RANK=1 python tests/kill_rank.py <pretrain_gpt flags>

The kill happens where the loop checks its exit conditions, after the iteration (and any save it
made) is complete, and it is a real SIGKILL: no handler, no cleanup, no flush. KILL_SIGNAL=SIGSTOP
stops the rank instead (a hung node: alive to the kernel, silent to everyone); whoever started it
must SIGCONT and SIGKILL it. KILL_SIGNAL=bug raises a RuntimeError instead (a rank that fails alone).
KILL_SIGNAL=hold_gil makes the main thread hold the GIL for good (a pure-Python spin with a switch interval
of an hour: no other thread of the process runs Python again, so its heartbeat stops), as
nvidia-resiliency-ext's lock_gil fault does; whoever started it must SIGKILL it. KILL_SIGNAL=sleep sleeps
SLEEP_S (120) seconds with the GIL released: alive and beating, in no collective.
"""

import os
import signal
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import pretrain_gpt  # noqa: E402
from training import exit_conditions  # noqa: E402

KILL_AT = int(os.environ["KILL_AT_ITERATION"])
KILL_RANK = int(os.environ["KILL_RANK"])
KILL_SIGNAL = os.environ.get("KILL_SIGNAL", "SIGKILL")
_check = exit_conditions.ExitConditions.check


def check_then_die(self, iteration):
    if iteration == KILL_AT and int(os.environ["RANK"]) == KILL_RANK:
        if KILL_SIGNAL == "bug":
            raise RuntimeError("tests/kill_rank.py: an injected bug")
        if KILL_SIGNAL == "sleep":  # stuck outside any collective, its heartbeat beating: only a timeout tells
            time.sleep(float(os.environ.get("SLEEP_S", "120")))
        if KILL_SIGNAL == "hold_gil":
            sys.setswitchinterval(3600.0)
            while True:
                pass
        os.kill(os.getpid(), signal.Signals[KILL_SIGNAL])
    return _check(self, iteration)


exit_conditions.ExitConditions.check = check_then_die

if __name__ == "__main__":
    sys.exit(pretrain_gpt.main())
