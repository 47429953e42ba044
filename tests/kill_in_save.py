"""pretrain_gpt.py SIGKILLed at one point of its first save: a job killed (preempted, OOM-killed, a
node lost) while it saves.

    KILL_SAVE_POINT=renamed python tests/kill_in_save.py <pretrain_gpt flags>

The points are the steps of `save_checkpoint` (checkpoint/ours/sharded.py, its files through checkpoint/writer.py) and
`commit` (checkpoint/format.py), in order:
  files        the first of the rank's safetensors files written into iter_N.partial, no more
  metadata     every file and metadata.json written into iter_N.partial, not yet renamed
  renamed      iter_N.partial renamed to iter_N, neither pointer written yet
  tracker      Megatron's tracker file `latest_checkpointed_iteration.txt` written, `latest` not yet
  latest-temp  `latest`'s temporary file written and fsynced, not yet renamed over `latest`
  latest       `latest` written: the save is complete, the prune and the log line are not done
With --ckpt-format torch_dist the steps are `save_megatron_checkpoint`'s (checkpoint/torch_dist/writer.py):
  files        DCP's files written into iter_N.partial, common.pt and metadata.json not yet
  renamed      iter_N.partial, complete, renamed to iter_N; the tracker file not written yet
  tracker-temp the tracker's temporary file written and fsynced, not yet renamed over the tracker
  tracker      the tracker file written: the save is complete, the log line not printed
The kill is a real SIGKILL: no handler, no cleanup, no flush."""

import os
import signal
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import pretrain_gpt  # noqa: E402
from checkpoint import format as checkpoint_format  # noqa: E402
from checkpoint import writer  # noqa: E402
from checkpoint.ours import sharded  # noqa: E402
from checkpoint.torch_dist import writer as torch_dist_writer  # noqa: E402

POINT = os.environ["KILL_SAVE_POINT"]
POINTS = ("files", "metadata", "renamed", "tracker", "latest-temp", "latest")
TORCH_DIST_POINTS = ("files", "renamed", "tracker-temp", "tracker")


def die() -> None:
    os.kill(os.getpid(), signal.SIGKILL)


def after(function, point):
    def wrapped(*args, **kwargs):
        result = function(*args, **kwargs)
        if POINT == point:
            die()
        return result
    return wrapped


def write_latest_then(path, text):
    if (path.name, POINT) in ((checkpoint_format.LATEST_FILE, "latest-temp"),
                              (checkpoint_format.TRACKER_FILE, "tracker-temp")):
        temporary = path.with_name(f".{path.name}.tmp-{os.getpid()}")  # as atomic_file names it
        temporary.write_text(text, encoding="utf-8")
        checkpoint_format.fsync_path(temporary)
        die()
    original_write_text_atomic(path, text)
    if (path.name, POINT) in ((checkpoint_format.LATEST_FILE, "latest"), (checkpoint_format.TRACKER_FILE, "tracker")):
        die()


assert POINT in POINTS + TORCH_DIST_POINTS, POINT
writer.save_tensors = after(writer.save_tensors, "files")  # write_files looks it up at call time
sharded.write_text_atomic = after(sharded.write_text_atomic, "metadata")  # sharded writes only metadata.json with it
checkpoint_format.replace_directory = after(checkpoint_format.replace_directory, "renamed")
original_write_text_atomic = checkpoint_format.write_text_atomic
checkpoint_format.write_text_atomic = write_latest_then  # commit() looks it up in the module at call time
# the torch_dist writer imported both by name; DCP's save it looks up in torch.distributed.checkpoint at call time
torch_dist_writer.dcp.save = after(torch_dist_writer.dcp.save, "files")
torch_dist_writer.replace_directory = after(torch_dist_writer.replace_directory, "renamed")
torch_dist_writer.write_text_atomic = write_latest_then

if __name__ == "__main__":
    sys.exit(pretrain_gpt.main())
