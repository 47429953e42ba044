"""The repository's own files, for the tests that check a command wrote nothing into it."""

from __future__ import annotations

import os
from pathlib import Path

from tests.readme import ROOT

# Not the repository's own: git's store, caches, the virtualenv .ci/run creates inside the clone (about 46,000
# files: walking into it and filtering afterwards cost CI about a second a call), and the egg-info that every
# `pip install -e .` rewrites (each xdist worker's installed_clone does, while other workers list the tree).
NOT_OURS = frozenset({".git", ".venv", "__pycache__", ".pytest_cache", "zero_gpt.egg-info"})


def repository_files(root: Path = ROOT) -> list[Path]:
    """Every file and folder under `root`, sorted, without entering the folders in NOT_OURS."""
    found = []
    for folder, subfolders, files in os.walk(root):
        subfolders[:] = [name for name in subfolders if name not in NOT_OURS]
        found += [Path(folder, name) for name in subfolders + files]
    return sorted(found)
