"""A first save killed after its iteration directory was renamed in but before a pointer named it: with `--load` equal
to `--save` and under the directory's lock, the one complete iteration is verified and adopted (pointers written as the
save would have), or set aside as `iter_N.unverified-<time>` and the run starts fresh.
"""

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
    """The `iter_N` directories holding our metadata.json, newest first."""
    return _iterations(save_dir, megatron=False)


def _unnamed(save_dir: Path) -> list[Path]:
    """The complete iterations no pointer names (ours without `latest`, or torch_dist ones without either pointer)."""
    if (save_dir / LATEST_FILE).exists():
        return []
    ours, megatron = complete_iterations(save_dir), _iterations(save_dir, megatron=True)
    if ours and megatron:
        return []
    if megatron and (save_dir / TRACKER_FILE).exists():
        return []
    return ours or megatron


def needs_finishing(load: Optional[str], save: Optional[str]) -> bool:
    """Whether `--save DIR --load DIR` finds one complete iteration and no pointer, as a killed first save leaves it;
    several mean the pointer was removed by hand, which stays an error."""
    return same_directory(load, save) and len(_unnamed(Path(save))) == 1


def _verify(candidate: Path, megatron: bool) -> None:
    if megatron:
        from checkpoint.torch_dist.resume import verify_megatron_completely  # DCP: imported only where needed

        verify_megatron_completely(candidate)
    else:
        verify_or_raise(candidate, read_metadata(candidate))


def finish_unfinished_save(save_dir: Path, log: Callable[[str], None]) -> Optional[Path]:
    """Point `latest` (torch_dist: the tracker) at the killed save's directory if it verifies, else set it aside;
    returns the adopted directory, or None."""
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
        else:  # Megatron's tracker too, unless present (then the save or the user wrote it).
            point_at(save_dir, candidate.name, tracker=not (save_dir / TRACKER_FILE).exists())
            pointer = LATEST_FILE
        log(f"> {save_dir} had no '{pointer}': a save was killed before writing it; {candidate} is complete "
            f"and verified, so '{pointer}' now names it")
        return candidate
    return None
