"""Dataset versions in Cassandra: the `dataset_versions` record and which rows belong to a version.

Every metadata row carries the `dataset` and `version` that wrote it, so a version's rows are told apart from other
datasets' rows in the same tables. A refresh rewrites only the rows that changed: the version's ``lineage`` lists
every version whose rows it still holds (the previous version's lineage plus its own), so a row written by an
earlier version of the lineage and not changed since is a member without being re-stamped, and a refresh costs in
proportion to its change. A version without a lineage holds only its own rows. Status only moves forward within one
version number: ``writing -> written -> complete``; ``replaced`` marks a version whose rows a later version
overwrote. A version that is ``complete`` is never put back to ``writing``: re-running its ingest keeps it complete
(rows are rewritten byte-identical or skipped). A second transform of the same dataset into the same tables would
overwrite the rows of the first (ids derive from dataset, split and path, not from the transform), so it is refused
unless the caller asks to replace that version.
"""

from __future__ import annotations

import json
import logging
import uuid
from collections import namedtuple
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from imgest.core.errors import ImgestError, LockLostError
from imgest.core.locks import held_by_me
from imgest.sinks.cassandra.schema import identifier

log = logging.getLogger(__name__)
ACTIVE = ("writing", "written", "complete")


class VersionConflictError(ImgestError):
    """A version would overwrite another version's rows, or a version number is reused with other settings."""


class VersionNotFoundError(ImgestError):
    """No (single) version matches what was asked for."""


@dataclass(frozen=True)
class VersionRecord:
    """The parts of a dataset_versions row that readers need."""

    dataset: str
    version: str
    status: str
    tables: dict[str, dict[str, str]]
    transform: str
    class_map: list[str]
    lineage: tuple[str, ...] = ()

    @property
    def members(self) -> list[str]:
        """The versions whose rows belong to this version: its lineage, or itself alone."""
        return list(self.lineage) if self.lineage else [self.version]

    @property
    def metadata_tables(self) -> set[str]:
        """'ks.table' of every metadata table the version writes."""
        return {t["metadata"] for t in self.tables.values()}


def not_imgest(keyspace: str) -> VersionNotFoundError:
    """The error for a keyspace without imgest's dataset_versions table, saying how to adopt its tables."""
    return VersionNotFoundError(
        f"keyspace {keyspace} has no dataset_versions table: its tables were not written by imgest (filled by "
        "cassandra-dali-plugin's extract_serial.py or extract_spark.py?). Record them as an imgest version in place "
        f"with: imgest adopt crs4 --data-table {keyspace}.<data table> --metadata-table {keyspace}.<metadata table> "
        "--dataset NAME (docs/crs4-plugin.md)"
    )


def records(session: Any, keyspace: str, dataset: str | None = None) -> list[VersionRecord]:
    """Version records of KEYSPACE (of DATASET only when given), in clustering order."""
    from cassandra import InvalidRequest

    ks = identifier(keyspace, "keyspace")
    columns = "dataset, version, status, tables, transform, class_map, lineage"
    where, args = (" WHERE dataset = %s", (dataset,)) if dataset else ("", ())
    try:
        rows = list(session.execute(f"SELECT {columns} FROM {ks}.dataset_versions{where}", args))
    except InvalidRequest as exc:  # a keyspace prepared by an imgest before lineage: no version has one
        if "table dataset_versions does not exist" in str(exc):
            raise not_imgest(ks) from None
        if "lineage" not in str(exc):
            raise
        columns = columns.removesuffix(", lineage")
        rows = list(session.execute(f"SELECT {columns} FROM {ks}.dataset_versions{where}", args))
    return [
        VersionRecord(
            r.dataset,
            r.version,
            r.status or "",
            json.loads(r.tables or "{}"),
            r.transform or "",
            list(r.class_map or []),
            tuple(getattr(r, "lineage", None) or ()),
        )
        for r in rows
    ]


def conflicting(existing: list[VersionRecord], version: str, tables: dict[str, dict[str, str]]) -> list[VersionRecord]:
    """Other active versions of the same dataset whose metadata tables overlap TABLES (their rows would be
    overwritten)."""
    ours = {t["metadata"] for t in tables.values()}
    return [r for r in existing if r.version != version and r.status in ACTIVE and r.metadata_tables & ours]


