"""Connecting to Cassandra: one place that builds the driver Cluster from CassandraSettings."""

from __future__ import annotations

import atexit
import logging
import threading
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from typing import Any

from imgest.core import defaults
from imgest.core.errors import AuthenticationError, ImgestError
from imgest.core.settings import CassandraSettings

log = logging.getLogger(__name__)


class CassandraConnectError(ImgestError):
    """Cassandra could not be reached, or refused the credentials."""


class CassandraUnavailableError(ImgestError):
    """Too few replicas are alive for the consistency level asked for."""


def describe_unavailable(exc: Any, session: Any) -> str:
    """What Unavailable or a read/write timeout means: the consistency level, replicas needed and alive or
    answering, nodes up and down as the driver sees them."""
    from cassandra import ConsistencyLevel, Unavailable

    cluster = getattr(session, "cluster", None)  # a wrapped session may not expose it: then no node list
    hosts = list(cluster.metadata.all_hosts()) if cluster is not None else []
    live = ", ".join(sorted(str(h.address) for h in hosts if h.is_up)) or "none known"
    down = ", ".join(sorted(str(h.address) for h in hosts if not h.is_up)) or "none known"
    level = ConsistencyLevel.value_to_name.get(exc.consistency, str(exc.consistency))
    if isinstance(exc, Unavailable):
        got = exc.alive_replicas
        need = f"needs {exc.required_replicas} live replicas but only {got} {'is' if got == 1 else 'are'} alive"
    else:  # ReadTimeout / WriteTimeout: the coordinator still counted the replicas as alive
        got = exc.received_responses
        need = (
            f"needs {exc.required_responses} replica answers but only {got} "
            f"{'replica' if got == 1 else 'replicas'} answered in time"
        )
    return (
        f"consistency level {level} {need} (nodes up: {live}; down: {down}); bring the nodes "
        "back, or lower --consistency / IMGEST_CASSANDRA_CONSISTENCY"
    )


def replica_shortfall(exc: BaseException) -> Any | None:
    """The Unavailable / ReadTimeout / WriteTimeout behind EXC (also inside NoHostAvailable, which the driver
    raises when its retry on the next host failed the same way), or None."""
    from cassandra import ReadTimeout, Unavailable, WriteTimeout
    from cassandra.cluster import NoHostAvailable

    kinds = (Unavailable, ReadTimeout, WriteTimeout)
    if isinstance(exc, kinds):
        return exc
    if isinstance(exc, NoHostAvailable):
        return next((e for e in (exc.errors or {}).values() if isinstance(e, kinds)), None)
    return None


@contextmanager
def explain_unavailable(session: Any) -> Iterator[None]:
    """Turn too few replicas (Unavailable, a read/write timeout, or NoHostAvailable of those) into
    CassandraUnavailableError naming the consistency level and the live replicas."""
    try:
        yield
    except Exception as exc:
        cause = replica_shortfall(exc)
        if cause is None:
            raise
        raise CassandraUnavailableError(describe_unavailable(cause, session)) from None


class CassandraAuthError(CassandraConnectError, AuthenticationError):
    """Cassandra refused the credentials (retrying cannot help)."""


def build_cluster(settings: CassandraSettings, **overrides: Any) -> Any:
    """A driver Cluster: token-aware routing (or OVERRIDES' load_balancing_policy), the native protocol and
    consistency level of SETTINGS, auth, SSL."""
    from cassandra import ConsistencyLevel
    from cassandra.auth import PlainTextAuthProvider
    from cassandra.cluster import EXEC_PROFILE_DEFAULT, Cluster, ExecutionProfile
    from cassandra.policies import DCAwareRoundRobinPolicy, TokenAwarePolicy

    auth = None
    if settings.username:
        auth = PlainTextAuthProvider(settings.username, settings.password or "")
    ssl_context = None
    if settings.tls:
        from imgest.core.cassandra_tls import ssl_context as make_context

        s = settings.shippable() if settings.ssl_cert_file else settings  # the certificate and key as texts
        ssl_context = make_context(s.ssl_ca_data, settings.ssl_ca_file, s.ssl_cert_data, s.ssl_key_data)
    from cassandra.query import named_tuple_factory

    profile = ExecutionProfile(
        load_balancing_policy=overrides.pop(
            "load_balancing_policy", TokenAwarePolicy(DCAwareRoundRobinPolicy(local_dc=settings.local_dc))
        ),
        request_timeout=overrides.pop("request_timeout", defaults.REQUEST_TIMEOUT_S),
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


_SHARED: dict[CassandraSettings, tuple[Any, ExitStack]] = {}
_SHARED_LOCK = threading.Lock()


def shared_session(settings: CassandraSettings) -> Any:
    """One connected Session per process and SETTINGS, reused by every Spark task the process runs.

    Spark reuses its Python workers across tasks, so each executor process connects once instead of once
    per partition. Sessions are shut down when the process exits (or by close_shared_sessions).
    """
    with _SHARED_LOCK:
        entry = _SHARED.get(settings)
        if entry is not None and not entry[0].is_shutdown:
            return entry[0]
        stack = ExitStack()
        session = stack.enter_context(cassandra_session(settings))
        if not _SHARED:
            atexit.register(close_shared_sessions)
        _SHARED[settings] = (session, stack)
        log.info("connected to Cassandra at %s (session shared by this process's tasks)", settings.address)
        return session


def close_shared_sessions() -> None:
    """Shut down every shared session of this process."""
    with _SHARED_LOCK:
        for _, stack in _SHARED.values():
            stack.close()
        _SHARED.clear()
