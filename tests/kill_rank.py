"""pretrain_gpt.py with one rank SIGKILLed after a given iteration: a node that dies mid-run.

    KILL_AT_ITERATION=13 KILL_RANK=1 python tests/kill_rank.py <pretrain_gpt flags>

The kill happens where the loop checks its exit conditions, after the iteration (and any save it
made) is complete, and it is a real SIGKILL: no handler, no cleanup, no flush.
"""

import os
import signal
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import pretrain_gpt  # noqa: E402
from gpt import exit_conditions  # noqa: E402

KILL_AT = int(os.environ["KILL_AT_ITERATION"])
KILL_RANK = int(os.environ["KILL_RANK"])
_check = exit_conditions.ExitConditions.check


def check_then_die(self, iteration):
    if iteration == KILL_AT and int(os.environ["RANK"]) == KILL_RANK:
        os.kill(os.getpid(), signal.SIGKILL)
    return _check(self, iteration)


exit_conditions.ExitConditions.check = check_then_die

if __name__ == "__main__":
    sys.exit(pretrain_gpt.main())
