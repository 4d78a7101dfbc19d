"""Writing images through the bulk-load helper: rows become SSTables on the executor's own disk and are
streamed to every replica in rounds of ``BulkTarget.round_bytes``.

The same contract as ``ImageWriter``: ``write(row)``, ``flush()`` on leaving the block, ``stats``, and an
``on_written`` callback per stored row. A row counts as written only when the round holding it has been
streamed; the helper streams a round's data tables before its metadata tables, so a metadata row still means
"committed" (a job killed between the two leaves data rows without metadata, which a re-run writes again).

Two rounds are in the helper's hands at a time: one streams while the next one's SSTables are written and the rows of
the one after arrive, so the transform does not wait for the network and the node except at the partition's end. The
helper holds the image bytes of at most three rounds in memory and the SSTables of two on the executor's scratch disk.
"""

from __future__ import annotations

import json
import struct
import uuid
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from imgest.core import defaults
from imgest.core.quarantine import QuarantineEntry, QuarantineLog, Reason
from imgest.core.settings import CassandraSettings
from imgest.sinks.cassandra.bulk_helper import BulkHelper, drop_helper, shared_helper
from imgest.sinks.cassandra.writer import CassandraWriteError, Row, WriteStats

INT = struct.Struct(">i")
# CQL mode: a round is acknowledged once all its requests are answered, so rounds stay small (progress and
# on_written stay timely); the helper bounds what is in flight, not the round
CQL_ROUND_ROWS = 256
CQL_ROUND_BYTES = 32 * 1024 * 1024


@dataclass(frozen=True)
class BulkTarget:
    """What executors need to bulk-load, resolved once by the driver: the helper and the loader's view of the
    cluster. TABLES: (name, CREATE statement, INSERT statement), data tables first, then metadata tables."""

    helper: str  # the built helper's folder, or "sparkfiles:<name>" when Spark shipped it to the executors
    keyspace: str
    partitioner: str
    tables: tuple[tuple[str, str, str], ...]
    storage_port: int
    ignore: tuple[str, ...] = ()  # nodes down when the job started (the consistency level allowed it)
    round_bytes: int = defaults.BULK_ROUND_BYTES
    buffer_mib: int = defaults.BULK_BUFFER_MIB
    connections_per_host: int = 1
    storage_compatibility_mode: str = "CASSANDRA_4"  # the nodes' (it picks the SSTable format they write and read)
    # "cql": the helper sends each image's rows as one CQL request (TABLES: (split, "", its prepared batch)) through
    # the Java driver instead of writing SSTables (HelperCqlWriter)
    mode: str = "bulk"
    consistency: str = defaults.CONSISTENCY
    max_in_flight: int = defaults.MAX_IN_FLIGHT
    # the ring as the job's driver read it (write_path.ring_view, JSON: each range's replicas, the tables' ids): the
    # helpers stream by it instead of each opening a driver session to read it ("": they read it themselves)
    ring: str = ""
    retries: int = 6  # CQL mode: resends of a request that timed out or found too few replicas (ImageWriter's)
    backoff_s: float = 0.1  # CQL mode: the first resend's wait, doubled for each next one

    def header(self, settings: CassandraSettings) -> dict[str, Any]:
        """The helper's header: tables, partitioner, and how to reach the cluster (credentials and CA inside)."""
        loader: dict[str, Any] = {
            "hosts": list(settings.hosts),
            "native_port": settings.port,
            "storage_port": self.storage_port,
            "connections_per_host": self.connections_per_host,
            "ignore": list(self.ignore),
        }
        if settings.username:
            loader |= {"user": settings.username, "password": settings.password or ""}
        shipped = settings.shippable()  # the TLS texts, shipped with the task
        if shipped.ssl_ca_data:
            loader["ca_pem"] = shipped.ssl_ca_data
        if shipped.ssl_cert_data and shipped.ssl_key_data:  # mutual TLS: the helper presents the client certificate
            loader |= {"cert_pem": shipped.ssl_cert_data, "key_pem": shipped.ssl_key_data}
        tables = [{"name": n, "create": c, "insert": i} for n, c, i in self.tables]
        if self.mode == "cql":
            if settings.local_dc:
                loader["local_dc"] = settings.local_dc
            return {
                "mode": "cql",
                "keyspace": self.keyspace,
                "tables": tables,
                "consistency": self.consistency,
                "max_in_flight": self.max_in_flight,
                "max_in_flight_bytes": defaults.MAX_IN_FLIGHT_BYTES,
                "timeout_s": defaults.REQUEST_TIMEOUT_S,
                "retries": self.retries,
                "backoff_s": self.backoff_s,
                "connect_timeout_s": settings.connect_timeout,
                "loader": loader,
            }
        if self.ring:
            loader["ring"] = json.loads(self.ring)
        return {
            "keyspace": self.keyspace,
            "partitioner": self.partitioner,
            "storage_compatibility_mode": self.storage_compatibility_mode,
            "buffer_mib": self.buffer_mib,
            "tables": tables,
            "loader": loader,
        }

    def helper_home(self) -> Any:
        from pathlib import Path

        if self.helper.startswith("sparkfiles:"):
            from pyspark import SparkFiles

            return Path(SparkFiles.get(self.helper.removeprefix("sparkfiles:")))
        return Path(self.helper)


