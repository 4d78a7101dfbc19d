"""Where split files get their (id, label) rows: Cassandra metadata, a shard dataset, or a cache file."""

from __future__ import annotations

import json
import tempfile
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from imgest.core.errors import ImgestError
from imgest.core.textcols import uuid_text
from imgest.sinks.cassandra.schema import identifier
from imgest.sinks.shards.store import ShardStore
from imgest.sinks.shards.store_names import samples_object


@dataclass
class LabelledRows:
    """Row ids and integer labels, with where they live. Ids are 16-byte UUIDs ('S16') from every source
    (Cassandra, a shard dataset, the metadata cache; imgest.splits.split.id_strings formats them), or strings
    where a caller gives strings."""

    ids: np.ndarray
    labels: np.ndarray
    num_classes: int
    source: dict[str, Any] = field(default_factory=dict)

    def save(self, path: Path) -> None:
        """The metadata cache (--metadata-ofn): Parquet with the source in its schema metadata. 16-byte UUIDs are
        stored as they are (``fixed_size_binary(16)``, 16 bytes a row, nothing formatted); other ids as strings."""
        ids = np.asarray(self.ids)
        if ids.dtype == np.dtype("S16"):
            column = pa.Array.from_buffers(pa.binary(16), len(ids), [None, pa.py_buffer(np.ascontiguousarray(ids))])
        else:
            column = pa.array(ids.astype(str, copy=False))
        table = pa.table({"id": column, "label": self.labels.astype(np.int32)})
        meta = {b"imgest_source": json.dumps(self.source).encode(), b"num_classes": str(self.num_classes).encode()}
        pq.write_table(table.replace_schema_metadata(meta), path)

    @classmethod
    def load(cls, path: Path) -> LabelledRows:
        """Read a cache written by save (--metadata-ifn): ids come back as 16-byte UUIDs ('S16'), also from a
        cache of UUID strings (as imgest wrote it before); ids that are not UUIDs come back as strings."""
        source = pq.ParquetFile(path)
        meta = source.schema_arrow.metadata or {}
        if b"num_classes" not in meta:
            raise ImgestError(f"{path} is not an imgest metadata cache (written with --metadata-ofn)")
        ids, labels = _cached_columns(source)
        return cls(ids, labels, int(meta[b"num_classes"]), json.loads(meta[b"imgest_source"]))


def _cached_columns(source: pq.ParquetFile) -> tuple[np.ndarray, np.ndarray]:
    """(ids, labels) of a metadata cache, read UUID_CHUNK rows at a time into the two output columns: ids as 'S16'
    (stored as 16 bytes, or as canonical UUID strings). A cache of other ids is read whole, its ids as strings."""
    rows = source.metadata.num_rows
    ids, labels = np.empty(rows, dtype="S16"), np.empty(rows, dtype=np.int32)
    start = 0
    for batch in source.iter_batches(batch_size=UUID_CHUNK, columns=["id", "label"]):
        chunk = _uuid_column(batch.column("id"))
        if chunk is None:  # not UUIDs: the strings as they are
            table = source.read(columns=["id", "label"])
            return np.asarray(table.column("id").to_pylist()), table.column("label").to_numpy()
        ids[start : start + len(chunk)] = chunk
        labels[start : start + len(chunk)] = batch.column("label").to_numpy(zero_copy_only=False)
        start += len(chunk)
    return ids, labels


def _uuid_column(ids: pa.Array) -> np.ndarray | None:
    """IDS as 16-byte UUIDs ('S16'): ``fixed_size_binary(16)`` as it is, strings that are all canonical UUIDs
    (lowercase, 36 characters: they format back to the same bytes) converted; None for any other ids."""
    if pa.types.is_fixed_size_binary(ids.type) and ids.type.byte_width == 16 and not ids.null_count:
        if not len(ids):
            return np.zeros(0, dtype="S16")
        return np.frombuffer(ids.buffers()[1], dtype="S16", count=len(ids), offset=ids.offset * 16).copy()
    if not pa.types.is_string(ids.type) or ids.null_count:
        return None
    ascii36 = pc.and_(pc.equal(pc.binary_length(ids), 36), pc.equal(pc.utf8_length(ids), 36))
    if not pc.all(ascii36).as_py():
        return None
    if not len(ids):
        return np.zeros(0, dtype="S16")
    raw = np.ascontiguousarray(_uuid_chunk(ids)).view("S16").ravel()
    return raw if np.array_equal(uuid_text(raw), _text_bytes(ids)) else None


