"""The block map of the files a check reads: for every file, its extents on the block device (FIEMAP), as columns.

Paths in the map are relative to the dataset root, so a map taken on one mount reads the same on another. The
map is held and written as numpy columns (``block_map.npz``): paths (fixed-width bytes), sizes, a fallback code
per file, and the extents of all files as one (m, 4) array indexed by per-file offsets. Nothing in it is one Python
object per file.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from imgest.validate.blockdev import device_of
from imgest.validate.fiemap import FALLBACK_FLAGS, Extent, fallback_reason, file_extents

# Fallback reasons by code; 0: the file can be read by LBA.
FALLBACKS: tuple[str, ...] = ("", "other_device", "empty", "hole", "unmapped", *FALLBACK_FLAGS.values())
EXTENT_COLUMNS = ("logical", "physical", "length", "flags")
CHUNK = 8192  # files per column chunk while building

Entry = tuple[str, int, Sequence[Extent], "str | None"]  # path, size, extents, fallback reason


@dataclass(frozen=True, eq=False)
class BlockMap:
    """The device under a dataset root and, per file (path relative to the root), its size, fallback code and
    extents ``extents[offsets[i]:offsets[i + 1]]`` (columns logical, physical, length, flags; bytes)."""

    root: Path
    device: Path
    paths: np.ndarray
    sizes: np.ndarray
    fallback: np.ndarray
    offsets: np.ndarray
    extents: np.ndarray

    def __len__(self) -> int:
        return len(self.paths)

    @classmethod
    def of(cls, root: Path, device: Path, entries: Iterable[Entry]) -> BlockMap:
        """The map of ENTRIES (path, size, extents, fallback reason or None), gathered in column chunks."""
        parts: list[tuple[np.ndarray, ...]] = []
        chunk: list[Entry] = []
        for entry in entries:
            chunk.append(entry)
            if len(chunk) == CHUNK:
                parts.append(_columns(chunk))
                chunk = []
        parts.append(_columns(chunk))
        paths, sizes, fallback, counts, extents = (np.concatenate([p[k] for p in parts]) for k in range(5))
        paths = paths if len(paths) else np.zeros(0, "S1")
        offsets = np.concatenate([[0], np.cumsum(counts)]).astype(np.int64)
        return cls(root, device, paths, sizes, fallback, offsets, extents.reshape(-1, 4))

    def find(self, path: str) -> int:
        """The position of PATH in the map, or -1."""
        order = self._order()
        key = path.encode()
        j = int(np.searchsorted(self.paths[order], key)) if len(order) else 0
        return int(order[j]) if j < len(order) and self.paths[order[j]] == key else -1

    def _order(self) -> np.ndarray:
        cached = self.__dict__.get("_sorted")
        if cached is None:
            cached = np.argsort(self.paths, kind="stable")
            object.__setattr__(self, "_sorted", cached)
        return cached

    def entry(self, i: int) -> tuple[int, list[Extent], str | None]:
        """(size, extents, fallback reason or None) of file I."""
        rows = self.extents[self.offsets[i] : self.offsets[i + 1]]
        code = int(self.fallback[i])
        return int(self.sizes[i]), [Extent(*map(int, r)) for r in rows], FALLBACKS[code] if code else None

    def fallback_counts(self) -> dict[str, int]:
        """How many files cannot be read by LBA, by reason."""
        codes, counts = np.unique(self.fallback[self.fallback > 0], return_counts=True)
        return {FALLBACKS[int(c)]: int(n) for c, n in zip(codes, counts, strict=True)}

    def save(self, path: Path) -> None:
        """Write the map as compressed numpy columns to PATH (``.npz``; no absolute path but the device)."""
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(path.name + ".tmp")
        with open(tmp, "wb") as fh:
            np.savez_compressed(
                fh,
                device=np.array(str(self.device)),
                paths=self.paths,
                sizes=self.sizes,
                fallback=self.fallback,
                fallback_names=np.array(FALLBACKS),
                offsets=self.offsets,
                extents=self.extents,
                extent_columns=np.array(EXTENT_COLUMNS),
            )
        tmp.replace(path)

    @classmethod
    def load(cls, path: Path, root: Path) -> BlockMap:
        """A map written by ``save``, for the dataset at ROOT."""
        with np.load(path) as z:
            return cls(
                root,
                Path(str(z["device"])),
                z["paths"],
                z["sizes"],
                z["fallback"],
                z["offsets"],
                z["extents"],
            )


def _columns(chunk: list[Entry]) -> tuple[np.ndarray, ...]:
    extents = [(e.logical, e.physical, e.length, e.flags) for _, _, ext, _ in chunk for e in ext]
    return (
        np.array([p.encode() for p, _, _, _ in chunk], dtype="S") if chunk else np.zeros(0, "S1"),
        np.array([s for _, s, _, _ in chunk], np.int64),
        np.array([FALLBACKS.index(f) if f else 0 for _, _, _, f in chunk], np.uint8),
        np.array([len(ext) for _, _, ext, _ in chunk], np.int64),
        np.array(extents, np.int64).reshape(-1, 4),
    )


def _entries(root: Path, paths: Iterable[str], advance: Callable[[int], None] | None) -> Iterator[Entry]:
    root_dev = root.stat().st_dev
    for rel in paths:
        path = root / rel
        st = path.stat()
        if st.st_dev != root_dev:
            yield rel, st.st_size, (), "other_device"
        else:
            extents = file_extents(path)
            yield rel, st.st_size, extents, fallback_reason(extents, st.st_size)
        if advance:
            advance(1)


def build_block_map(root: Path, paths: Iterable[str], advance: Callable[[int], None] | None = None) -> BlockMap:
    """The extents of every file of PATHS (relative to ROOT, streamed), all on ROOT's block device.

    Raises NoBlockDeviceError or FiemapUnsupportedError (with the reason) when ROOT's filesystem has no block
    device or no FIEMAP; a file on another device than ROOT falls back with reason ``other_device``.
    """
    return BlockMap.of(root, device_of(root), _entries(root, paths, advance))


def write_block_map(path: Path, block_map: BlockMap) -> None:
    """Write the map to PATH (see BlockMap.save)."""
    block_map.save(path)
