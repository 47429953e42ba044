"""Host memory that stage 3 frees goes back to the system, not into the C allocator's heap.

Stage 3 frees every gathered chunk after use and requests it again for the next pass: on CPU, one
malloc and one free of the chunk's bytes per block, forward and backward. glibc serves a request
of at least its *mmap threshold* with a fresh mapping that `free` unmaps, and anything smaller from
its heap, which keeps freed memory resident. The threshold starts at 128 KiB but is dynamic: each
free of a mapped block raises it to that block's size (up to 32 MiB), so after the first released
chunk every later chunk comes from the heap, and the heap grows by the chunks that were ever gathered
at once plus its fragmentation. Measured on the 2-rank 307M stage-3 run (24 MiB chunks): about 0.6 GiB
per rank held by the allocator after one iteration, none of it in use.

Setting the threshold explicitly (mallopt M_MMAP_THRESHOLD) turns the dynamic adjustment off. We set
it to the smallest chunk stage 3 gathers, so every chunk is mapped on gather and unmapped on release
(its RSS is exactly the live chunks), while smaller tensors (activations of a small micro-batch,
bucket-sized scratch) keep glibc's heap and its speed. A caching allocator (CUDA's) reuses blocks of
equal size on its own and needs none of this.

Other C libraries (musl, macOS) keep their own policies; there this is a no-op and says so.
"""

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


def mmap_threshold_for(chunk_bytes: int) -> int:
    """The threshold that maps every block of `chunk_bytes` or more: `chunk_bytes` itself, within the
    range glibc accepts (a chunk beyond 32 MiB is mapped whatever the threshold)."""
    return max(GLIBC_MIN_THRESHOLD, min(int(chunk_bytes), GLIBC_MAX_THRESHOLD))


def return_freed_chunks_to_system(chunk_bytes: int) -> bool:
    """Make blocks of `chunk_bytes` or more go back to the system when freed (see the module
    docstring). Returns whether the C library took the setting; process-wide and idempotent. With
    several gatherers in one process the last one's chunk size holds, which only moves the boundary
    between mapped and heap blocks."""
    libc = _glibc()
    if libc is None or chunk_bytes <= 0:
        return False
    return bool(libc.mallopt(ctypes.c_int(M_MMAP_THRESHOLD), ctypes.c_int(mmap_threshold_for(chunk_bytes))))
