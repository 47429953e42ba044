"""Index arrays cached as ``.npy`` files named by a hash of their inputs, written atomically; concurrent ranks write
identical content, and an unwritable cache only costs a rebuild.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import tempfile

import numpy as np

from base.file_modes import apply_umask

logger = logging.getLogger(__name__)


def cache_key(description: dict) -> str:
    """A short stable hash of a JSON-serialisable description of the inputs."""
    return hashlib.sha256(json.dumps(description, sort_keys=True).encode()).hexdigest()[:20]


def load_cached_arrays(paths: dict[str, str], what: str) -> dict[str, np.ndarray] | None:
    """Every array of the entry, memory-mapped read-only; None when any file is missing or unreadable."""
    if not all(os.path.isfile(path) for path in paths.values()):
        return None
    try:
        return {kind: np.load(path, mmap_mode="r") for kind, path in paths.items()}
    except (OSError, ValueError) as error:
        logger.warning("ignoring unreadable index cache for %s (%s); rebuilding", what, error)
        return None


def save_cached_arrays(paths: dict[str, str], arrays: dict[str, np.ndarray], what: str) -> None:
    """Write each array atomically; warn and go on when the directory cannot be written."""
    for kind, path in paths.items():
        directory = os.path.dirname(path)
        try:
            os.makedirs(directory, exist_ok=True)
            handle, temp_path = tempfile.mkstemp(dir=directory, suffix=".npy.tmp")
            try:
                with os.fdopen(handle, "wb") as temp_file:
                    np.save(temp_file, arrays[kind])
                apply_umask(temp_path)  # mkstemp makes it 0600; the cache is shared by every user of the data
                os.replace(temp_path, path)
            except BaseException:
                os.remove(temp_path)
                raise
        except OSError as error:
            logger.warning("cannot write the index cache for %s in %s (%s); continuing without it",
                           what, directory, error)
            return
