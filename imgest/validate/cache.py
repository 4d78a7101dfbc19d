"""Dropping files' pages from the page cache, so that a timed pass reads from the device ("cold") and not from
memory (``validate xnvme --cold``).

``posix_fadvise(POSIX_FADV_DONTNEED)`` asks the kernel to drop a file's clean cached pages: no root needed, only
the files named are touched, and the rest of the machine keeps its cache (``echo 3 > /proc/sys/vm/drop_caches``
drops everything, as root). Dirty pages are written back first (``fsync``), or the kernel would keep them. On a
loop-mounted filesystem a file is cached twice: in the mounted filesystem's cache and, as blocks of the image
file, in the cache of the filesystem holding the image; both are dropped.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from pathlib import Path


def evict(paths: Iterable[Path | str]) -> int:
    """Drop the cached pages of every file of PATHS; returns how many files were evicted."""
    count = 0
    for path in paths:
        fd = os.open(path, os.O_RDONLY)
        try:
            os.fsync(fd)
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)
        count += 1
    return count
