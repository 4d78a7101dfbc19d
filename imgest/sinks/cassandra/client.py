"""Connecting to Cassandra: one place that builds the driver Cluster from CassandraSettings."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from imgest.core.errors import AuthenticationError, ImgestError
from imgest.core.settings import CassandraSettings

log = logging.getLogger(__name__)


class CassandraConnectError(ImgestError):
    """Cassandra could not be reached, or refused the credentials."""


class CassandraUnavailableError(ImgestError):
    """Too few replicas are alive for the consistency level asked for."""


def describe_unavailable(exc: Any, session: Any) -> str:
    """What an Unavailable error means: the consistency level, replicas needed and alive, nodes up and down."""
    from cassandra import ConsistencyLevel

    hosts = list(session.cluster.metadata.all_hosts()) if session is not None else []
    live = ", ".join(sorted(str(h.address) for h in hosts if h.is_up)) or "none known"
    down = ", ".join(sorted(str(h.address) for h in hosts if not h.is_up)) or "none known"
    level = ConsistencyLevel.value_to_name.get(exc.consistency, str(exc.consistency))
    return (
        f"consistency level {level} needs {exc.required_replicas} live replicas but only {exc.alive_replicas} "
        f"{'is' if exc.alive_replicas == 1 else 'are'} alive (nodes up: {live}; down: {down}); bring the nodes "
        "back, or lower --consistency / IMGEST_CASSANDRA_CONSISTENCY"
    )


@contextmanager
def explain_unavailable(session: Any) -> Iterator[None]:
    """Turn the driver's Unavailable into CassandraUnavailableError with a message naming level and replicas."""
    from cassandra import Unavailable

    try:
        yield
    except Unavailable as exc:
        raise CassandraUnavailableError(describe_unavailable(exc, session)) from None


class CassandraAuthError(CassandraConnectError, AuthenticationError):
    """Cassandra refused the credentials (retrying cannot help)."""


def build_cluster(settings: CassandraSettings, **overrides: Any) -> Any:
    """A driver Cluster: token-aware routing, the native protocol and consistency level of SETTINGS, auth, SSL."""
    from cassandra import ConsistencyLevel
    from cassandra.auth import PlainTextAuthProvider
    from cassandra.cluster import EXEC_PROFILE_DEFAULT, Cluster, ExecutionProfile
    from cassandra.policies import DCAwareRoundRobinPolicy, TokenAwarePolicy

    auth = None
    if settings.username:
        auth = PlainTextAuthProvider(settings.username, settings.password or "")
    ssl_context = None
    if settings.ssl_ca_file:
        import ssl

        ssl_context = ssl.create_default_context(cafile=settings.ssl_ca_file)
    from cassandra.query import named_tuple_factory

    profile = ExecutionProfile(
        load_balancing_policy=TokenAwarePolicy(DCAwareRoundRobinPolicy()),
        request_timeout=overrides.pop("request_timeout", 30.0),
        row_factory=overrides.pop("row_factory", named_tuple_factory),
        consistency_level=ConsistencyLevel.name_to_value[settings.consistency],
    )
    return Cluster(
        list(settings.hosts),
        port=settings.port,
        auth_provider=auth,
        ssl_context=ssl_context,
        protocol_version=settings.protocol_version,
        execution_profiles={EXEC_PROFILE_DEFAULT: profile},
        connect_timeout=settings.connect_timeout,
        control_connection_timeout=settings.connect_timeout,
        **overrides,
    )


@contextmanager
def cassandra_session(settings: CassandraSettings, keyspace: str | None = None) -> Iterator[Any]:
    """A connected Session, shut down on exit. Bad credentials or no answer raise CassandraConnectError."""
    from cassandra import AuthenticationFailed
    from cassandra.cluster import NoHostAvailable

    cluster = build_cluster(settings)
    try:
        try:
            session = cluster.connect(keyspace)
        except NoHostAvailable as exc:
            errors = list(exc.errors.values())
            user = settings.username or "(no user)"
            if any(isinstance(e, AuthenticationFailed) for e in errors):
                raise CassandraAuthError(
                    f"Cassandra at {settings.address} refused the credentials of user {user!r}; "
                    "check the username/password in the Airflow connection or IMGEST_CASSANDRA_USER/_PASSWORD"
                ) from None
            first = errors[0] if errors else exc
            raise CassandraConnectError(
                f"Cassandra at {settings.address} did not answer ({type(first).__name__}: {first}); "
                "is it running? (`imgest services status`)"
            ) from None
        yield session
    finally:
        cluster.shutdown()
