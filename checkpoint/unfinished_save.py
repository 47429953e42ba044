"""A save that was killed after its iteration directory was renamed in but before `latest` was
written (checkpoint/format.py's `commit`): finished, or set aside, so the same command resumes.

Megatron-LM writes its tracker file only after every rank's files are saved, and a `--load` directory without it
starts from random with a warning, the folder then overwritten by the next save of the same number. Here the
directory is complete when metadata.json exists (written last, inside the staging directory), so one that also
verifies (every file's size, header and hash, checkpoint/integrity.py) is what the killed save finished writing:
`latest` (and the tracker, where the save had not written it yet) is pointed at it, as the save would have done
next. One that does not verify is renamed `iter_N.unverified-<time>` (never deleted) and the run starts fresh, as
Megatron's would.

A torch_dist directory (ours with `--ckpt-format torch_dist`) is committed by the tracker alone: its save renames
iter_N.partial, then writes the tracker, and a kill between leaves a complete directory the tracker does not name.
So the same rule holds: when the save directory has neither `latest` nor the tracker and holds exactly one complete
iteration, of either format, it is verified (a torch_dist one: its backends, common.pt and every stored item's
CRC-32, checkpoint/torch_dist/resume.py) and adopted, the tracker pointing at it, or set aside. A torch_dist
directory the tracker names is committed and never touched. Only for `--load` equal to `--save` (a requeued job's
own directory), and only under the save directory's lock, so no other run writes into it meanwhile."""

from __future__ import annotations

import re
import time
from pathlib import Path
from typing import Callable, Optional

from base.errors import CheckpointError
from checkpoint.format import LATEST_FILE, METADATA_FILE, TRACKER_FILE, point_at, read_metadata, write_text_atomic
from checkpoint.formats import MEGATRON, format_of
from checkpoint.integrity import verify_or_raise

UNVERIFIED_SUFFIX = ".unverified-"


def same_directory(load: Optional[str], save: Optional[str]) -> bool:
    return bool(load) and bool(save) and Path(load).resolve() == Path(save).resolve()


def _iterations(save_dir: Path, megatron: bool) -> list[Path]:
    if not save_dir.is_dir():
        return []
    found = [path for path in save_dir.iterdir()
             if re.fullmatch(r"iter_\d+", path.name) and (path / METADATA_FILE).is_file()
             and (format_of(path) is MEGATRON) == megatron]
    return sorted(found, key=lambda path: int(path.name[len("iter_"):]), reverse=True)


def complete_iterations(save_dir: Path) -> list[Path]:
    """The `iter_N` directories holding this project's metadata.json (not Megatron-Core's), newest (highest N)
    first."""
    return _iterations(save_dir, megatron=False)


def _unnamed(save_dir: Path) -> list[Path]:
    """The complete iterations no pointer names where a killed first save leaves them (module docstring): ours
    without `latest`, or Megatron's torch_dist ones without `latest` and the tracker; never the two kinds mixed."""
    if (save_dir / LATEST_FILE).exists():
        return []
    ours, megatron = complete_iterations(save_dir), _iterations(save_dir, megatron=True)
    if ours and megatron:
        return []
    if megatron and (save_dir / TRACKER_FILE).exists():
        return []
    return ours or megatron


def needs_finishing(load: Optional[str], save: Optional[str]) -> bool:
    """Whether `--save DIR --load DIR` finds DIR as a killed first save leaves it: one complete
    iteration directory and no pointer naming it. Every later save replaces an existing pointer atomically,
    so several complete iterations without it mean it was removed by hand: that stays an error
    (checkpoint/start_decision.py), as the user must say which one to resume."""
    return same_directory(load, save) and len(_unnamed(Path(save))) == 1


def _verify(candidate: Path, megatron: bool) -> None:
    if megatron:
        from checkpoint.torch_dist.resume import verify_megatron_completely  # DCP: imported only where needed

        verify_megatron_completely(candidate)
    else:
        verify_or_raise(candidate, read_metadata(candidate))


def finish_unfinished_save(save_dir: Path, log: Callable[[str], None]) -> Optional[Path]:
    """Point `latest` (a torch_dist iteration: the tracker) at the iteration directory the killed save left if it
    verifies, else set it aside (the run then starts fresh); returns the adopted directory, or None."""
    for candidate in _unnamed(save_dir):
        megatron = format_of(candidate) is MEGATRON
        try:
            _verify(candidate, megatron)
        except (CheckpointError, OSError) as error:
            aside = candidate.with_name(f"{candidate.name}{UNVERIFIED_SUFFIX}{time.strftime('%Y%m%d-%H%M%S')}")
            candidate.rename(aside)
            tracker = save_dir / TRACKER_FILE
            named = tracker.is_file() and tracker.read_text(encoding="utf-8", errors="replace").strip() \
                == str(int(candidate.name[len("iter_"):]))
            if named:  # the pointer to what was set aside goes, so the run starts fresh as said
                tracker.unlink()
            log(f"> {candidate} has no '{TRACKER_FILE if megatron else LATEST_FILE}' and does not verify ({error}); "
                f"set aside as {aside}" + (f"; {TRACKER_FILE} named it and is removed" if named else ""))
            continue
        if megatron:  # Megatron-LM's layout has no `latest`: its tracker is the commit
            write_text_atomic(save_dir / TRACKER_FILE, str(int(candidate.name[len("iter_"):])))
            pointer = TRACKER_FILE
        else:  # Megatron's tracker too, unless it is there: then the save wrote it, or a user did (their word)
            point_at(save_dir, candidate.name, tracker=not (save_dir / TRACKER_FILE).exists())
            pointer = LATEST_FILE
        log(f"> {save_dir} had no '{pointer}': a save was killed before writing it; {candidate} is complete "
            f"and verified, so '{pointer}' now names it")
        return candidate
    return None
