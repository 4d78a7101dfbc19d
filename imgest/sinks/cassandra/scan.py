"""Token-range scans of a Cassandra table as Arrow record batches: the one way imgest reads a whole table.

The ring's full token range (Murmur3: ``[-2**63, 2**63 - 1]``) is cut into RANGES contiguous sub-ranges; each is
read with ``SELECT cols FROM t WHERE token(pk) >= ? AND token(pk) <= ?`` (inclusive integer bounds, so the first
sub-range starts at the minimum token and nothing falls between two), paged by PAGE_SIZE rows, on CONCURRENCY
threads. What the scan asks of each node is bounded (``scan_limits``): at most a few page requests in flight on any
replica, a refused read waited out and resumed from its paging state, a read refused to the end reported with the
nodes' state. Every sub-range is an ordinary partition-key range read, spread over the replicas that own it: no
``ALLOW FILTERING``, no single coordinator walking the whole table.

Rows of one dataset version are kept by comparing the ``dataset`` / ``version`` columns in Arrow (vectorized),
never row by row in Python. A refreshed version's rows carry the version that last wrote them, so VERSION may be a
sequence: the version's lineage (``versions.VersionRecord.members``), any of which counts. Memory is bounded by
about 2 x CONCURRENCY x PAGE_SIZE rows of the selected columns, whatever the table's size; the caller receives one
record batch per page.

    for batch in scan_columns(session, "ks.metadata", ["id", "label", "split"], dataset="imagenet", version="v1"):
        ids = batch.column("id")  # fixed_size_binary(16): the UUID's 16 bytes
"""

from __future__ import annotations

import contextlib
import logging
from collections import Counter
from collections.abc import Iterator, Sequence
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from imgest.sinks.cassandra.scan_limits import NodeLimiter, ScanError, ScanLimits, node_per_node, range_replicas
from imgest.sinks.cassandra.scan_reads import RangeReads
from imgest.sinks.cassandra.schema import identifier

log = logging.getLogger(__name__)

MIN_TOKEN = -(2**63)
MAX_TOKEN = 2**63 - 1
DEFAULT_RANGES = 256
DEFAULT_PAGE_SIZE = 5000
DEFAULT_CONCURRENCY = 16
MURMUR3 = "org.apache.cassandra.dht.Murmur3Partitioner"

# CQL type -> Arrow type of the column in the batches; uuids become their 16 bytes.
ARROW_TYPES: dict[str, pa.DataType] = {
    "uuid": pa.binary(16),
    "timeuuid": pa.binary(16),
    "int": pa.int32(),
    "bigint": pa.int64(),
    "smallint": pa.int16(),
    "tinyint": pa.int8(),
    "float": pa.float32(),
    "double": pa.float64(),
    "boolean": pa.bool_(),
    "text": pa.string(),
    "varchar": pa.string(),
    "ascii": pa.string(),
    "blob": pa.binary(),
    "timestamp": pa.timestamp("ms", tz="UTC"),
}