def encode(value: Any) -> bytes | None:
    """VALUE serialized as CQL stores it (uuid, int, text, blob)."""
    kind = type(value)  # the common types first, without isinstance's walk (a metadata row has 13 values)
    if kind is str:
        return value.encode()
    if kind is int:
        return INT.pack(value)
    if kind is uuid.UUID:
        return value.bytes
    if value is None:
        return None
    if isinstance(value, uuid.UUID):
        return value.bytes
    if isinstance(value, bool):
        raise TypeError("no boolean column is bulk-written")
    if isinstance(value, int):
        return INT.pack(value)
    if isinstance(value, str):
        return value.encode()
    return bytes(value)


class BulkImageWriter:
    """Context manager with ImageWriter's interface over a shared helper of this executor."""

    # rounds in the helper's hands: one closing (its SSTables written) while the one before it streams; the helper
    # holds the image bytes of at most three rounds (closing, queued, being written) and the SSTables of two on disk
    ROUNDS_IN_FLIGHT = 2
    LEAVES_SSTABLES = True  # each round streamed leaves an SSTable per table on each replica (stats.loads)

    def __init__(
        self,
        target: BulkTarget,
        settings: CassandraSettings,
        table_names: Callable[[str], tuple[str, str]],
        quarantine: QuarantineLog,
        max_blob_bytes: int = defaults.MAX_BLOB_BYTES,
        on_written: Callable[[Row, int], None] | None = None,
    ) -> None:
        self._helper: BulkHelper = shared_helper(target.helper_home(), target.header(settings))
        self._index = {name: i for i, (name, _, _) in enumerate(target.tables)}
        self._names = table_names  # split -> (data table, metadata table)
        self._quarantine = quarantine
        self._max_blob = max_blob_bytes
        self._round = target.round_bytes
        self._after: int | None = None  # expect(): bytes still to come after the rows written (None: unknown)
        self._on_written = on_written
        self._by_split: dict[str, tuple[int, int]] = {}
        # rows of this round, without their bytes (in the helper): id, label, split, rel_path, stored size
        self._pending: list[tuple[uuid.UUID, int, str, str, int]] = []
        self._pending_bytes = 0
        # the rounds handed to the helper and not yet acknowledged, oldest first (at most ROUNDS_IN_FLIGHT)
        self._loading: deque[list[tuple[uuid.UUID, int, str, str, int]]] = deque()
        self.stats = WriteStats()

    def __enter__(self) -> BulkImageWriter:
        return self

    def __exit__(self, exc_type: object, *exc: object) -> None:
        if exc_type is not None:  # rows of this partition sit unacknowledged in the helper: start the next clean
            drop_helper(self._helper)
            return
        self.flush()

    def write(self, row: Row) -> None:
        if len(row.data) > self._max_blob:
            detail = f"{len(row.data)} bytes > store limit {self._max_blob}"
            self._quarantine.add(
                QuarantineEntry(row.rel_path, row.split, Reason.TOO_LARGE_FOR_STORE, detail, str(row.id))
            )
            return
        self._send(row)
        self._pending.append((row.id, row.label, row.split, row.rel_path, len(row.data)))
        self._pending_bytes += len(row.data)
        if self._round_full():
            self._next_round()

    def _send(self, row: Row) -> None:
        """ROW's data row and metadata row down the helper's pipe."""
        data, meta = self._tables(row.split)
        self._helper.add(data, (row.id.bytes, INT.pack(row.label), row.data))
        self._helper.add(meta, [encode(v) for v in row.meta])

    def expect(self, after_bytes: int | None) -> None:
        """The bytes the partition's rows after those written so far will store (an estimate; None: unknown). A round
        then also ends once it holds as much as is still to come (at least BULK_MIN_ROUND_BYTES): rounds halve
        towards the partition's end, so the last one, which streams with no next round to overlap, is small."""
        self._after = after_bytes

    def _round_full(self) -> bool:
        if self._pending_bytes >= self._round:
            return True
        return self._after is not None and self._pending_bytes >= max(defaults.BULK_MIN_ROUND_BYTES, self._after)

    def _tables(self, split: str) -> tuple[int, int]:
        """The helper's indexes of SPLIT's (data table, metadata table)."""
        found = self._by_split.get(split)
        if found is None:
            data, meta = self._names(split)
            found = self._by_split[split] = (self._index[data], self._index[meta])
        return found

    def _next_round(self) -> None:
        """Hand the helper this round to load, once fewer than ROUNDS_IN_FLIGHT rounds are in its hands (waiting for
        the oldest's acknowledgement otherwise)."""
        if len(self._loading) >= self.ROUNDS_IN_FLIGHT:
            self._acknowledged()
        self._helper.start_load()
        self._loading.append(self._pending)
        self._pending = []
        self._pending_bytes = 0

    def _acknowledged(self) -> None:
        """Wait until the oldest round in flight is on every replica; its rows count as written from here, except those
        the cluster refused for good (CQL mode only): too large is quarantined, anything else an error of the flush."""
        self._helper.wait_load()
        self.stats.loads += int(self.LEAVES_SSTABLES)
        rows = self._loading.popleft()
        refused = {index: (kind, message) for index, kind, message in self._helper.refused}
        self.stats.retries += self._helper.resent
        for index, (row_id, label, split, rel_path, nbytes) in enumerate(rows):
            if index in refused:
                kind, message = refused[index]
                if kind == "too_large":
                    detail = f"server refused {nbytes} bytes: {message}"
                    self._quarantine.add(
                        QuarantineEntry(rel_path, split, Reason.TOO_LARGE_FOR_STORE, detail, str(row_id))
                    )
                else:
                    self.stats.errors.append(f"row {row_id} ({rel_path}): {message}")
                continue
            self.stats.written += 1
            self.stats.bytes += nbytes
            if self._on_written is not None:
                self._on_written(Row(row_id, label, b"", split, (), rel_path), nbytes)

    def flush(self) -> None:
        """Stream every row written so far and wait: each counts as written once the helper acknowledges it."""
        if self._pending:
            self._next_round()
        while self._loading:
            self._acknowledged()


