"""The repository's own files, for the tests that check a command wrote nothing into it."""

from __future__ import annotations

import os
from pathlib import Path

from tests.readme import ROOT

# Not the repository's own: git's store, caches, and the virtualenv .ci/run creates inside the clone (about 46,000
# files: walking into it and filtering afterwards cost CI about a second a call).
NOT_OURS = frozenset({".git", ".venv", "__pycache__", ".pytest_cache"})
# At the top only, written while other xdist workers list the tree: the egg-info every `pip install -e .` rewrites
# (each worker's installed_clone) and runs/, where in-process launches run from the repository put their outputs.
OTHER_WORKERS = frozenset({"zero_gpt.egg-info", "runs"})


def repository_files(root: Path = ROOT) -> list[Path]:
    """Every file and folder under `root`, sorted, without entering the folders in NOT_OURS (or OTHER_WORKERS at the
    top)."""
    found = []
    for folder, subfolders, files in os.walk(root):
        skipped = NOT_OURS | OTHER_WORKERS if Path(folder) == root else NOT_OURS
        subfolders[:] = [name for name in subfolders if name not in skipped]
        found += [Path(folder, name) for name in subfolders + files]
    return sorted(found)
