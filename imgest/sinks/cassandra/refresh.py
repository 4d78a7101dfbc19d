"""Applying a refresh to Cassandra once the new version's rows are written.

The Spark job has upserted the added and changed images under the new version (same deterministic ids, so a
changed image overwrites its row in place). What is left happens here, in this order: the unchanged rows'
metadata are re-stamped with the new version (metadata only: no image bytes move), the quarantine entries of
unchanged bad files are carried over, and removed images are deleted (metadata row first, since a metadata row
means "committed", then the data row). Every statement is idempotent, so a failed finish is simply re-run.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from imgest.sinks.cassandra.schema import TableLayout

log = logging.getLogger(__name__)
CONCURRENCY = 64


@dataclass(frozen=True)
class RefreshRows:
    """The rows a refresh touches after the job: (id, split) pairs."""

    unchanged: list[tuple[str, str]]
    removed: list[tuple[str, str]]


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


def apply_refresh(
    session: Any, tables: TableLayout, dataset: str, version: str, previous: str | None, rows: RefreshRows
) -> dict[str, int]:
    """Re-stamp unchanged rows with VERSION, carry their quarantine entries over from PREVIOUS, delete removed
    rows; returns how many statements of each kind ran."""
    ks = tables.keyspace
    bad = quarantined_ids(session, ks, dataset, previous)
    stamped = 0
    for split in sorted({s for _, s in rows.unchanged}):
        stmt = session.prepare(f"UPDATE {ks}.{tables.metadata_table(split)} SET dataset = ?, version = ? WHERE id = ?")
        ids = (uuid.UUID(i) for i, s in rows.unchanged if s == split and i not in bad)
        stamped += _run(session, stmt, ((dataset, version, i) for i in ids))
    carried = 0
    if previous and bad:
        keep = {i for i, _ in rows.unchanged} & bad
        old = session.execute(
            f"SELECT id, split, rel_path, reason, detail FROM {ks}.quarantine WHERE dataset = %s AND version = %s",
            (dataset, previous),
        )
        insert = session.prepare(
            f"INSERT INTO {ks}.quarantine (dataset, version, id, split, rel_path, reason, detail)"
            " VALUES (?, ?, ?, ?, ?, ?, ?)"
        )
        carried = _run(
            session,
            insert,
            ((dataset, version, r.id, r.split, r.rel_path, r.reason, r.detail) for r in old if str(r.id) in keep),
        )
    deleted = 0
    for split in sorted({s for _, s in rows.removed}):
        ids = [uuid.UUID(i) for i, s in rows.removed if s == split]
        meta = session.prepare(f"DELETE FROM {ks}.{tables.metadata_table(split)} WHERE id = ?")
        data = session.prepare(f"DELETE FROM {ks}.{tables.data_table(split)} WHERE id = ?")
        _run(session, meta, ((i,) for i in ids))
        deleted += _run(session, data, ((i,) for i in ids))
    log.info(
        "refresh %s/%s: %d rows re-stamped, %d quarantine entries carried, %d rows deleted",
        dataset,
        version,
        stamped,
        carried,
        deleted,
    )
    return {"restamped": stamped, "quarantine_carried": carried, "deleted": deleted}


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
