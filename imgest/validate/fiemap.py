"""Where a file's bytes lie on its block device: the FIEMAP ioctl (ext4, XFS, btrfs alike), parsed.

``struct fiemap`` is a 32-byte header (start, length, flags, mapped extents, extent count, reserved) followed by
``struct fiemap_extent`` records of 56 bytes (logical, physical, length, 2 reserved u64, flags, 3 reserved u32).
Offsets and lengths are in bytes; ``physical`` is relative to the start of the block device the filesystem is on.
"""

from __future__ import annotations

import errno
import fcntl
import os
import struct
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from imgest.core.errors import ImgestError

FS_IOC_FIEMAP = 0xC020660B  # _IOWR('f', 11, struct fiemap)
FIEMAP_FLAG_SYNC = 0x1  # flush the file's dirty pages before mapping, so no extent is left delalloc
HEADER = struct.Struct("=QQIIII")
EXTENT = struct.Struct("=QQQQQIIII")

FLAG_LAST = 0x1
# Extents whose bytes cannot be read verbatim from the device at fe_physical: the block engine falls back.
FALLBACK_FLAGS = {
    0x2: "unknown",
    0x4: "delalloc",
    0x8: "encoded",
    0x80: "encrypted",
    0x100: "not_aligned",
    0x200: "inline",
    0x400: "tail",
    0x800: "unwritten",
}


class FiemapUnsupportedError(ImgestError):
    """The filesystem holding a file does not answer the FIEMAP ioctl."""


@dataclass(frozen=True)
class Extent:
    """One mapped range of a file: LENGTH bytes at file offset LOGICAL lie at device byte offset PHYSICAL."""

    logical: int
    physical: int
    length: int
    flags: int

    def fallback_reasons(self) -> list[str]:
        """The flags that forbid reading this extent by LBA, by name (empty when it can be read)."""
        return [name for bit, name in FALLBACK_FLAGS.items() if self.flags & bit]


def pack_request(start: int, length: int, count: int, flags: int = FIEMAP_FLAG_SYNC) -> bytearray:
    """The ioctl buffer asking for up to COUNT extents of the byte range [START, START + LENGTH)."""
    buf = bytearray(HEADER.size + EXTENT.size * count)
    HEADER.pack_into(buf, 0, start, length, flags, 0, count, 0)
    return buf


def parse_response(buf: bytes | bytearray) -> list[Extent]:
    """The extents the kernel filled into BUF (an answered pack_request buffer)."""
    mapped = HEADER.unpack_from(buf, 0)[3]
    extents = []
    for i in range(mapped):
        logical, physical, length, _, _, flags, *_ = EXTENT.unpack_from(buf, HEADER.size + i * EXTENT.size)
        extents.append(Extent(logical, physical, length, flags))
    return extents


def _query(fd: int, start: int, count: int) -> list[Extent]:
    buf = pack_request(start, (1 << 64) - 1 - start, count)
    fcntl.ioctl(fd, FS_IOC_FIEMAP, buf, True)
    return parse_response(buf)


def file_extents(path: Path, batch: int = 64) -> list[Extent]:
    """Every extent of PATH in file order, or FiemapUnsupportedError naming the path and the reason."""
    fd = os.open(path, os.O_RDONLY)
    try:
        extents: list[Extent] = []
        start = 0
        while True:
            try:
                part = _query(fd, start, batch)
            except OSError as exc:
                if exc.errno in (errno.EOPNOTSUPP, errno.ENOTTY, errno.EINVAL):
                    raise FiemapUnsupportedError(
                        f"{path}: the filesystem does not support the FIEMAP ioctl ({os.strerror(exc.errno)})"
                    ) from None
                raise
            extents.extend(part)
            if not part or part[-1].flags & FLAG_LAST:
                return extents
            start = part[-1].logical + part[-1].length
    finally:
        os.close(fd)


def fallback_reason(extents: list[Extent], size: int) -> str | None:
    """Why the bytes [0, SIZE) cannot be read by LBA from EXTENTS, or None when they can."""
    covered = 0
    for extent in extents:
        if extent.logical >= size:
            break
        reasons = extent.fallback_reasons()
        if reasons:
            return reasons[0]
        if extent.logical != covered:
            return "hole"
        covered = extent.logical + extent.length
    return None if covered >= size else ("empty" if not extents else "hole")


def device_ranges(extents: list[Extent], offset: int, size: int) -> Iterator[tuple[int, int]]:
    """(device byte offset, length) pieces holding file bytes [OFFSET, OFFSET + SIZE), in order."""
    end = offset + size
    for extent in extents:
        lo, hi = max(offset, extent.logical), min(end, extent.logical + extent.length)
        if lo < hi:
            yield extent.physical + (lo - extent.logical), hi - lo
