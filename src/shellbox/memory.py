"""The server process's allocator: large blocks go back to the system once freed.

glibc serves blocks of 128 KiB and more with ``mmap``, but raises that threshold (up to
32 MiB) each time such a block is freed; from then on 1 MiB commands come out of the heap,
whose freed middle stays with the process. After a burst of large calls the server then kept
hundreds of MiB it no longer used. A fixed threshold turns that adjustment off.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import logging

M_MMAP_THRESHOLD = -3  # mallopt parameter, from glibc's malloc.h
MMAP_THRESHOLD_BYTES = 128 * 1024  # glibc's own starting value

log = logging.getLogger("shellbox")


def return_large_blocks_to_os() -> bool:
    """Fix glibc's mmap threshold; False (and nothing done) on another C library."""
    name = ctypes.util.find_library("c")
    if name is None:
        return False
    libc = ctypes.CDLL(name)
    mallopt = getattr(libc, "mallopt", None)
    if mallopt is None or not hasattr(libc, "gnu_get_libc_version"):
        return False
    if mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD_BYTES) != 1:
        log.warning("mallopt(M_MMAP_THRESHOLD) failed; freed large blocks may stay resident")
        return False
    return True
