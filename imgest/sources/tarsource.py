"""ImageNet's archives read in place by offset: the train tar of per-class tars and the flat val tar.

``TarOfTars`` reads ``ILSVRC2012_img_train.tar`` (one ``<wnid>.tar`` per class); ``FlatTar`` reads
``ILSVRC2012_img_val.tar`` (the images themselves, labelled elsewhere). Both stream headers (tarfile's ``r:``
mode, the member list cleared as it goes), so memory stays flat whatever the member count.

A class tar that is empty, corrupt or truncated never ends the scan: the members read before the damage are
kept, the container is listed in the report with how many members were read, and the scan goes on with the
next class tar. Members that are links, devices or FIFOs are skipped and counted by kind; a class tar whose
name holds a path separator or ``..`` is skipped (no class is derived from it). A damaged val tar is treated
like a damaged class tar: its members read before the damage are kept and it is listed as broken.
"""

from __future__ import annotations

import tarfile
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path, PurePath
from typing import IO, Any

from imgest.core.errors import ConfigError
from imgest.sources.tree import Skips
from imgest.sources.valsolution import DEVKIT_GROUND_TRUTH, VAL_SOLUTION

TAR_SYMLINK = "tar-symlink"
TAR_HARDLINK = "tar-hardlink"
TAR_DEVICE = "tar-device-or-fifo"
TAR_UNSAFE_NAME = "tar-unsafe-name"
TAR_ERRORS = (tarfile.TarError, EOFError, OSError)
TRAIN_TAR = "ILSVRC2012_img_train.tar"
VAL_TAR = "ILSVRC2012_img_val.tar"


@dataclass(frozen=True)
class ImageNetTars:
    """ImageNet's archives of one source: the train tar of class tars; the val tar and its labels when present."""

    train: Path
    val: Path | None
    solution: Path | None

    @property
    def folder(self) -> Path:
        """The folder holding the archives: manifest rows name their tar relative to it."""
        return self.train.parent


def imagenet_tars(src: Path) -> ImageNetTars:
    """The archives of a tar source SRC: the train tar itself, or a folder holding ``ILSVRC2012_img_train.tar``.

    Rule: the val split is ``ILSVRC2012_img_val.tar`` in the train tar's folder, labelled by the
    ``LOC_val_solution.csv`` in that same folder, whichever of the two SRC names.
    """
    if src.is_dir():
        train = src / TRAIN_TAR
        if not train.is_file():
            raise ConfigError(
                f"{src} holds no {TRAIN_TAR}: the tar layout reads a folder holding ImageNet's train tar (and "
                f"optionally {VAL_TAR} with {VAL_SOLUTION}), or a train tar given as the source"
            )
    elif src.name == VAL_TAR:
        raise ConfigError(
            f"{src} is ImageNet's val tar: its labels are positions among the train classes, so give the folder "
            f"holding it with {TRAIN_TAR} and {VAL_SOLUTION} as the source"
        )
    else:
        train = src
    val, solution = train.parent / VAL_TAR, train.parent / VAL_SOLUTION
    return ImageNetTars(
        train, val if val.is_file() and val != train else None, solution if solution.is_file() else None
    )


def no_solution_hint(folder: Path) -> str:
    """Which label file a val tar in FOLDER lacks (and, when the devkit's is there, why that one is not read)."""
    if (folder / DEVKIT_GROUND_TRUTH).is_file():
        return (
            f"no {VAL_SOLUTION} in {folder} (its {DEVKIT_GROUND_TRUTH} is not read: its ids need the devkit's meta.mat)"
        )
    return f"no {VAL_SOLUTION} in {folder}"


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
    """One image member: its class ('' in a flat tar), path inside the outer tar, size, time and data offset."""

    wnid: str
    rel_path: str
    size: int
    mtime: float
    offset: int


