"""Adopt tables another writer filled (the cassandra-dali-plugin's ``extract_serial.py`` / ``extract_spark.py``) as
an imgest dataset version, in place: nothing is copied and the plugin keeps reading them as before.

The plugin writes ``data`` (id uuid, label int, data blob) and ``metadata`` (id, label, or_label, or_split); imgest
also needs, per row, the sha256 and size of the stored bytes, the split and the class name, and a
``dataset_versions`` record naming the tables. Adoption adds the missing metadata columns (``ALTER TABLE ... ADD``:
the plugin's scripts select their own columns and do not see them), reads the data table once by token range in
bounded pages to record each row's sha256 and size (the bytes are what imgest's readers will check), then the
metadata table once for split and class names, and writes a ``complete`` version record whose class map is the
plugin's label order. Memory stays at a few pages of rows and one entry per class; rerunning gives the same result.
"""

from __future__ import annotations

import hashlib
import json
import logging
from collections import Counter
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from typing import Any

from imgest.core.errors import ImgestError
from imgest.sinks.cassandra.schema import TableLayout, add_column, identifier, render
from imgest.sinks.cassandra.versions import advance_status

log = logging.getLogger(__name__)

PLUGIN_DATA = {"id": "uuid", "label": "int", "data": "blob"}
IMGEST_COLUMNS = {  # sql/metadata_table.cql's columns beyond the plugin's id and label
    "wnid": "text",
    "split": "text",
    "rel_path": "text",
    "width": "int",
    "height": "int",
    "nbytes": "int",
    "sha256": "text",
    "src_sha256": "text",
    "transform_key": "text",
    "dataset": "text",
    "version": "text",
}
DATA_PAGE = 64  # data rows per page: the blobs of CONCURRENCY pages are what the pass holds
CONCURRENCY = 4


class AdoptError(ImgestError):
    """The tables cannot be adopted as they are (names, columns, labels)."""


@dataclass
class AdoptReport:
    """What adoption recorded."""

    dataset: str
    version: str
    data_table: str
    metadata_table: str
    rows: int = 0
    bytes: int = 0
    metadata_without_data: int = 0
    split_counts: dict[str, int] = field(default_factory=dict)
    class_map: list[str] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def layout_of(data_table: str, metadata_table: str) -> tuple[TableLayout, str | None]:
    """The imgest TableLayout the two tables fit ('ks.data_<split>' + 'ks.metadata_<split>', per split, or
    'ks.data' + 'ks.metadata' with a split column) and the split of a per-split pair; AdoptError otherwise."""
    ks, _, data = data_table.partition(".")
    mks, _, meta = metadata_table.partition(".")
    identifier(ks, "keyspace"), identifier(data, "data table"), identifier(meta, "metadata table")
    if ks != mks:
        raise AdoptError(f"{data_table} and {metadata_table} are in different keyspaces; adopt tables of one keyspace")
    if (data, meta) == ("data", "metadata"):
        return TableLayout(ks), None
    if data.startswith("data_") and meta == "metadata_" + data.removeprefix("data_"):
        return TableLayout(ks, layout="per-split"), data.removeprefix("data_")
    raise AdoptError(
        f"imgest reads tables named data + metadata or data_<split> + metadata_<split>, not {data} + {meta}; "
        "create the tables under those names (the plugin's scripts take any names: --data-table/--metadata-table)"
    )


def _columns(session: Any, table: str) -> dict[str, str]:
    from imgest.sinks.cassandra.scan import _table_meta

    return {name: col.cql_type for name, col in _table_meta(session, table).columns.items()}


def _check_columns(session: Any, data_table: str, metadata_table: str) -> dict[str, str]:
    data = _columns(session, data_table)
    wrong = {k: data.get(k) for k, v in PLUGIN_DATA.items() if data.get(k) != v}
    if wrong:
        raise AdoptError(f"{data_table} needs columns id uuid, label int, data blob (it has {data})")
    meta = _columns(session, metadata_table)
    if meta.get("id") != "uuid" or meta.get("label") != "int":
        raise AdoptError(f"{metadata_table} needs columns id uuid and label int (it has {meta})")
    return meta


def _prepare_tables(session: Any, keyspace: str, metadata_table: str) -> None:
    for column, cql_type in IMGEST_COLUMNS.items():
        add_column(session, metadata_table, column, cql_type)
    for statement in render("versions_table", keyspace=keyspace) + render("quarantine_table", keyspace=keyspace):
        session.execute(statement, timeout=60)
    add_column(session, f"{keyspace}.dataset_versions", "checks", "map<text, text>")
    add_column(session, f"{keyspace}.dataset_versions", "changes", "map<text, int>")
    add_column(session, f"{keyspace}.dataset_versions", "lineage", "list<text>")


