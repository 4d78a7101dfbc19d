"""Typed connection settings for Cassandra and S3, resolved once at an entry point.

Values come, in this order, from CLI flags, an Airflow connection or ``IMGEST_*`` variables, and nothing else:
no address is assumed. The embedded services are reached only when ``eval "$(imgest services env)"`` (or the
process that started them: the demo, the test suite, an embedded Airflow) put their settings in the environment
(``imgest.services.embedded_env``). A Cassandra without contact points is an error naming the setting; an S3
connection without an endpoint is AWS itself. S3 credentials follow botocore's default chain (environment,
profiles, web identity, container and instance roles, SSO) unless keys are given; temporary ones carry their
session token and expiry, and a process holding shipped ones renews them from its own chain before they expire.
Secrets are excluded from ``repr``.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from imgest.core import credentials as _credentials
from imgest.core import defaults

EMBEDDED_HOST = "127.0.0.1"  # where `imgest services up` binds the embedded servers (services code only)
HOSTS_ENV = "IMGEST_CASSANDRA_HOSTS"
CREDENTIALS_FILE_ENV = "IMGEST_S3_CREDENTIALS_FILE"  # the embedded S3 server's keys (`imgest services env`)
ROLE_ENV = "IMGEST_S3_ROLE_ARN"  # the role shipped temporary keys came from (renewal assumes it again)
PROFILE_ENV = "IMGEST_S3_PROFILE"  # the profile shipped temporary keys came from (renewal resolves it again)
EXPIRY_ENV = "IMGEST_S3_CREDENTIALS_EXPIRY"  # epoch seconds when AWS_SESSION_TOKEN's credentials expire


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

    hosts: tuple[str, ...] = ()
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
    # Mutual TLS: the client certificate and key, as files (of this host) and as the texts shipped to executors
    # (imgest.core.cassandra_tls).
    ssl_cert_file: str | None = None
    ssl_key_file: str | None = None
    ssl_cert_data: str | None = field(default=None, repr=False)
    ssl_key_data: str | None = field(default=None, repr=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "consistency", consistency_level(self.consistency))
        if not self.hosts:
            from imgest.core.errors import ConfigError

            raise ConfigError(
                f"no Cassandra contact points: pass --hosts, set {HOSTS_ENV} (comma separated) or the Airflow "
                'connection cassandra_default\'s Host; for the embedded server: eval "$(imgest services env)"'
            )

    @classmethod
    def from_env(cls, hosts: str | None = None, port: int | None = None) -> CassandraSettings:
        """HOSTS / PORT (flags) when given, else IMGEST_CASSANDRA_HOSTS (comma separated; one of them is
        required) and _PORT (9042); _USER, _PASSWORD, _SSL_CA, _SSL_CERT, _SSL_KEY (files; _SSL_CA_PEM, _SSL_CERT_PEM,
        _SSL_KEY_PEM: the texts), _PROTOCOL, _CONSISTENCY, _LOCAL_DC."""
        env = os.environ.get
        return cls(
            ssl_cert_file=env("IMGEST_CASSANDRA_SSL_CERT") or None,
            ssl_key_file=env("IMGEST_CASSANDRA_SSL_KEY") or None,
            ssl_ca_data=env("IMGEST_CASSANDRA_SSL_CA_PEM") or None,
            ssl_cert_data=env("IMGEST_CASSANDRA_SSL_CERT_PEM") or None,
            ssl_key_data=env("IMGEST_CASSANDRA_SSL_KEY_PEM") or None,
            hosts=split_hosts(hosts or os.environ.get(HOSTS_ENV, "")),
            port=port or env_int("IMGEST_CASSANDRA_PORT", 9042),
            username=os.environ.get("IMGEST_CASSANDRA_USER") or None,
            password=os.environ.get("IMGEST_CASSANDRA_PASSWORD") or None,
            ssl_ca_file=os.environ.get("IMGEST_CASSANDRA_SSL_CA") or None,
            protocol_version=env_int("IMGEST_CASSANDRA_PROTOCOL", 4),
            consistency=env_consistency(),
            local_dc=os.environ.get("IMGEST_CASSANDRA_LOCAL_DC") or None,
        )

    def shippable(self) -> CassandraSettings:
        """These settings with the TLS texts inside (the CA; the client certificate and its key, as PKCS#8), for
        executors and the bulk helper, which cannot read this host's files."""
        from dataclasses import replace

        from imgest.core.cassandra_tls import pkcs8, read_pem

        ca, cert, key = self.ssl_ca_data, self.ssl_cert_data, self.ssl_key_data
        if self.ssl_ca_file and not ca:
            ca = read_pem(self.ssl_ca_file, "CA", "--ssl-ca / IMGEST_CASSANDRA_SSL_CA")
        if self.ssl_cert_file and not cert:
            cert = read_pem(self.ssl_cert_file, "client certificate", "--ssl-cert / IMGEST_CASSANDRA_SSL_CERT")
        if self.ssl_key_file and not key:
            key = read_pem(self.ssl_key_file, "client key", "--ssl-key / IMGEST_CASSANDRA_SSL_KEY")
        if bool(cert) != bool(key):
            from imgest.core.errors import ConfigError

            raise ConfigError("Cassandra mutual TLS needs the client certificate and its key (--ssl-cert, --ssl-key)")
        key = pkcs8(key) if key else None
        if (ca, cert, key) == (self.ssl_ca_data, self.ssl_cert_data, self.ssl_key_data):
            return self
        return replace(self, ssl_ca_data=ca, ssl_cert_data=cert, ssl_key_data=key)

    @property
    def tls(self) -> bool:
        """TLS is on (a CA is given, as a file or as text)."""
        return bool(self.ssl_ca_data or self.ssl_ca_file)

    @property
    def address(self) -> str:
        """'host1,host2:port' for messages."""
        return f"{','.join(self.hosts)}:{self.port}"


def split_hosts(text: str) -> tuple[str, ...]:
    """Contact points of a comma-separated TEXT, blanks dropped."""
    return tuple(h.strip() for h in text.split(",") if h.strip())


def env_consistency() -> str:
    """The consistency level of IMGEST_CASSANDRA_CONSISTENCY, else imgest's default."""
    return consistency_level(os.environ.get("IMGEST_CASSANDRA_CONSISTENCY") or defaults.CONSISTENCY)


def env_endpoint(prefix: str = "") -> str | None:
    """The S3 endpoint of PREFIX+IMGEST_S3_ENDPOINT, else AWS's own variables (AWS_ENDPOINT_URL_S3,
    AWS_ENDPOINT_URL); None: AWS S3 itself."""
    env = os.environ.get
    if prefix:
        return env(f"{prefix}S3_ENDPOINT") or None
    return env("IMGEST_S3_ENDPOINT") or env("AWS_ENDPOINT_URL_S3") or env("AWS_ENDPOINT_URL") or None


@dataclass(frozen=True)
class S3Settings:
    """How to reach an S3-compatible object store (no endpoint: AWS S3; no keys: botocore's default chain)."""

    endpoint_url: str | None = None
    access_key: str | None = field(default=None, repr=False)
    secret_key: str | None = field(default=None, repr=False)
    region: str = "us-east-1"
    # The bucket of destinations left empty (the connection's extra bucket, IMGEST_S3_BUCKET); None: no default.
    bucket: str | None = None
    session_token: str | None = field(default=None, repr=False)
    # When temporary keys expire (epoch seconds); a process renews them from its own chain before that.
    expires_at: float | None = None
    # The role the keys were assumed from (the connection's role_arn): renewal assumes it again with the host's own
    # credentials, instead of taking whatever the host's chain holds.
    role_arn: str | None = None
    # The shared-config profile the keys were resolved from (the connection's profile_name, or AWS_PROFILE when the
    # driver resolved its chain): a host that has that profile renews from it (an SSO session, a role profile).
    profile: str | None = None

    @classmethod
    def from_env(cls) -> S3Settings:
        """IMGEST_S3_ENDPOINT (or AWS_ENDPOINT_URL_S3 / AWS_ENDPOINT_URL; none: AWS), AWS_ACCESS_KEY_ID /
        AWS_SECRET_ACCESS_KEY / AWS_SESSION_TOKEN (with IMGEST_S3_CREDENTIALS_EXPIRY), else the embedded server's
        keys when IMGEST_S3_CREDENTIALS_FILE names them, else botocore's chain; AWS_DEFAULT_REGION, IMGEST_S3_BUCKET."""
        env = os.environ.get
        key, secret, token = env("AWS_ACCESS_KEY_ID"), env("AWS_SECRET_ACCESS_KEY"), env("AWS_SESSION_TOKEN")
        if not key or not secret:
            key, secret, token = (*credentials_file(env(CREDENTIALS_FILE_ENV) or ""), None)
        expiry = env(EXPIRY_ENV)
        return cls(
            role_arn=env(ROLE_ENV) or None,
            profile=env(PROFILE_ENV) or None,
            endpoint_url=env_endpoint(),
            access_key=key or None,
            secret_key=secret or None,
            region=env("AWS_REGION") or env("AWS_DEFAULT_REGION") or "us-east-1",
            bucket=env("IMGEST_S3_BUCKET") or None,
            session_token=token or None,
            expires_at=float(expiry) if expiry and token else None,
        )

    def credentials(self) -> Any:
        """botocore credentials for these settings: the keys given (renewed from this host's chain before they
        expire when temporary), else botocore's default chain; None when the chain finds none."""
        return _credentials.botocore_credentials(self)

    def frozen(self) -> S3Settings:
        """These settings with keys in them, for processes elsewhere (Spark executors): the chain's current keys,
        session token and expiry when none were given. Given keys are returned as they are."""
        return _credentials.frozen_settings(self)

    def client(self, max_pool_connections: int = 10):  # -> botocore S3 client; boto3 is imported lazily (heavy)
        """A boto3 S3 client for these settings (MAX_POOL_CONNECTIONS: HTTP connections kept for its threads)."""
        return _credentials.s3_client(self, max_pool_connections)


def credentials_file(path: str) -> tuple[str | None, str | None]:
    """The key pair of a credentials JSON file at PATH (the embedded server's), or (None, None) without one."""
    if not path:
        return None, None
    try:
        data = json.loads(Path(path).read_text())
    except FileNotFoundError:  # the embedded server has not started yet: no keys to give
        return None, None
    return data["access_key"], data["secret_key"]


def s3_env(dest: str) -> None:
    """Give the Spark job the destination's S3 settings through its environment (never argv): the endpoint and,
    when this process has keys (its own, or the embedded server's), those keys with their session token."""
    if not dest.startswith("s3://"):
        return
    settings = S3Settings.from_env()
    for key, value in _credentials.env_of(settings).items():
        os.environ.setdefault(key, value)
    if settings.endpoint_url:
        os.environ.setdefault("IMGEST_S3_ENDPOINT", settings.endpoint_url)
