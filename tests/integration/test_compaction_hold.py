"""Compaction held on a bulk load's tables and given back, against the real node's schema."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from imgest.core.settings import CassandraSettings
from imgest.services.cassandra import CassandraServer
from imgest.sinks.cassandra import compaction_hold
from imgest.sinks.cassandra.client import cassandra_session

pytestmark = pytest.mark.services
KS = "imgest_test_compaction_hold"


@pytest.fixture(scope="module")
def session(cassandra_server: CassandraServer) -> Iterator[Any]:
    with cassandra_session(CassandraSettings(hosts=(cassandra_server.host,), port=cassandra_server.native_port)) as s:
        s.execute(f"DROP KEYSPACE IF EXISTS {KS}", timeout=60)
        s.execute(f"CREATE KEYSPACE {KS} WITH replication = {{'class': 'SimpleStrategy', 'replication_factor': 1}}")
        yield s
        s.execute(f"DROP KEYSPACE IF EXISTS {KS}", timeout=60)


def _state(session: Any, table: str) -> tuple[dict[str, str], str]:
    row = session.execute(
        "SELECT compaction, comment FROM system_schema.tables WHERE keyspace_name = %s AND table_name = %s",
        (KS, table),
    ).one()
    return dict(row.compaction), row.comment


def test_held_then_given_back_with_the_options_and_comment_it_had(session: Any) -> None:
    session.execute(
        f"CREATE TABLE {KS}.a (id int PRIMARY KEY) WITH compaction = "
        "{'class': 'SizeTieredCompactionStrategy', 'min_threshold': '6'} AND comment = 'the operator''s note'"
    )
    before = _state(session, "a")
    assert compaction_hold.hold(session, [f"{KS}.a"], "ds/v1") == [f"{KS}.a"]
    options, comment = _state(session, "a")
    assert options == {**before[0], "enabled": "false"}
    assert comment.startswith(f"{compaction_hold.MARK} by ds/v1 since ")
    assert comment.endswith(f"{compaction_hold.WAS}the operator's note")
    # held twice (a resumed load): the first comment is kept, not nested
    compaction_hold.hold(session, [f"{KS}.a"], "ds/v1")
    assert _state(session, "a")[1].count(compaction_hold.WAS) == 1
    assert compaction_hold.release(session, [f"{KS}.a", f"{KS}.missing"]) == [f"{KS}.a"]
    assert _state(session, "a") == before
    assert compaction_hold.release(session, [f"{KS}.a"]) == []  # nothing held: nothing changes


def test_compaction_the_operator_turned_off_stays_off(session: Any) -> None:
    session.execute(
        f"CREATE TABLE {KS}.b (id int PRIMARY KEY) WITH compaction = "
        "{'class': 'SizeTieredCompactionStrategy', 'enabled': 'false'}"
    )
    before = _state(session, "b")
    assert compaction_hold.hold(session, [f"{KS}.b"], "ds/v1") == []
    assert compaction_hold.release(session, [f"{KS}.b"]) == []
    assert _state(session, "b") == before
