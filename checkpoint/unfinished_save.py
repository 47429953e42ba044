"""A save that was killed after its iteration directory was renamed in but before `latest` was
written (checkpoint/format.py's `commit`): finished, or set aside, so the same command resumes.

Megatron-LM writes its tracker file `latest_checkpointed_iteration.txt` only after every rank's
files are saved, and a `--load` directory without it starts from random with a warning: the folder it
left is then overwritten by the next save of the same number. Here the directory is complete when
metadata.json exists (it is written last, inside the staging directory), so such a directory that
also verifies (every file's size, header and hash, checkpoint/integrity.py) is what the killed
save finished writing: `latest` (and Megatron's tracker file, where the save had not written it yet)
is pointed at it, as the save would have done next. One that does not
verify is renamed `iter_N.unverified-<time>` (never deleted: the user may want to look at it) and
the run starts fresh, as Megatron's would.

Only for `--load` equal to `--save` (a requeued job's own directory), and only under the save
directory's lock, so no other run is writing into it meanwhile. Only for this project's own format: a
Megatron-LM torch_dist iteration directory (ours written with `--ckpt-format torch_dist`, or Megatron-LM's)
is committed by the tracker file alone and has no `latest`, so it is never taken for an unfinished save and
never set aside; without the tracker it is not read, as Megatron-LM does not read it.
"""

from __future__ import annotations

import re
import time
from pathlib import Path
from typing import Callable, Optional

from base.errors import CheckpointError
from checkpoint.format import LATEST_FILE, METADATA_FILE, TRACKER_FILE, point_at, read_metadata
from checkpoint.integrity import verify_or_raise
from checkpoint.megatron_common import is_megatron_checkpoint

UNVERIFIED_SUFFIX = ".unverified-"


def same_directory(load: Optional[str], save: Optional[str]) -> bool:
    return bool(load) and bool(save) and Path(load).resolve() == Path(save).resolve()


def complete_iterations(save_dir: Path) -> list[Path]:
    """The `iter_N` directories holding this project's metadata.json (not Megatron-Core's), newest (highest N)
    first."""
    if not save_dir.is_dir():
        return []
    found = [path for path in save_dir.iterdir()
             if re.fullmatch(r"iter_\d+", path.name) and (path / METADATA_FILE).is_file()
             and not is_megatron_checkpoint(path)]
    return sorted(found, key=lambda path: int(path.name[len("iter_"):]), reverse=True)


def needs_finishing(load: Optional[str], save: Optional[str]) -> bool:
    """Whether `--save DIR --load DIR` finds DIR as a killed first save leaves it: one complete
    iteration directory and no `latest`. Every later save replaces an existing `latest` atomically,
    so several complete iterations without `latest` mean it was removed by hand: that stays an error
    (checkpoint/start_decision.py), as the user must say which one to resume."""
    if not same_directory(load, save):
        return False
    save_dir = Path(save)
    return not (save_dir / LATEST_FILE).exists() and len(complete_iterations(save_dir)) == 1


def finish_unfinished_save(save_dir: Path, log: Callable[[str], None]) -> Optional[Path]:
    """Point `latest` at the iteration directory the killed save left if it verifies, else set it
    aside (the run then starts fresh); returns the adopted directory, or None."""
    for candidate in complete_iterations(save_dir):
        try:
            verify_or_raise(candidate, read_metadata(candidate))
        except (CheckpointError, OSError) as error:
            aside = candidate.with_name(f"{candidate.name}{UNVERIFIED_SUFFIX}{time.strftime('%Y%m%d-%H%M%S')}")
            candidate.rename(aside)
            tracker = save_dir / TRACKER_FILE
            named = tracker.is_file() and tracker.read_text(encoding="utf-8", errors="replace").strip() \
                == str(int(candidate.name[len("iter_"):]))
            if named:  # the pointer to what was set aside goes, so the run starts fresh as said
                tracker.unlink()
            log(f"> {candidate} has no '{LATEST_FILE}' and does not verify ({error}); set aside as {aside}"
                + (f"; {TRACKER_FILE} named it and is removed" if named else ""))
            continue
        # Megatron's tracker too, unless it is there: then the save wrote it, or a user did (their word)
        point_at(save_dir, candidate.name, tracker=not (save_dir / TRACKER_FILE).exists())
        log(f"> {save_dir} had no '{LATEST_FILE}': a save was killed before writing it; {candidate} is complete "
            f"and verified, so '{LATEST_FILE}' now names it")
        return candidate
    return None
