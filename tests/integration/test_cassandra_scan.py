"""The token-range scanner against the real node: every row exactly once across ranges and pages, version
filtering in Arrow, counts, and the split builder on top of it (same split as before, bounded memory)."""

from __future__ import annotations

import itertools
import json
import tracemalloc
import uuid
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pytest

from imgest.core.settings import CassandraSettings
from imgest.services.cassandra import CassandraServer
from imgest.sinks.cassandra.client import cassandra_session
from imgest.sinks.cassandra.scan import (
    MAX_TOKEN,
    MIN_TOKEN,
    ScanError,
    count_by,
    count_partitions,
    scan_columns,
    token_ranges,
    uuid_column,
)
from imgest.sinks.cassandra.schema import TableLayout, apply_schema
from imgest.sinks.cassandra.versions import set_lineage, version_members, version_rows
from imgest.splits.sources import LabelledRows, from_cassandra
from imgest.splits.split import id_strings, load_split, write_split_files

pytestmark = pytest.mark.services
TABLES = TableLayout("imgest_test_scan")
META = f"{TABLES.keyspace}.metadata"
ROWS = 12_000  # of dataset "big" version "v1": many pages and ranges at the sizes the tests use
CLASSES = 10


def _rows() -> list[tuple[uuid.UUID, int, str, str | None, str | None]]:
    """(id, label, split, dataset, version): big/v1 in train and val, plus rows the filters must leave out."""
    rows = []
    for n in range(ROWS):
        rows.append(
            (uuid.uuid5(uuid.NAMESPACE_OID, f"scan-{n}"), n % CLASSES, "train" if n % 5 else "val", "big", "v1")
        )
    for n in range(300):  # another version of the dataset, another dataset, rows without a version
        rid = uuid.uuid5(uuid.NAMESPACE_OID, f"other-{n}")
        rows.append((rid, n % 3, "train", *(("big", "v0"), ("small", "v1"), (None, None))[n % 3]))
    return rows


@pytest.fixture(scope="module")
def session(cassandra_server: CassandraServer) -> Iterator[Any]:
    from cassandra.concurrent import execute_concurrent_with_args

    with cassandra_session(CassandraSettings(hosts=(cassandra_server.host,), port=cassandra_server.native_port)) as s:
        s.execute(f"DROP KEYSPACE IF EXISTS {TABLES.keyspace}", timeout=60)
        apply_schema(s, TABLES, ["train", "val"], "SimpleStrategy:1")
        insert = s.prepare(f"INSERT INTO {META} (id, label, split, dataset, version) VALUES (?, ?, ?, ?, ?)")
        for ok, result in execute_concurrent_with_args(s, insert, _rows(), concurrency=64):
            assert ok, result
        s.execute(
            f"INSERT INTO {TABLES.keyspace}.dataset_versions (dataset, version, status, tables, class_map)"
            " VALUES (%s, %s, 'complete', %s, %s)",
            ("big", "v1", json.dumps({"train": {"metadata": META}}), [f"n{c:08d}" for c in range(CLASSES)]),
        )
        yield s


def _ids(batches: Iterator[pa.RecordBatch]) -> list[str]:
    return [str(uuid.UUID(bytes=b)) for batch in batches for b in batch.column("id").to_pylist()]


@pytest.mark.parametrize("count", [1, 2, 3, 7, 256, 1000])
def test_token_ranges_cover_the_whole_ring_once(count: int) -> None:
    ranges = token_ranges(count)
    assert len(ranges) == count
    assert ranges[0][0] == MIN_TOKEN  # the minimum token itself is inside the first range
    assert ranges[-1][1] == MAX_TOKEN
    for (_, high), (low, _) in itertools.pairwise(ranges):
        assert low == high + 1  # contiguous, no gap and no overlap
    assert all(low <= high for low, high in ranges)
    with pytest.raises(ScanError):
        token_ranges(0)


