"""Session fixtures for the real embedded services: reuse a running one, stop only what we started."""

from __future__ import annotations

import secrets
from collections.abc import Iterator
from pathlib import Path

import pytest

from imgest.core.settings import CassandraSettings
from imgest.services import AirflowServer, CassandraServer, S3Server
from imgest.services.base import Service
from imgest.services.spark_cluster import SparkCluster
from imgest.sinks.cassandra.client import cassandra_session


def serve(service: Service) -> Iterator[Service]:
    """Yield SERVICE, started if it was not answering; stopped afterwards only if this started it."""
    started = False
    if not service.answers():
        result = service.up()
        started = result.started
        print(f"\n[fixture] {result.message}")
    yield service
    if started:
        service.down()


@pytest.fixture(scope="session")
def cassandra_server() -> Iterator[CassandraServer]:
    """The embedded Cassandra node (AllowAllAuthenticator) on 127.0.0.1."""
    yield from serve(CassandraServer.default())  # type: ignore[misc]


@pytest.fixture(scope="session")
def cassandra_auth_server() -> Iterator[CassandraServer]:
    """A second node with PasswordAuthenticator (superuser cassandra/cassandra)."""
    yield from serve(CassandraServer.default(auth=True))  # type: ignore[misc]


@pytest.fixture(scope="session")
def cassandra_tls_server() -> Iterator[CassandraServer]:
    """A node that speaks TLS only on its native port, with a CA and certificate made at its first start."""
    yield from serve(CassandraServer.default(tls=True))  # type: ignore[misc]


@pytest.fixture(scope="session")
def spark_cluster() -> Iterator[SparkCluster]:
    """The Spark standalone master and its two clean workers."""
    yield from serve(SparkCluster.default())  # type: ignore[misc]


@pytest.fixture(scope="session")
def s3_server() -> Iterator[S3Server]:
    """The embedded SeaweedFS S3 server with enforced keys."""
    yield from serve(S3Server.default())  # type: ignore[misc]


@pytest.fixture(scope="session")
def airflow_home(cassandra_server: CassandraServer, s3_server: S3Server) -> AirflowServer:
    """A migrated AIRFLOW_HOME whose connections point at the embedded services (no scheduler)."""
    server = AirflowServer.default()
    server.prepare(cassandra_server, s3_server)
    return server


@pytest.fixture(scope="session")
def cassandra_role(cassandra_auth_server: CassandraServer) -> tuple[CassandraSettings, str]:
    """A login role with a random password on the password-checking node: (settings, password)."""
    role, password = f"imgest_test_{secrets.token_hex(4)}", "pw" + secrets.token_hex(12)
    admin = CassandraSettings(port=cassandra_auth_server.native_port, username="cassandra", password="cassandra")
    with cassandra_session(admin) as session:
        session.execute(f"CREATE ROLE {role} WITH LOGIN = true AND SUPERUSER = true AND PASSWORD = '{password}'")
    return CassandraSettings(port=cassandra_auth_server.native_port, username=role, password=password), password


@pytest.fixture
def event_log(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """spark-submit reads SPARK_CONF_DIR/spark-defaults.conf: the event log goes to a folder of this test."""
    conf, events = tmp_path / "spark-conf", tmp_path / "events"
    conf.mkdir()
    events.mkdir()
    (conf / "spark-defaults.conf").write_text(f"spark.eventLog.enabled true\nspark.eventLog.dir {events.as_uri()}\n")
    monkeypatch.setenv("SPARK_CONF_DIR", str(conf))
    return events
