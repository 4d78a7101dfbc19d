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
ONE_COPY = "{'class': 'SimpleStrategy', 'replication_factor': 1}"


@pytest.fixture(scope="module")
def session(cassandra_server: CassandraServer) -> Iterator[Any]:
    with cassandra_session(CassandraSettings(hosts=(cassandra_server.host,), port=cassandra_server.native_port)) as s:
        s.execute(f"DROP KEYSPACE IF EXISTS {KS}", timeout=60)
        s.execute(f"CREATE KEYSPACE {KS} WITH replication = {ONE_COPY}")
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
    # another dataset's load took the hold over (it loads the same tables): only that dataset gives it back
    compaction_hold.hold(session, [f"{KS}.a"], "other/v7")
    assert compaction_hold.holder_of(_state(session, "a")[1]) == "other/v7"
    assert compaction_hold.release(session, [f"{KS}.a"], "ds") == []
    assert compaction_hold.release(session, [f"{KS}.a", f"{KS}.missing"], "other") == [f"{KS}.a"]
    assert _state(session, "a") == before
    assert compaction_hold.release(session, [f"{KS}.a"], "other") == []  # nothing held: nothing changes


def test_compaction_the_operator_turned_off_stays_off(session: Any) -> None:
    session.execute(
        f"CREATE TABLE {KS}.b (id int PRIMARY KEY) WITH compaction = "
        "{'class': 'SizeTieredCompactionStrategy', 'enabled': 'false'}"
    )
    before = _state(session, "b")
    assert compaction_hold.hold(session, [f"{KS}.b"], "ds/v1") == []
    assert compaction_hold.release(session, [f"{KS}.b"], "ds") == []
    assert _state(session, "b") == before


def test_a_role_that_may_not_alter_loads_with_compaction_on(cassandra_auth_server: CassandraServer) -> None:
    """An operator created the tables and granted the ingest role MODIFY and SELECT only: nothing held, no error."""
    import secrets

    node = (cassandra_auth_server.host,), cassandra_auth_server.native_port
    admin = CassandraSettings(hosts=node[0], port=node[1], username="cassandra", password="cassandra")
    role, password = f"imgest_test_writer_{secrets.token_hex(4)}", "pw" + secrets.token_hex(12)
    with cassandra_session(admin) as s:
        s.execute(f"CREATE KEYSPACE IF NOT EXISTS {KS} WITH replication = {ONE_COPY}")
        s.execute(f"CREATE TABLE IF NOT EXISTS {KS}.c (id int PRIMARY KEY)")
        s.execute(f"CREATE ROLE {role} WITH LOGIN = true AND PASSWORD = '{password}'")
        for permission in ("SELECT", "MODIFY"):
            s.execute(f"GRANT {permission} ON KEYSPACE {KS} TO {role}")
        before = _state(s, "c")
    writer = CassandraSettings(hosts=node[0], port=node[1], username=role, password=password)
    with cassandra_session(writer) as s:
        assert compaction_hold.hold(s, [f"{KS}.c"], "ds/v1") == []
        assert compaction_hold.release(s, [f"{KS}.c"], "ds") == []
        assert _state(s, "c") == before


def test_the_writers_bench_waits_for_the_node_to_stop_compacting(cassandra_server: CassandraServer) -> None:
    """`imgest bench plugin --parts writers` counts a writer's node CPU until the node is done compacting: on an
    idle node that is the quiet window itself."""
    from imgest.bench.plugin_writers import settle

    settings = CassandraSettings(hosts=(cassandra_server.host,), port=cassandra_server.native_port)
    assert 0.5 <= settle(settings, quiet_s=0.5, limit_s=60) < 60
