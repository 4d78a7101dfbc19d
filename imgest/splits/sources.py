"""Where split files get their (id, label) rows: Cassandra metadata, a shard dataset, or a cache file."""

from __future__ import annotations

import io
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from imgest.core import workdir
from imgest.core.errors import ImgestError
from imgest.sinks.cassandra.schema import identifier
from imgest.sinks.shards.store import ShardStore


@dataclass
class LabelledRows:
    """Row ids (UUID strings) and integer labels, with where they live."""

    ids: np.ndarray
    labels: np.ndarray
    num_classes: int
    source: dict[str, Any] = field(default_factory=dict)

    def save(self, path: Path) -> None:
        """The metadata cache (--metadata-ofn): Parquet with the source in its schema metadata."""
        table = pa.table({"id": self.ids.astype(str), "label": self.labels.astype(np.int32)})
        meta = {b"imgest_source": json.dumps(self.source).encode(), b"num_classes": str(self.num_classes).encode()}
        pq.write_table(table.replace_schema_metadata(meta), path)

    @classmethod
    def load(cls, path: Path) -> LabelledRows:
        """Read a cache written by save (--metadata-ifn)."""
        table = pq.read_table(path)
        meta = table.schema.metadata or {}
        if b"num_classes" not in meta:
            raise ImgestError(f"{path} is not an imgest metadata cache (written with --metadata-ofn)")
        return cls(
            np.asarray(table.column("id").to_pylist()),
            table.column("label").to_numpy(),
            int(meta[b"num_classes"]),
            json.loads(meta[b"imgest_source"]),
        )


def qualified(name: str, what: str) -> tuple[str, str]:
    """'keyspace.table' split and validated."""
    keyspace, _, table = name.partition(".")
    return identifier(keyspace, f"{what} keyspace"), identifier(table, what)


def from_cassandra(
    session: Any,
    metadata_table: str,
    data_table: str,
    only_split: str | None = None,
    dataset: str | None = None,
    version: str | None = None,
) -> LabelledRows:
    """Rows of one version in METADATA_TABLE ('ks.table'): DATASET / VERSION, or the only active version there
    (the complete one first); ONLY_SPLIT keeps the rows of one original split. Rows of other datasets or
    versions in the same table are never read; the class count is that version's class map."""
    from imgest.sinks.cassandra.versions import resolve, version_rows

    ks, meta = qualified(metadata_table, "metadata table")
    qualified(data_table, "data table")
    record = resolve(session, f"{ks}.{meta}", dataset, version)
    ids, labels = [], []
    for row in version_rows(session, f"{ks}.{meta}", record.dataset, record.version, "id, label, split"):
        if only_split is None or row.split == only_split:
            ids.append(str(row.id))
            labels.append(row.label)
    where = f"{metadata_table} for {record.dataset} version {record.version}"
    if not ids:
        raise ImgestError(f"no rows in {where}" + (f" for split {only_split!r}" if only_split else ""))
    classes = len(record.class_map) or max(labels) + 1
    order = np.argsort(ids)  # a source-independent order: the same rows always give the same split
    source = {
        "kind": "cassandra",
        "data_table": data_table,
        "metadata_table": metadata_table,
        "dataset": record.dataset,
        "version": record.version,
    }
    return LabelledRows(np.asarray(ids)[order], np.asarray(labels)[order], classes, source)


def from_shards(store: ShardStore, only_split: str | None = None) -> LabelledRows:
    """Rows of a published shard dataset (its samples.parquet and manifest.json)."""
    manifest = store.read_manifest()
    chunks = store.read_chunks(workdir.PUBLISHED_SAMPLES)
    if manifest is None or chunks is None:
        raise ImgestError(
            f"{store.location} holds no published shard dataset (manifest.json and {workdir.PUBLISHED_SAMPLES})"
        )
    table = pq.read_table(io.BytesIO(b"".join(chunks)))
    if only_split is not None:
        table = table.filter(pc.equal(table.column("split"), only_split))
    table = table.sort_by("id")
    source = {"kind": "shards", "location": store.location, "samples": workdir.PUBLISHED_SAMPLES}
    return LabelledRows(
        np.asarray(table.column("id").to_pylist()), table.column("label").to_numpy(), len(manifest["classes"]), source
    )
