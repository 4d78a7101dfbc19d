"""Dataset locks kept in the dataset's own keyspace, so every writer of its Cassandra tables finds them.

A laptop's CLI on a local master and a DAG run on a cluster that write the same keyspace share no state folder and
perhaps no S3 bucket; they share the keyspace. ``cassandra://<hosts>[:port]/<keyspace>`` names this store
(``imgest.core.lock_stores.cassandra_lock_url``; found through the ``imgest.lock_stores`` entry point): one row per
dataset in ``<keyspace>.imgest_locks`` (created with the keyspace when missing, with the run's replication).

The four steps of a lock store are lightweight transactions (Paxos, ``SERIAL``: one winner across data centres):
``INSERT ... IF NOT EXISTS``, ``UPDATE ... IF version = <read>``, ``DELETE ... IF version = <read>``; each write
sets a new random ``version``. A read is a ``SERIAL`` read (it sees the last accepted write); its age is the
coordinator's ``currentTimestamp()`` minus the row's write time, which a transaction takes from its Paxos ballot (the
coordinator's clock), so writers with skewed clocks agree on a lease that ran out. A transaction whose outcome the
coordinator could not learn (a timeout) is settled by reading the row back: the new version is there or not.
"""

from __future__ import annotations

import json
import logging
import uuid
from datetime import UTC
from typing import Any
from urllib.parse import parse_qs, urlsplit

from imgest.core import defaults
from imgest.core.errors import ImgestError
from imgest.core.lock_stores import Record
from imgest.core.settings import CassandraSettings
from imgest.sinks.cassandra.schema import identifier

log = logging.getLogger(__name__)
TABLE = "imgest_locks"


def parse_url(url: str) -> tuple[tuple[str, ...], int | None, str, str]:
    """``cassandra://h1,h2:9042/ks?replication=...`` -> (hosts, port or None, keyspace, replication spec)."""
    parts = urlsplit(url)
    netloc, port = parts.netloc, None
    host_part, _, maybe_port = netloc.rpartition(":")
    if host_part and maybe_port.isdigit():
        netloc, port = host_part, int(maybe_port)
    hosts = tuple(h for h in netloc.split(",") if h)
    keyspace = parts.path.strip("/")
    if parts.scheme != "cassandra" or not keyspace:
        raise ValueError(f"{url!r} is not a Cassandra lock store (cassandra://hosts[:port]/keyspace)")
    replication = parse_qs(parts.query).get("replication", [defaults.REPLICATION])[0]
    return hosts, port, keyspace, replication


class CassandraLockStore:
    """Lock records as rows of ``<keyspace>.imgest_locks``, changed only by lightweight transactions."""

    def __init__(self, url: str, settings: CassandraSettings | None = None) -> None:
        self._hosts, self._port, keyspace, self.replication = parse_url(url)
        self.keyspace = identifier(keyspace, "keyspace")  # names go into CQL unquoted: refused unless safe
        self._settings = settings
        self.table = f"{self.keyspace}.{TABLE}"
        self.location = f"cassandra://{urlsplit(url).netloc}/{self.keyspace}"
        self._session: Any = None
        self._made = False

    @property
    def settings(self) -> CassandraSettings:
        """The settings given, else this process's (``lock_stores.use_cassandra``: the CLI's flags, a Spark
        driver's job), else the environment's with the URL's contact points; resolved at the first request."""
        if self._settings is None:
            from imgest.core.lock_stores import process_cassandra

            hosts = ",".join(self._hosts) or None
            self._settings = process_cassandra() or CassandraSettings.from_env(hosts, self._port)
        return self._settings

    def _refused(self, exc: Exception) -> ImgestError:
        user = self.settings.username or "(no user)"
        return ImgestError(
            f"the dataset lock store {self.location} (table {self.table}): {type(exc).__name__}: {exc}; user {user} "
            "needs SELECT and MODIFY on it (and CREATE on the keyspace when it is new)"
        )

    def _run(self, cql: str, params: tuple[Any, ...], serial_read: bool = False) -> Any:
        from cassandra import ConsistencyLevel
        from cassandra.query import SimpleStatement

        from imgest.sinks.cassandra.client import shared_session

        if self._session is None or self._session.is_shutdown:
            self._session = shared_session(self.settings)
        level = ConsistencyLevel.SERIAL if serial_read else ConsistencyLevel.QUORUM
        statement = SimpleStatement(cql, consistency_level=level, serial_consistency_level=ConsistencyLevel.SERIAL)
        return self._session.execute(statement, params)

    def _make(self) -> None:
        """The keyspace (with the run's replication) and the table, when missing; once per store."""
        if self._made:
            return
        from imgest.sinks.cassandra.schema import replication

        self._run(f"CREATE KEYSPACE IF NOT EXISTS {self.keyspace} WITH replication = "
                  f"{replication(self.replication)}", ())  # fmt: skip
        self._run(f"CREATE TABLE IF NOT EXISTS {self.table} (name text PRIMARY KEY, record text, version text)", ())
        self._made = True

    def _cas(self, cql: str, params: tuple[Any, ...], name: str, new_version: str | None) -> bool:
        """Run a transaction; when its outcome is unknown (a timeout), read the row back: NEW_VERSION there (None:
        the row gone) means it was applied."""
        from cassandra import WriteTimeout

        try:
            return bool(self._run(cql, params).was_applied)
        except WriteTimeout as exc:
            log.warning("lock %s: the outcome of a transaction on %s is unknown (%s): reading it back", name,
                        self.location, exc)  # fmt: skip
            now = self.read(name)
            return (now is None) if new_version is None else (now is not None and now.version == new_version)
        except ImgestError:
            raise
        except Exception as exc:
            raise self._refused(exc) from None

    def create(self, name: str, fields: dict[str, Any]) -> bool:
        try:
            self._make()
        except ImgestError:
            raise
        except Exception as exc:
            raise self._refused(exc) from None
        version = uuid.uuid4().hex
        cql = f"INSERT INTO {self.table} (name, record, version) VALUES (%s, %s, %s) IF NOT EXISTS"
        return self._cas(cql, (name, json.dumps(fields), version), name, version)

    def read(self, name: str) -> Record | None:
        cql = (
            f"SELECT record, version, writetime(record) AS written, currentTimestamp() AS now FROM {self.table} "
            "WHERE name = %s"
        )
        row = self._select(cql, (name,))
        if not row:
            return None
        row = row[0]
        now = row.now.replace(tzinfo=UTC).timestamp()  # the driver gives the coordinator's time as naive UTC
        return Record(json.loads(row.record), row.version, max(0.0, now - row.written / 1e6))

    def _select(self, cql: str, params: tuple[Any, ...]) -> list[Any]:
        from cassandra import InvalidRequest

        try:
            return list(self._run(cql, params, serial_read=bool(params)))
        except InvalidRequest as exc:
            if "does not exist" in str(exc):  # no lock was ever taken in this keyspace
                return []
            raise self._refused(exc) from None
        except Exception as exc:
            raise self._refused(exc) from None

    def replace(self, name: str, fields: dict[str, Any], version: str) -> bool:
        new = uuid.uuid4().hex
        cql = f"UPDATE {self.table} SET record = %s, version = %s WHERE name = %s IF version = %s"
        return self._cas(cql, (json.dumps(fields), new, name, version), name, new)

    def delete(self, name: str, version: str) -> bool:
        return self._cas(f"DELETE FROM {self.table} WHERE name = %s IF version = %s", (name, version), name, None)

    def names(self) -> list[str]:
        return sorted(row.name for row in self._select(f"SELECT name FROM {self.table}", ()))
