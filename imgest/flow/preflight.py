"""Checks that run before any Spark work: names, destinations and credentials, each failing with one line.

The CLI runs them before ``spark-submit``; the DAG's ``prepare_*`` tasks run them before the ingest task. A
refused credential raises an ``AuthenticationError`` subtype, which the DAG's operators turn into a failure
without retries.
"""

from __future__ import annotations

from imgest.core.settings import CassandraSettings, S3Settings
from imgest.sinks.cassandra.schema import TableLayout, replication


def check_tables(keyspace: str, layout: str, suffix: str, replication_spec: str) -> TableLayout:
    """The table layout, after checking every name and the replication (ConfigError saying why)."""
    replication(replication_spec)
    return TableLayout(keyspace, layout, suffix)


def check_cassandra(settings: CassandraSettings) -> None:
    """Connect and run one query: CassandraAuthError for refused credentials, CassandraConnectError for no answer."""
    from imgest.sinks.cassandra.client import cassandra_session

    with cassandra_session(settings) as session:
        session.execute("SELECT release_version FROM system.local")


def check_shard_dest(dest: str, settings: S3Settings | None = None) -> None:
    """DEST is a usable destination and, on S3, its bucket answers these credentials (S3AuthError if refused)."""
    from imgest.sinks.shards.store import open_store

    store = open_store(dest, settings)  # ConfigError for a malformed destination
    check = getattr(store, "check", None)
    if check is not None:
        check()
