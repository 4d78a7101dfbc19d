"""Airflow connections -> imgest's typed settings. The only place operators read connections."""

from __future__ import annotations

from imgest.settings import CassandraSettings, S3Settings


def _connection(conn_id: str):  # -> airflow Connection
    from airflow.sdk import BaseHook

    return BaseHook.get_connection(conn_id)


def cassandra_settings(conn_id: str = "cassandra_default") -> CassandraSettings:
    """Hosts (comma separated in host), port, login/password and extra {ssl_ca, protocol_version}."""
    conn = _connection(conn_id)
    extra = conn.extra_dejson
    return CassandraSettings(
        hosts=tuple(h.strip() for h in (conn.host or "127.0.0.1").split(",") if h.strip()),
        port=conn.port or 9042,
        username=conn.login or None,
        password=conn.password or None,
        ssl_ca_file=extra.get("ssl_ca") or None,
        protocol_version=int(extra.get("protocol_version", 4)),
    )


def s3_settings(conn_id: str = "aws_default", bucket: str = "imgest") -> S3Settings:
    """Keys from login/password, endpoint and region from extra {endpoint_url, region_name}."""
    conn = _connection(conn_id)
    extra = conn.extra_dejson
    return S3Settings(
        endpoint_url=extra.get("endpoint_url") or None,
        access_key=conn.login or None,
        secret_key=conn.password or None,
        region=extra.get("region_name", "us-east-1"),
        bucket=bucket,
    )