class HelperCqlWriter(BulkImageWriter):
    """ImageWriter's contract with the CQL requests sent by the helper's Java driver (a BulkTarget of mode "cql"):
    each image's data and metadata rows go down the pipe as one frame and leave as one prepared UNLOGGED batch, with
    retries and the bounded window in the helper. Rows count as written once their round's reply says the cluster
    took them; a row the cluster refused as too large is quarantined, any other refusal is an error of the flush,
    as with ImageWriter."""

    LEAVES_SSTABLES = False  # rounds are CQL requests
    ROUNDS_IN_FLIGHT = 1  # the helper bounds the requests in flight; a round is answered once all its rows are

    def __init__(
        self,
        target: BulkTarget,
        settings: CassandraSettings,
        quarantine: QuarantineLog,
        max_blob_bytes: int = defaults.MAX_BLOB_BYTES,
        on_written: Callable[[Row, int], None] | None = None,
    ) -> None:
        super().__init__(target, settings, lambda split: (split, split), quarantine, max_blob_bytes, on_written)
        self._round = CQL_ROUND_BYTES

    def _send(self, row: Row) -> None:
        """ROW's 16 values in one frame, bound by the helper to its split's prepared batch."""
        statement = self._tables(row.split)[0]
        self._helper.add(statement, [row.id.bytes, INT.pack(row.label), row.data, *[encode(v) for v in row.meta]])

    def _round_full(self) -> bool:
        return self._pending_bytes >= self._round or len(self._pending) >= CQL_ROUND_ROWS

    def flush(self) -> None:
        super().flush()
        if self.stats.errors:
            raise CassandraWriteError(
                f"{len(self.stats.errors)} rows failed after the helper's retries; first: {self.stats.errors[0]}"
            )
