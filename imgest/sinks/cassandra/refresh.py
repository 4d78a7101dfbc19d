"""Applying a refresh to Cassandra once the new version's rows are written.

The Spark job has upserted the added and changed images under the new version (same deterministic ids, so a
changed image overwrites its row in place). What is left happens here, and costs in proportion to the change,
not to the dataset: the new version's lineage is recorded (the previous version's plus its own, so the rows
earlier versions wrote and nobody changed belong to it without being touched), the quarantine entries of
unchanged bad files are carried over, and removed images are deleted (metadata row first, since a metadata row
means "committed", then the data row). Every statement is idempotent, so a failed finish is simply re-run.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from imgest.core.locks import check_fence
from imgest.sinks.cassandra.schema import TableLayout
from imgest.sinks.cassandra.versions import set_lineage

log = logging.getLogger(__name__)
CONCURRENCY = 64
DELETE_BATCH = 65_536  # removed ids turned into Python objects at a time


@dataclass(frozen=True)
class RefreshRows:
    """The rows a refresh touched. TOUCHED: ids the job rewrote (added or changed) or that were removed; only
    those the previous version quarantined matter (its entries of other ids are carried over), so the caller may
    give just those. REMOVED: (id, split) of the removed images, an Arrow table (as long as the dataset, at most)."""

    touched: set[str]
    removed: pa.Table


def _run(session: Any, statement: Any, params: Iterable[tuple[Any, ...]]) -> int:
    from cassandra.concurrent import execute_concurrent_with_args

    params = list(params)
    if not params:
        return 0
    for ok, result in execute_concurrent_with_args(session, statement, params, concurrency=CONCURRENCY):
        if not ok:
            raise result
    return len(params)


def quarantined_ids(session: Any, keyspace: str, dataset: str, version: str | None) -> set[str]:
    if not version:
        return set()
    rows = session.execute(
        f"SELECT id FROM {keyspace}.quarantine WHERE dataset = %s AND version = %s", (dataset, version)
    )
    return {str(r.id) for r in rows}


def _carry_quarantine(
    session: Any, ks: str, dataset: str, version: str, previous: str | None, rows: RefreshRows
) -> int:
    """Copy PREVIOUS's quarantine entries of files the refresh did not touch (still bad, not re-read) to VERSION."""
    if not previous:
        return 0
    gone = rows.touched
    old = session.execute(
        f"SELECT id, split, rel_path, reason, detail FROM {ks}.quarantine WHERE dataset = %s AND version = %s",
        (dataset, previous),
    )
    insert = session.prepare(
        f"INSERT INTO {ks}.quarantine (dataset, version, id, split, rel_path, reason, detail)"
        " VALUES (?, ?, ?, ?, ?, ?, ?)"
    )
    kept = ((dataset, version, r.id, r.split, r.rel_path, r.reason, r.detail) for r in old if str(r.id) not in gone)
    return _run(session, insert, kept)


def apply_refresh(
    session: Any, tables: TableLayout, dataset: str, version: str, previous: str | None, rows: RefreshRows
) -> dict[str, int]:
    """Record VERSION's lineage, carry the quarantine entries of untouched files over from PREVIOUS, delete
    removed rows; returns the lineage's length and how many statements of each kind ran. Fenced: a process that
    lost the dataset's lock raises LockLostError before anything changes."""
    check_fence(dataset)
    ks = tables.keyspace
    lineage = set_lineage(session, ks, dataset, version, previous)
    carried = _carry_quarantine(session, ks, dataset, version, previous, rows)
    deleted = delete_removed(session, tables, rows.removed)
    log.info(
        "refresh %s/%s: lineage %s, %d quarantine entries carried, %d rows deleted (no unchanged row touched)",
        dataset,
        version,
        " <- ".join(reversed(lineage)),
        carried,
        deleted,
    )
    return {"lineage": len(lineage), "restamped": 0, "quarantine_carried": carried, "deleted": deleted}


def delete_removed(session: Any, tables: TableLayout, removed: pa.Table, batch: int = DELETE_BATCH) -> int:
    """Delete the (id, split) rows of REMOVED, BATCH ids at a time (metadata row first, then data row); returns
    how many."""
    deleted = 0
    ks = tables.keyspace
    for split in sorted(pc.unique(removed.column("split")).to_pylist()):
        ids = removed.filter(pc.equal(removed.column("split"), split)).column("id")
        meta = session.prepare(f"DELETE FROM {ks}.{tables.metadata_table(split)} WHERE id = ?")
        data = session.prepare(f"DELETE FROM {ks}.{tables.data_table(split)} WHERE id = ?")
        for start in range(0, len(ids), batch):
            chunk = [uuid.UUID(i) for i in ids.slice(start, batch).to_pylist()]
            _run(session, meta, ((i,) for i in chunk))
            deleted += _run(session, data, ((i,) for i in chunk))
    return deleted


def record_changes(
    session: Any, keyspace: str, dataset: str, version: str, changes: dict[str, int], found: dict[str, int]
) -> None:
    """The version's refresh counts, and its split and label counts over every row it now holds."""
    splits: dict[str, int] = {}
    for key, n in found.items():
        split = key.split("/")[0]
        splits[split] = splits.get(split, 0) + n
    session.execute(
        f"UPDATE {keyspace}.dataset_versions SET changes = %s, split_counts = %s, label_counts = %s"
        " WHERE dataset = %s AND version = %s",
        (changes, splits, found, dataset, version),
    )


def recorded_hashes(session: Any, tables: TableLayout, rows: list[tuple[str, str]]) -> dict[str, str]:
    """id -> the source sha256 the ingest recorded in the metadata table, for ROWS (id, split): what a refresh
    compares a file with when its baseline never read it (queries of 100 ids, one metadata table per split)."""
    found: dict[str, str] = {}
    by_split: dict[str, list[uuid.UUID]] = {}
    for key, split in rows:
        by_split.setdefault(split, []).append(uuid.UUID(key))
    for split, ids in by_split.items():
        query = session.prepare(
            f"SELECT id, src_sha256 FROM {tables.keyspace}.{tables.metadata_table(split)} WHERE id IN ?"
        )
        for start in range(0, len(ids), 100):
            for row in session.execute(query, (ids[start : start + 100],)):
                if row.src_sha256:
                    found[str(row.id)] = row.src_sha256
    return found
