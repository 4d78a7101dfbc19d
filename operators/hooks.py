"""Hooks that own imgest's connections: the providers' hooks, extended to give imgest's typed settings.

Operators never map connection fields themselves; they ask a hook for settings (or a session) inside
``execute``. The Cassandra connection's extras follow the provider's names (``ssl_options``,
``protocol_version``, ``load_balancing_policy_args.local_dc``) and also accept ``ssl_ca``, ``ssl_cert`` and
``ssl_key`` (each a file path or the PEM text itself: mutual TLS from the connection alone), ``local_dc`` and
``consistency`` (the consistency level of writes and verify reads, default LOCAL_QUORUM).
Spark jobs get them as the driver's environment (``spark_env``); the driver ships them to executors. The AWS
connection's ``endpoint_url`` and ``region_name`` are read by the Amazon provider itself.
"""

from __future__ import annotations

from typing import Any

from airflow.providers.amazon.aws.hooks.s3 import S3Hook
from airflow.providers.apache.cassandra.hooks.cassandra import CassandraHook

from imgest.core.errors import ConfigError
from imgest.core.settings import CassandraSettings, S3Settings, env_consistency


class ImgestCassandraHook(CassandraHook):
    """The provider's CassandraHook, plus the connection as imgest's CassandraSettings."""

    def __init__(self, cassandra_conn_id: str = CassandraHook.default_conn_name) -> None:
        super().__init__(cassandra_conn_id=cassandra_conn_id)
        self.cassandra_conn_id = cassandra_conn_id

    def settings(self) -> CassandraSettings:
        """Hosts (comma separated), port, login/password, TLS CA, protocol version, consistency and local DC."""
        conn = self.get_connection(self.cassandra_conn_id)
        hosts = tuple(h.strip() for h in (conn.host or "").split(",") if h.strip())
        if not hosts:  # never a silent 127.0.0.1: on a cluster that is the worker itself
            raise ConfigError(
                f"Airflow connection {self.cassandra_conn_id!r} has no host: set its Host to the Cassandra contact "
                "points, comma separated (Admin > Connections, or AIRFLOW_CONN_"
                f'{self.cassandra_conn_id.upper()}=\'{{"conn_type": "cassandra", "host": "10.0.0.5,10.0.0.6"}}\')'
            )
        extra = conn.extra_dejson
        options = extra.get("ssl_options") or {}
        tls = {  # each a path or the PEM text itself; the provider's ssl_options paths too
            "ca": extra.get("ssl_ca") or options.get("ca_certs"),
            "cert": extra.get("ssl_cert") or options.get("certfile"),
            "key": extra.get("ssl_key") or options.get("keyfile"),
        }
        from imgest.core.cassandra_tls import is_pem

        files = {f"ssl_{k}_file": v for k, v in tls.items() if v and not is_pem(v)}
        texts = {f"ssl_{k}_data": v for k, v in tls.items() if v and is_pem(v)}
        return CassandraSettings(
            hosts=hosts,
            port=int(conn.port or 9042),
            username=conn.login or None,
            password=conn.password or None,
            **files,
            **texts,
            protocol_version=int(extra.get("protocol_version") or 4),
            consistency=extra.get("consistency") or env_consistency(),
            local_dc=extra.get("local_dc") or (extra.get("load_balancing_policy_args") or {}).get("local_dc") or None,
        )

    def session(self) -> Any:
        """imgest's own session (token-aware, tuned timeouts) for this connection: a context manager."""
        from imgest.sinks.cassandra.client import cassandra_session

        return cassandra_session(self.settings())

    def spark_env(self) -> dict[str, str]:
        """What a Spark job needs to reach this cluster, as environment variables (never argv)."""
        s = self.settings()
        env = {
            "IMGEST_CASSANDRA_HOSTS": ",".join(s.hosts),
            "IMGEST_CASSANDRA_PORT": str(s.port),
            "IMGEST_CASSANDRA_PROTOCOL": str(s.protocol_version),
            "IMGEST_CASSANDRA_CONSISTENCY": s.consistency,
        }
        if s.username:
            env.update({"IMGEST_CASSANDRA_USER": s.username, "IMGEST_CASSANDRA_PASSWORD": s.password or ""})
        shipped = s.shippable()  # the TLS texts (the job's driver may run on another host than this task)
        texts = {"CA": shipped.ssl_ca_data, "CERT": shipped.ssl_cert_data, "KEY": shipped.ssl_key_data}
        env.update({f"IMGEST_CASSANDRA_SSL_{name}_PEM": text for name, text in texts.items() if text})
        if s.local_dc:
            env["IMGEST_CASSANDRA_LOCAL_DC"] = s.local_dc
        return env

    def uri(self) -> str:
        """cassandra://host:port of the connection, for Asset URIs."""
        s = self.settings()
        return f"cassandra://{s.hosts[0]}:{s.port}"


