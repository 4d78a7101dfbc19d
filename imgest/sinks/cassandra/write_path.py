"""Which way rows reach Cassandra, decided once by the job's driver: ``cql`` (an UNLOGGED batch per image through
the Python driver), ``cql-helper`` (the same batch per image, sent by the bulk helper's JVM through the Java driver:
the same requests for less client CPU per row) or ``bulk`` (executors write SSTables, the helper streams them to every
replica).

``auto`` picks bulk when it pays and the cluster can take it: at least ``defaults.BULK_MIN_ROWS`` rows to write
(below that, starting a helper JVM per executor costs more than it saves), a Cassandra 5 cluster (the helper
writes Cassandra 5.0's SSTable format), the helper installed (``imgest bulk-helper install``) and Java where the
driver runs. On another Cassandra version it picks cql-helper for as many rows where the helper is installed, else
cql.
``bulk`` or ``cql-helper`` asked for explicitly fails with the reason where it cannot run. The decision and its
reason go to the job's log and summary.
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass
from typing import Any

from imgest.core import defaults
from imgest.core.errors import ConfigError
from imgest.sinks.cassandra.bulk_helper import NOT_INSTALLED, BulkLoadError, ensure_helper, installed, tool
from imgest.sinks.cassandra.bulk_writer import BulkTarget
from imgest.sinks.cassandra.client import CassandraUnavailableError
from imgest.sinks.cassandra.ingest import META_COLUMNS, batch_insert
from imgest.sinks.cassandra.schema import TableLayout

log = logging.getLogger(__name__)
DATA_COLUMNS = ("id", "label", "data")  # the order BulkImageWriter sends a data row's values in
HELPER_FORMAT_MAJOR = 5  # the helper's cassandra-all writes this major's SSTable format


@dataclass(frozen=True)
class WritePath:
    path: str  # "bulk", "cql" or "cql-helper"
    reason: str


def choose(session: Any, requested: str, rows: int) -> WritePath:
    """REQUESTED (auto, bulk, cql or cql-helper) resolved for a job that writes ROWS rows; bulk or cql-helper asked
    for but impossible raises ConfigError naming why."""
    if requested == "cql":
        return WritePath("cql", "asked for (--write-path cql)")
    if requested == "cql-helper":
        missing = helper_tools_missing()
        if missing:
            raise ConfigError(f"--write-path cql-helper: {missing}; use --write-path cql")
        return WritePath("cql-helper", "asked for (--write-path cql-helper)")
    blocker = bulk_blocker(session)
    if requested == "bulk":
        if blocker:
            raise ConfigError(f"--write-path bulk: {blocker}; use --write-path cql")
        return WritePath("bulk", "asked for (--write-path bulk)")
    if blocker and rows >= defaults.BULK_MIN_ROWS and helper_tools_missing() is None:
        return WritePath("cql-helper", f"auto: {blocker}; {rows} rows >= {defaults.BULK_MIN_ROWS}: CQL from the helper")
    if blocker:
        return WritePath("cql", f"auto: {blocker}")
    if rows < defaults.BULK_MIN_ROWS:
        return WritePath("cql", f"auto: {rows} rows < {defaults.BULK_MIN_ROWS}, where starting the loaders costs more")
    return WritePath("bulk", f"auto: {rows} rows >= {defaults.BULK_MIN_ROWS}, Cassandra {HELPER_FORMAT_MAJOR}")


def bulk_partitions(rows: int, parallelism: int) -> int:
    """Spark partitions of a bulk load of ROWS rows: every partition ends with a load, so each one streams at least
    one SSTable per table, which the nodes compact once four of a size are there (size-tiered); max(cores, one per
    BULK_ROWS_PER_PARTITION rows)."""
    return max(parallelism, math.ceil(rows / defaults.BULK_ROWS_PER_PARTITION))


def bulk_blocker(session: Any) -> str | None:
    """Why the bulk path cannot run here, or None."""
    versions = {str(row.release_version) for row in session.execute("SELECT release_version FROM system.local")}
    versions |= {str(row.release_version) for row in session.execute("SELECT release_version FROM system.peers")}
    majors = {int(v.split(".")[0]) for v in versions if v and v[0].isdigit()}
    if majors != {HELPER_FORMAT_MAJOR}:
        found = ", ".join(sorted(versions)) or "unknown"
        return f"the bulk helper writes Cassandra {HELPER_FORMAT_MAJOR}.0 SSTables and the cluster runs {found}"
    return helper_tools_missing()


def helper_tools_missing() -> str | None:
    """Why the helper cannot be started here (not installed: ``imgest bulk-helper install``; no java), or None."""
    if installed() is None:
        return NOT_INSTALLED.split(": run ", 1)[0] + " (imgest bulk-helper install)"
    try:
        tool("java", "")
    except BulkLoadError as exc:
        return str(exc).split(";")[0].removeprefix("bulk-load helper: ")
    return None


def cql_helper_target(
    tables: TableLayout, splits: list[str], consistency: str, max_in_flight: int, helper: str = ""
) -> BulkTarget:
    """The helper's settings for CQL mode: each split's prepared batch of its data and metadata rows (the statement
    the driver path prepares), the consistency level and the requests in flight per helper (no partitioner: the
    Java driver routes by the cluster's own token map)."""
    return BulkTarget(
        helper=helper or str(ensure_helper()),
        keyspace=tables.keyspace,
        partitioner="",
        tables=tuple((split, "", batch_insert(tables, split)) for split in sorted(set(splits))),
        storage_port=0,
        mode="cql",
        consistency=consistency,
        max_in_flight=max_in_flight,
    )


def bulk_target(
    session: Any, tables: TableLayout, splits: list[str], consistency: str, storage_port: int | None, helper: str = ""
) -> BulkTarget:
    """The loader's settings for TABLES of SPLITS: the built helper (HELPER overrides its location, e.g. shipped
    by Spark), the cluster's partitioner and storage port, each table's own CREATE statement, and the nodes to
    leave out because they are down (only where CONSISTENCY still holds without them)."""
    local = session.execute("SELECT partitioner, listen_port FROM system.local").one()
    data = sorted({tables.data_table(s) for s in splits})
    meta = sorted({tables.metadata_table(s) for s in splits})
    statements = tuple(
        (name, *table_statements(session, tables.keyspace, name, columns))
        for names, columns in ((data, DATA_COLUMNS), (meta, META_COLUMNS))
        for name in names
    )
    port = storage_port or int(local.listen_port or 7000)
    return BulkTarget(
        helper=helper or str(ensure_helper()),
        keyspace=tables.keyspace,
        partitioner=local.partitioner,
        tables=statements,
        storage_port=port,
        ignore=down_nodes(session, tables.keyspace, consistency),
        storage_compatibility_mode=compatibility_mode(session),
        ring=ring_view(session, tables.keyspace, statements, port),
    )


def ring_view(session: Any, keyspace: str, statements: tuple[tuple[str, str, str], ...], port: int) -> str:
    """The ring as the helpers' loader needs it, read once here (JSON): each token range (start, end] with the
    endpoints of its replicas for KEYSPACE, and each table of STATEMENTS with its id and CREATE statement. An endpoint
    is what sstableloader's own reading gives: the address the driver reaches the node at, and the node's storage
    port (PORT where the node does not say). "" when the driver's view is incomplete (no token map, a range without a
    replica, a table it does not list): each helper then reads the ring itself."""
    import json

    cluster = session.cluster
    cluster.refresh_keyspace_metadata(keyspace)
    token_map = cluster.metadata.token_map
    if token_map is None or not token_map.ring:
        return ""
    token_map.rebuild_keyspace(keyspace, build_if_absent=True)
    ranges = []
    for i, end in enumerate(token_map.ring):
        start = token_map.ring[i - 1]  # the first range wraps around from the last token
        replicas = token_map.get_replicas(keyspace, end)
        if not replicas:
            log.warning(
                "bulk load: the driver sees no replica of range (%s, %s]; each helper reads the ring", start, end
            )
            return ""
        endpoints = [f"{h.address}:{h.broadcast_port or port}" for h in replicas]
        ranges.append([str(start.value), str(end.value), endpoints])
    ids = {
        r.table_name: str(r.id)
        for r in session.execute(
            "SELECT table_name, id FROM system_schema.tables WHERE keyspace_name = %s", (keyspace,)
        )
    }
    tables = [{"create": create, "id": ids[name]} for name, create, _ in statements if name in ids]
    if len(tables) != len(statements):
        return ""
    log.info("bulk load: the helpers stream by this driver's view of the ring (%d ranges)", len(ranges))
    return json.dumps({"ranges": ranges, "tables": tables})


def compatibility_mode(session: Any) -> str:
    """The contact node's storage_compatibility_mode (Cassandra 5.0: CASSANDRA_4 by default, which writes and
    accepts at start-up only the 4.x SSTable format): the helper writes the format the nodes write."""
    row = session.execute("SELECT value FROM system_views.settings WHERE name = 'storage_compatibility_mode'").one()
    return str(row.value) if row is not None and row.value else "CASSANDRA_4"


def table_statements(session: Any, keyspace: str, table: str, columns: tuple[str, ...]) -> tuple[str, str]:
    """(CREATE TABLE as the cluster has it, INSERT of COLUMNS in the order the writer sends their values)."""
    cluster = session.cluster
    cluster.refresh_table_metadata(keyspace, table)
    meta = cluster.metadata.keyspaces[keyspace].tables[table]
    insert = f"INSERT INTO {keyspace}.{table} ({', '.join(columns)}) VALUES ({', '.join('?' * len(columns))})"
    return meta.as_cql_query(), insert


def required(consistency: str, replicas: int) -> int:
    """Replicas of a range that must take the rows for CONSISTENCY to hold."""
    fixed = {"ANY": 1, "ONE": 1, "LOCAL_ONE": 1, "TWO": 2, "THREE": 3, "ALL": replicas}
    return fixed.get(consistency, replicas // 2 + 1)


def down_nodes(session: Any, keyspace: str, consistency: str) -> tuple[str, ...]:
    """Nodes the driver sees down, which the loader must skip; raises CassandraUnavailableError when a range
    would be left with fewer live replicas than CONSISTENCY needs (streaming cannot hint them later)."""
    metadata = session.cluster.metadata
    down = sorted(str(h.address) for h in metadata.all_hosts() if h.is_up is False)
    if not down:
        return ()
    token_map = metadata.token_map
    for token in token_map.ring if token_map else ():
        replicas = token_map.get_replicas(keyspace, token)
        live = [h for h in replicas if h.is_up is not False]
        need = required(consistency, len(replicas))
        if len(live) < need:
            raise CassandraUnavailableError(
                f"bulk load at {consistency}: a token range has {len(live)} of {len(replicas)} replicas up and "
                f"needs {need}; down: {', '.join(down)}"
            )
    log.warning("bulk load leaves out %s (down); they miss these rows until a repair", ", ".join(down))
    return tuple(down)
