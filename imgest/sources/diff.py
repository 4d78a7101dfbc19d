"""What changed in a source since the last stored version: added, changed, removed, unchanged images.

A refresh scans again and compares the new manifest with the baseline (the manifest of the last complete
version plus each image's source sha256). Same id, size, mtime and label: unchanged, not read. An object of an
S3 source compares its ETag instead of its mtime (a re-upload of the same bytes keeps the ETag). Size or mtime
differ: the file is hashed and only a different hash (or label) makes it changed. Ids are deterministic
(dataset/split/path), so a changed image keeps its id and is re-ingested in place.
"""

from __future__ import annotations

import hashlib
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field, fields
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from imgest.core.quarantine import BadImage
from imgest.sources.manifest import Candidate
from imgest.sources.read import read_candidate

HASH_COLUMN = "src_sha256"
MISSING_HASH = ""  # a file that vanished or could not be read while hashing: ingest quarantines it
COMPARED = ("size", "mtime", "label", "wnid")  # equal in the baseline: unchanged, the file is not read
ETAG = "etag"  # an S3 object's: compared instead of the mtime when the row has one
HASH_CHUNK = 4096  # suspects hashed (and held as Python rows) at a time
CANDIDATE = frozenset(f.name for f in fields(Candidate))
_SAME, _ADDED, _CHANGED, _SAME_BYTES = 0, 1, 2, 3  # what diff_manifest found of a row (_SAME_BYTES: hashed, equal)


def _no_ids() -> pa.Array:
    return pa.array([], pa.string())


@dataclass
class SourceChanges:
    """Ids per kind of change, as Arrow string arrays (a first version adds, a removed source removes, every row:
    no Python object per row); ``unchanged`` is a count (those rows are not touched)."""

    added: pa.Array = field(default_factory=_no_ids)
    changed: pa.Array = field(default_factory=_no_ids)
    removed: pa.Array = field(default_factory=_no_ids)
    unchanged: int = 0
    touched_same_bytes: int = 0  # size or mtime differed but the hash did not: unchanged, not re-ingested

    @property
    def any(self) -> bool:
        return len(self.added) + len(self.changed) + len(self.removed) > 0

    def all_changed(self, ids: pa.Array | pa.ChunkedArray) -> SourceChanges:
        """These changes with every one of IDS (the current rows) that is not added counted as changed."""
        ids = _array(ids)
        changed = ids.filter(pc.invert(pc.is_in(ids, value_set=self.added)))
        return SourceChanges(self.added, changed, self.removed, 0, self.touched_same_bytes)

    def rewritten(self) -> pa.Array:
        """The ids the job writes: added, then changed."""
        return pa.concat_arrays([self.added, self.changed])

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


def hash_candidates(root: Path, cands: list[Candidate], workers: int = 4) -> list[str]:
    """Source sha256 of each candidate (hashlib releases the GIL: threads overlap reading and hashing)."""

    def one(cand: Candidate) -> str:
        try:
            return hashlib.sha256(read_candidate(root, cand)).hexdigest()
        except BadImage:
            return MISSING_HASH

    with ThreadPoolExecutor(max_workers=workers) as pool:
        return list(pool.map(one, cands))