def claim_version(
    session: Any,
    keyspace: str,
    dataset: str,
    version: str,
    tables: dict[str, dict[str, str]],
    transform: str,
    replace: bool = False,
) -> str | None:
    """Mark VERSION 'writing' (or keep it 'complete'); refuse conflicts. Returns the status it had before."""
    existing = records(session, keyspace, dataset)
    own = next((r for r in existing if r.version == version), None)
    if own is not None and own.transform and json.loads(own.transform) != json.loads(transform):
        raise VersionConflictError(
            f"version {version!r} of dataset {dataset!r} in {keyspace} was written with another transform "
            f"({own.transform}); give the new one another --version"
        )
    others = conflicting(existing, version, tables)
    if others and not replace:
        names = ", ".join(f"{r.version} ({r.status})" for r in others)
        raise VersionConflictError(
            f"dataset {dataset!r} version {names} already lives in {', '.join(sorted(others[0].metadata_tables))}; "
            f"writing version {version!r} there would overwrite its rows. Use --table-suffix (e.g. _v2) to keep "
            "both in tables of their own, or --replace-version to replace it"
        )
    for other in others:
        session.execute(
            f"UPDATE {keyspace}.dataset_versions SET status = 'replaced' WHERE dataset = %s AND version = %s",
            (dataset, other.version),
        )
        log.warning("version %s of %s is marked replaced by %s", other.version, dataset, version)
    if own is not None and own.status == "complete":
        log.info("version %s of %s is already complete; it stays complete", version, dataset)
        return own.status
    _set_writing(session, keyspace, dataset, version, json.dumps(tables), transform, own is None)
    return own.status if own else None


def _set_writing(
    session: Any, keyspace: str, dataset: str, version: str, tables: str, transform: str, new: bool
) -> None:
    """Insert the record as 'writing', or move it back to 'writing' unless it became 'complete' meanwhile; the
    writer is this process's lock holder (None outside a lock)."""
    now, writer = datetime.now(UTC), held_by_me(dataset)
    if new:
        session.execute(
            f"INSERT INTO {keyspace}.dataset_versions (dataset, version, status, tables, transform, started_at, writer)"
            " VALUES (%s, %s, 'writing', %s, %s, %s, %s) IF NOT EXISTS",
            (dataset, version, tables, transform, now, writer),
        )
        return
    session.execute(
        f"UPDATE {keyspace}.dataset_versions SET status = 'writing', tables = %s, transform = %s, started_at = %s,"
        " writer = %s WHERE dataset = %s AND version = %s IF status IN ('writing', 'written', 'replaced')",
        (tables, transform, now, writer, dataset, version),
    )


def advance_status(session: Any, keyspace: str, dataset: str, version: str, to: str, allowed: tuple[str, ...]) -> bool:
    """Set the status to TO only if it is one of ALLOWED now (a lightweight transaction); True if applied.

    A process that holds the dataset's lock advances only a record it is the writer of (``writer`` in the same
    LWT): a zombie whose lock was taken over, and whose version a newer holder claimed since its fence, changes
    nothing (LockLostError). A record of another writer (or of none: older records, a CLI verify of a DAG's
    version) is taken over first, by an LWT on the writer read, right after a fence proves the lock is held."""
    from imgest.core.locks import check_fence

    me = held_by_me(dataset)
    extra = ", verified_at = %s" if to == "complete" else ""
    params: tuple[Any, ...] = (datetime.now(UTC),) if extra else ()
    placeholders = ", ".join("%s" for _ in allowed)
    update = f"UPDATE {keyspace}.dataset_versions SET status = %s{extra} WHERE dataset = %s AND version = %s"
    cond = f" IF status IN ({placeholders})"
    if me is None:
        return bool(session.execute(update + cond, (to, *params, dataset, version, *allowed)).one()[0])
    for _ in range(2):
        row = session.execute(update + cond + " AND writer = %s", (to, *params, dataset, version, *allowed, me)).one()
        if row[0]:
            return True
        status, writer = getattr(row, "status", None), getattr(row, "writer", None)
        if status not in allowed:
            return False
        check_fence(dataset)  # the lock is this process's now: the other writer is gone
        took = session.execute(
            f"UPDATE {keyspace}.dataset_versions SET writer = %s WHERE dataset = %s AND version = %s IF writer = %s",
            (me, dataset, version, writer),
        ).one()
        log.warning("version %s of %s: writer %s taken over by %s (applied: %s)", version, dataset, writer, me, took[0])
    raise LockLostError(
        f"{me} could not mark version {version!r} of {dataset!r} {to}: its writer changed under it (another holder "
        f"of the lock claimed it); see {keyspace}.dataset_versions"
    )