@pytest.mark.parametrize(("ranges", "page_size", "concurrency"), [(1, 1000, 1), (7, 97, 3), (300, 50, 16)])
def test_every_row_exactly_once_across_ranges_and_pages(session: Any, ranges: int, page_size: int, concurrency: int):
    everything = {str(r[0]) for r in _rows()}
    batches = list(scan_columns(session, META, ["id"], ranges=ranges, page_size=page_size, concurrency=concurrency))
    ids = _ids(iter(batches))
    assert len(ids) == len(everything)  # no row twice
    assert set(ids) == everything
    assert max(b.num_rows for b in batches) <= page_size  # batches are pages: bounded whatever the table's size
    # the rows holding the smallest and the largest token are found: the ends of the ring are covered
    tokens = {str(r.id): r.t for r in session.execute(f"SELECT id, token(id) AS t FROM {META}")}
    lowest, highest = min(tokens, key=tokens.get), max(tokens, key=tokens.get)
    assert {lowest, highest} <= set(ids)


def test_version_filter_and_column_types(session: Any) -> None:
    batches = list(scan_columns(session, META, ["id", "label", "split"], "big", "v1", ranges=16, page_size=500))
    table = pa.Table.from_batches(batches)
    assert table.schema.names == ["id", "label", "split"]  # the filter columns are read, then dropped
    assert table.schema.field("id").type == pa.binary(16)
    assert table.schema.field("label").type == pa.int32()
    want = {str(r[0]): (r[1], r[2]) for r in _rows() if (r[3], r[4]) == ("big", "v1")}
    pairs = zip(table["label"].to_pylist(), table["split"].to_pylist(), strict=True)
    got = dict(zip(_ids(iter(batches)), pairs, strict=True))
    assert got == want
    assert uuid_column(table["id"].combine_chunks()).dtype == np.dtype("S16")


def test_counts_and_named_rows_match_the_rows_written(session: Any) -> None:
    want = Counter(f"{r[2]}/{r[1]}" for r in _rows() if (r[3], r[4]) == ("small", "v1"))
    assert count_by(session, META, ["split", "label"], "small", "v1", ranges=5) == want
    rows = list(version_rows(session, META, "big", "v0", "id, label, split"))
    assert {(r.id, r.label, r.split) for r in rows} == {r[:3] for r in _rows() if (r[3], r[4]) == ("big", "v0")}
    assert all(isinstance(r.id, uuid.UUID) for r in rows)


def test_count_partitions_counts_each_row_of_a_blob_table_once(session: Any) -> None:
    """count_partitions (SELECT DISTINCT of the partition key) over a data table of blobs and the metadata table,
    at several range counts and page sizes."""
    from cassandra.concurrent import execute_concurrent_with_args

    data = f"{TABLES.keyspace}.{TABLES.data_table('train')}"
    session.execute(f"TRUNCATE {data}", timeout=60)
    insert = session.prepare(f"INSERT INTO {data} (id, label, data) VALUES (?, ?, ?)")
    rows = [(uuid.uuid5(uuid.NAMESPACE_OID, f"blob-{n}"), n % CLASSES, bytes([n % 251]) * 30_000) for n in range(700)]
    for ok, result in execute_concurrent_with_args(session, insert, rows, concurrency=32):
        assert ok, result
    for ranges, page_size in ((1, 100), (7, 64), (256, 5000)):
        assert count_partitions(session, data, ranges=ranges, page_size=page_size) == 700
    assert count_partitions(session, META, ranges=3) == len(_rows())


def test_unknown_table_or_column_is_named(session: Any) -> None:
    with pytest.raises(ScanError, match=r"imgest_test_scan\.nope does not exist"):
        list(scan_columns(session, f"{TABLES.keyspace}.nope", ["id"]))
    with pytest.raises(ScanError, match="no column 'colour'"):
        list(scan_columns(session, META, ["id", "colour"]))


def _split_as_before(session: Any) -> LabelledRows:
    """The rows as the split builder read them before the scanner: Python objects, sorted by UUID string."""
    rows = [
        (str(r.id), r.label)
        for r in session.execute(f"SELECT id, label, split, dataset, version FROM {META}")
        if (r.dataset, r.version, r.split) == ("big", "v1", "train")
    ]
    rows.sort()
    return LabelledRows(np.asarray([i for i, _ in rows]), np.asarray([lab for _, lab in rows]), CLASSES, {})


