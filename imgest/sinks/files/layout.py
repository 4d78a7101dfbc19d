"""The files target's layout, the contract its writer, verifier, collector and readers share.

A published files dataset under DEST holds versions side by side and one manifest naming the current one:

- ``DEST/v/<key>/``: one complete version, self-contained:

  - ``<split>/<wnid>/<id>.<ext>``: each stored image (``ext`` is ``jpg`` in JPEG mode, the source's extension in
    UNCHANGED mode), so class folders sort like the labels (labels = sorted class folder order, the mapping DALI
    ``fn.readers.file`` assigns);
  - ``samples.parquet``: one row per stored image, sorted by ``path``: ``id``, ``path`` (relative to the version
    folder, POSIX), ``label``, ``split``, ``wnid``, ``bytes``, ``sha256`` (of the stored bytes);
  - ``manifest.json``: the version's own manifest (as below, without ``root``), so the folder alone is a readable
    dataset too.

  ``<key>`` derives from content only (a digest of the scan manifest and the dataset name, then the transform
  key), never from time or attempt: the same scan and transform always give the same folder.
- ``DEST/manifest.json``: the commit. Format ``files``, dataset, version, counts per split, class map, bytes,
  quarantine summary and entries, transform settings, ``root`` (``v/<key>``, the current version folder) and
  ``history`` (earlier version folders, most recent first). It is replaced atomically (temporary name, then
  rename) after the version folder is in place, so a reader that starts from it sees the old version or the new
  one, never a half-written one, and the previous version stays readable until the switch.
- ``DEST/_staging/<key>/``: a version being written (``<key>.parts/``: the partitions' parts of
  ``samples.parquet`` before the merge). Publishing is one directory rename ``_staging/<key>`` -> ``v/<key>``
  followed by the manifest switch.

Readers resolve the version folder through the manifest (``data_root``); a manifest without ``root`` (a version
folder itself, or a dataset written before versioned folders) means the files lie beside it. Old versions and
stale staging are removed by ``imgest gc files`` (``imgest.sinks.files.gc``), never by the writer.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Any

from imgest.core import workdir
from imgest.core.errors import ImgestError

SAMPLES_COLUMNS = ("id", "path", "label", "split", "wnid", "bytes", "sha256")
STAGING = "_staging"
VERSIONS = "v"
PARTS_SUFFIX = ".parts"
LOCK_SUFFIX = ".lock"  # held by the job writing a version; `imgest gc files` leaves that staging alone


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


def version_folder(key: str) -> str:
    """The manifest's ``root`` of version KEY (relative to DEST, POSIX)."""
    return f"{VERSIONS}/{key}"


def staging_dir(dest: Path, key: str) -> Path:
    """Where version KEY is written before it is published."""
    return dest / STAGING / key


def parts_dir(dest: Path, key: str) -> Path:
    """Where the partitions of version KEY write their parts of samples.parquet."""
    return dest / STAGING / f"{key}{PARTS_SUFFIX}"


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


def data_root(dest: Path, manifest: dict[str, Any] | None = None) -> Path:
    """The folder holding the current version's images and samples.parquet (paths in it are relative to this
    folder): DEST/<manifest's root>, or DEST itself when the manifest names no root. FilesDatasetError when the
    manifest is missing or names a folder that is not there."""
    doc = manifest if manifest is not None else read_manifest(dest)
    rel = doc.get("root")
    if not rel:
        return dest
    parts = PurePosixPath(rel).parts
    if PurePosixPath(rel).is_absolute() or ".." in parts or not parts:
        raise FilesDatasetError(f"{dest / workdir.PUBLISHED_MANIFEST} names root {rel!r}, not a folder inside {dest}")
    folder = dest.joinpath(*parts)
    if not (folder / workdir.PUBLISHED_SAMPLES).is_file():
        raise FilesDatasetError(
            f"{dest / workdir.PUBLISHED_MANIFEST} names version folder {folder}, which has no "
            f"{workdir.PUBLISHED_SAMPLES}; it was removed by hand: publish the files dataset again"
        )
    return folder


def samples_path(dest: Path) -> Path:
    """samples.parquet of the current version of the files dataset under DEST."""
    return data_root(dest) / workdir.PUBLISHED_SAMPLES


def iter_files(root: Path, split: str | None = None) -> Iterator[StoredFile]:
    """Every stored image of the dataset under ROOT (of SPLIT when given), in samples.parquet order; paths are
    relative to ``data_root(ROOT)``."""
    import pyarrow.parquet as pq

    where = samples_path(root)
    for batch in pq.ParquetFile(where).iter_batches(batch_size=8192, columns=list(SAMPLES_COLUMNS)):
        for row in batch.to_pylist():
            if split is None or row["split"] == split:
                yield StoredFile(**row)