@dataclass
class _ArchiveReader:
    """What both readers share: the archive, the junk policy, and where skipped, broken and cut-off parts go."""

    path: PurePath
    skips: Skips
    junk: Callable[[str], str | None] = lambda name: None
    on_junk: Callable[[str], None] = lambda kind: None
    broken: list[dict[str, Any]] = field(default_factory=list)
    truncated: list[tuple[str, str]] = field(default_factory=list)  # (rel_path, detail) of cut-off members
    # What serves the archive's bytes: a seekable binary file (None: PATH opened on the local disk). An S3
    # source passes a reader of ranged GETs, so one index logic serves a local file and an object alike.
    opener: Callable[[], IO[bytes]] | None = None

    def _open(self) -> IO[bytes]:
        return self.opener() if self.opener is not None else open(self.path, "rb")

    def _keep(self, item: tarfile.TarInfo, rel: str, room: int, container: str) -> bool:
        """Whether ITEM (REL in reports) holds image bytes to keep; ROOM: bytes its container has left at its data."""
        kind = member_kind(item)
        if kind:
            self.skips.add(kind, rel, f"links to {item.linkname!r}" if item.linkname else "")
            return False
        if not item.isfile():
            return False
        kind = self.junk(Path(item.name).name)
        if kind:
            self.on_junk(kind)
            return False
        if item.size > room:
            self.truncated.append((rel, f"{container} ends {item.size - room} bytes inside this member"))
            return False
        return True


@dataclass
class TarOfTars(_ArchiveReader):
    """Streams the image members of an outer tar of class tars; fills SKIPS, BROKEN and TRUNCATED."""

    def class_names(self) -> list[str]:
        """Sorted classes: one per plainly named nested tar (damaged ones included, so labels stay put)."""
        names = {class_tar_name(m.name) for m in self._outer(record=False) if m.isfile()}
        return sorted(n for n in names if n)

    def entries(self) -> Iterator[TarEntry]:
        """Every readable image member of every class tar, in archive order."""
        with self._open() as fh:
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
            with self._open() as fh, tarfile.open(fileobj=fh, mode="r:") as outer:
                while (member := outer.next()) is not None:
                    outer.members.clear()  # keep memory flat on 1000+ members
                    yield member
        except TAR_ERRORS as exc:
            if record:
                self.broken.append(broken_record(self.path.name, exc, None))

    def _inner(self, fh: IO[bytes], member: tarfile.TarInfo, wnid: str) -> Iterator[TarEntry]:
        read = 0
        try:
            for item in stream_members(_FileSlice(fh, member.offset_data, member.size)):
                read += 1
                rel = f"{member.name}/{item.name}"
                data_offset = member.offset_data + item.offset_data
                room = member.size - item.offset_data
                if self._keep(item, rel, room, f"class tar {member.name}"):
                    yield TarEntry(wnid, rel, item.size, float(item.mtime), data_offset)
        except TAR_ERRORS as exc:
            self.broken.append(broken_record(member.name, exc, read))


@dataclass
class FlatTar(_ArchiveReader):
    """Streams the image members of a flat tar of images (ImageNet's val tar); fills SKIPS, BROKEN, TRUNCATED."""

    def entries(self) -> Iterator[TarEntry]:
        """Every readable image member in archive order, with wnid '' (the tar carries no labels)."""
        read = 0
        try:
            with self._open() as fh:
                size = fh.seek(0, 2)
                for item in stream_members(_FileSlice(fh, 0, size)):
                    read += 1
                    room = size - item.offset_data
                    if self._keep(item, item.name, room, f"val tar {self.path.name}"):
                        yield TarEntry("", item.name, item.size, float(item.mtime), item.offset_data)
        except TAR_ERRORS as exc:
            self.broken.append(broken_record(self.path.name, exc, read))


def stream_members(view: _FileSlice) -> Iterator[tarfile.TarInfo]:
    """The members of the tar in VIEW, headers only, none kept; raises ReadError when the end marker is missing."""
    with tarfile.open(fileobj=view, mode="r:") as tar:  # type: ignore[call-overload]
        while (item := tar.next()) is not None:
            tar.members.clear()  # keep memory flat on 1.3 M members
            yield item
        end = tar.offset
    view.seek(end)
    if view.read(tarfile.BLOCKSIZE) != tarfile.NUL * tarfile.BLOCKSIZE:
        # tarfile ends quietly on a cut or garbled header after the first member; the marker tells
        raise tarfile.ReadError(f"no end-of-archive marker at byte {end}: truncated or garbled")


def broken_record(name: str, exc: BaseException, read: int | None) -> dict[str, Any]:
    """The scan report's entry for an unreadable container NAME after READ members (None: not counted)."""
    return {"container": name, "error": f"{type(exc).__name__}: {exc}", "members_read": read, "member_count": "unknown"}


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
