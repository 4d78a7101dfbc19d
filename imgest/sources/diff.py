"""What changed in a source since the last stored version: added, changed, removed, unchanged images.

A refresh scans again and compares the new manifest with the baseline (the manifest of the last complete
version plus each image's source sha256). Same id, size, mtime and label: unchanged, not read. An object of an
S3 source compares its ETag instead of its mtime (a re-upload of the same bytes keeps the ETag). Size or mtime
differ: the file is hashed and only a different hash (or label) makes it changed. Ids are deterministic
(dataset/split/path), so a changed image keeps its id and is re-ingested in place.

Memory stays flat whatever the dataset's size: the baseline's ids are held as sorted 64-bit keys (12 bytes a row,
a seeded hash of each id), the manifest is read, compared and written READ_ROWS rows at a time, and the baseline
rows a chunk matches are read back from the row groups holding them (their id compared too: a key collision
never matches two different ids). Besides the keys, one byte a row of each file (what happened to it).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field, fields
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from imgest.core.errors import ImgestError
from imgest.sinks.shards.plan import id_hashes
from imgest.sources.manifest import Candidate
from imgest.sources.source_hash import HASH_COLUMN, MISSING_HASH, hash_candidates

COMPARED = ("size", "mtime", "label", "wnid")  # equal in the baseline: unchanged, the file is not read
ETAG = "etag"  # an S3 object's: compared instead of the mtime when the row has one
HASH_CHUNK = 4096  # suspects hashed (and held as Python rows) at a time
READ_ROWS = 16_384  # rows of a manifest or baseline decoded, compared and written at a time
READ_BUFFER = 1 << 20  # bytes of a column chunk read at a time (else a whole row group's chunk is read at once)
KEY_SEEDS = (0, 1, 2, 3)  # id key seeds tried in turn while two different ids of the baseline share a key
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


class BaselineError(ImgestError):
    """The baseline of the last version cannot be compared with (its ids cannot be told apart)."""


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


@dataclass
class _KeyIndex:
    """The baseline's ids as sorted 64-bit keys: ``rows[i]`` is the baseline row of ``keys[i]``. ``aliases`` are
    the later rows of an id the baseline holds twice, ``alias_of`` the first row of each (they share its fate)."""

    keys: np.ndarray
    rows: np.ndarray
    seed: int
    size: int
    aliases: np.ndarray = field(default_factory=lambda: _no_rows(np.int64))
    alias_of: np.ndarray = field(default_factory=lambda: _no_rows(np.int64))

    def find(self, ids: pa.Array | pa.ChunkedArray) -> np.ndarray:
        """The baseline row of each of IDS whose key it holds (-1 where none): compare the ids before trusting it."""
        keys = id_hashes(ids, self.seed)
        if not len(self.keys):
            return np.full(len(keys), -1, np.int64)
        slot = np.minimum(np.searchsorted(self.keys, keys), len(self.keys) - 1)
        return np.where(self.keys[slot] == keys, self.rows[slot].astype(np.int64), -1)


def _index_baseline(baseline: pq.ParquetFile | None, path: Path | None) -> _KeyIndex:
    """The key index of BASELINE's ids (the file PATH; empty when there is none), with a seed under which no two
    different ids share a key."""
    if baseline is None:
        return _KeyIndex(_no_rows(np.uint64), _no_rows(np.uint32), KEY_SEEDS[0], 0)
    size = baseline.metadata.num_rows
    for seed in KEY_SEEDS:
        keys = np.empty(size, np.uint64)
        start = 0
        for batch in baseline.iter_batches(batch_size=READ_ROWS, columns=["id"]):
            keys[start : start + batch.num_rows] = id_hashes(batch.column(0), seed)
            start += batch.num_rows
        order = np.argsort(keys, kind="stable")  # equal keys keep the baseline's order: the first row first
        keys.sort()  # in place: the same as keys[order], without a third array a row
        rows = order.astype(np.uint32) if size < 2**32 else order
        del order
        later = np.flatnonzero(keys[1:] == keys[:-1]) + 1
        if not len(later):
            return _KeyIndex(keys, rows, seed, size)
        head = np.maximum.accumulate(np.where(np.r_[True, keys[1:] != keys[:-1]], np.arange(size), 0))[later]
        aliases, alias_of = rows[later].astype(np.int64), rows[head].astype(np.int64)
        twice = _RowReader(baseline, ["id"]).take(aliases).column("id")
        if twice.equals(_RowReader(baseline, ["id"]).take(alias_of).column("id")):  # the same id twice, not a collision
            keep = np.ones(size, bool)
            keep[later] = False
            return _KeyIndex(keys[keep], rows[keep], seed, size, aliases, alias_of)
    raise BaselineError(
        f"{path}: different ids share a 64-bit key under every seed {KEY_SEEDS}: delete the folder holding it "
        f"({path.parent if path else 'refresh/<target>'}: baseline, plan and state) so that the next refresh "
        "makes a new first version of every image, or report this (it should never happen)"
    )


class _RowReader:
    """The COLUMNS of SOURCE's rows by row number, a batch of READ_ROWS rows decoded at a time. A read continues
    where the last one stopped when its rows come later in the row group (rows asked for in the file's order cost
    one pass, however large the row groups); an earlier row starts its row group again."""

    def __init__(self, source: pq.ParquetFile, columns: list[str]) -> None:
        self.source, self.columns = source, columns
        meta = source.metadata
        self.starts = np.cumsum([0] + [meta.row_group(g).num_rows for g in range(meta.num_row_groups)])
        self.empty = pa.table({c: pa.array([], source.schema_arrow.field(c).type) for c in columns})
        self._group = -1
        self._batches: Iterator[pa.RecordBatch] = iter(())
        self._batch: pa.RecordBatch | None = None
        self._offset = 0  # the row number of the batch's first row

    def _seek(self, row: int) -> pa.RecordBatch:
        """The batch holding ROW (self._offset is its first row's number)."""
        group = int(np.searchsorted(self.starts, row, side="right")) - 1
        if group != self._group or row < self._offset:
            self._group, self._offset, self._batch = group, int(self.starts[group]), None
            self._batches = self.source.iter_batches(batch_size=READ_ROWS, row_groups=[group], columns=self.columns)
        while self._batch is None or row >= self._offset + self._batch.num_rows:
            if self._batch is not None:
                self._offset += self._batch.num_rows
            self._batch = next(self._batches)
        return self._batch

    def take(self, at: np.ndarray) -> pa.Table:
        """The rows AT (row numbers; -1: a null row), in AT's order."""
        valid = np.flatnonzero(at >= 0)
        order = valid[np.argsort(at[valid], kind="stable")]
        wanted = at[order]
        pieces, lo = [self.empty], 0
        while lo < len(wanted):
            batch = self._seek(int(wanted[lo]))
            hi = int(np.searchsorted(wanted, self._offset + batch.num_rows))
            pieces.append(pa.Table.from_batches([batch.take(pa.array(wanted[lo:hi] - self._offset))]))
            lo = hi
        found = pa.concat_tables(pieces).combine_chunks()
        index = np.full(len(at), -1, np.int64)
        index[order] = np.arange(len(order))
        return found.take(pa.array(index, mask=index < 0))


def _before_reader(baseline: pq.ParquetFile | None) -> _RowReader | None:
    """A reader of the baseline's compared columns (None when there is no baseline)."""
    if baseline is None:
        return None
    present = set(baseline.schema_arrow.names)
    return _RowReader(baseline, [c for c in _BEFORE if c in present])


def _before(reader: _RowReader | None, at: np.ndarray) -> pa.Table:
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
    manifest: Path, baseline: Path | None, root: Path, new_baseline: Path, chunk: int = HASH_CHUNK
) -> SourceChanges:
    """Compare MANIFEST with BASELINE (None: everything is added); returns the changes and writes NEW_BASELINE
    (the manifest's rows with their source sha256). Compared as Arrow columns READ_ROWS rows at a time (64-bit
    id keys locate each row in the baseline), never one Python object per row; only the suspects (added, or
    size / mtime / label differ) are read and hashed, CHUNK at a time."""
    old = open_parquet(baseline) if baseline is not None and baseline.is_file() else None
    index = _index_baseline(old, baseline)
    reader = _before_reader(old)
    source = open_parquet(manifest)
    kinds = np.zeros(source.metadata.num_rows, np.uint8)
    seen = np.zeros(index.size, bool)
    found: dict[int, list[pa.Array]] = {_ADDED: [], _CHANGED: []}
    unchanged, start = 0, 0
    with parquet_writer(new_baseline, _baseline_schema(source.schema_arrow)) as writer:
        for batch in source.iter_batches(batch_size=READ_ROWS):
            table = _with_etag(pa.Table.from_batches([batch]))
            part = _compare(table, reader, index, root, chunk)
            seen[part.rows[part.rows >= 0]] = True
            kinds[start : start + table.num_rows] = part.kinds
            unchanged += part.unchanged
            for kind, ids in found.items():
                ids.append(_array(table.column("id").filter(pa.array(part.kinds == kind))))
            writer.write_table(pa.Table.from_arrays([*table.columns, part.hashes], schema=writer.schema))
            start += table.num_rows
    seen[index.aliases] = seen[index.alias_of]
    removed_at = np.flatnonzero(~seen)
    removed = _RowReader(old, ["id"]).take(removed_at).column("id") if old is not None else _no_ids()
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


def _compare(table: pa.Table, old: _RowReader | None, index: _KeyIndex, root: Path, chunk: int) -> _Compared:
    """Compare TABLE (a chunk of the manifest, with an etag column) with its rows in the baseline (read by OLD)."""
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
        for i, row, prior, digest in zip(part, rows, then, fresh, strict=True):
            if at[i] < 0:
                kinds[i] = _ADDED
            elif digest and digest == prior[HASH_COLUMN] and all(row[c] == prior[c] for c in ("label", "wnid")):
                kinds[i] = _SAME_BYTES
            else:
                kinds[i] = _CHANGED
    hashes = _hash_column(same, before.column(HASH_COLUMN), suspects, digests)
    return _Compared(at, kinds, hashes, int(pc.sum(same).as_py() or 0))


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
