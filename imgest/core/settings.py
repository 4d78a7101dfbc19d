"""Typed connection settings for Cassandra and S3, resolved once at an entry point.

Values come from CLI flags, an Airflow connection or the environment; the defaults point at the
embedded services that ``imgest services up`` starts. Secrets are excluded from ``repr``.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from pathlib import Path

from imgest.core import defaults
from imgest.core.paths import state_dir

EMBEDDED_HOST = "127.0.0.1"


def env_int(name: str, default: int) -> int:
    """Integer from environment variable NAME, or DEFAULT; a non-integer is a clear error."""
    raw = os.environ.get(name)
    if raw is None or raw == "":
        return default
    try:
        return int(raw)
    except ValueError:
        from imgest.core.errors import ConfigError

        raise ConfigError(f"environment variable {name}={raw!r} must be an integer") from None


def consistency_level(name: str) -> str:
    """NAME upper-cased if it is a Cassandra consistency level imgest accepts, else a ConfigError."""
    level = (name or "").strip().upper()
    if level not in defaults.CONSISTENCY_LEVELS:
        from imgest.core.errors import ConfigError

        raise ConfigError(f"consistency level {name!r} is not one of {', '.join(defaults.CONSISTENCY_LEVELS)}")
    return level


@dataclass(frozen=True)
class CassandraSettings:
    """How to reach a Cassandra cluster."""

    hosts: tuple[str, ...] = (EMBEDDED_HOST,)
    port: int = 9042
    username: str | None = None
    password: str | None = field(default=None, repr=False)
    ssl_ca_file: str | None = None
    connect_timeout: float = 10.0
    # Native protocol v4 by default: v5 adds a CRC32 over every frame segment, which costs about a quarter of
    # the client's CPU when writing image blobs. Stored bytes are checked end to end instead (sha256 in the
    # metadata table, byte-compared samples in `imgest verify`). IMGEST_CASSANDRA_PROTOCOL=5 turns it back on.
    protocol_version: int = 4
    # Consistency level of writes and verify reads (ONE, QUORUM, LOCAL_QUORUM, ALL, ...).
    consistency: str = defaults.CONSISTENCY
    # The data centre whose nodes are tried first (and the only ones LOCAL_* levels count); None: the contact
    # point's. IMGEST_CASSANDRA_LOCAL_DC, --local-dc, or the connection extra ``local_dc``.
    local_dc: str | None = None
    # The CA certificate itself (PEM text), read from ssl_ca_file by a Spark driver and shipped to executors,
    # which may run where that file does not exist.
    ssl_ca_data: str | None = field(default=None, repr=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "consistency", consistency_level(self.consistency))

    @classmethod
    def from_env(cls) -> CassandraSettings:
        """IMGEST_CASSANDRA_HOSTS (comma separated), _PORT, _USER, _PASSWORD, _SSL_CA, _PROTOCOL, _CONSISTENCY,
        _LOCAL_DC."""
        hosts = os.environ.get("IMGEST_CASSANDRA_HOSTS", EMBEDDED_HOST)
        return cls(
            hosts=tuple(h.strip() for h in hosts.split(",") if h.strip()),
            port=env_int("IMGEST_CASSANDRA_PORT", 9042),
            username=os.environ.get("IMGEST_CASSANDRA_USER") or None,
            password=os.environ.get("IMGEST_CASSANDRA_PASSWORD") or None,
            ssl_ca_file=os.environ.get("IMGEST_CASSANDRA_SSL_CA") or None,
            protocol_version=env_int("IMGEST_CASSANDRA_PROTOCOL", 4),
            consistency=os.environ.get("IMGEST_CASSANDRA_CONSISTENCY") or defaults.CONSISTENCY,
            local_dc=os.environ.get("IMGEST_CASSANDRA_LOCAL_DC") or None,
        )

    def shippable(self) -> CassandraSettings:
        """These settings with the CA certificate's text inside, for executors that cannot read ssl_ca_file."""
        if not self.ssl_ca_file or self.ssl_ca_data:
            return self
        from dataclasses import replace

        try:
            pem = Path(self.ssl_ca_file).read_text()
        except OSError as exc:
            from imgest.core.errors import ConfigError

            raise ConfigError(
                f"Cassandra CA file {self.ssl_ca_file}: {exc.strerror}; check --ssl-ca / IMGEST_CASSANDRA_SSL_CA"
            ) from None
        return replace(self, ssl_ca_data=pem)

    @property
    def address(self) -> str:
        """'host1,host2:port' for messages."""
        return f"{','.join(self.hosts)}:{self.port}"


@dataclass(frozen=True)
class S3Settings:
    """How to reach an S3-compatible object store."""

    endpoint_url: str | None = f"http://{EMBEDDED_HOST}:8333"
    access_key: str | None = field(default=None, repr=False)
    secret_key: str | None = field(default=None, repr=False)
    region: str = "us-east-1"
    bucket: str = "imgest"

    @classmethod
    def from_env(cls) -> S3Settings:
        """IMGEST_S3_ENDPOINT, AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY, IMGEST_S3_BUCKET.

        Without keys in the environment, the embedded server's generated keys are used.
        """
        endpoint = os.environ.get("IMGEST_S3_ENDPOINT", f"http://{EMBEDDED_HOST}:{env_int('IMGEST_S3_PORT', 8333)}")
        key = os.environ.get("AWS_ACCESS_KEY_ID")
        secret = os.environ.get("AWS_SECRET_ACCESS_KEY")
        if not key or not secret:
            key, secret = embedded_s3_credentials()
        return cls(
            endpoint_url=endpoint or None,
            access_key=key,
            secret_key=secret,
            region=os.environ.get("AWS_DEFAULT_REGION", "us-east-1"),
            bucket=os.environ.get("IMGEST_S3_BUCKET", "imgest"),
        )

    def client(self, max_pool_connections: int = 10):  # -> botocore S3 client; boto3 is imported lazily (heavy)
        """A boto3 S3 client for these settings (MAX_POOL_CONNECTIONS: HTTP connections kept for its threads)."""
        import boto3
        from botocore.config import Config

        return boto3.client(
            "s3",
            endpoint_url=self.endpoint_url,
            aws_access_key_id=self.access_key,
            aws_secret_access_key=self.secret_key,
            region_name=self.region,
            config=Config(
                retries={"max_attempts": 5, "mode": "standard"},
                s3={"addressing_style": "path"},
                max_pool_connections=max_pool_connections,
            ),
        )


def embedded_s3_credentials() -> tuple[str | None, str | None]:
    """The key pair generated for the embedded S3 server, or (None, None) before its first start."""
    path = state_dir() / "s3" / "credentials.json"
    try:
        data = json.loads(path.read_text())
    except FileNotFoundError:
        return None, None
    return data["access_key"], data["secret_key"]