def diff_manifest(
    manifest: Path, baseline: Path | None, root: Path, chunk: int = HASH_CHUNK
) -> tuple[SourceChanges, pa.Table]:
    """Compare MANIFEST with BASELINE (None: everything is added); returns the changes and the new baseline
    (the manifest's rows with their source sha256). Compared as Arrow columns (a vectorized lookup of each id in
    the baseline), never one Python object per row; only the suspects (added, or size / mtime / label differ)
    are read and hashed, CHUNK at a time."""
    table = _with_etag(pq.read_table(manifest))
    old = _read_baseline(baseline)
    pos = pc.index_in(table.column("id"), value_set=old.column("id"))
    before = {c: old.column(c).take(pos) for c in (*COMPARED, ETAG, HASH_COLUMN)}
    same = pc.is_valid(pos)
    equal = {c: pc.fill_null(pc.equal(table.column(c), before[c]), False) for c in (*COMPARED, ETAG)}
    has_etag = pc.not_equal(table.column(ETAG), "")
    equal["mtime"] = pc.if_else(has_etag, equal[ETAG], equal["mtime"])
    for c in COMPARED:
        same = pc.and_(same, equal[c])
    unchanged = int(pc.sum(same).as_py() or 0)
    suspects = np.flatnonzero(~same.to_numpy(zero_copy_only=False))
    found = pc.is_valid(pos).to_numpy(zero_copy_only=False)
    kind = np.zeros(table.num_rows, dtype=np.uint8)  # one byte a row: _SAME, _ADDED, _CHANGED or _SAME_BYTES
    digests: list[pa.Array] = []
    for start in range(0, len(suspects), chunk):
        part = suspects[start : start + chunk]
        rows = table.take(pa.array(part)).to_pylist()
        fresh = hash_candidates(root, [Candidate(**{k: v for k, v in row.items() if k in CANDIDATE}) for row in rows])
        digests.append(pa.array(fresh, pa.string()))
        for i, row, digest in zip(part, rows, fresh, strict=True):
            if not found[i]:
                kind[i] = _ADDED
            elif (
                digest
                and digest == before[HASH_COLUMN][int(i)].as_py()
                and all(row[c] == before[c][int(i)].as_py() for c in ("label", "wnid"))
            ):
                kind[i] = _SAME_BYTES
            else:
                kind[i] = _CHANGED
    same_bytes = int(np.count_nonzero(kind == _SAME_BYTES))
    ids = table.column("id")
    gone = pc.invert(pc.is_in(old.column("id"), value_set=_array(ids)))
    removed = _array(old.column("id").filter(gone))
    changes = SourceChanges(
        added=_array(ids.filter(pa.array(kind == _ADDED))),
        changed=_array(ids.filter(pa.array(kind == _CHANGED))),
        removed=removed.take(pc.sort_indices(removed)),
        unchanged=unchanged + same_bytes,
        touched_same_bytes=same_bytes,
    )
    return changes, table.append_column(HASH_COLUMN, _hash_column(same, before[HASH_COLUMN], suspects, digests))


def _hash_column(same: pa.Array, before: pa.ChunkedArray, suspects: np.ndarray, digests: list[pa.Array]) -> pa.Array:
    """Each row's source sha256: the baseline's where the row is unchanged, the fresh digest at each suspect
    (one take over both, no Python string per row)."""
    kept = _array(pc.if_else(same, before, MISSING_HASH))
    pool = pa.concat_arrays([kept.cast(pa.string()), *digests])
    index = np.arange(len(kept), dtype=np.int64)
    index[suspects] = len(kept) + np.arange(len(suspects), dtype=np.int64)
    return pool.take(pa.array(index))


def _with_etag(table: pa.Table) -> pa.Table:
    """TABLE with an ``etag`` column ('' in each row of a manifest or baseline written before there was one)."""
    if ETAG in table.column_names:
        return table.set_column(table.column_names.index(ETAG), ETAG, pc.fill_null(table.column(ETAG), ""))
    return table.append_column(ETAG, pa.array([""] * table.num_rows, pa.string()))


def _read_baseline(baseline: Path | None) -> pa.Table:
    """The baseline's compared columns (an empty table when there is none)."""
    if baseline is not None and baseline.is_file():
        columns = ["id", *COMPARED, HASH_COLUMN]
        if ETAG in pq.read_schema(baseline).names:
            columns.append(ETAG)
        return _with_etag(pq.read_table(baseline, columns=columns))
    schema = pa.schema(
        [
            ("id", pa.string()),
            ("size", pa.int64()),
            ("mtime", pa.float64()),
            ("label", pa.int32()),
            ("wnid", pa.string()),
            (HASH_COLUMN, pa.string()),
            (ETAG, pa.string()),
        ]
    )
    return schema.empty_table()


def select_ids(table: pa.Table, ids: pa.Array | pa.ChunkedArray | list[str]) -> pa.Table:
    """The rows of TABLE whose id is in IDS, in TABLE's order."""
    return table.filter(pc.is_in(table.column("id"), value_set=_array(ids)))


def write_table(table: pa.Table, path: Path) -> None:
    """Write TABLE to PATH atomically (a crash leaves the old file)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".partial")
    pq.write_table(table, tmp, compression="zstd")
    tmp.replace(path)
