"""What the check reads: every stored image of a files dataset with the label DALI assigns and its ingest sha256."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from imgest.sinks.files.layout import iter_files, read_manifest


@dataclass(frozen=True)
class Sample:
    """One stored image: SIZE bytes at OFFSET of the file PATH (relative to the dataset root)."""

    path: str
    offset: int
    size: int
    label: int
    sha256: str


@dataclass(frozen=True)
class SplitView:
    """The samples of one split, sorted by path, with labels = index of the sorted class folders."""

    root: Path
    split: str
    classes: tuple[str, ...]
    samples: tuple[Sample, ...]

    @property
    def split_dir(self) -> Path:
        """The folder fn.readers.file is pointed at."""
        return self.root / self.split


def class_folders(split_dir: Path) -> tuple[str, ...]:
    """The class folders of a split, sorted: their index is the label fn.readers.file assigns."""
    return tuple(sorted(p.name for p in split_dir.iterdir() if p.is_dir()))


def load_splits(root: Path, splits: list[str] | None = None) -> list[SplitView]:
    """Every split of the files dataset under ROOT (or only SPLITS), from samples.parquet and the class folders.

    The size of each sample is the file's size now, so a file changed after ingest is still read whole and
    shows up as a hash mismatch.
    """
    read_manifest(root)
    by_split: dict[str, list[tuple[str, str]]] = {}
    for stored in iter_files(root):
        if splits is None or stored.split in splits:
            by_split.setdefault(stored.split, []).append((stored.path, stored.sha256))
    views = []
    for split in sorted(by_split):
        classes = class_folders(root / split)
        label_of = {wnid: i for i, wnid in enumerate(classes)}
        samples = tuple(
            Sample(path, 0, (root / path).stat().st_size, label_of[Path(path).parent.name], sha)
            for path, sha in sorted(by_split[split])
        )
        views.append(SplitView(root, split, classes, samples))
    return views
