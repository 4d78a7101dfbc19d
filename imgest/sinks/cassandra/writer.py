"""Writing images to Cassandra: bounded in-flight asynchronous inserts with retries.

Each image is one request: an UNLOGGED batch of its data-row and metadata-row inserts, prepared once as one
statement (``BEGIN UNLOGGED BATCH INSERT ...; INSERT ...; APPLY BATCH``), so a row is one bind of its values
rather than a batch object of two bound statements built per image. Both rows share the partition key (the
image id) and the keyspace, so Cassandra applies them as a single mutation: on every replica both rows land or
neither does, and a metadata row always means "this image is committed". One request per image instead of two
halves the work on both sides of the wire. Up to ``max_in_flight``
images are in flight at once, as a sliding window rather than fixed batches, so nothing waits for the
slowest request of a batch. Timeouts and unavailable errors are retried with exponential backoff; a value
the server refuses as too large is quarantined, not lost.
"""

from __future__ import annotations

import logging
import re
import threading
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from imgest.core import defaults
from imgest.core.errors import ImgestError
from imgest.core.quarantine import QuarantineEntry, QuarantineLog, Reason

log = logging.getLogger(__name__)

TOO_LARGE = re.compile(r"oversized mutation|exceeds allowed maximum|too large|larger than", re.IGNORECASE)
DEFAULT_MAX_BLOB_BYTES = defaults.MAX_BLOB_BYTES


class CassandraWriteError(ImgestError):
    """Rows could not be written after all retries; names the table, the row and the cause."""


@dataclass(frozen=True)
class Row:
    """One image to store: data-table values and metadata-table values."""

    id: uuid.UUID
    label: int
    data: bytes
    split: str
    meta: tuple[Any, ...]  # values for the metadata insert, in its column order
    rel_path: str


@dataclass
class WriteStats:
    written: int = 0
    bytes: int = 0
    retries: int = 0
    loads: int = 0  # bulk: rounds streamed, each leaving one SSTable per table it holds rows of on each replica
    errors: list[str] = field(default_factory=list)


def _retryable(exc: BaseException) -> bool:
    from cassandra import OperationTimedOut, Unavailable, WriteTimeout
    from cassandra.cluster import NoHostAvailable
    from cassandra.protocol import OverloadedErrorMessage

    return isinstance(exc, WriteTimeout | Unavailable | OperationTimedOut | NoHostAvailable | OverloadedErrorMessage)


class ImageWriter:
    """Context manager: ``write(row)`` blocks only while MAX_IN_FLIGHT images are pending."""

    def __init__(
        self,
        session: Any,
        prepared: Callable[[str], Any],
        quarantine: QuarantineLog,
        max_in_flight: int = defaults.MAX_IN_FLIGHT,
        retries: int = 6,
        backoff: float = 0.1,
        max_blob_bytes: int = DEFAULT_MAX_BLOB_BYTES,
        max_in_flight_bytes: int = defaults.MAX_IN_FLIGHT_BYTES,
        on_written: Callable[[Row, int], None] | None = None,  # (row, its image bytes) once stored
    ) -> None:
        self._session = session
        self._prepared = prepared  # split -> the prepared batch of its data and metadata inserts
        self._quarantine = quarantine
        self._slots = threading.BoundedSemaphore(max_in_flight)
        self._max_in_flight = max_in_flight
        self._retries = retries
        self._backoff = backoff
        self._max_blob = max_blob_bytes
        self._on_written = on_written
        self._budget = max_in_flight_bytes
        self._in_flight_bytes = 0
        self._room = threading.Condition()
        self._lock = threading.Lock()
        self.stats = WriteStats()

    def __enter__(self) -> ImageWriter:
        return self

    def __exit__(self, *exc: object) -> None:
        self.flush()

    def expect(self, after_bytes: int | None) -> None:
        """The bytes the partition's rows after those written so far will store (the bulk writers size their rounds
        with it); requests need no plan."""

    def write(self, row: Row) -> None:
        """Queue ROW; blocks while the window is full."""
        if len(row.data) > self._max_blob:
            self._quarantine_row(row, f"{len(row.data)} bytes > store limit {self._max_blob}")
            return
        with self._room:  # memory stays bounded whatever the image sizes
            while self._in_flight_bytes and self._in_flight_bytes + len(row.data) > self._budget:
                self._room.wait()
            self._in_flight_bytes += len(row.data)
        self._slots.acquire()
        self._send(row, attempt=0)

    def flush(self) -> None:
        """Wait for every pending image; raise CassandraWriteError if any failed for good."""
        for _ in range(self._max_in_flight):
            self._slots.acquire()
        for _ in range(self._max_in_flight):
            self._slots.release()
        if self.stats.errors:
            first = self.stats.errors[0]
            raise CassandraWriteError(
                f"{len(self.stats.errors)} rows failed after {self._retries} retries; first: {first}"
            )

    # ---- callbacks (run on the driver's event loop thread: never block there) -----------------------------
    def _send(self, row: Row, attempt: int) -> None:
        try:
            future = self._session.execute_async(self._prepared(row.split), (row.id, row.label, row.data, *row.meta))
        except Exception as exc:  # raised before the request left (no host, session closed): same path as a reply
            self._failed(exc, row, attempt)
            return
        future.add_callbacks(self._ok, self._failed, callback_args=(row,), errback_args=(row, attempt))

    def _ok(self, _result: Any, row: Row) -> None:
        with self._lock:
            self.stats.written += 1
            self.stats.bytes += len(row.data)
        if self._on_written is not None:
            self._on_written(row, len(row.data))
        self._release(row)

    def _failed(self, exc: BaseException, row: Row, attempt: int) -> None:
        from cassandra import InvalidRequest

        if isinstance(exc, InvalidRequest) and TOO_LARGE.search(str(exc)):
            self._quarantine_row(row, f"server refused {len(row.data)} bytes: {exc}")
            self._release(row)
            return
        if _retryable(exc) and attempt < self._retries:
            with self._lock:
                self.stats.retries += 1
            delay = self._backoff * (2**attempt)
            log.warning("retrying insert of %s in %.2fs after %s", row.id, delay, type(exc).__name__)
            timer = threading.Timer(delay, self._send, args=(row, attempt + 1))
            timer.daemon = True
            timer.start()
            return
        from imgest.sinks.cassandra.client import describe_unavailable, replica_shortfall

        cause = f"{type(exc).__name__}: {exc}"
        try:
            shortfall = replica_shortfall(exc)
            if shortfall is not None:
                cause = f"{type(shortfall).__name__}: {describe_unavailable(shortfall, self._session)}"
        finally:  # whatever describing the error does, the row is recorded and its slot released
            with self._lock:
                self.stats.errors.append(f"row {row.id} ({row.rel_path}): {cause}")
            self._release(row)

    def _release(self, row: Row) -> None:
        with self._room:
            self._in_flight_bytes -= len(row.data)
            self._room.notify_all()
        self._slots.release()

    def _quarantine_row(self, row: Row, detail: str) -> None:
        with self._lock:
            self._quarantine.add(
                QuarantineEntry(row.rel_path, row.split, Reason.TOO_LARGE_FOR_STORE, detail, str(row.id))
            )
