"""Each replica read alone: what one node holds of a table, from its own data only.

A read at ALL (or QUORUM) proves less than it seems: with read repair at its blocking default, a replica that lacks
rows is repaired during the read, so a load that reached one replica of three passes a check at ALL. A query at
``NODE_LOCAL`` (Cassandra 4.0+, consistency code 11) is answered by the node that receives it from its own data,
asking no other replica and repairing nothing; a session whose only contact point and only allowed host is that
node makes it the one that receives it. Cassandra refuses such queries unless the node was started with
``-Dcassandra.enable_nodelocal_queries=true`` (the project's test ring is: imgest.services.ring).
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, replace
from typing import Any

from imgest.core.errors import ServiceError
from imgest.core.settings import CassandraSettings
from imgest.sinks.cassandra.client import build_cluster

NODE_LOCAL = 11  # org.apache.cassandra.db.ConsistencyLevel.NODE_LOCAL's code (the Python driver has no name for it)
PAGE_ROWS = 200  # rows per page: a data page holds images


@dataclass(frozen=True)
class ReplicaRows:
    """What one node holds of a keyspace's split-column tables: id (text) -> sha256 (hex) recorded in its metadata
    table, and id -> sha256 (hex) of the bytes in its data table."""

    host: str
    metadata: dict[str, str]
    data: dict[str, str]

    def missing(self, expected: dict[str, str]) -> dict[str, list[str]]:
        """Per table, the ids of EXPECTED (id -> sha256) this node lacks or holds other bytes for (sorted)."""
        return {
            "metadata": sorted(i for i, sha in expected.items() if self.metadata.get(i) != sha),
            "data": sorted(i for i, sha in expected.items() if self.data.get(i) != sha),
        }


@contextmanager
def node_session(settings: CassandraSettings, host: str) -> Iterator[Any]:
    """A session whose only contact point and only allowed coordinator is HOST."""
    from cassandra.policies import WhiteListRoundRobinPolicy

    cluster = build_cluster(replace(settings, hosts=(host,)), load_balancing_policy=WhiteListRoundRobinPolicy([host]))
    try:
        yield cluster.connect()
    finally:
        cluster.shutdown()


def node_local_rows(session: Any, host: str, query: str) -> Iterator[Any]:
    """The rows of QUERY as HOST alone holds them (a NODE_LOCAL read through SESSION, paged); raises ServiceError
    when another node answered or the node refuses node-local queries."""
    from cassandra import InvalidRequest
    from cassandra.query import SimpleStatement

    statement = SimpleStatement(query, consistency_level=NODE_LOCAL, fetch_size=PAGE_ROWS)
    try:
        result = session.execute(statement, timeout=120)
    except InvalidRequest as exc:
        raise ServiceError(
            f"{host} refused a node-local read ({exc}); start it with -Dcassandra.enable_nodelocal_queries=true"
        ) from None
    answered = result.response_future.coordinator_host
    if answered is None or str(answered).split(":")[0] != host:
        raise ServiceError(f"a node-local read meant for {host} was answered by {answered}")
    yield from result


def replica_rows(settings: CassandraSettings, host: str, keyspace: str, suffix: str = "") -> ReplicaRows:
    """What HOST alone holds of KEYSPACE's data{SUFFIX} and metadata{SUFFIX} tables (split-column layout)."""
    with node_session(settings, host) as session:
        rows = node_local_rows(session, host, f"SELECT id, sha256 FROM {keyspace}.metadata{suffix}")
        meta = {str(r.id): r.sha256 for r in rows}
        rows = node_local_rows(session, host, f"SELECT id, data FROM {keyspace}.data{suffix}")
        data = {str(r.id): hashlib.sha256(r.data).hexdigest() for r in rows}
    return ReplicaRows(host, meta, data)
