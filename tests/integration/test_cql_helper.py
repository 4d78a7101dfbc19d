"""The cql-helper write path against the real node: each image's rows leave the helper's JVM as one CQL batch through
the Java driver; rows count once their round is answered, a value the node refuses as too large is quarantined, any
other refusal fails the flush naming the row, and too few replicas are retried before they are reported."""

from __future__ import annotations

import dataclasses
import hashlib
import uuid
from collections.abc import Iterator
from typing import Any

import pytest

from imgest.core.quarantine import QuarantineLog
from imgest.core.settings import CassandraSettings
from imgest.services.cassandra import CassandraServer
from imgest.sinks.cassandra import bulk_helper
from imgest.sinks.cassandra.bulk_writer import CQL_ROUND_ROWS, BulkTarget, HelperCqlWriter
from imgest.sinks.cassandra.client import cassandra_session
from imgest.sinks.cassandra.schema import TableLayout, apply_schema
from imgest.sinks.cassandra.write_path import cql_helper_target
from imgest.sinks.cassandra.writer import CassandraWriteError, Row

pytestmark = pytest.mark.services
KS = "imgest_test_cql_helper"
ROW_BYTES = 20_000


@pytest.fixture(scope="module")
def target(cassandra_server: CassandraServer) -> Iterator[tuple[BulkTarget, CassandraSettings, Any]]:
    settings = CassandraSettings(hosts=(cassandra_server.host,), port=cassandra_server.native_port)
    layout = TableLayout(keyspace=KS)
    with cassandra_session(settings) as session:
        session.execute(f"DROP KEYSPACE IF EXISTS {KS}", timeout=120)
        apply_schema(session, layout, ["train"], "SimpleStrategy:1")
        yield cql_helper_target(layout, ["train"], "ONE", 16), settings, session
        session.execute(f"DROP KEYSPACE IF EXISTS {KS}", timeout=120)
    bulk_helper._close_all()


@pytest.fixture(autouse=True)
def _empty_tables(target: tuple[Any, Any, Any]) -> None:
    """Each test starts from empty tables: what a test reads back is what it wrote, whatever ran before it."""
    for table in ("data", "metadata"):
        target[2].execute(f"TRUNCATE {KS}.{table}", timeout=120)


def _digest(data: bytes) -> str:
    """A row's bytes as their sha256 (a failing comparison of 100 rows of 30 KB each took pytest minutes to print)."""
    return hashlib.sha256(data).hexdigest()


def _row(i: int, size: int = ROW_BYTES, width: Any = 1) -> Row:
    data = hashlib.sha256(str(i).encode()).digest() * (size // 32)
    rid = uuid.uuid5(uuid.NAMESPACE_URL, f"cql-helper/{i}")
    meta = (rid, i % 3, "n0", "train", f"n0/{i}.JPEG", width, 1, len(data), "s", "s", "k", "cqlh", "v1")
    return Row(rid, i % 3, data, "train", meta, f"n0/{i}.JPEG")


def _writer(target: BulkTarget, settings: CassandraSettings, quarantine: QuarantineLog, written: list[str]) -> Any:
    return HelperCqlWriter(target, settings, quarantine, on_written=lambda r, n: written.append(r.rel_path))


def _write_all(writer: HelperCqlWriter, rows: list[Row]) -> None:
    for row in rows:
        writer.write(row)


def test_rows_go_as_cql_through_the_helper_and_count_once_answered(target: tuple[Any, Any, Any]) -> None:
    bulk, settings, session = target
    assert bulk.mode == "cql"
    assert bulk.header(settings)["mode"] == "cql"
    n = CQL_ROUND_ROWS * 2 + 37  # three rounds, the last one short
    written: list[str] = []
    quarantine = QuarantineLog()
    with _writer(bulk, settings, quarantine, written) as w:
        for i in range(n):
            w.write(_row(i))
            assert len(written) == w.stats.written <= i + 1 - len(w._pending) - sum(map(len, w._loading))
            assert w._helper.loading <= 1
    assert sorted(written) == sorted(f"n0/{i}.JPEG" for i in range(n))
    assert (w.stats.written, w.stats.bytes, w.stats.retries, len(quarantine)) == (n, n * len(_row(0).data), 0, 0)
    stored = {r.id: _digest(r.data) for r in session.execute(f"SELECT id, data FROM {KS}.data")}
    assert stored == {_row(i).id: _digest(_row(i).data) for i in range(n)}
    meta = {r.id: (r.rel_path, r.width, r.dataset) for r in session.execute(f"SELECT * FROM {KS}.metadata")}
    assert meta == {_row(i).id: (f"n0/{i}.JPEG", 1, "cqlh") for i in range(n)}


def test_a_value_the_node_refuses_as_too_large_is_quarantined(target: tuple[Any, Any, Any]) -> None:
    """40 MiB exceeds the node's 32 MiB mutation limit: the node's refusal, through the Java driver, becomes a
    quarantine entry; the rows around it are stored."""
    bulk, settings, session = target
    written: list[str] = []
    quarantine = QuarantineLog()
    with HelperCqlWriter(
        bulk, settings, quarantine, max_blob_bytes=64 << 20, on_written=lambda r, n: written.append(r.rel_path)
    ) as w:
        for row in (_row(5000), _row(5001, size=40 << 20), _row(5002)):
            w.write(row)
    assert written == ["n0/5000.JPEG", "n0/5002.JPEG"]
    [entry] = quarantine.entries
    assert (entry.reason, entry.path, entry.id) == ("too-large-for-store", "n0/5001.JPEG", str(_row(5001).id))
    assert "server refused" in entry.detail
    assert "InvalidQueryException" in entry.detail
    assert session.execute(f"SELECT id FROM {KS}.data WHERE id = %s", (_row(5001).id,)).one() is None


def test_any_other_refusal_fails_the_flush_naming_the_row(target: tuple[Any, Any, Any]) -> None:
    """A value of the wrong size for its int column (a real refusal of the node): the flush raises, naming the row,
    and the good rows of the same round are stored and counted."""
    bulk, settings, session = target
    written: list[str] = []
    w = _writer(bulk, settings, QuarantineLog(), written)
    with pytest.raises(CassandraWriteError, match=r"1 rows failed .*n0/6001\.JPEG.*InvalidQueryException"), w:
        _write_all(w, [_row(6000), _row(6001, width=b"\x00\x01"), _row(6002)])
    assert written == ["n0/6000.JPEG", "n0/6002.JPEG"]
    assert session.execute(f"SELECT id FROM {KS}.metadata WHERE id = %s", (_row(6001).id,)).one() is None


def test_too_few_replicas_are_retried_then_reported(target: tuple[Any, Any, Any]) -> None:
    """Consistency TWO on a one-replica keyspace: the node answers unavailable; the helper sends the request again
    (RETRIES times, backing off) and then reports the row with the node's reason."""
    bulk, settings, _session = target
    two = dataclasses.replace(bulk, consistency="TWO", retries=2, backoff_s=0.01)
    w = _writer(two, settings, QuarantineLog(), [])
    with pytest.raises(CassandraWriteError, match=r"1 rows failed .*n0/7000\.JPEG.*TWO"), w:
        w.write(_row(7000))
    assert w.stats.retries == 2
