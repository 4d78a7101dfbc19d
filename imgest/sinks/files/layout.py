"""The files target's layout, the contract its writer, verifier and readers share.

A published files dataset under DIR holds:

- ``DIR/<split>/<wnid>/<id>.<ext>``: each stored image (``ext`` is ``jpg`` in JPEG mode, the source's
  extension in UNCHANGED mode), so class folders sort like the labels (labels = sorted class folder order,
  the mapping DALI ``fn.readers.file`` assigns);
- ``DIR/samples.parquet``: one row per stored image: ``id``, ``path`` (relative to DIR, POSIX), ``label``,
  ``split``, ``wnid``, ``bytes``, ``sha256`` (of the stored bytes);
- ``DIR/manifest.json``, written last: format ``files``, dataset, version, counts per split, class map, bytes,
  quarantine summary and entries, transform settings. A reader that starts from it never sees a half-written
  dataset.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from imgest.core import workdir
from imgest.core.errors import ImgestError

SAMPLES_COLUMNS = ("id", "path", "label", "split", "wnid", "bytes", "sha256")
STAGING = "_staging"


class FilesDatasetError(ImgestError):
    """A files dataset is missing, unpublished or inconsistent."""


@dataclass(frozen=True)
class StoredFile:
    """One image of a published files dataset."""

    id: str
    path: str
    label: int
    split: str
    wnid: str
    bytes: int
    sha256: str


def file_path(split: str, wnid: str, image_id: str, ext: str) -> str:
    """The relative path of one stored image."""
    return f"{split}/{wnid}/{image_id}.{ext.lstrip('.').lower()}"


def read_manifest(root: Path) -> dict[str, Any]:
    """DIR/manifest.json of a published files dataset, or FilesDatasetError naming DIR."""
    path = root / workdir.PUBLISHED_MANIFEST
    try:
        doc = json.loads(path.read_text())
    except FileNotFoundError:
        raise FilesDatasetError(f"{root} holds no published files dataset ({path.name} is missing)") from None
    if doc.get("format") != "files":
        raise FilesDatasetError(f"{path} describes a {doc.get('format')!r} dataset, not a files dataset")
    return doc


def iter_files(root: Path, split: str | None = None) -> Iterator[StoredFile]:
    """Every stored image of the dataset under ROOT (of SPLIT when given), in samples.parquet order."""
    import pyarrow.parquet as pq

    read_manifest(root)
    table = pq.read_table(root / workdir.PUBLISHED_SAMPLES, columns=list(SAMPLES_COLUMNS))
    for batch in table.to_batches(max_chunksize=8192):
        for row in batch.to_pylist():
            if split is None or row["split"] == split:
                yield StoredFile(**row)
