"""Files and directories we create get the mode the user's umask gives: safetensors and tempfile create private
(0600/0700) files, which `apply_umask` widens to what open() or mkdir() would give."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Union

FILE_MODE = 0o666
DIRECTORY_MODE = 0o777


def current_umask() -> int:
    """The process's umask, from /proc where possible (reading it there changes nothing)."""
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
    base = DIRECTORY_MODE if os.path.isdir(path) else FILE_MODE
    os.chmod(path, base & ~current_umask())
