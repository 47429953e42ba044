"""pretrain_gpt.py with an OSError raised on one rank at one stage of a save or of a load: a rank that fails alone
inside work every rank does together (a full disk on one node, a file only it reads).

    FAIL_STAGE=plan FAIL_RANK=1 FAIL_MARK=/tmp/raised python tests/raise_in_collective_work.py <pretrain_gpt flags>

The stages, in this project's format (checkpoint/ours/sharded.py) or in torch_dist's (checkpoint/torch_dist/writer.py),
whichever the run saves:
  plan      the rank's part of the save, before it is written (ours: begin_save; torch_dist: _chunks)
  write     its files (ours: write_rank_files; torch_dist: DCP asking for its first item, inside DCP's save)
  finalise  the first rank's metadata (ours: metadata.json; torch_dist: common.pt)
  tracker   the first rank's tracker file (latest_checkpointed_iteration.txt)
  load      the start of the rank's load of the checkpoint it resumes from (its format's load_resume)
The time of the raise goes into FAIL_MARK."""

import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import pretrain_gpt  # noqa: E402
from checkpoint import format as checkpoint_format  # noqa: E402
from checkpoint.ours import resume as ours_resume  # noqa: E402
from checkpoint.ours import sharded  # noqa: E402
from checkpoint.torch_dist import resume as torch_dist_resume  # noqa: E402
from checkpoint.torch_dist import writer as torch_dist_writer  # noqa: E402

STAGE = os.environ["FAIL_STAGE"]
STAGES = ("plan", "write", "finalise", "tracker", "load")


def fail() -> None:
    Path(os.environ["FAIL_MARK"]).write_text(str(time.time()))
    raise OSError(f"tests/raise_in_collective_work.py: injected at {STAGE} on rank {os.environ['RANK']}")


def failing(function, stage: str, path_name: str = ""):
    def wrapped(*args, **kwargs):
        named = not path_name or Path(args[0]).name == path_name
        if STAGE == stage and os.environ["RANK"] == os.environ["FAIL_RANK"] and named:
            fail()
        return function(*args, **kwargs)
    return wrapped


assert STAGE in STAGES, STAGE
# each is looked up in its module at call time
sharded.begin_save = failing(sharded.begin_save, "plan")
sharded.write_rank_files = failing(sharded.write_rank_files, "write")
sharded.write_text_atomic = failing(sharded.write_text_atomic, "finalise", checkpoint_format.METADATA_FILE)
checkpoint_format.write_text_atomic = failing(checkpoint_format.write_text_atomic, "tracker",
                                              checkpoint_format.TRACKER_FILE)
torch_dist_writer._chunks = failing(torch_dist_writer._chunks, "plan")
torch_dist_writer._Planner.resolve_data = failing(torch_dist_writer._Planner.resolve_data, "write")
torch_dist_writer._common = failing(torch_dist_writer._common, "finalise")
torch_dist_writer.write_text_atomic = failing(torch_dist_writer.write_text_atomic, "tracker",
                                              checkpoint_format.TRACKER_FILE)
ours_resume.load_resume = failing(ours_resume.load_resume, "load")
torch_dist_resume.load_resume = failing(torch_dist_resume.load_resume, "load")

if __name__ == "__main__":
    sys.exit(pretrain_gpt.main())
