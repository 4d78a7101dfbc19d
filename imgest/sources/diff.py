"""What changed in a source since the last stored version: added, changed, removed, unchanged images.

A refresh scans again and compares the new manifest with the baseline (the manifest of the last complete
version plus each image's source sha256). Same id, size, mtime and label: unchanged, not read. An object of an
S3 source compares its ETag instead of its mtime (a re-upload of the same bytes keeps the ETag). Size or mtime
differ: the file is hashed and only a different hash (or label) makes it changed. Ids are deterministic
(dataset/split/path), so a changed image keeps its id and is re-ingested in place.

The first version reads no file here: every row is added, and the ingest job, which reads every byte anyway,
records each image's source sha256 with it (Cassandra's metadata ``src_sha256``). Its baseline leaves the hash
empty; when such a row later looks changed (size or mtime), the hash recorded at ingest is asked for (``known``,
O(suspects)); without one the row counts as changed and is re-ingested in place, and the baseline keeps the hash
from then on.

Memory stays flat whatever the dataset's size: the baseline's ids are held as sorted 64-bit keys (12 bytes a row,
a seeded hash of each id), the manifest is read, compared and written READ_ROWS rows at a time, and the baseline
rows a chunk matches are read back from the row groups holding them (their id compared too: a key collision
never matches two different ids). Besides the keys, one byte a row of each file (what happened to it).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field, fields
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from imgest.sources.diff_index import READ_ROWS, KeyIndex, RowReader, index_baseline
from imgest.sources.manifest import Candidate
from imgest.sources.source_hash import HASH_COLUMN, MISSING_HASH, hash_candidates

COMPARED = ("size", "mtime", "label", "wnid")  # equal in the baseline: unchanged, the file is not read
ETAG = "etag"  # an S3 object's: compared instead of the mtime when the row has one
HASH_CHUNK = 4096  # suspects hashed (and held as Python rows) at a time
READ_BUFFER = 1 << 20  # bytes of a column chunk read at a time (else a whole row group's chunk is read at once)
CANDIDATE = frozenset(f.name for f in fields(Candidate))
_SAME, _ADDED, _CHANGED, _SAME_BYTES = 0, 1, 2, 3  # what diff_manifest found of a row (_SAME_BYTES: hashed, equal)
_BEFORE = ("id", *COMPARED, ETAG, HASH_COLUMN)  # the baseline's columns a comparison reads
_BEFORE_SCHEMA = pa.schema(  # their types (a first version has no baseline)
    [
        ("id", pa.string()),
        ("size", pa.int64()),
        ("mtime", pa.float64()),
        ("label", pa.int32()),
        ("wnid", pa.string()),
        (ETAG, pa.string()),
        (HASH_COLUMN, pa.string()),
    ]
)


# (id, split) of baseline rows whose source sha256 the baseline lacks -> the sha256 recorded when they were ingested
KnownHashes = Callable[[list[tuple[str, str]]], dict[str, str]]


def open_parquet(path: Path) -> pq.ParquetFile:
    """PATH for reading a batch at a time: its pages are streamed through a READ_BUFFER buffer, so a large row
    group costs no more memory than a small one."""
    return pq.ParquetFile(path, buffer_size=READ_BUFFER, pre_buffer=False)


def _no_ids() -> pa.Array:
    return pa.array([], pa.string())


def _no_rows(dtype: type = np.uint8) -> np.ndarray:
    return np.zeros(0, dtype)


@dataclass
class SourceChanges:
    """Ids per kind of change, as Arrow string arrays (a first version adds, a removed source removes, every row:
    no Python object per row); ``unchanged`` is a count (those rows are not touched). ``kinds`` says what happened
    to each row of the manifest (one byte a row, manifest order) and ``removed_at`` holds the baseline's row
    numbers of the removed images (ascending): the delta and removed files are written from them by streaming."""

    added: pa.Array = field(default_factory=_no_ids)
    changed: pa.Array = field(default_factory=_no_ids)
    removed: pa.Array = field(default_factory=_no_ids)
    unchanged: int = 0
    touched_same_bytes: int = 0  # size or mtime differed but the hash did not: unchanged, not re-ingested
    kinds: np.ndarray = field(default_factory=_no_rows)
    removed_at: np.ndarray = field(default_factory=lambda: _no_rows(np.int64))

    @property
    def any(self) -> bool:
        return len(self.added) + len(self.changed) + len(self.removed) > 0

    def all_changed(self, manifest: Path) -> SourceChanges:
        """These changes with every row of MANIFEST (the one compared) that is not added counted as changed."""
        kinds = np.full(len(self.kinds), _CHANGED, np.uint8)
        kinds[self.kinds == _ADDED] = _ADDED
        changed = ids_where(manifest, kinds == _CHANGED)
        return SourceChanges(self.added, changed, self.removed, 0, self.touched_same_bytes, kinds, self.removed_at)

    def rewritten(self) -> pa.Array:
        """The ids the job writes: added, then changed."""
        return pa.concat_arrays([self.added, self.changed])

    def rewritten_rows(self) -> np.ndarray:
        """A mask over the manifest's rows: True where the job writes the row (added or changed)."""
        return (self.kinds == _ADDED) | (self.kinds == _CHANGED)

    def touched(self) -> pa.Array:
        """The ids of the last version that are gone or different: removed, then changed."""
        return pa.concat_arrays([self.removed, self.changed])

    def counts(self) -> dict[str, int]:
        return {
            "added": len(self.added),
            "changed": len(self.changed),
            "removed": len(self.removed),
            "unchanged": self.unchanged,
        }