def test_split_builder_gives_the_same_split_as_before(session: Any, tmp_path: Path) -> None:
    rows = from_cassandra(session, META, f"{TABLES.keyspace}.data", "train", "big", ranges=32, page_size=300)
    before = _split_as_before(session)
    assert rows.ids.dtype == np.dtype("S16")
    assert rows.labels.dtype == np.int32
    assert np.array_equal(id_strings(rows.ids), before.ids)
    assert np.array_equal(rows.labels, before.labels)
    assert rows.num_classes == CLASSES
    rows.source = before.source = {"kind": "cassandra"}
    new = write_split_files(rows, [8, 2], "original", 5, tmp_path / "new.npz", crs4=True)
    old = write_split_files(before, [8, 2], "original", 5, tmp_path / "old.npz")
    a, b = load_split(tmp_path / "new.npz"), load_split(tmp_path / "old.npz")
    assert np.array_equal(a.row_ids, b.row_ids)
    assert all(np.array_equal(x, y) for x, y in zip(a.parts, b.parts, strict=True))
    assert np.array_equal(new.part(1)[0], old.part(1)[0])  # in memory too: parts give UUID strings


def _peak(session: Any, split: str | None) -> tuple[int, int]:
    """(rows, peak traced bytes) of one build of the rows of SPLIT (None: the whole version) in pages of 100, one
    range in flight, after a build that prepared the statements. One page in flight keeps the driver's share of the
    peak small and fixed (with 4 in flight, how many pages its thread held at the peak swung the figure by a megabyte
    with the machine's load); a busy machine adds pages, never columns."""
    knobs = {"ranges": 64, "page_size": 100, "concurrency": 1}
    from_cassandra(session, META, f"{TABLES.keyspace}.data", split, "big", **knobs)  # statements prepared, warm
    tracemalloc.start()
    try:
        rows = from_cassandra(session, META, f"{TABLES.keyspace}.data", split, "big", **knobs)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    return len(rows.ids), peak


