"""Deterministic webdataset tar shards, with their DALI index and sha256 computed while writing.

Every header field that could vary between runs is fixed (mtime 0, uid/gid 0, no user names, mode 0644,
POSIX ustar), so the same samples in the same order give byte-identical shards. The index is the
``v1.2`` format DALI's ``wds2idx`` writes: one line per sample listing ``ext offset size name`` for
each member, where offset is where the member's data starts.
"""

from __future__ import annotations

import hashlib
import tarfile
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

BLOCK = 512
RECORD = 20 * BLOCK  # tar pads the archive to whole records, as GNU tar and Python's tarfile do
INDEX_VERSION = "v1.2"


@dataclass(frozen=True)
class ShardFile:
    """A finished shard on local disk."""

    path: Path
    index: str
    sha256: str
    nbytes: int
    samples: int


def index_key(line: str) -> str:
    """The sample key of one sample line of a DALI index (``ext offset size key.ext ...``)."""
    return line.split(" ", 4)[3].partition(".")[0]


def member_overhead(size: int) -> int:
    """Bytes a member of SIZE takes in the tar: header plus data padded to the block size."""
    return BLOCK + -(-size // BLOCK) * BLOCK


def ustar_header(name: str, size: int) -> bytes:
    """The POSIX ustar header of a regular file NAME of SIZE bytes with every varying field fixed (mode 0644,
    uid/gid 0, mtime 0, no user names): byte for byte what tarfile writes for it, five times faster."""
    raw = name.encode("utf-8")
    if len(raw) > 100 or size >= 8**11:  # needs a prefix field or a base-256 size: tarfile does those
        info = tarfile.TarInfo(name)
        info.size, info.mtime, info.mode, info.uname, info.gname = size, 0, 0o644, "", ""
        return info.tobuf(tarfile.USTAR_FORMAT, "utf-8", "strict")
    head = bytearray(BLOCK)
    head[: len(raw)] = raw
    head[100:124] = b"0000644\x000000000\x000000000\x00"  # mode, uid, gid
    head[124:136] = b"%011o\x00" % size
    head[136:148] = b"00000000000\x00"  # mtime
    head[148:156] = b"        "  # the checksum counts its own field as spaces
    head[156:157] = b"0"  # regular file
    head[257:265] = b"ustar\x0000"
    head[148:156] = b"%06o\x00 " % sum(head)
    return bytes(head)


class ShardTarWriter:
    """Context manager: ``add(key, [(ext, bytes), ...])`` per sample; the file appears only when complete."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._partial = path.with_name(path.name + ".partial")
        self._fh: BinaryIO | None = None
        self._sha = hashlib.sha256()
        self._pos = 0
        self._lines: list[str] = []
        self.result: ShardFile | None = None

    def __enter__(self) -> ShardTarWriter:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._fh = open(self._partial, "wb")
        return self

    def _write(self, data: bytes) -> None:
        assert self._fh is not None
        self._fh.write(data)
        self._sha.update(data)
        self._pos += len(data)

    def add(self, key: str, members: list[tuple[str, bytes]]) -> None:
        """Append one sample: members KEY.EXT in the given order."""
        if "/" in key or "." in key or not key:
            raise ValueError(f"sample key {key!r} must be non-empty without '/' or '.'")
        parts = []
        for ext, data in members:
            name = f"{key}.{ext}"
            self._write(ustar_header(name, len(data)))
            parts.append(f"{ext} {self._pos} {len(data)} {name}")
            self._write(data)
            if len(data) % BLOCK:
                self._write(bytes(BLOCK - len(data) % BLOCK))
        self._lines.append(" ".join(parts))

    def __exit__(self, exc_type: object, *_: object) -> None:
        assert self._fh is not None
        try:
            if exc_type is None:
                self._write(bytes(2 * BLOCK))
                if self._pos % RECORD:
                    self._write(bytes(RECORD - self._pos % RECORD))
        finally:
            self._fh.close()
        if exc_type is not None:
            self._partial.unlink(missing_ok=True)
            return
        self._partial.replace(self.path)
        index = f"{INDEX_VERSION} {len(self._lines)}\n" + "".join(line + "\n" for line in self._lines)
        self.result = ShardFile(self.path, index, self._sha.hexdigest(), self._pos, len(self._lines))