def _array(ids: pa.Array | pa.ChunkedArray | list[str]) -> pa.Array:
    """IDS as one Arrow string array."""
    if isinstance(ids, pa.ChunkedArray):
        return ids.combine_chunks() if ids.num_chunks else pa.array([], ids.type)
    if isinstance(ids, pa.Array):
        return ids
    return pa.array(ids, pa.string())


def _before_reader(baseline: pq.ParquetFile | None) -> RowReader | None:
    """A reader of the baseline's compared columns (None when there is no baseline)."""
    if baseline is None:
        return None
    present = set(baseline.schema_arrow.names)
    return RowReader(baseline, [c for c in _BEFORE if c in present])


def _before(reader: RowReader | None, at: np.ndarray) -> pa.Table:
    """The baseline's compared columns at the rows AT (-1: null), with an ``etag`` ('' when it has none)."""
    if reader is None or not np.any(at >= 0):
        return pa.table({f.name: pa.nulls(len(at), f.type) for f in _BEFORE_SCHEMA})
    return _with_etag(reader.take(at))


@contextmanager
def parquet_writer(path: Path, schema: pa.Schema) -> Iterator[pq.ParquetWriter]:
    """A writer of PATH that publishes it only when the block ends without error (a crash leaves the old file)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".partial")
    try:
        with pq.ParquetWriter(tmp, schema, compression="zstd") as writer:
            yield writer
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    tmp.replace(path)


def diff_manifest(
    manifest: Path,
    baseline: Path | None,
    root: Path,
    new_baseline: Path,
    chunk: int = HASH_CHUNK,
    known: KnownHashes | None = None,
) -> SourceChanges:
    """Compare MANIFEST with BASELINE (None: everything is added, no file read); returns the changes and writes
    NEW_BASELINE (the manifest's rows with their source sha256, '' where not read yet). Compared as Arrow columns
    READ_ROWS rows at a time (64-bit id keys locate each row in the baseline), never one Python object per row;
    only the suspects (added, or size / mtime / label differ) are read and hashed, CHUNK at a time. KNOWN gives
    the hash recorded at ingest of a suspect whose baseline row has none."""
    old = open_parquet(baseline) if baseline is not None and baseline.is_file() else None
    index = index_baseline(old, baseline)
    reader = _before_reader(old)
    source = open_parquet(manifest)
    kinds = np.zeros(source.metadata.num_rows, np.uint8)
    seen = np.zeros(index.size, bool)
    found: dict[int, list[pa.Array]] = {_ADDED: [], _CHANGED: []}
    unchanged, start = 0, 0
    with parquet_writer(new_baseline, _baseline_schema(source.schema_arrow)) as writer:
        for batch in source.iter_batches(batch_size=READ_ROWS):
            table = _with_etag(pa.Table.from_batches([batch]))
            part = _compare(table, reader, index, root, chunk, known)
            seen[part.rows[part.rows >= 0]] = True
            kinds[start : start + table.num_rows] = part.kinds
            unchanged += part.unchanged
            for kind, ids in found.items():
                ids.append(_array(table.column("id").filter(pa.array(part.kinds == kind))))
            writer.write_table(pa.Table.from_arrays([*table.columns, part.hashes], schema=writer.schema))
            start += table.num_rows
    seen[index.aliases] = seen[index.alias_of]
    removed_at = np.flatnonzero(~seen)
    removed = RowReader(old, ["id"]).take(removed_at).column("id") if old is not None else _no_ids()
    removed = _array(removed)
    same_bytes = int(np.count_nonzero(kinds == _SAME_BYTES))
    return SourceChanges(
        added=pa.concat_arrays([_no_ids(), *found[_ADDED]]),
        changed=pa.concat_arrays([_no_ids(), *found[_CHANGED]]),
        removed=removed.take(pc.sort_indices(removed)),
        unchanged=unchanged + same_bytes,
        touched_same_bytes=same_bytes,
        kinds=kinds,
        removed_at=removed_at,
    )


@dataclass
class _Compared:
    """One chunk of the manifest compared: each row's baseline row (-1: none), kind and source sha256."""

    rows: np.ndarray
    kinds: np.ndarray
    hashes: pa.Array
    unchanged: int


def _compare(
    table: pa.Table, old: RowReader | None, index: KeyIndex, root: Path, chunk: int, known: KnownHashes | None
) -> _Compared:
    """Compare TABLE (a chunk of the manifest, with an etag column) with its rows in the baseline (read by OLD)."""
    if old is None:  # a first version: every row added, none read (the ingest records each hash)
        unread = pa.array(np.full(table.num_rows, MISSING_HASH, object), pa.string())
        return _Compared(np.full(table.num_rows, -1, np.int64), np.full(table.num_rows, _ADDED, np.uint8), unread, 0)
    at = index.find(table.column("id"))
    before = _before(old, at)
    match = pc.fill_null(pc.equal(table.column("id"), before.column("id")), False)  # a key collision: no match
    at = np.where(match.to_numpy(zero_copy_only=False), at, -1)
    equal = {c: pc.fill_null(pc.equal(table.column(c), before.column(c)), False) for c in (*COMPARED, ETAG)}
    equal["mtime"] = pc.if_else(pc.not_equal(table.column(ETAG), ""), equal[ETAG], equal["mtime"])
    same = match
    for c in COMPARED:
        same = pc.and_(same, equal[c])
    suspects = np.flatnonzero(~same.to_numpy(zero_copy_only=False))
    kinds = np.zeros(table.num_rows, dtype=np.uint8)  # one byte a row: _SAME, _ADDED, _CHANGED or _SAME_BYTES
    digests: list[pa.Array] = []
    for first in range(0, len(suspects), chunk):
        part = suspects[first : first + chunk]
        rows = table.take(pa.array(part)).to_pylist()
        then = before.select(["label", "wnid", HASH_COLUMN]).take(pa.array(part)).to_pylist()
        fresh = hash_candidates(root, [Candidate(**{k: v for k, v in row.items() if k in CANDIDATE}) for row in rows])
        digests.append(pa.array(fresh, pa.string()))
        _recall(known, part, at, rows, then)
        for i, row, prior, digest in zip(part, rows, then, fresh, strict=True):
            if at[i] < 0:
                kinds[i] = _ADDED
            elif digest and digest == prior[HASH_COLUMN] and all(row[c] == prior[c] for c in ("label", "wnid")):
                kinds[i] = _SAME_BYTES
            else:
                kinds[i] = _CHANGED
    hashes = _hash_column(same, before.column(HASH_COLUMN), suspects, digests)
    return _Compared(at, kinds, hashes, int(pc.sum(same).as_py() or 0))


def _recall(known: KnownHashes | None, part: np.ndarray, at: np.ndarray, rows: list[dict], then: list[dict]) -> None:
    """Fill THEN's missing source sha256 (rows of a version whose baseline did not read them) from KNOWN."""
    unknown = [
        (row["id"], row["split"])
        for i, row, prior in zip(part, rows, then, strict=True)
        if at[i] >= 0 and not prior[HASH_COLUMN]
    ]
    if known is None or not unknown:
        return
    recorded = known(unknown)
    for row, prior in zip(rows, then, strict=True):
        if not prior[HASH_COLUMN] and row["id"] in recorded:
            prior[HASH_COLUMN] = recorded[row["id"]]


def _hash_column(same: pa.Array, before: pa.ChunkedArray, suspects: np.ndarray, digests: list[pa.Array]) -> pa.Array:
    """Each row's source sha256: the baseline's where the row is unchanged, the fresh digest at each suspect
    (one take over both, no Python string per row)."""
    kept = _array(pc.if_else(same, before, MISSING_HASH))
    pool = pa.concat_arrays([kept.cast(pa.string()), *digests])
    index = np.arange(len(kept), dtype=np.int64)
    index[suspects] = len(kept) + np.arange(len(suspects), dtype=np.int64)
    return pool.take(pa.array(index))


def _baseline_schema(manifest: pa.Schema) -> pa.Schema:
    """The new baseline's schema: the manifest's (an ``etag`` column added when it has none) and the source
    sha256, with the manifest's metadata."""
    if ETAG not in manifest.names:
        manifest = manifest.append(pa.field(ETAG, pa.string()))
    return manifest.append(pa.field(HASH_COLUMN, pa.string()))


def _with_etag(table: pa.Table) -> pa.Table:
    """TABLE with an ``etag`` column ('' in each row of a manifest or baseline written before there was one)."""
    if ETAG in table.column_names:
        return table.set_column(table.column_names.index(ETAG), ETAG, pc.fill_null(table.column(ETAG), ""))
    return table.append_column(ETAG, pa.array([""] * table.num_rows, pa.string()))


def ids_where(path: Path, rows: np.ndarray) -> pa.Array:
    """The ids of PATH's rows where the mask ROWS is True, in the file's order (read a batch at a time)."""
    parts = [_no_ids()]
    start = 0
    for batch in open_parquet(path).iter_batches(batch_size=READ_ROWS, columns=["id"]):
        keep = rows[start : start + batch.num_rows]
        parts.append(_array(batch.column(0).filter(pa.array(keep))))
        start += batch.num_rows
    return pa.concat_arrays(parts)


def write_rows(source: Path, path: Path, rows: np.ndarray, columns: list[str] | None = None) -> int:
    """Write the COLUMNS (default all) of SOURCE's rows where the mask ROWS is True to PATH, in SOURCE's order,
    a batch at a time and atomically; returns the row count written."""
    reader = open_parquet(source)
    schema = reader.schema_arrow
    if columns is not None:
        schema = pa.schema([schema.field(c) for c in columns], metadata=schema.metadata)
    written, start = 0, 0
    with parquet_writer(path, schema) as writer:
        for batch in reader.iter_batches(batch_size=READ_ROWS, columns=columns):
            keep = rows[start : start + batch.num_rows]
            start += batch.num_rows
            if keep.any():
                part = pa.Table.from_batches([batch.filter(pa.array(keep))])
                writer.write_table(part.cast(schema))
                written += part.num_rows
    return written
