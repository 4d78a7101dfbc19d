"""Session fixtures for the real embedded services: reuse a running one, stop only what we started."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from imgest.services import AirflowServer, CassandraServer, S3Server
from imgest.services.base import Service


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
def s3_server() -> Iterator[S3Server]:
    """The embedded SeaweedFS S3 server with enforced keys."""
    yield from serve(S3Server.default())  # type: ignore[misc]


@pytest.fixture(scope="session")
def airflow_home(cassandra_server: CassandraServer, s3_server: S3Server) -> AirflowServer:
    """A migrated AIRFLOW_HOME whose connections point at the embedded services (no scheduler)."""
    server = AirflowServer.default()
    server.prepare(cassandra_server, s3_server)
    return server