def _text_bytes(text: pa.Array) -> np.ndarray:
    """A slice of 36-character strings as an (n, 36) uint8 array of their bytes (a view of the string buffer)."""
    offsets = np.frombuffer(text.buffers()[1], dtype=np.int32)[text.offset : text.offset + len(text) + 1]
    return np.frombuffer(text.buffers()[2], dtype=np.uint8)[offsets[0] : offsets[-1]].reshape(len(text), 36)


def qualified(name: str, what: str) -> tuple[str, str]:
    """'keyspace.table' split and validated."""
    keyspace, _, table = name.partition(".")
    return identifier(keyspace, f"{what} keyspace"), identifier(table, what)


def _version_columns(
    session: Any, metadata_table: str, dataset: str, version: str | list[str], only_split: str | None, **scan: Any
) -> tuple[np.ndarray, np.ndarray]:
    """(ids as 16-byte UUIDs, int32 labels) of one version's rows (VERSION: its members), sorted by id, from a
    token-range scan in bounded batches. Memory: the two output columns (20 bytes a row) and one batch: the scan is
    spilled to a temporary file as it streams in (counting the ids per first byte), then read back into each
    row's bucket of the output (bucket_sorted)."""
    from imgest.sinks.cassandra.scan import scan_columns, uuid_column

    counts = np.zeros(256, dtype=np.int64)
    with tempfile.TemporaryDirectory(prefix="imgest-split-") as tmp:
        ids_file, labels_file = Path(tmp) / "ids", Path(tmp) / "labels"
        with ids_file.open("wb") as ids_out, labels_file.open("wb") as labels_out:
            for batch in scan_columns(session, metadata_table, ["id", "label", "split"], dataset, version, **scan):
                if only_split is not None:
                    batch = batch.filter(pc.equal(batch.column("split"), only_split))
                ids = uuid_column(batch.column("id"))
                counts += np.bincount(_first_byte(ids), minlength=256)
                ids_out.write(ids.tobytes())
                labels_out.write(batch.column("label").fill_null(-1).to_numpy().astype(np.int32).tobytes())
        return bucket_sorted(lambda: _spilled(ids_file, labels_file), counts)


def _spilled(ids_file: Path, labels_file: Path, rows: int = 8 * 8_192) -> Iterator[tuple[np.ndarray, np.ndarray]]:
    """The (ids, labels) that _version_columns spilled, ROWS at a time."""
    with ids_file.open("rb") as ids_in, labels_file.open("rb") as labels_in:
        while len(ids := np.fromfile(ids_in, dtype="S16", count=rows)):
            yield ids, np.fromfile(labels_in, dtype=np.int32, count=len(ids))


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
    source = {
        "kind": "cassandra",
        "data_table": data_table,
        "metadata_table": metadata_table,
        "dataset": record.dataset,
        "version": record.version,
    }
    return LabelledRows(ids, labels, classes, source)


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
    raw = _text_bytes(pc.utf8_lower(text))
    hexdigits = np.delete(raw, [8, 13, 18, 23], axis=1)
    nibbles = np.where(hexdigits >= ord("a"), hexdigits - ord("a") + 10, hexdigits - ord("0")).astype(np.uint8)
    return (nibbles[:, 0::2] << 4) | nibbles[:, 1::2]


