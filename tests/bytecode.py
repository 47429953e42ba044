"""The repository's bytecode, compiled once a test session where the environment asks Python not to write it.

With PYTHONDONTWRITEBYTECODE set (this machine's and CI's environment set it), Python never caches the project's
bytecode, so every interpreter a test starts - a torchrun rank, a script, a docs command - compiled the ~350 modules
`import pretrain_gpt` reaches from source again: about 1 s of CPU a process on the 2-core machine (measured: compiling
them in one process, 1.04 s). The session compiles every .py of the repository once instead (2.7 s of CPU, measured) into
the usual __pycache__ folders, which Python reads whatever that variable says; torch's own bytecode was written when
pip installed it. The folders the session created are removed when it ends, so the checkout is left as the variable
asked; a __pycache__ that was there before is not touched. Python checks each .pyc against its source's size and
mtime, so a source edited meanwhile is compiled again, as it would be without the cache.
"""

from __future__ import annotations

import os
import py_compile
import shutil
import sys
from pathlib import Path

from tests.repository_tree import NOT_OURS


def compile_repository(root: Path) -> list[Path]:
    """Compile every .py under `root` (not entering NOT_OURS) when bytecode is not written on import; the __pycache__
    folders this created. Nothing when Python writes bytecode itself, or a file does not compile (its import says so)."""
    if not sys.dont_write_bytecode:
        return []
    created = []
    for folder, subfolders, files in os.walk(root):
        subfolders[:] = [name for name in subfolders if name not in NOT_OURS]
        sources = [name for name in files if name.endswith(".py")]
        if not sources:
            continue
        cache = Path(folder, "__pycache__")
        if not cache.exists():
            created.append(cache)
        for name in sources:
            try:
                py_compile.compile(os.path.join(folder, name), doraise=True)
            except (py_compile.PyCompileError, OSError):
                pass
    return created


def remove(created: list[Path]) -> None:
    for cache in created:
        shutil.rmtree(cache, ignore_errors=True)
