"""The block map of a dataset: for every stored file, its extents on the block device (FIEMAP).

Paths in the map are relative to the dataset root, so a map taken on one mount reads the same on another.
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from imgest.validate.blockdev import device_of
from imgest.validate.fiemap import Extent, fallback_reason, file_extents


@dataclass(frozen=True)
class FileMap:
    """Where one file's bytes lie; FALLBACK names why they cannot be read by LBA (None when they can)."""

    size: int
    extents: tuple[Extent, ...]
    fallback: str | None


@dataclass
class BlockMap:
    """The device under a dataset root and the extents of its files (keyed by path relative to the root)."""

    root: Path
    device: Path
    files: dict[str, FileMap] = field(default_factory=dict)

    def fallback_counts(self) -> dict[str, int]:
        """How many files cannot be read by LBA, by reason."""
        return dict(Counter(f.fallback for f in self.files.values() if f.fallback))

    def to_dict(self) -> dict[str, Any]:
        """The map as JSON-ready data (no absolute paths but the device)."""
        return {
            "device": str(self.device),
            "files": {
                path: {
                    "size": f.size,
                    "fallback": f.fallback,
                    "extents": [[e.logical, e.physical, e.length, e.flags] for e in f.extents],
                }
                for path, f in sorted(self.files.items())
            },
            "extent_columns": ["logical", "physical", "length", "flags"],
            "fallbacks": self.fallback_counts(),
        }


def build_block_map(root: Path, paths: Iterable[str], advance: Callable[[int], None] | None = None) -> BlockMap:
    """The extents of every file of PATHS (relative to ROOT), all on ROOT's block device.

    Raises NoBlockDeviceError or FiemapUnsupportedError (with the reason) when ROOT's filesystem has no block
    device or no FIEMAP; a file on another device than ROOT falls back with reason ``other_device``.
    """
    device = device_of(root)
    root_dev = root.stat().st_dev
    block_map = BlockMap(root, device)
    for rel in paths:
        path = root / rel
        st = path.stat()
        if st.st_dev != root_dev:
            block_map.files[rel] = FileMap(st.st_size, (), "other_device")
        else:
            extents = file_extents(path)
            block_map.files[rel] = FileMap(st.st_size, tuple(extents), fallback_reason(extents, st.st_size))
        if advance:
            advance(1)
    return block_map


def write_block_map(path: Path, block_map: BlockMap) -> None:
    """Write the map as JSON to PATH."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(block_map.to_dict(), indent=1) + "\n")
