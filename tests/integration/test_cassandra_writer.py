"""ImageWriter against the real node: bytes round-trip, oversized values quarantined, timeouts retried."""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator
from typing import Any

import pytest

from imgest.core.quarantine import QuarantineLog
from imgest.core.settings import CassandraSettings
from imgest.services.cassandra import CassandraServer
from imgest.sinks.cassandra.client import cassandra_session
from imgest.sinks.cassandra.schema import TableLayout, apply_schema
from imgest.sinks.cassandra.writer import CassandraWriteError, ImageWriter, Row

pytestmark = pytest.mark.services
TABLES = TableLayout("imgest_test_writer")


@pytest.fixture(scope="module")
def session(cassandra_server: CassandraServer) -> Iterator[Any]:
    settings = CassandraSettings(hosts=(cassandra_server.host,), port=cassandra_server.native_port)
    with cassandra_session(settings) as s:
        apply_schema(s, TABLES, ["train"], "SimpleStrategy:1")
        s.execute(f"TRUNCATE {TABLES.keyspace}.data")
        s.execute(f"TRUNCATE {TABLES.keyspace}.metadata")
        yield s


def _prepared(session: Any) -> Any:
    ks = TABLES.keyspace
    batch = session.prepare(
        f"BEGIN UNLOGGED BATCH INSERT INTO {ks}.data (id, label, data) VALUES (?, ?, ?); "
        f"INSERT INTO {ks}.metadata (id, label, split, rel_path) VALUES (?, ?, ?, ?); APPLY BATCH"
    )
    return lambda split: batch


def _row(n: int, size: int = 2048) -> Row:
    rid = uuid.uuid5(uuid.NAMESPACE_OID, f"writer-test-{n}")
    return Row(rid, n % 7, os.urandom(size), "train", (rid, n % 7, "train", f"f{n}.jpg"), f"f{n}.jpg")


def test_rows_round_trip_with_metadata(session: Any) -> None:
    rows = [_row(n) for n in range(300)]
    quarantine = QuarantineLog()
    with ImageWriter(session, _prepared(session), quarantine, max_in_flight=16) as writer:
        for row in rows:
            writer.write(row)
    assert writer.stats.written == 300
    assert len(quarantine) == 0
    for row in rows[::37]:
        got = session.execute(f"SELECT label, data FROM {TABLES.keyspace}.data WHERE id = %s", (row.id,)).one()
        assert (got.label, bytes(got.data)) == (row.label, row.data)
        meta = session.execute(f"SELECT rel_path FROM {TABLES.keyspace}.metadata WHERE id = %s", (row.id,)).one()
        assert meta.rel_path == row.rel_path


def test_value_over_client_limit_is_quarantined_not_lost(session: Any) -> None:
    quarantine = QuarantineLog()
    with ImageWriter(session, _prepared(session), quarantine, max_blob_bytes=1000) as writer:
        writer.write(_row(1000, size=5000))
        writer.write(_row(1001, size=500))
    assert writer.stats.written == 1
    assert [(e.reason, e.path) for e in quarantine.entries] == [("too-large-for-store", "f1000.jpg")]


def test_value_refused_by_server_is_quarantined(session: Any) -> None:
    """40 MiB exceeds the node's 32 MiB mutation limit: the server's refusal becomes a quarantine entry."""
    quarantine = QuarantineLog()
    with ImageWriter(session, _prepared(session), quarantine, max_blob_bytes=64 << 20) as writer:
        writer.write(_row(2000, size=40 << 20))
    assert writer.stats.written == 0
    assert len(quarantine) == 1
    entry = quarantine.entries[0]
    assert entry.reason == "too-large-for-store"
    assert "server refused" in entry.detail


class _FlakySession:
    """Injects WriteTimeouts (a fault a single healthy local node does not produce on demand)."""

    def __init__(self, real: Any, failures: int) -> None:
        self._real, self.failures = real, failures

    def execute_async(self, stmt: Any, params: Any = None) -> Any:
        from cassandra import ConsistencyLevel, WriteTimeout
        from cassandra.policies import WriteType

        if self.failures > 0:
            self.failures -= 1
            future = self._real.execute_async("SELECT now() FROM system.local")
            err = WriteTimeout(
                "injected",
                consistency=ConsistencyLevel.ONE,
                required_responses=1,
                received_responses=0,
                write_type=WriteType.SIMPLE,
            )
            future.add_callbacks = lambda callback, errback, callback_args=(), errback_args=(), **_: errback(
                err, *errback_args
            )
            return future
        return self._real.execute_async(stmt, params)


def test_timeouts_are_retried_with_backoff(session: Any) -> None:
    flaky = _FlakySession(session, failures=3)
    quarantine = QuarantineLog()
    row = _row(3000)
    with ImageWriter(flaky, _prepared(session), quarantine, backoff=0.01) as writer:
        writer.write(row)
    assert writer.stats.written == 1
    assert writer.stats.retries == 3
    got = session.execute(f"SELECT data FROM {TABLES.keyspace}.data WHERE id = %s", (row.id,)).one()
    assert bytes(got.data) == row.data


def test_persistent_failure_raises_naming_the_row(session: Any) -> None:
    flaky = _FlakySession(session, failures=100)
    writer = ImageWriter(flaky, _prepared(session), QuarantineLog(), retries=2, backoff=0.01)
    with (
        pytest.raises(CassandraWriteError, match=r"1 rows failed after 2 retries; first: row .*f4000.jpg"),
        writer,
    ):
        writer.write(_row(4000))
