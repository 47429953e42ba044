"""Files and directories this program creates get the permissions the user's umask gives.

Some writers create private files whatever the umask says: `safetensors.torch.save_file` writes its
file 0600, and `tempfile.mkstemp`/`mkdtemp` (used for atomic writes) create 0600 files and 0700
directories. Renamed into place, those would leave checkpoints, exported models and shared data caches
unreadable to teammates. The writers call `apply_umask` on what they create, so a file ends up as
`open()` would have made it (0666 & ~umask) and a directory as `mkdir` would (0777 & ~umask).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Union

FILE_MODE = 0o666
DIRECTORY_MODE = 0o777


def current_umask() -> int:
    """The process's umask. Linux reports it in /proc (reading it changes nothing); elsewhere it is
    read by setting and restoring it, which is what os.umask offers."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("Umask:"):
                return int(line.split()[1], 8)
    except (OSError, ValueError, IndexError):
        pass
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def apply_umask(path: Union[str, os.PathLike]) -> None:
    """Give `path` (a file or a directory) the mode a plain open() or mkdir() would have given it."""
    base = DIRECTORY_MODE if os.path.isdir(path) else FILE_MODE
    os.chmod(path, base & ~current_umask())
