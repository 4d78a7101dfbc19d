"""Where split files get their (id, label) rows: Cassandra metadata, a shard dataset, or a cache file."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from imgest.core.errors import ImgestError
from imgest.sinks.cassandra.schema import identifier
from imgest.sinks.shards.store import ShardStore, samples_object
from imgest.splits.split import id_strings


@dataclass
class LabelledRows:
    """Row ids and integer labels, with where they live. Ids are UUID strings, or 16-byte UUIDs ('S16') when read
    from Cassandra (imgest.splits.split.id_strings formats them)."""

    ids: np.ndarray
    labels: np.ndarray
    num_classes: int
    source: dict[str, Any] = field(default_factory=dict)

    def save(self, path: Path) -> None:
        """The metadata cache (--metadata-ofn): Parquet with the source in its schema metadata."""
        table = pa.table({"id": id_strings(self.ids).astype(str), "label": self.labels.astype(np.int32)})
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


def _version_columns(
    session: Any, metadata_table: str, dataset: str, version: str | list[str], only_split: str | None, **scan: Any
) -> tuple[np.ndarray, np.ndarray]:
    """(ids as 16-byte UUIDs, int32 labels) of one version's rows (VERSION: its members), from a token-range scan in
    bounded batches."""
    from imgest.sinks.cassandra.scan import scan_columns, uuid_column

    ids, labels = [], []
    for batch in scan_columns(session, metadata_table, ["id", "label", "split"], dataset, version, **scan):
        if only_split is not None:
            batch = batch.filter(pc.equal(batch.column("split"), only_split))
        ids.append(uuid_column(batch.column("id")))
        labels.append(batch.column("label").fill_null(-1).to_numpy().astype(np.int32))
    if not ids:
        return np.zeros(0, dtype="S16"), np.zeros(0, dtype=np.int32)
    return np.concatenate(ids), np.concatenate(labels)


def from_cassandra(
    session: Any,
    metadata_table: str,
    data_table: str,
    only_split: str | None = None,
    dataset: str | None = None,
    version: str | None = None,
    **scan: Any,
) -> LabelledRows:
    """Rows of one version in METADATA_TABLE ('ks.table'): DATASET / VERSION, or the only active version there
    (the complete one first); ONLY_SPLIT keeps the rows of one original split. Rows of other datasets or
    versions in the same table are never read; the class count is that version's class map. Read by a
    token-range scan (SCAN: its knobs) into numpy columns: ids are 16-byte UUIDs ('S16'), sorted, so the same
    rows always give the same split whatever order the table returns them in."""
    from imgest.sinks.cassandra.versions import resolve

    ks, meta = qualified(metadata_table, "metadata table")
    qualified(data_table, "data table")
    record = resolve(session, f"{ks}.{meta}", dataset, version)
    ids, labels = _version_columns(session, f"{ks}.{meta}", record.dataset, record.members, only_split, **scan)
    where = f"{metadata_table} for {record.dataset} version {record.version}"
    if not len(ids):
        raise ImgestError(f"no rows in {where}" + (f" for split {only_split!r}" if only_split else ""))
    classes = len(record.class_map) or int(labels.max()) + 1
    order = np.argsort(ids, kind="stable")  # byte order of the UUIDs = the order of their strings
    source = {
        "kind": "cassandra",
        "data_table": data_table,
        "metadata_table": metadata_table,
        "dataset": record.dataset,
        "version": record.version,
    }
    return LabelledRows(ids[order], labels[order], classes, source)


UUID_CHUNK = 65_536  # ids converted at a time: the temporaries stay a few MB whatever the count


def uuid_bytes(ids: pa.ChunkedArray | pa.Array, chunk: int = UUID_CHUNK) -> np.ndarray:
    """UUID strings (36 characters, any case) as 16-byte UUIDs ('S16'), vectorized over the string buffer CHUNK
    ids at a time: no Python object per id, and only the output grows with the count. Byte order sorts like the
    lowercase strings."""
    text = ids.combine_chunks() if isinstance(ids, pa.ChunkedArray) else ids
    out = np.empty((len(text), 16), dtype=np.uint8)
    for start in range(0, len(text), chunk):
        out[start : start + chunk] = _uuid_chunk(text.slice(start, chunk))
    return out.view("S16").ravel()


def _uuid_chunk(text: pa.Array) -> np.ndarray:
    """One slice of UUID strings as an (n, 16) uint8 array."""
    if text.null_count or not pc.all(pc.equal(pc.utf8_length(text), 36)).as_py():
        raise ImgestError("sample ids must be UUID strings of 36 characters")
    text = pc.utf8_lower(text)
    offsets = np.frombuffer(text.buffers()[1], dtype=np.int32)[text.offset : text.offset + len(text) + 1]
    raw = np.frombuffer(text.buffers()[2], dtype=np.uint8)[offsets[0] : offsets[-1]].reshape(len(text), 36)
    hexdigits = np.delete(raw, [8, 13, 18, 23], axis=1)
    nibbles = np.where(hexdigits >= ord("a"), hexdigits - ord("a") + 10, hexdigits - ord("0")).astype(np.uint8)
    return (nibbles[:, 0::2] << 4) | nibbles[:, 1::2]


def from_shards(store: ShardStore, only_split: str | None = None) -> LabelledRows:
    """Rows of a published shard dataset (its samples.parquet and manifest.json): only the id, label and split
    columns are read, ids become 16-byte UUIDs ('S16', sorted), never one Python object per row."""
    manifest = store.read_manifest()
    samples = samples_object(manifest or {})
    chunks = store.read_chunks(samples) if manifest is not None else None
    if manifest is None or chunks is None:
        raise ImgestError(f"{store.location} holds no published shard dataset (manifest.json and {samples})")
    table = pq.read_table(pa.BufferReader(b"".join(chunks)), columns=["id", "label", "split"])
    if only_split is not None:
        table = table.filter(pc.equal(table.column("split"), only_split))
    ids = uuid_bytes(table.column("id"))
    labels = table.column("label").to_numpy().astype(np.int32)
    del table
    order = np.argsort(ids, kind="stable")
    source = {"kind": "shards", "location": store.location, "samples": samples}
    return LabelledRows(ids[order], labels[order], len(manifest["classes"]), source)