def from_shards(store: ShardStore, only_split: str | None = None) -> LabelledRows:
    """Rows of a published shard dataset (its samples.parquet and manifest.json): only the id, label and split
    columns are read, ids become 16-byte UUIDs ('S16', sorted), never one Python object per row. Memory: the
    two output columns (20 bytes a row) and one batch; samples.parquet is streamed to a temporary file, read
    twice (a counting pass, then each row placed into its first id byte's bucket, each bucket sorted in place)."""
    manifest = store.read_manifest()
    samples = samples_object(manifest or {})
    chunks = store.read_chunks(samples) if manifest is not None else None
    if manifest is None or chunks is None:
        raise ImgestError(f"{store.location} holds no published shard dataset (manifest.json and {samples})")
    with tempfile.TemporaryDirectory(prefix="imgest-split-") as tmp:
        local = Path(tmp) / "samples.parquet"
        with local.open("wb") as fh:
            for chunk in chunks:
                fh.write(chunk)
        ids, labels = sorted_columns(pq.ParquetFile(local, buffer_size=1 << 20, pre_buffer=False), only_split)
    source = {"kind": "shards", "location": store.location, "samples": samples}
    return LabelledRows(ids, labels, len(manifest["classes"]), source)


SAMPLE_BATCH_ROWS = 8_192  # samples.parquet rows decoded at a time


def sorted_columns(samples: pq.ParquetFile, only_split: str | None) -> tuple[np.ndarray, np.ndarray]:
    """(ids as 16-byte UUIDs, int32 labels) of SAMPLES' rows (of ONLY_SPLIT), sorted by id (byte order), in memory
    of the output plus one batch: a counting pass finds how many ids start with each byte, then bucket_sorted."""
    counts = np.zeros(256, dtype=np.int64)
    for ids, _ in _sample_batches(samples, only_split, with_labels=False):
        counts += np.bincount(_first_byte(ids), minlength=256)
    return bucket_sorted(lambda: _sample_batches(samples, only_split, with_labels=True), counts)


def bucket_sorted(
    batches: Callable[[], Iterator[tuple[np.ndarray, np.ndarray]]], counts: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """The (ids, labels) of BATCHES sorted by id, COUNTS being how many ids start with each byte: every row is put
    in its byte's bucket of the output, then each bucket is sorted in place (memory: the output and a batch)."""
    ends = np.cumsum(counts)
    starts = ends - counts
    out_ids, out_labels = np.empty(int(ends[-1]), dtype="S16"), np.empty(int(ends[-1]), dtype=np.int32)
    cursor = starts.copy()
    for ids, labels in batches():
        first = _first_byte(ids)
        order = np.argsort(first, kind="stable")
        first = first[order]
        here = np.bincount(first, minlength=256)
        rank = np.arange(len(first)) - (np.cumsum(here) - here)[first]  # place within its byte's run
        at = cursor[first] + rank
        out_ids[at], out_labels[at] = ids[order], labels[order]
        cursor += here
    for start, end in zip(starts.tolist(), ends.tolist(), strict=True):
        if end - start > 1:
            order = np.argsort(out_ids[start:end], kind="stable")
            out_ids[start:end] = out_ids[start:end][order]
            out_labels[start:end] = out_labels[start:end][order]
    return out_ids, out_labels


def _first_byte(ids: np.ndarray) -> np.ndarray:
    return np.frombuffer(ids.tobytes(), dtype=np.uint8)[::16] if len(ids) else np.zeros(0, np.uint8)


def _sample_batches(
    samples: pq.ParquetFile, only_split: str | None, with_labels: bool
) -> Iterator[tuple[np.ndarray, np.ndarray]]:
    """(ids as 16-byte UUIDs, int32 labels or an empty array) of every batch of SAMPLES, filtered to ONLY_SPLIT."""
    columns = ["id", "split", "label"] if with_labels else ["id", "split"]
    for batch in samples.iter_batches(batch_size=SAMPLE_BATCH_ROWS, columns=columns):
        if only_split is not None:
            batch = batch.filter(pc.equal(batch.column("split"), only_split))
        labels = batch.column("label").to_numpy(zero_copy_only=False) if with_labels else np.zeros(0)
        yield uuid_bytes(batch.column("id")), labels.astype(np.int32)
