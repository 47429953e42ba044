"""A save directory belongs to one run through its lock `DIR/.lock` (a RunLock), so the owner's cleanup is safe; and
what counts as checkpoints another run made.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

from base.output_locks import RunLock
from checkpoint.format import LATEST_FILE, METADATA_FILE, RETIRED_SUFFIX, TRACKER_FILE

LOCK_FILE = ".lock"


def holds_checkpoints(directory: Path) -> list[str]:
    """The names in `directory` that are another run's finished work (`latest`, the tracker, complete iterations); not
    `.partial` ones."""
    if not directory.is_dir():
        return []
    names = []
    for path in sorted(directory.iterdir()):
        if path.name in (LATEST_FILE, TRACKER_FILE):
            names.append(path.name)
        elif re.fullmatch(rf"iter_\d+({re.escape(RETIRED_SUFFIX)}\d+)?", path.name) \
                and (path / METADATA_FILE).is_file():
            names.append(path.name)
    return names


class SaveDirectoryLock(RunLock):
    """A `--save` directory's lock, `DIR/.lock`."""

    def __init__(self, directory: str | os.PathLike, **kwargs) -> None:
        self.directory = Path(directory)
        super().__init__(self.directory / LOCK_FILE, str(self.directory), "pass another --save directory", **kwargs)
