"""The manifest: one Parquet row per candidate image, plus the class map beside it."""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterable, Iterator
from dataclasses import asdict, dataclass, fields
from itertools import islice
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

# Fixed namespace: ids derive from dataset name, split and relative path only (never time or chance).
ID_NAMESPACE = uuid.UUID("6f1d8b1e-5b6a-4a43-9c1e-2f4b9f0e7a11")
BATCH_ROWS = 8192


def image_id(dataset: str, split: str, rel_path: str) -> str:
    """Deterministic UUID of an image: uuid5 over 'dataset/split/relative path'."""
    return str(uuid.uuid5(ID_NAMESPACE, f"{dataset}/{split}/{rel_path}"))


@dataclass(frozen=True)
class Candidate:
    """One candidate image. CONTAINER/OFFSET locate it inside a tar (else '' and -1); ETAG is an S3 object's
    (a source on S3: refresh compares it with the size instead of the mtime), else ''."""

    id: str
    split: str
    rel_path: str
    wnid: str
    label: int
    size: int
    mtime: float
    container: str = ""
    offset: int = -1
    etag: str = ""


@dataclass(frozen=True)
class ClassInfo:
    """A class: its folder name (wnid), index, and human name when known."""

    index: int
    wnid: str
    name: str = ""


SCHEMA = pa.schema(
    [
        ("id", pa.string()),
        ("split", pa.string()),
        ("rel_path", pa.string()),
        ("wnid", pa.string()),
        ("label", pa.int32()),
        ("size", pa.int64()),
        ("mtime", pa.float64()),
        ("container", pa.string()),
        ("offset", pa.int64()),
        ("etag", pa.string()),
    ]
)
_FIELDS = [f.name for f in fields(Candidate)]


def write_manifest(candidates: Iterable[Candidate], path: Path, metadata: dict[str, str] | None = None) -> int:
    """Stream CANDIDATES into a Parquet file in batches (flat memory); returns the row count."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".partial")
    schema = SCHEMA.with_metadata({k.encode(): v.encode() for k, v in (metadata or {}).items()})
    rows = 0
    with pq.ParquetWriter(tmp, schema, compression="zstd") as writer:
        batch: dict[str, list[object]] = {name: [] for name in _FIELDS}
        for cand in candidates:
            for name in _FIELDS:
                batch[name].append(getattr(cand, name))
            rows += 1
            if len(batch["id"]) >= BATCH_ROWS:
                writer.write_batch(pa.record_batch(batch, schema=schema))
                batch = {name: [] for name in _FIELDS}
        if batch["id"] or rows == 0:
            writer.write_batch(pa.record_batch(batch, schema=schema))
    tmp.replace(path)
    return rows


def iter_manifest(path: Path, columns: list[str] | None = None) -> Iterator[Candidate]:
    """Candidates from a manifest, batch by batch."""
    pf = pq.ParquetFile(path)
    for batch in pf.iter_batches(batch_size=BATCH_ROWS):
        for row in batch.to_pylist():
            yield Candidate(**row)


def chunked(items: Iterable[Candidate], size: int) -> Iterator[list[Candidate]]:
    """Consecutive lists of at most SIZE candidates (streams: one list in memory at a time)."""
    it = iter(items)
    while chunk := list(islice(it, size)):
        yield chunk


def manifest_metadata(path: Path) -> dict[str, str]:
    """Key/value metadata stored with the manifest (dataset name, layout, source root)."""
    meta = pq.read_schema(path).metadata or {}
    return {k.decode(): v.decode() for k, v in meta.items() if not k.startswith(b"ARROW")}


def write_classes(classes: list[ClassInfo], path: Path) -> None:
    path.write_text(json.dumps([asdict(c) for c in classes], indent=1) + "\n")


def read_classes(path: Path) -> list[ClassInfo]:
    return [ClassInfo(**c) for c in json.loads(path.read_text())]
