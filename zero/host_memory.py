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
it to the size of a block's smallest weight matrix (h x h elements in the parameter dtype), because
everything a block's cycle frees is at least that big: the gathered chunk, gloo's copy of it in the
collective, and each weight's gradient before the reducer takes it. Those are mapped when allocated
and unmapped when freed, so RSS follows what is live, while smaller tensors keep glibc's heap and its
speed. Measured on the 4-rank fp32 run of the same model (peak RSS growth over the planner's
prediction): threshold at the chunk size (32 MiB, glibc's cap) 1.14-1.18 over the ranks, at the
largest weight (16 MiB) 1.07-1.12, at half of it 1.03, at 1 MiB 1.02-1.03; on the 12 x 1024 fp32
benchmark model 1 MiB cost 5-7% of step time against 32 MiB, and 4 MiB (its h x h) none measurable.
A caching allocator (CUDA's) reuses blocks of equal size on its own and needs none of this.

Other C libraries (musl, macOS) keep their own policies; there this is a no-op (it returns False).
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


def mmap_threshold_for(block_bytes: int) -> int:
    """The threshold that maps every block of `block_bytes` or more: `block_bytes` itself, within the
    range glibc accepts (a block beyond 32 MiB is mapped whatever the threshold)."""
    return max(GLIBC_MIN_THRESHOLD, min(int(block_bytes), GLIBC_MAX_THRESHOLD))


def return_freed_blocks_to_system(block_bytes: int) -> bool:
    """Make blocks of `block_bytes` or more go back to the system when freed (see the module
    docstring). Returns whether the C library took the setting; process-wide and idempotent. With
    several gatherers in one process the last one's size holds, which only moves the boundary
    between mapped and heap blocks."""
    libc = _glibc()
    if libc is None or block_bytes <= 0:
        return False
    return bool(libc.mallopt(ctypes.c_int(M_MMAP_THRESHOLD), ctypes.c_int(mmap_threshold_for(block_bytes))))