def token_ranges(count: int) -> list[tuple[int, int]]:
    """COUNT contiguous inclusive (low, high) token ranges covering [MIN_TOKEN, MAX_TOKEN] exactly once."""
    if count < 1:
        raise ScanError(f"a token-range scan needs at least one range, not {count}")
    span = MAX_TOKEN - MIN_TOKEN + 1
    bounds = [MIN_TOKEN + span * i // count for i in range(count + 1)]
    return [(bounds[i], bounds[i + 1] - 1) for i in range(count)]


def _table_meta(session: Any, table: str) -> Any:
    keyspace, _, name = table.partition(".")
    identifier(keyspace, "keyspace")
    identifier(name, "table")
    metadata = session.cluster.metadata
    if metadata.partitioner != MURMUR3:
        raise ScanError(f"token-range scans of {table} need the Murmur3Partitioner, not {metadata.partitioner}")
    ks = metadata.keyspaces.get(keyspace)
    meta = ks.tables.get(name) if ks is not None else None
    if meta is None:  # made since this session's last look (another process's ingest; schema events come debounced)
        with contextlib.suppress(Exception):  # no such keyspace: the error below says so
            if ks is None:  # the driver drops a table's refresh when it does not know the keyspace yet
                session.cluster.refresh_keyspace_metadata(keyspace)
            session.cluster.refresh_table_metadata(keyspace, name)
        ks = session.cluster.metadata.keyspaces.get(keyspace)
        meta = ks.tables.get(name) if ks is not None else None
    if meta is None:
        raise ScanError(f"table {table} does not exist (create it with the ingest, or check --keyspace)")
    return meta


def arrow_schema(session: Any, table: str, columns: Sequence[str]) -> pa.Schema:
    """The schema of the batches scan_columns yields for COLUMNS of TABLE ('ks.table')."""
    meta = _table_meta(session, table)
    fields = []
    for name in columns:
        col = meta.columns.get(name)
        if col is None:
            raise ScanError(f"table {table} has no column {name!r} (columns: {', '.join(meta.columns)})")
        kind = ARROW_TYPES.get(col.cql_type)
        if kind is None:
            raise ScanError(f"column {table}.{name} has CQL type {col.cql_type}, which scans do not convert")
        fields.append(pa.field(name, kind))
    return pa.schema(fields)


def _to_arrow(rows: list[Any], schema: pa.Schema) -> pa.RecordBatch:
    """One page of driver rows (tuples in SCHEMA's column order) as a record batch."""
    arrays = []
    for i, field in enumerate(schema):
        values = [row[i] for row in rows]
        if field.type == pa.binary(16):
            values = [None if v is None else v.bytes for v in values]
        arrays.append(pa.array(values, type=field.type))
    return pa.RecordBatch.from_arrays(arrays, schema=schema)


def uuid_column(array: pa.Array) -> np.ndarray:
    """A fixed_size_binary(16) column of a scan as a numpy array of 16-byte UUIDs ('S16', a copy); byte order
    sorts like the UUIDs' strings. Ids are primary keys, so never null."""
    if array.null_count:
        raise ScanError(f"a uuid column of {len(array)} rows holds {array.null_count} nulls")
    raw = np.frombuffer(array.buffers()[1], dtype="S16")
    return raw[array.offset : array.offset + len(array)].copy()


Versions = str | Sequence[str] | None


def _matches(batch: pa.RecordBatch, filters: dict[str, str | list[str]]) -> pa.Array:
    """Boolean mask of the rows of BATCH whose columns equal FILTERS' values, or are among them when a value is a
    list (nulls never match)."""
    masks = [
        pc.is_in(batch.column(k), value_set=pa.array(v, pa.string()))
        if isinstance(v, list)
        else pc.equal(batch.column(k), v)
        for k, v in filters.items()
    ]
    keep = masks[0]
    for mask in masks[1:]:
        keep = pc.and_kleene(keep, mask)
    return keep


def count_partitions(
    session: Any,
    table: str,
    ranges: int = DEFAULT_RANGES,
    page_size: int = DEFAULT_PAGE_SIZE,
    concurrency: int = 4,
    limits: ScanLimits | None = None,
) -> int:
    """Partitions of TABLE ('ks.table') by a token-range scan of ``SELECT DISTINCT`` its partition key. A plain
    ``SELECT id`` makes the node read every row whole (a CQL select fetches all regular columns to tell a row's
    liveness): on a data table of 128,000 80 KB images, 16 such pages at once took a 1 GiB node down. DISTINCT
    reads only the partition keys. Each partition comes exactly once, as in scan_columns."""
    pk = ", ".join(c.name for c in _table_meta(session, table).partition_key)
    select = f"SELECT DISTINCT {pk} FROM {table}"
    pages = _range_pages(session, table, select, pk, ranges, page_size, concurrency, limits)
    return sum(len(page) for page in pages)


def _range_pages(
    session: Any,
    table: str,
    select: str,
    pk: str,
    ranges: int,
    page_size: int,
    concurrency: int,
    limits: ScanLimits | None = None,
    pick: Sequence[int] | None = None,
) -> Iterator[list[Any]]:
    """The pages of SELECT (a query of TABLE without its WHERE) over RANGES token sub-ranges of the partition key PK,
    in token order, PAGE_SIZE rows a page. Page requests run on CONCURRENCY threads, at most LIMITS.per_node of them
    in flight on any replica (scan_limits), each refused read retried from its paging state with a backoff; a page
    that cannot be read raises ScanError with the replicas' state. Memory: two pages of each range being read."""
    limits = limits or ScanLimits(in_flight=concurrency)
    stmt = session.prepare(f"{select} WHERE token({pk}) >= ? AND token({pk}) <= ?")
    stmt.fetch_size = page_size
    bounds = token_ranges(ranges)
    if pick is not None:  # a subset of the sub-ranges, still in token order
        bounds = [bounds[i] for i in sorted(set(pick))]
    groups = range_replicas(session, table.partition(".")[0], bounds)
    per_node = limits.per_node or node_per_node(session)
    reads = RangeReads(
        session, table, stmt, bounds, groups, limits, NodeLimiter(per_node, {n for g in groups for n in g})
    )
    for index, item in reads.pages():
        if isinstance(item, ScanError):
            raise item
        if isinstance(item, BaseException):
            low, high = bounds[index]
            raise ScanError(f"scan of {table} failed in token range [{low}, {high}]: {item}") from item
        yield item


def scan_columns(
    session: Any,
    table: str,
    columns: Sequence[str],
    dataset: str | None = None,
    version: Versions = None,
    ranges: int = DEFAULT_RANGES,
    page_size: int = DEFAULT_PAGE_SIZE,
    concurrency: int = DEFAULT_CONCURRENCY,
    limits: ScanLimits | None = None,
    pick: Sequence[int] | None = None,
) -> Iterator[pa.RecordBatch]:
    """COLUMNS of every row of TABLE ('ks.table') as Arrow record batches of at most PAGE_SIZE rows; only the
    rows whose ``dataset`` / ``version`` columns equal DATASET / VERSION when given (VERSION a sequence: any of
    them, a refreshed version's lineage). Each row comes exactly once;
    the order is the token order of the sub-ranges, not a stable row order. uuid columns are fixed_size_binary(16).
    PICK: only the rows of these of the RANGES sub-ranges (indices; a uniform share of the rows, the partition key
    hashed to tokens)."""
    columns = list(columns)
    versions = version if version is None or isinstance(version, str) else sorted(set(version))
    filters = {k: v for k, v in (("dataset", dataset), ("version", versions)) if v is not None}
    selected = columns + [k for k in filters if k not in columns]
    schema = arrow_schema(session, table, selected)
    pk = ", ".join(c.name for c in _table_meta(session, table).partition_key)
    select = f"SELECT {', '.join(selected)} FROM {table}"
    for page in _range_pages(session, table, select, pk, ranges, page_size, concurrency, limits, pick):
        if not page:
            continue
        batch = _to_arrow(page, schema)
        if filters:
            batch = batch.filter(_matches(batch, filters)).select(columns)
        if batch.num_rows:
            yield batch


def count_by(
    session: Any,
    table: str,
    keys: Sequence[str],
    dataset: str | None = None,
    version: Versions = None,
    **scan: Any,
) -> Counter[str]:
    """Rows of TABLE per combination of the KEYS columns, as 'a/b' strings (e.g. 'train/3'), counted over a
    token-range scan of those columns only (SCAN: scan_columns' knobs)."""
    counts: Counter[str] = Counter()
    for batch in scan_columns(session, table, keys, dataset, version, **scan):
        grouped = pa.Table.from_batches([batch]).group_by(list(keys)).aggregate([([], "count_all")])
        for row in grouped.to_pylist():
            counts["/".join(str(row[k]) for k in keys)] += row["count_all"]
    return counts