def _record_bytes(session: Any, report: AdoptReport) -> dict[int, int]:
    """Pass 1 over the data table: each row's sha256 and size into its metadata row; returns rows per label."""
    import uuid

    from cassandra.concurrent import execute_concurrent_with_args

    from imgest.sinks.cassandra.scan import scan_columns

    update = session.prepare(
        f"UPDATE {report.metadata_table} SET label = ?, sha256 = ?, nbytes = ?, dataset = ?, version = ? WHERE id = ?"
    )
    labels: Counter[int] = Counter()
    pages = scan_columns(
        session, report.data_table, ["id", "label", "data"], page_size=DATA_PAGE, concurrency=CONCURRENCY
    )
    for batch in pages:
        ids, labels_, blobs = (batch.column(c).to_pylist() for c in ("id", "label", "data"))
        args = [  # the data table's label is the one the plugin's reader returns: the metadata row gets it too
            (
                label,
                hashlib.sha256(blob or b"").hexdigest(),
                len(blob or b""),
                report.dataset,
                report.version,
                uuid.UUID(bytes=i),
            )
            for i, label, blob in zip(ids, labels_, blobs, strict=True)
        ]
        for ok, result in execute_concurrent_with_args(session, update, args, concurrency=32):
            if not ok:
                raise AdoptError(f"recording sha256 in {report.metadata_table} failed: {result}") from result
        labels.update(batch.column("label").to_pylist())
        report.rows += len(args)
        report.bytes += sum(a[2] for a in args)
    return dict(labels)


def _record_names(session: Any, report: AdoptReport, split: str | None, meta_columns: dict[str, str]) -> dict[int, str]:
    """Pass 2 over the metadata table: split and class name per row; returns label -> class name."""
    import uuid

    from cassandra.concurrent import execute_concurrent_with_args

    from imgest.sinks.cassandra.scan import scan_columns

    extra = [c for c in ("or_label", "or_split") if meta_columns.get(c) == "text"]
    update = session.prepare(f"UPDATE {report.metadata_table} SET split = ?, wnid = ? WHERE id = ?")
    names: dict[int, str] = {}
    splits: Counter[str] = Counter()
    for batch in scan_columns(session, report.metadata_table, ["id", "label", "sha256", *extra]):
        rows = batch.to_pylist()
        args = []
        for row in rows:
            if row["sha256"] is None:  # a metadata row whose data row is not there: not part of the version
                report.metadata_without_data += 1
                continue
            name = row.get("or_label") or str(row["label"])
            where = row.get("or_split") or split or "train"
            if names.setdefault(row["label"], name) != name:
                raise AdoptError(
                    f"label {row['label']} of {report.metadata_table} names two classes, {names[row['label']]!r} "
                    f"and {name!r}: the tables mix label numberings"
                )
            splits[where] += 1
            args.append((where, name, uuid.UUID(bytes=row["id"])))
        for ok, result in execute_concurrent_with_args(session, update, args, concurrency=32):
            if not ok:
                raise AdoptError(f"recording splits in {report.metadata_table} failed: {result}") from result
    report.split_counts = dict(splits)
    return names


def adopt_tables(
    session: Any, data_table: str, metadata_table: str, dataset: str, version: str | None = None
) -> AdoptReport:
    """Record DATA_TABLE + METADATA_TABLE (filled by another writer) as a complete VERSION of DATASET (by default
    'adopted-<16 hex digits of the table names>'), in place; the report says what was recorded."""
    tables, split = layout_of(data_table, metadata_table)
    identifier(dataset, "dataset")
    version = version or "adopted-" + hashlib.sha256(f"{data_table} {metadata_table}".encode()).hexdigest()[:16]
    meta_columns = _check_columns(session, data_table, metadata_table)
    ks = tables.keyspace
    _prepare_tables(session, ks, metadata_table)
    report = AdoptReport(dataset, version, data_table, metadata_table)
    split_name = split or "train"
    record = json.dumps({split_name: {"data": data_table, "metadata": metadata_table}})
    transform = json.dumps({"adopted": "cassandra-dali-plugin tables: the stored bytes as they are"})
    now = datetime.now(UTC)
    session.execute(  # status only moves forward: a rerun over a complete adoption keeps it complete
        f"INSERT INTO {ks}.dataset_versions (dataset, version, status, tables, transform, started_at) "
        "VALUES (%s, %s, 'writing', %s, %s, %s) IF NOT EXISTS",
        (dataset, version, record, transform, now),
    )
    label_counts = _record_bytes(session, report)
    names = _record_names(session, report, split, meta_columns)
    classes = max([*names, *label_counts], default=-1) + 1
    report.class_map = [names.get(k, str(k)) for k in range(classes)]
    session.execute(
        f"UPDATE {ks}.dataset_versions SET split_counts = %s, label_counts = %s, class_map = %s, quarantine_count = 0, "
        "finished_at = %s, checks = %s WHERE dataset = %s AND version = %s",
        (
            report.split_counts,
            {str(k): v for k, v in label_counts.items()},
            report.class_map,
            datetime.now(UTC),
            {"adopted": f"{report.rows} rows, sha256 of the stored bytes recorded"},
            dataset,
            version,
        ),
    )
    advance_status(session, ks, dataset, version, "complete", ("writing", "written", "complete"))
    log.info("adopted %s + %s as %s version %s: %d rows", data_table, metadata_table, dataset, version, report.rows)
    return report