def test_split_builder_memory_grows_by_columns_not_objects(session: Any) -> None:
    """Five times the rows cost only their numpy columns (16-byte id + int32 label, a sort order and one copy:
    about 65 bytes a row measured, under CPU hogs too; 120 allowed), not a Python object per row: the list of UUID
    strings and its U36 array that the builder held before cost about 245 bytes a row. The rest of the peak is the
    page in flight, fixed by page_size x concurrency whatever the table's size."""
    small_rows, small_peak = _peak(session, "val")
    big_rows, big_peak = _peak(session, None)
    assert (small_rows, big_rows) == (ROWS // 5, ROWS)
    per_row = (big_peak - small_peak) / (big_rows - small_rows)
    assert per_row < 120, f"peak {small_peak} bytes for {small_rows} rows, {big_peak} for {big_rows}"


def test_a_refreshed_version_holds_its_lineages_rows(session: Any) -> None:
    """A refresh writes only what changed: r2's lineage [r1, r2] makes r1's untouched rows r2's too, and rows of
    versions outside the lineage (r0) stay out, in the scanner, the counts and the split builder alike."""
    tables = TableLayout("imgest_test_lineage")
    meta = f"{tables.keyspace}.metadata"
    session.execute(f"DROP KEYSPACE IF EXISTS {tables.keyspace}", timeout=60)
    apply_schema(session, tables, ["train"], "SimpleStrategy:1")
    versions = {"r1": 5, "r2": 3, "r0": 2}  # r0: an older version's leftover, not in r2's lineage
    insert = session.prepare(f"INSERT INTO {meta} (id, label, split, dataset, version) VALUES (?, ?, ?, ?, ?)")
    want = set()
    for version, count in versions.items():
        for n in range(count):
            rid = uuid.uuid5(uuid.NAMESPACE_OID, f"lineage-{version}-{n}")
            session.execute(insert, (rid, n % 2, "train", "lin", version))
            if version != "r0":
                want.add(str(rid))
    tables_json = json.dumps({"train": {"metadata": meta}})
    for version, status in (("r1", "replaced"), ("r2", "complete")):
        session.execute(
            f"INSERT INTO {tables.keyspace}.dataset_versions (dataset, version, status, tables, class_map)"
            " VALUES (%s, %s, %s, %s, %s)",
            ("lin", version, status, tables_json, ["n0", "n1"]),
        )
    assert set_lineage(session, tables.keyspace, "lin", "r2", "r1") == ["r1", "r2"]
    assert set_lineage(session, tables.keyspace, "lin", "r2", "r1") == ["r1", "r2"]  # a re-run finish: same
    members = version_members(session, tables.keyspace, "lin", "r2")
    assert members == ["r1", "r2"]
    assert set(_ids(scan_columns(session, meta, ["id"], "lin", members, ranges=4))) == want
    assert sum(count_by(session, meta, ["split"], "lin", members).values()) == 8
    assert set(_ids(scan_columns(session, meta, ["id"], "lin", "r2"))) != want  # r2 alone: only what it wrote
    rows = from_cassandra(session, meta, f"{tables.keyspace}.data", "train", "lin")
    assert set(id_strings(rows.ids)) == want
    assert rows.source["version"] == "r2"


def test_a_table_made_by_another_process_since_the_sessions_last_look_is_found(
    session: Any, cassandra_server: CassandraServer
) -> None:
    """Another process (an ingest job) creates the tables; this long-lived session's cached schema does not have them
    yet (schema events arrive debounced; the cache entry is removed here so the stale view is certain). The scan
    refreshes the keyspace's metadata on a miss instead of saying the table does not exist."""
    from imgest.sinks.cassandra.scan import arrow_schema

    table = f"{TABLES.keyspace}.made_elsewhere"
    with cassandra_session(CassandraSettings(hosts=(cassandra_server.host,), port=cassandra_server.native_port)) as s:
        s.execute(f"DROP TABLE IF EXISTS {table}", timeout=60)
        s.execute(f"CREATE TABLE {table} (id uuid PRIMARY KEY, label int)", timeout=60)
        s.execute(f"INSERT INTO {table} (id, label) VALUES (%s, 7)", (uuid.uuid4(),))
    session.cluster.metadata.keyspaces[TABLES.keyspace].tables.pop("made_elsewhere", None)
    assert arrow_schema(session, table, ["id", "label"]).names == ["id", "label"]
    assert sum(b.num_rows for b in scan_columns(session, table, ["id", "label"])) == 1
    with pytest.raises(ScanError, match="does not exist"):
        arrow_schema(session, f"{TABLES.keyspace}.never_made", ["id"])


def test_a_keyspace_made_by_another_process_since_the_sessions_last_look_is_found(
    session: Any, cassandra_server: CassandraServer
) -> None:
    """The keyspace too is new to this session (dropped here, made again by an ingest elsewhere): the driver drops a
    table's refresh for a keyspace it does not know, so the scan refreshes the keyspace first (CI run of stop 74:
    `table imgest_test_apart.metadata does not exist` right after the ingest that made it)."""
    from imgest.sinks.cassandra.scan import arrow_schema

    keyspace = "imgest_test_made_elsewhere"
    session.execute(f"DROP KEYSPACE IF EXISTS {keyspace}", timeout=60)
    with cassandra_session(CassandraSettings(hosts=(cassandra_server.host,), port=cassandra_server.native_port)) as s:
        s.execute(
            f"CREATE KEYSPACE {keyspace} WITH replication = {{'class': 'SimpleStrategy', 'replication_factor': 1}}",
            timeout=60,
        )
        s.execute(f"CREATE TABLE {keyspace}.meta (id uuid PRIMARY KEY, label int)", timeout=60)
    session.cluster.metadata.keyspaces.pop(keyspace, None)  # the stale view, certain
    try:
        assert arrow_schema(session, f"{keyspace}.meta", ["id", "label"]).names == ["id", "label"]
    finally:
        session.execute(f"DROP KEYSPACE IF EXISTS {keyspace}", timeout=60)