class ImgestS3Hook(S3Hook):
    """The Amazon provider's S3Hook, plus the connection as imgest's S3Settings."""

    def settings(self, bucket: str | None = None) -> S3Settings:
        """The connection's keys, else the provider's chain (role, web identity, profile...) resolved now with its
        session token and expiry (renewed before then by whoever holds them); endpoint and region from the
        connection (no endpoint: AWS S3)."""
        region = self.conn_config.region_name or "us-east-1"
        creds = self.get_session(region_name=region).get_credentials()
        if creds is None:
            raise ConfigError(
                f"Airflow connection {self.aws_conn_id!r} yields no S3 credentials: set its Login / Password (key "
                "id / secret), its extra role_arn or profile_name, or give this host a role"
            )
        frozen = creds.get_frozen_credentials()
        settings = S3Settings(
            endpoint_url=self.conn_config.endpoint_url or None,
            access_key=frozen.access_key,
            secret_key=frozen.secret_key,
            region=region,
            bucket=bucket,
            session_token=frozen.token or None,
        )
        from dataclasses import replace

        from imgest.core.credentials import expiry_of

        role = self.conn_config.role_arn or None  # renewal assumes it again
        profile = self.conn_config.profile_name or None  # or resolves this profile again, where a host has it
        # expiry None: keys that do not expire
        return replace(settings, expires_at=expiry_of(creds), role_arn=role, profile=profile)

    def spark_env(self) -> dict[str, str]:
        """What a Spark job needs to reach this S3 endpoint, as environment variables (never argv)."""
        from imgest.core.credentials import env_of

        s = self.settings()
        env = {**env_of(s), "AWS_DEFAULT_REGION": s.region}
        if s.endpoint_url:
            env["IMGEST_S3_ENDPOINT"] = s.endpoint_url
        return env


def connection_bucket(aws_conn_id: str = "aws_default") -> str | None:
    """The bucket the AWS connection names for destinations left empty (its extra ``bucket``); None when the
    connection is not defined or names none ($IMGEST_S3_BUCKET decides then)."""
    from imgest.operators.compat import connection_or_none

    conn = connection_or_none(aws_conn_id)
    if conn is None:
        return None
    return str(conn.extra_dejson.get("bucket") or "") or None


def store_settings(dest: str, aws_conn_id: str) -> S3Settings | None:
    """S3 settings for DEST when it is an s3:// URL, None for a local folder."""
    if not dest.startswith("s3://"):
        return None
    return ImgestS3Hook(aws_conn_id=aws_conn_id).settings(dest[5:].split("/", 1)[0])


def source_settings(source: str | None, source_conn_id: str) -> S3Settings | None:
    """The connection of SOURCE when it is an s3:// URL (its own, SOURCE_CONN_ID), None for a local path."""
    if not source or not source.startswith("s3://") or not source_conn_id:
        return None
    return ImgestS3Hook(aws_conn_id=source_conn_id).settings(source[5:].split("/", 1)[0])


def lock_store(aws_conn_id: str = "aws_default", cassandra_conn_id: str = "cassandra_default"):  # -> LockStores
    """The dataset lock's stores: under $IMGEST_LOCK_URL (the keyspace the run writes, reached through
    CASSANDRA_CONN_ID; beside its S3 destination) or $IMGEST_STATE_URL (reached through AWS_CONN_ID) when set, else
    local."""
    from imgest.core.lock_stores import default_stores, lock_url

    url = lock_url() or ""
    return default_stores(*_lock_settings(url, aws_conn_id, cassandra_conn_id))


def lock_stores_at(location: str, aws_conn_id: str = "aws_default", cassandra_conn_id: str = "cassandra_default"):
    """The lock stores a holder names by LOCATION (``LockStores.location``: a process that watches the lock another
    one took, as the lock's trigger does), reached through AWS_CONN_ID and CASSANDRA_CONN_ID."""
    from imgest.core.lock_stores import stores_at

    return stores_at(location, *_lock_settings(location, aws_conn_id, cassandra_conn_id))


def _lock_settings(url: str, aws_conn_id: str, cassandra_conn_id: str) -> tuple[Any, Any]:
    """(S3 settings, Cassandra settings) of the lock stores URL names: each None where URL names no such store."""
    s3 = next((store_settings(u.strip(), aws_conn_id) for u in url.split("|") if u.strip().startswith("s3://")), None)
    cassandra = ImgestCassandraHook(cassandra_conn_id).settings() if "cassandra://" in url else None
    return s3, cassandra


def state_store(aws_conn_id: str = "aws_default"):  # -> imgest.flow.steps.StateStore | None
    """The run's state store when its state is in object storage ($IMGEST_STATE_URL, set or derived for this task),
    reached through AWS_CONN_ID; None when it stays on the local disk."""
    from imgest.core.lock_stores import state_url
    from imgest.flow.steps import StateStore

    url = state_url()
    settings = store_settings(url, aws_conn_id) if url else None
    return StateStore(url, aws_conn_id, settings) if url and settings else None
