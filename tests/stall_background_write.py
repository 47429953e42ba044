"""pretrain_gpt.py whose background checkpoint writer (--async-save) stalls in one save: a job killed while a
checkpoint is being written behind training.

    STALL_SAVE_ITERATION=6 STALL_MARKER=/tmp/stalled python tests/stall_background_write.py <pretrain_gpt flags>

In the save of iteration STALL_SAVE_ITERATION each rank's writer thread writes the rank's first file, creates
STALL_MARKER.rank<RANK> and then waits forever; training goes on meanwhile, until the next save waits for this
one. Whoever started the ranks kills them (SIGKILL: no handler, no cleanup, no flush). Every other save is written
as usual.
"""

import os
import sys
import threading
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import pretrain_gpt  # noqa: E402
from checkpoint import writer  # noqa: E402
from checkpoint.format import STAGING_SUFFIX, iteration_dir_name  # noqa: E402

STALLED_SAVE = iteration_dir_name(int(os.environ["STALL_SAVE_ITERATION"])) + STAGING_SUFFIX
MARKER = f"{os.environ['STALL_MARKER']}.rank{os.environ.get('RANK', '0')}"
write = writer.save_tensors


def write_then_stall(path, tensors, metadata=None):
    size = write(path, tensors, metadata)
    if Path(path).parent.name == STALLED_SAVE:
        Path(MARKER).touch()
        threading.Event().wait()  # forever: the writer of a save that a kill will interrupt
    return size


writer.save_tensors = write_then_stall  # checkpoint/writer.py writes every file

if __name__ == "__main__":
    sys.exit(pretrain_gpt.main())
