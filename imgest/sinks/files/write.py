"""Writing the files target: each partition stages its images, the driver publishes them, manifest.json last.

Files are written under ``DIR/_staging/`` (temporary name, then rename), so nothing half-written is ever
visible under a published path. Publishing withdraws the old manifest, moves every staged file into place,
removes files of the previous version that the new one no longer holds, writes ``samples.parquet`` and then
``manifest.json``. Paths derive from the image ids, so a re-run writes the same files.
"""

from __future__ import annotations

import hashlib
import io
import json
import logging
import os
from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from imgest.core import workdir
from imgest.core.quarantine import QuarantineLog, quarantine_summary
from imgest.sinks.files.layout import SAMPLES_COLUMNS, STAGING, StoredFile, file_path
from imgest.sources.manifest import Candidate, ClassInfo
from imgest.transform.image import TransformSpec
from imgest.transform.pipeline import process_candidates

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class FilesConfig:
    """What every partition needs."""

    root: str  # the source dataset
    dataset: str
    dest: str  # the files dataset folder (on storage every Spark node sees)
    spec: TransformSpec


@dataclass
class FilesPartResult:
    """What one partition wrote."""

    files: list[StoredFile] = field(default_factory=list)
    quarantine: list[dict[str, Any]] = field(default_factory=list)

    def merge(self, other: FilesPartResult) -> None:
        self.files += other.files
        self.quarantine += other.quarantine


def write_atomic(path: Path, data: bytes) -> None:
    """Write PATH under a temporary name, then rename: readers see the old or the new file, never a part."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".partial")
    tmp.write_bytes(data)
    os.replace(tmp, path)


def write_partition(
    candidates: Iterable[Candidate], cfg: FilesConfig, on_image: Callable[[int], None] | None = None
) -> FilesPartResult:
    """Transform each candidate and stage it as _staging/<split>/<wnid>/<id>.<ext>."""
    result, quarantine = FilesPartResult(), QuarantineLog()
    staging = Path(cfg.dest) / STAGING
    for item in process_candidates(candidates, Path(cfg.root), cfg.spec, quarantine):
        cand, data = item.candidate, item.image.data
        rel = file_path(cand.split, cand.wnid, cand.id, item.image.ext)
        write_atomic(staging / rel, data)
        sha = hashlib.sha256(data).hexdigest()
        result.files.append(StoredFile(cand.id, rel, cand.label, cand.split, cand.wnid, len(data), sha))
        if on_image:
            on_image(len(data))
    result.quarantine = [{**asdict(e), "reason": str(e.reason)} for e in quarantine.entries]
    return result


def samples_parquet(files: list[StoredFile]) -> bytes:
    """samples.parquet of FILES, sorted by path (the order fn.readers.file lists a folder in)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    rows = sorted(files, key=lambda f: f.path)
    table = pa.table({c: [getattr(f, c) for f in rows] for c in SAMPLES_COLUMNS})
    buf = io.BytesIO()
    pq.write_table(table, buf, compression="zstd")
    return buf.getvalue()


def build_manifest(
    result: FilesPartResult, cfg: FilesConfig, version: str, classes: list[ClassInfo], scan_quarantine: QuarantineLog
) -> dict[str, Any]:
    """manifest.json of the files dataset (no timestamps: a re-run writes the same document)."""
    quarantine = result.quarantine + [{**asdict(e), "reason": str(e.reason)} for e in scan_quarantine.entries]
    per_split = Counter(f.split for f in result.files)
    return {
        "format": "files",
        "dataset": cfg.dataset,
        "version": version,
        "layout": "<split>/<wnid>/<id>.<ext>",
        "samples": dict(sorted(per_split.items())),
        "bytes": sum(f.bytes for f in result.files),
        "classes": [asdict(c) for c in classes],
        "quarantine": quarantine_summary(quarantine),
        "transform": cfg.spec.as_dict(),
    }


def _old_paths(dest: Path) -> set[str]:
    import pyarrow.parquet as pq

    samples = dest / workdir.PUBLISHED_SAMPLES
    return set(pq.read_table(samples, columns=["path"]).column("path").to_pylist()) if samples.is_file() else set()


def publish(dest: Path, result: FilesPartResult, manifest: dict[str, Any]) -> dict[str, int]:
    """Move staged files into place, drop files the new version no longer holds, manifest.json last."""
    (dest / workdir.PUBLISHED_MANIFEST).unlink(missing_ok=True)  # readers see no dataset while files move
    old = _old_paths(dest)
    staging = dest / STAGING
    for f in result.files:
        target = dest / f.path
        target.parent.mkdir(parents=True, exist_ok=True)
        os.replace(staging / f.path, target)
    new = {f.path for f in result.files}
    for path in old - new:
        (dest / path).unlink(missing_ok=True)
    write_atomic(dest / workdir.PUBLISHED_SAMPLES, samples_parquet(result.files))
    write_atomic(dest / workdir.PUBLISHED_MANIFEST, json.dumps(manifest, indent=1, sort_keys=True).encode())
    _remove_empty_dirs(staging)
    return {"published": len(new), "removed": len(old - new)}


def _remove_empty_dirs(root: Path) -> None:
    if not root.is_dir():
        return
    for path in sorted(root.rglob("*"), key=lambda p: len(p.parts), reverse=True):
        if path.is_dir() and not any(path.iterdir()):
            path.rmdir()
    if not any(root.iterdir()):
        root.rmdir()
