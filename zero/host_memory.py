"""Host memory an iteration frees goes back to the system: a fixed glibc mmap threshold (the model's h x h weight size)
maps large blocks and unmaps them on free, where glibc's dynamic threshold would keep them in its heap (0.6 GiB per rank
held on a stage-3 run). A no-op outside glibc."""

from __future__ import annotations

import ctypes
import sys

M_MMAP_THRESHOLD = -3           # glibc's mallopt parameter number (malloc.h)
GLIBC_MIN_THRESHOLD = 128 * 1024  # glibc's own starting threshold
GLIBC_MAX_THRESHOLD = 32 * 2**20  # HEAP_MAX_SIZE / 2 on 64-bit: mallopt refuses more


def _glibc():
    """The process's C library if it is glibc, else None."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        libc = ctypes.CDLL(None)
        libc.gnu_get_libc_version  # only glibc has it
        return libc
    except (OSError, AttributeError):
        return None


def mmap_threshold_for(block_bytes: int) -> int:
    """The threshold mapping blocks of `block_bytes` or more, within glibc's range."""
    return max(GLIBC_MIN_THRESHOLD, min(int(block_bytes), GLIBC_MAX_THRESHOLD))


def return_freed_blocks_to_system(block_bytes: int) -> bool:
    """Make blocks of `block_bytes` or more go back to the system when freed; process-wide."""
    libc = _glibc()
    if libc is None or block_bytes <= 0:
        return False
    return bool(libc.mallopt(ctypes.c_int(M_MMAP_THRESHOLD), ctypes.c_int(mmap_threshold_for(block_bytes))))
