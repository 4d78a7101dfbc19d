"""What a read-back check must read: the ids, labels and recorded sha256 of one dataset version (or split).

Each loader refuses a version that is not finished (Cassandra: status ``complete``; shards and files: a
published ``manifest.json``) unless asked explicitly, and names what it looked for.
"""

from __future__ import annotations

import io
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from imgest.core import workdir
from imgest.core.errors import ImgestError
from imgest.readback.measure import Expected
from imgest.sinks.cassandra.versions import version_rows


class NotReadableError(ImgestError):
    """The dataset version is missing or not finished."""


@dataclass
class ReadSet:
    """One dataset version (or split of it) to read back."""

    kind: str  # cassandra | shards | files
    location: str
    ids: list[str]
    labels: np.ndarray
    expected: dict[str, Expected]
    bytes: int = 0
    paths: list[str] = field(default_factory=list)  # files: absolute paths, in ids order
    shards: list[str] = field(default_factory=list)  # shards: names of the tars holding the split
    table: str = ""  # cassandra: keyspace.data table
    version: str = ""

    def __len__(self) -> int:
        return len(self.ids)

    def subset(self, n: int | None) -> ReadSet:
        """The first N items (all when N is None): for quick checks on big datasets."""
        if n is None or n >= len(self.ids) or self.kind == "shards":
            return self
        ids = self.ids[:n]
        return ReadSet(
            self.kind,
            self.location,
            ids,
            self.labels[:n],
            {i: self.expected[i] for i in ids},
            self.bytes,
            self.paths[:n],
            self.shards,
            self.table,
            self.version,
        )


def files_set(root: Path, split: str | None = "train") -> ReadSet:
    """A published files dataset (its manifest.json) or NotReadableError."""
    from imgest.sinks.files.layout import FilesDatasetError, iter_files, read_manifest

    try:
        version = read_manifest(root).get("version", "")
        items = list(iter_files(root, split))
    except FilesDatasetError as exc:
        raise NotReadableError(str(exc)) from None
    return ReadSet(
        "files",
        str(root),
        [f.id for f in items],
        np.array([f.label for f in items], dtype=np.int32),
        {f.id: Expected(f.label, f.sha256) for f in items},
        sum(f.bytes for f in items),
        paths=[str(root / f.path) for f in items],
        version=version,
    )


def shards_set(store: Any, split: str | None = "train") -> ReadSet:
    """A published shard dataset (manifest.json + samples.parquet); sha256 comes with each sample's .json."""
    import pyarrow.parquet as pq

    manifest = store.read_manifest()
    if manifest is None:
        raise NotReadableError(f"{store.location} holds no published shard dataset (no manifest.json)")
    chunks = store.read_chunks(workdir.PUBLISHED_SAMPLES)
    if chunks is None:
        raise NotReadableError(f"{store.location} has no {workdir.PUBLISHED_SAMPLES}")
    table = pq.read_table(io.BytesIO(b"".join(chunks)), columns=["id", "label", "split"])
    rows = [r for r in table.to_pylist() if split is None or r["split"] == split]
    shards = [s["name"] for s in manifest["shards"] if split is None or s["split"] == split]
    return ReadSet(
        "shards",
        store.location,
        [r["id"] for r in rows],
        np.array([r["label"] for r in rows], dtype=np.int32),
        {r["id"]: Expected(r["label"], None) for r in rows},
        sum(s["bytes"] for s in manifest["shards"] if s["name"] in set(shards)),
        shards=shards,
    )


def cassandra_set(
    session: Any,
    tables: Any,
    dataset: str,
    version: str | None = None,
    split: str | None = "train",
    allow_incomplete: bool = False,
) -> ReadSet:
    """The rows of one version of DATASET in TABLES (a TableLayout); the newest complete version by default."""
    ks = tables.keyspace
    records = list(session.execute(f"SELECT version, status FROM {ks}.dataset_versions WHERE dataset = %s", (dataset,)))
    if version is not None:
        records = [r for r in records if r.version == version]
    if not records:
        raise NotReadableError(f"no version {version or ''} of dataset {dataset!r} in {ks}.dataset_versions")
    ready = [r for r in records if r.status == "complete" or allow_incomplete]
    if not ready:
        states = ", ".join(f"{r.version}={r.status}" for r in records)
        raise NotReadableError(
            f"dataset {dataset!r} in {ks} has no complete version ({states}); verify it first, or allow incomplete"
        )
    chosen = ready[-1].version
    meta = tables.metadata_table(split or "train")
    ids, labels, expected, nbytes = [], [], {}, 0
    rows = version_rows(session, f"{ks}.{meta}", dataset, chosen, "id, label, split, sha256, nbytes")
    for row in rows:  # this version's rows only: other datasets and versions in the table are left out
        if split is not None and row.split != split:
            continue
        ids.append(str(row.id))
        labels.append(row.label)
        expected[str(row.id)] = Expected(row.label, row.sha256)
        nbytes += row.nbytes or 0
    return ReadSet(
        "cassandra",
        f"{ks}.{tables.data_table(split or 'train')}",
        ids,
        np.array(labels, dtype=np.int32),
        expected,
        nbytes,
        table=f"{ks}.{tables.data_table(split or 'train')}",
        version=chosen,
    )


def json_meta(raw: np.ndarray) -> dict[str, Any]:
    """The .json member of a shard sample as a dict."""
    return json.loads(raw.tobytes())
