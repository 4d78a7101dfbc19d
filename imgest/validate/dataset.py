"""What the check reads: a seeded, class-balanced sample (or every image) of a files dataset's splits, as columns.

samples.parquet is streamed in bounded chunks through the read-back check's sampler
(``imgest.core.sampling.BalancedSample``), so the xNVMe check and the read-back check pick the same images for
the same size and seed. A split is held as numpy columns (paths, sizes, labels, sha256), never as one Python
object per image; ``Sample`` objects are made one batch at a time for the engines.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from imgest.core import defaults, workdir
from imgest.core.sampling import BalancedSample, Columns, SampleReport
from imgest.core.textcols import bytes_column, sha_columns
from imgest.sinks.files.layout import data_root, read_manifest

log = logging.getLogger(__name__)
CHUNK = 65_536  # samples.parquet rows converted to columns at a time


@dataclass(frozen=True)
class Sample:
    """One stored image: SIZE bytes at OFFSET of the file PATH (relative to the dataset root)."""

    path: str
    offset: int
    size: int
    label: int
    sha256: str


@dataclass(frozen=True, eq=False)
class SplitView:
    """The images of one split to check, sorted by path, as columns; labels = index of the sorted class folders.

    ``paths`` are fixed-width bytes (relative to ROOT), ``sizes`` int64 (the file's size now), ``labels`` int32,
    ``sha256`` (n, 32) uint8 as recorded at ingest, ``recorded`` bool. ``sample`` says what part of the split's
    ``sample.total`` rows this is. ``reader_dir``, when set, is a folder holding exactly these files (under their
    class folders) for ``fn.readers.file``; None means the split's own folder.
    """

    root: Path
    split: str
    classes: tuple[str, ...]
    paths: np.ndarray
    sizes: np.ndarray
    labels: np.ndarray
    sha256: np.ndarray
    recorded: np.ndarray
    sample: SampleReport
    reader_dir: Path | None = None

    def __len__(self) -> int:
        return len(self.paths)

    @property
    def split_dir(self) -> Path:
        """The split's folder under ROOT."""
        return self.root / self.split

    @property
    def full(self) -> bool:
        """True when every row of the split is checked."""
        return len(self) == self.sample.total

    @property
    def nbytes(self) -> int:
        """Bytes of the images to check."""
        return int(self.sizes.sum())

    def path(self, i: int) -> str:
        """The relative path of image I."""
        return self.paths[i].decode()

    def batch(self, start: int, stop: int) -> list[Sample]:
        """Images [START, STOP) as Sample objects (for the engines)."""
        return [
            Sample(self.path(i), 0, int(self.sizes[i]), int(self.labels[i]), self.sha256[i].tobytes().hex())
            for i in range(start, min(stop, len(self)))
        ]

    def batches(self, size: int) -> Iterator[list[Sample]]:
        """Every image in order, SIZE at a time."""
        for start in range(0, len(self), size):
            yield self.batch(start, start + size)

    def iter_paths(self) -> Iterator[str]:
        """The relative paths, in order."""
        for raw in self.paths:
            yield raw.decode()

    def index_of(self, paths: list[str]) -> np.ndarray:
        """Position of each of PATHS (relative to ROOT) in this view, or -1 when it is not among the images."""
        if not paths or not len(self):
            return np.full(len(paths), -1, np.int64)
        keys = np.array([p.encode() for p in paths], dtype="S")
        pos = np.minimum(np.searchsorted(self.paths, keys), len(self) - 1)
        return np.where(self.paths[pos] == keys, pos, -1)

    def moved_to(self, root: Path, reader_dir: Path | None = None) -> SplitView:
        """The same images under another ROOT (a copy of the dataset)."""
        return dataclasses.replace(self, root=root, reader_dir=reader_dir)


def class_folders(split_dir: Path) -> tuple[str, ...]:
    """The class folders of a split, sorted: their index is the label fn.readers.file assigns."""
    return tuple(sorted(p.name for p in split_dir.iterdir() if p.is_dir()))


def split_names(root: Path) -> list[str]:
    """The splits the published manifest counts rows for, sorted."""
    return sorted(split for split, count in read_manifest(root).get("samples", {}).items() if count)


def planned_images(root: Path, splits: list[str] | None, sample: int) -> int:
    """How many images a check of SAMPLE per split (0: every row) reads, from the manifest's counts."""
    counts = read_manifest(root).get("samples", {})
    return sum(min(int(n), sample) if sample else int(n) for s, n in counts.items() if splits is None or s in splits)


def _chunks(root: Path, split: str) -> Iterator[Columns]:
    """samples.parquet rows of SPLIT as column chunks (id, label, path, sha256, recorded), CHUNK rows at a time."""
    import pyarrow.compute as pc
    import pyarrow.parquet as pq

    where = root / workdir.PUBLISHED_SAMPLES
    columns = ["id", "path", "label", "split", "sha256"]
    for batch in pq.ParquetFile(where).iter_batches(batch_size=CHUNK, columns=columns):
        batch = batch.filter(pc.equal(batch.column("split"), split))
        if not batch.num_rows:
            continue
        sha, recorded = sha_columns(batch.column("sha256"))
        yield {
            "id": bytes_column(batch.column("id").cast("string")),
            "label": batch.column("label").to_numpy(zero_copy_only=False).astype(np.int32),
            "path": bytes_column(batch.column("path")),
            "sha256": sha,
            "recorded": recorded,
        }


def _empty() -> Columns:
    return {
        "id": np.zeros(0, "S1"),
        "label": np.zeros(0, np.int32),
        "path": np.zeros(0, "S1"),
        "sha256": np.zeros((0, 32), np.uint8),
        "recorded": np.zeros(0, bool),
    }


def _labels_and_sizes(root: Path, paths: np.ndarray, label_of: dict[bytes, int]) -> tuple[np.ndarray, np.ndarray]:
    """Per path (``<split>/<wnid>/<file>``) the label of its class folder (-1: no such folder) and the file's size
    now, CHUNK paths at a time."""
    labels = np.empty(len(paths), np.int32)
    sizes = np.empty(len(paths), np.int64)
    for start in range(0, len(paths), CHUNK):
        part = paths[start : start + CHUNK]
        labels[start : start + len(part)] = [label_of.get(p.split(b"/")[-2], -1) for p in part]
        sizes[start : start + len(part)] = [(root / p.decode()).stat().st_size for p in part]
    return labels, sizes


def load_split(root: Path, split: str, sample: int = 0, seed: int = defaults.CHECK_SAMPLE_SEED) -> SplitView:
    """A seeded, class-balanced SAMPLE of SPLIT's images (every image when SAMPLE is 0), samples.parquet streamed.

    The size of each image is the file's size now, so a file changed after ingest is still read whole and shows up
    as a hash mismatch. ROOT may be the dataset's folder or its version folder: the view's root is the version
    folder (``imgest.sinks.files.layout.data_root``).
    """
    root = data_root(root)
    picker = BalancedSample(sample, seed, _empty())
    for chunk in _chunks(root, split):
        picker.add(chunk)
    rows, report = picker.result()
    order = np.argsort(rows["path"], kind="stable")
    paths = rows["path"][order]
    classes = class_folders(root / split)
    labels, sizes = _labels_and_sizes(root, paths, {wnid.encode(): i for i, wnid in enumerate(classes)})
    log.info("%s/%s: %s", root, split, report.summary())
    return SplitView(root, split, classes, paths, sizes, labels, rows["sha256"][order], rows["recorded"][order], report)


def load_splits(
    root: Path, splits: list[str] | None = None, sample: int = 0, seed: int = defaults.CHECK_SAMPLE_SEED
) -> list[SplitView]:
    """Every split of the files dataset under ROOT (or only SPLITS): SAMPLE images of each (0: every image)."""
    return [load_split(root, split, sample, seed) for split in split_names(root) if splits is None or split in splits]
