"""Token-range scans that cannot take a node down, against the real node: the split scan's page requests in flight on
the node, counted on the wire (tests/cql_wire.py), stay within the per-node bound while the scan does use it; a
refused read is waited out and resumed from its paging state (every row exactly once); a read refused to the end
fails with the node's own state in the message."""

from __future__ import annotations

import json
import logging
import uuid
from collections.abc import Iterator
from typing import Any

import pytest

from imgest.core.settings import CassandraSettings
from imgest.services.cassandra import CassandraServer
from imgest.sinks.cassandra.client import cassandra_session
from imgest.sinks.cassandra.scan import ScanError, scan_columns
from imgest.sinks.cassandra.scan_limits import ScanLimits, node_per_node
from imgest.sinks.cassandra.schema import TableLayout, apply_schema
from imgest.splits.sources import from_cassandra
from tests.cql_wire import CqlWire

pytestmark = pytest.mark.services
TABLES = TableLayout("imgest_test_scan_bounds")
META = f"{TABLES.keyspace}.metadata"
ROWS = 6_000
CLASSES = 6


@pytest.fixture(scope="module")
def wire(cassandra_server: CassandraServer) -> Iterator[CqlWire]:
    """The node behind a frame-counting relay, with a version of ROWS rows (4/5 train) written through it."""
    from cassandra.concurrent import execute_concurrent_with_args

    with CqlWire(cassandra_server.host, cassandra_server.native_port) as relay:
        with cassandra_session(CassandraSettings(hosts=("127.0.0.1",), port=relay.port)) as s:
            s.execute(f"DROP KEYSPACE IF EXISTS {TABLES.keyspace}", timeout=60)
            apply_schema(s, TABLES, ["train", "val"], "SimpleStrategy:1")
            insert = s.prepare(f"INSERT INTO {META} (id, label, split, dataset, version) VALUES (?, ?, ?, ?, ?)")
            rows = [
                (uuid.uuid5(uuid.NAMESPACE_OID, f"bounds-{n}"), n % CLASSES, "train" if n % 5 else "val", "d", "v1")
                for n in range(ROWS)
            ]
            for ok, result in execute_concurrent_with_args(s, insert, rows, concurrency=32):
                assert ok, result
            s.execute(
                f"INSERT INTO {TABLES.keyspace}.dataset_versions (dataset, version, status, tables, class_map)"
                " VALUES (%s, %s, 'complete', %s, %s)",
                ("d", "v1", json.dumps({"train": {"metadata": META}}), [f"n{c:08d}" for c in range(CLASSES)]),
            )
        yield relay


@pytest.fixture
def session(wire: CqlWire) -> Iterator[Any]:
    with cassandra_session(CassandraSettings(hosts=("127.0.0.1",), port=wire.port)) as s:
        yield s


def test_the_split_scan_keeps_its_requests_per_node_within_the_bound(wire: CqlWire, session: Any) -> None:
    """The split builder's scan (16 worker threads by default) asks the embedded node (concurrent_reads 8) for at
    most 2 pages at once, as the node sees it on the wire (before the bound it asked for 16); every train row comes
    back once. That the bound is used, not merely never reached: the next test."""
    bound = node_per_node(session)
    assert bound == 2  # a quarter of the embedded node's concurrent_reads
    wire.reset()
    rows = from_cassandra(session, META, f"{TABLES.keyspace}.data", only_split="train", dataset="d")
    assert len(rows.ids) == ROWS - ROWS // 5
    assert len(set(rows.ids.tolist())) == len(rows.ids)
    assert wire.executes >= 256  # one request per token range at least: the scan went through the relay
    assert 1 <= wire.peak <= bound


def test_a_wider_bound_is_used_and_kept(wire: CqlWire, session: Any) -> None:
    wire.reset()
    limits = ScanLimits(in_flight=12, per_node=5)
    batches = scan_columns(session, META, ["id"], "d", "v1", ranges=24, page_size=100, limits=limits)
    assert sum(b.num_rows for b in batches) == ROWS
    assert 2 < wire.peak <= 5  # more than the default bound, never more than this one


class RefusingSession:
    """The real session, whose first REFUSALS page requests of the scan fail as an overloaded replica answers
    (ReadFailure: a fault the node gives only when it is dying, injected here)."""

    def __init__(self, session: Any, refusals: int) -> None:
        self.session, self.refusals, self.calls = session, refusals, 0

    def __getattr__(self, name: str) -> Any:
        return getattr(self.session, name)

    def execute(self, query: Any, parameters: Any = None, **kwargs: Any) -> Any:
        from cassandra import ConsistencyLevel, ReadFailure

        if kwargs.get("paging_state") is not None or parameters is not None:
            self.calls += 1
            if self.calls <= self.refusals:
                raise ReadFailure(
                    "Replica(s) failed to execute read",
                    consistency=ConsistencyLevel.LOCAL_QUORUM,
                    required_responses=1,
                    received_responses=0,
                    failures=1,
                )
        return self.session.execute(query, parameters, **kwargs)


def test_refused_reads_are_waited_out_and_resumed_without_loss(session: Any, caplog: pytest.LogCaptureFixture) -> None:
    refusing = RefusingSession(session, refusals=3)
    limits = ScanLimits(in_flight=1, per_node=2, backoff_s=0.01, attempts=5)
    caplog.set_level(logging.WARNING, logger="imgest.sinks.cassandra.scan_limits")
    ids = [b for batch in scan_columns(refusing, META, ["id"], "d", "v1", page_size=250, limits=limits)
           for b in batch.column("id").to_pylist()]  # fmt: skip
    assert len(ids) == ROWS
    assert len(set(ids)) == ROWS
    assert sum("refused (ReadFailure" in r.getMessage() for r in caplog.records) == 3


def test_a_read_refused_to_the_end_names_the_range_and_the_nodes_state(session: Any) -> None:
    refusing = RefusingSession(session, refusals=10**6)
    limits = ScanLimits(in_flight=2, per_node=2, backoff_s=0.01, attempts=3)
    with pytest.raises(ScanError) as info:
        for _ in scan_columns(refusing, META, ["id"], "d", "v1", limits=limits):
            pass
    text = str(info.value)
    assert f"scan of {META} in token range [-9223372036854775808, " in text
    assert "failed after 3 tries: ReadFailure" in text
    assert ": up; CompactionExecutor " in text  # asked of the node itself (system_views.thread_pools)
    assert " active / " in text
    assert "ReadStage " in text
