"""ImageNet's tar of per-class tars, read in place by offset: broken class tars and odd members are reported.

A class tar that is empty, corrupt or truncated never ends the scan: the members read before the damage are
kept, the container is listed in the report with how many members were read, and the scan goes on with the
next class tar. Members that are links, devices or FIFOs are skipped and counted by kind; a class tar whose
name holds a path separator or ``..`` is skipped (no class is derived from it).
"""

from __future__ import annotations

import tarfile
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

from imgest.sources.tree import Skips

TAR_SYMLINK = "tar-symlink"
TAR_HARDLINK = "tar-hardlink"
TAR_DEVICE = "tar-device-or-fifo"
TAR_UNSAFE_NAME = "tar-unsafe-name"
TAR_ERRORS = (tarfile.TarError, EOFError, OSError)


def member_kind(info: tarfile.TarInfo) -> str | None:
    """Why a tar member holds no image bytes of its own (None for a regular file or a folder)."""
    if info.issym():
        return TAR_SYMLINK
    if info.islnk():
        return TAR_HARDLINK
    if info.ischr() or info.isblk() or info.isfifo():
        return TAR_DEVICE
    return None


def class_tar_name(name: str) -> str | None:
    """The class (wnid) of a nested tar called NAME, or None when NAME is not a plain ``<wnid>.tar``."""
    plain = name[2:] if name.startswith("./") else name
    stem = plain[:-4] if plain.endswith(".tar") else ""
    if not stem or "/" in plain or "\\" in plain or ".." in plain or stem.startswith("."):
        return None
    return stem


@dataclass(frozen=True)
class TarEntry:
    """One image member: its class, path inside the outer tar, size, time and data offset in the outer tar."""

    wnid: str
    rel_path: str
    size: int
    mtime: float
    offset: int


@dataclass
class TarOfTars:
    """Streams the image members of an outer tar of class tars; fills SKIPS, BROKEN and TRUNCATED."""

    path: Path
    skips: Skips
    junk: Callable[[str], str | None] = lambda name: None
    on_junk: Callable[[str], None] = lambda kind: None
    broken: list[dict[str, Any]] = field(default_factory=list)
    truncated: list[tuple[str, str]] = field(default_factory=list)  # (rel_path, detail) of cut-off members

    def class_names(self) -> list[str]:
        """Sorted classes: one per plainly named nested tar (damaged ones included, so labels stay put)."""
        names = {class_tar_name(m.name) for m in self._outer(record=False) if m.isfile()}
        return sorted(n for n in names if n)

    def entries(self) -> Iterator[TarEntry]:
        """Every readable image member of every class tar, in archive order."""
        with open(self.path, "rb") as fh:
            for member in self._outer(record=True):
                kind = member_kind(member)
                if kind:
                    self.skips.add(kind, member.name, "outer tar member")
                    continue
                if not member.isfile():
                    continue
                if not member.name.endswith(".tar"):
                    self.on_junk("non-tar-member")
                    continue
                wnid = class_tar_name(member.name)
                if wnid is None:
                    self.skips.add(TAR_UNSAFE_NAME, member.name, "a class name cannot hold a path separator or ..")
                    continue
                yield from self._inner(fh, member, wnid)

    def _outer(self, record: bool) -> Iterator[tarfile.TarInfo]:
        try:
            with tarfile.open(self.path, mode="r:") as outer:
                while (member := outer.next()) is not None:
                    outer.members.clear()  # keep memory flat on 1000+ members
                    yield member
        except TAR_ERRORS as exc:
            if record:
                self._record_broken(self.path.name, exc, None)

    def _inner(self, fh: IO[bytes], member: tarfile.TarInfo, wnid: str) -> Iterator[TarEntry]:
        view = _FileSlice(fh, member.offset_data, member.size)
        read = 0
        try:
            with tarfile.open(fileobj=view, mode="r:") as inner:  # type: ignore[call-overload]
                while (item := inner.next()) is not None:
                    inner.members.clear()
                    read += 1
                    entry = self._entry(member, item, wnid)
                    if entry is not None:
                        yield entry
                end = inner.offset
            view.seek(end)
            if view.read(tarfile.BLOCKSIZE) != tarfile.NUL * tarfile.BLOCKSIZE:
                # tarfile ends quietly on a cut or garbled header after the first member; the marker tells
                raise tarfile.ReadError(f"no end-of-archive marker at byte {end}: truncated or garbled")
        except TAR_ERRORS as exc:
            self._record_broken(member.name, exc, read)

    def _entry(self, member: tarfile.TarInfo, item: tarfile.TarInfo, wnid: str) -> TarEntry | None:
        rel = f"{member.name}/{item.name}"
        kind = member_kind(item)
        if kind:
            self.skips.add(kind, rel, f"links to {item.linkname!r}" if item.linkname else "")
            return None
        if not item.isfile():
            return None
        junk = self.junk(Path(item.name).name)
        if junk:
            self.on_junk(junk)
            return None
        if item.offset_data + item.size > member.size:
            missing = item.offset_data + item.size - member.size
            self.truncated.append((rel, f"class tar {member.name} ends {missing} bytes inside this member"))
            return None
        return TarEntry(wnid, rel, item.size, float(item.mtime), member.offset_data + item.offset_data)

    def _record_broken(self, name: str, exc: BaseException, read: int | None) -> None:
        self.broken.append(
            {
                "container": name,
                "error": f"{type(exc).__name__}: {exc}",
                "members_read": read,
                "member_count": "unknown",
            }
        )


class _FileSlice:
    """A read-only, seekable window [start, start+size) of an open binary file."""

    def __init__(self, fh: IO[bytes], start: int, size: int) -> None:
        self._fh, self._start, self._size, self._pos = fh, start, size, 0

    def read(self, n: int = -1) -> bytes:
        n = self._size - self._pos if n < 0 else min(n, self._size - self._pos)
        self._fh.seek(self._start + self._pos)
        data = self._fh.read(n)
        self._pos += len(data)
        return data

    def seek(self, offset: int, whence: int = 0) -> int:
        base = {0: 0, 1: self._pos, 2: self._size}[whence]
        self._pos = max(0, min(self._size, base + offset))
        return self._pos

    def tell(self) -> int:
        return self._pos
