"""Keep a worker process's freed memory for its next item instead of giving it back.

A preprocessing function makes the same large temporary arrays for every item (a batch's
worth of parsed fields, index arrays, digits), many alive at once. glibc adapts its
thresholds to the largest single block it has freed, and returns the top of the heap to the
system once more than twice that is free: at the end of every item, when all the
temporaries go together. The next item then faults every page in again and the kernel zeroes
it: on the DLRM stages that was a third of a worker's CPU time, spent in the kernel. Fixing
the thresholds, as ``MALLOC_MMAP_THRESHOLD_`` and ``MALLOC_TRIM_THRESHOLD_`` would, makes a
worker reuse its heap: its resident memory stays at its peak (which the memory budget sees,
as it sees any RSS) and its items cost user time only. tcmalloc and jemalloc, which
TensorFlow and many DLRM stacks preload, behave alike.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import logging

log = logging.getLogger(__name__)

# mallopt(3) parameters.
_M_TRIM_THRESHOLD = -1
_M_MMAP_THRESHOLD = -3

# glibc caps the mmap threshold at 32 MiB on 64-bit systems; arrays larger than that are
# still mapped and unmapped, which their size amortises.
MMAP_THRESHOLD = 32 * 2**20
# Free memory at the top of the heap kept before it is returned to the system.
TRIM_THRESHOLD = 512 * 2**20


def keep_freed_memory() -> bool:
    """Make this process's allocator reuse freed memory; say whether it could (glibc only)."""
    path = ctypes.util.find_library("c")
    if path is None:
        return False
    try:
        libc = ctypes.CDLL(path)
        mallopt = libc.mallopt
    except (OSError, AttributeError):
        return False  # not glibc (musl, macOS): its allocator behaves otherwise
    ok = mallopt(_M_MMAP_THRESHOLD, MMAP_THRESHOLD) == 1
    ok = mallopt(_M_TRIM_THRESHOLD, TRIM_THRESHOLD) == 1 and ok
    if not ok:
        log.debug("mallopt refused the heap thresholds; the allocator keeps its defaults")
    return ok