def version_members(session: Any, keyspace: str, dataset: str, version: str) -> list[str]:
    """The versions whose rows belong to VERSION of DATASET (its lineage, or itself alone)."""
    ks = identifier(keyspace, "keyspace")
    row = session.execute(
        f"SELECT lineage FROM {ks}.dataset_versions WHERE dataset = %s AND version = %s", (dataset, version)
    ).one()
    return list(row.lineage) if row is not None and row.lineage else [version]


def set_lineage(session: Any, keyspace: str, dataset: str, version: str, previous: str | None) -> list[str]:
    """Record that VERSION holds PREVIOUS's rows it did not rewrite (PREVIOUS's lineage plus VERSION); returns
    the lineage. Idempotent: a re-run finish records the same list."""
    lineage = [v for v in version_members(session, keyspace, dataset, previous) if v != version] if previous else []
    lineage.append(version)
    ks = identifier(keyspace, "keyspace")
    session.execute(
        f"UPDATE {ks}.dataset_versions SET lineage = %s WHERE dataset = %s AND version = %s",
        (lineage, dataset, version),
    )
    return lineage


def version_rows(session: Any, table: str, dataset: str, version: str | list[str], columns: str) -> Iterator[Any]:
    """COLUMNS ('a, b') of the rows of TABLE ('ks.table') written by DATASET / VERSION (a version's members when a
    list), as named tuples (uuid
    columns as uuid.UUID), read by a token-range scan (no ALLOW FILTERING). Only one page of rows is held at a
    time; callers that keep columns should use scan.scan_columns, which yields Arrow batches."""
    import pyarrow as pa

    from imgest.sinks.cassandra.scan import scan_columns

    names = [c.strip() for c in columns.split(",")]
    row_type = namedtuple("Row", names)  # type: ignore[misc]
    for batch in scan_columns(session, table, names, dataset, version):
        values = []
        for name in names:
            col = batch.column(name)
            if pa.types.is_fixed_size_binary(col.type):
                values.append([None if b is None else uuid.UUID(bytes=b) for b in col.to_pylist()])
            else:
                values.append(col.to_pylist())
        for row in zip(*values, strict=True):
            yield row_type(*row)


def resolve(session: Any, metadata_table: str, dataset: str | None = None, version: str | None = None) -> VersionRecord:
    """The one active version whose rows live in METADATA_TABLE ('ks.table'), narrowed by DATASET / VERSION;
    the complete one first. Several datasets in one table need DATASET."""
    keyspace = metadata_table.partition(".")[0]
    found = [
        r
        for r in records(session, keyspace, dataset)
        if metadata_table in r.metadata_tables and r.status in ACTIVE and (version is None or r.version == version)
    ]
    complete = [r for r in found if r.status == "complete"]
    chosen = complete or found
    if len({r.dataset for r in chosen}) > 1:
        names = ", ".join(sorted({r.dataset for r in chosen}))
        raise VersionNotFoundError(f"{metadata_table} holds datasets {names}; name one with --dataset")
    if not chosen:
        what = f"dataset {dataset!r}" if dataset else "any dataset"
        raise VersionNotFoundError(
            f"no active version{f' {version!r}' if version else ''} of {what} writes {metadata_table} "
            f"(see {keyspace}.dataset_versions)"
        )
    return chosen[-1]
