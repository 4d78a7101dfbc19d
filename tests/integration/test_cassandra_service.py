"""The embedded Cassandra 5.0 node: large blobs, authentication, jar caching, and the shared client sessions."""

from __future__ import annotations

import pytest

from imgest.core.settings import CassandraSettings
from imgest.services.cassandra import CassandraServer, resolve_jars
from imgest.sinks.cassandra.client import CassandraConnectError, cassandra_session
from imgest.sinks.smoke import cassandra_roundtrip

pytestmark = pytest.mark.services


def _settings(server: CassandraServer, user: str | None = None, password: str | None = None) -> CassandraSettings:
    return CassandraSettings(hosts=(server.host,), port=server.native_port, username=user, password=password)


def test_15mb_blob_roundtrip(cassandra_server: CassandraServer) -> None:
    with cassandra_session(_settings(cassandra_server)) as session:
        result = cassandra_roundtrip(session, nbytes=15 * 1024 * 1024, keyspace="imgest_test_services")
        assert result.equal
        assert result.nbytes == 15 * 1024 * 1024
        row = session.execute("SELECT release_version FROM system.local").one()
        assert row.release_version.startswith("5.0.")


def test_status_reports_answering_node(cassandra_server: CassandraServer) -> None:
    status = cassandra_server.status()
    assert status.answers
    assert status.address == "127.0.0.1:9042"
    assert " up " in status.line()


def test_second_resolve_uses_cached_jars(cassandra_server: CassandraServer) -> None:
    lib, resolved_now = resolve_jars()
    assert not resolved_now
    assert any(lib.glob("cassandra-all-5.0.*.jar"))


def test_password_auth_accepts_right_and_refuses_wrong_password(
    cassandra_auth_server: CassandraServer,
) -> None:
    with cassandra_session(_settings(cassandra_auth_server, "cassandra", "cassandra")) as session:
        assert session.execute("SELECT release_version FROM system.local").one() is not None
    with (
        pytest.raises(CassandraConnectError) as err,
        cassandra_session(_settings(cassandra_auth_server, "cassandra", "not-the-password")),
    ):
        pass
    message = str(err.value)
    assert "refused the credentials" in message
    assert "'cassandra'" in message
    assert cassandra_auth_server.address in message
    assert "not-the-password" not in message


def test_no_password_against_auth_node_is_refused(cassandra_auth_server: CassandraServer) -> None:
    assert cassandra_auth_server.answers()  # a node that is down must not pass this test
    with (
        pytest.raises(CassandraConnectError, match=r"refused the credentials of user '\(no user\)'"),
        cassandra_session(_settings(cassandra_auth_server)),
    ):
        pass


def test_one_session_per_process_and_settings(cassandra_role: tuple[CassandraSettings, str]) -> None:
    from dataclasses import replace

    from imgest.sinks.cassandra import client

    settings, _ = cassandra_role
    first = client.shared_session(settings)
    assert client.shared_session(replace(settings)) is first  # equal settings (as unpickled per task): reused
    other = client.shared_session(replace(settings, consistency="ONE"))
    assert other is not first
    assert other.execute("SELECT release_version FROM system.local").one() is not None
    client.close_shared_sessions()
    assert first.is_shutdown
    assert other.is_shutdown
    assert client.shared_session(settings) is not first  # a shut-down session is replaced, not handed out
    client.close_shared_sessions()
