"""Reading image rows back from Cassandra at training speed, for DALI's ``fn.external_source``.

``CassandraReader`` streams the rows of a list of ids as batches ``(list of uint8 arrays, int32 labels)``:

- requests go out asynchronously with prepared statements; with ``rows_per_request=1`` each is a single-partition
  select routed to a replica (token-aware), with more each is a small ``IN`` query (fewer round trips and less
  client CPU per row, one coordinator hop on a ring);
- the read-ahead window (rows requested and not yet consumed) sizes itself by default: delivery rate x round
  trip, grown from a slow start of ``slow_start`` batches, capped by ``max_window_mb`` of rows and by
  ``requests_in_flight`` (``imgest.readback.window``), so the reader keeps its rate 100 ms away without a
  setting; ``prefetch_buffers`` fixes it to that many batches instead (the cassandra-dali-plugin's name);
- requests take turns over several connections (driver Clusters; the driver's libev loop serves them all from
  one I/O thread): one TCP connection carries only so much per round trip (its receive window; Toxiproxy holds
  1,024 chunks per connection and direction), so 100 ms away two connections cap the reader whatever its window.
  By default ``open`` times the round trip and opens what ``open_mb_s`` would need (2 on a fast link, up to
  ``max_io_threads``), and one more opens in the background for every ``connection_mb`` the window requests
  ahead beyond that; ``io_threads`` fixes the number instead;
- rows complete out of order inside the window (``ooo``, the default), so one slow row delays one batch by
  nothing but its own latency, never the stream; ``ooo=False`` delivers them in the epoch's order;
- ``shard_id`` / ``num_shards`` give each training process a disjoint part; ``seed`` reshuffles every epoch
  (the same seed and epoch always give the same order, so every process agrees on the parts).

``simple_batches`` is the straightforward reader it is compared with: one ``execute_concurrent_with_args``
per batch, nothing requested ahead.
"""

from __future__ import annotations

import logging
import math
import threading
import uuid
from collections import deque
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from imgest.core.errors import ImgestError
from imgest.core.settings import CassandraSettings
from imgest.readback.window import AdaptiveWindow, WindowStats

log = logging.getLogger(__name__)
Batch = tuple[list[np.ndarray], np.ndarray, list[str]]  # images (encoded bytes), labels, ids
ADAPTIVE_CONNECTIONS = 2  # connections the adaptive default opens with (more as the window's bytes grow)


class ReadError(ImgestError):
    """A row could not be read back (missing, or the server failed after retries)."""


@dataclass(frozen=True)
class CassandraReadOptions:
    """Knobs of the Cassandra reader, named after what they do (and like the cassandra-dali-plugin's where they
    mean the same). The defaults size the window by themselves; the others are for experts."""

    batch_size: int = 64
    prefetch_buffers: int | None = None  # None: adaptive window; N: exactly N batches requested ahead
    slow_start: int = 4  # batches in the first (and smallest) adaptive window
    max_window_mb: int = 256  # memory bound of the adaptive window (rows requested and not yet consumed)
    requests_in_flight: int = 512  # cap on requests on the wire
    rows_per_request: int = 16  # ids per request (1: single-partition, token-aware; more: an IN query)
    io_threads: int | None = None  # connections (driver Clusters); None: 2, more as the window's bytes grow
    max_io_threads: int = 8  # the most connections the adaptive default opens
    connection_mb: int = 4  # the adaptive default opens one connection per this many MB requested ahead
    open_mb_s: int = 400  # ... and at open as many as this rate times the round trip (timed at open) would need
    ooo: bool = True  # out-of-order: rows are delivered as they land (False: in the epoch's order)
    retries: int = 3  # per request, on timeouts and unavailable errors
    shard_id: int = 0
    num_shards: int = 1
    seed: int | None = 0  # None: keep the given order; else reshuffle every epoch with (seed, epoch)

    def connections_for(self, bytes_ahead: float) -> int:
        """Connections the requests should take turns over with BYTES_AHEAD requested and not yet consumed:
        io_threads when set, else one per connection_mb, at least 2 and at most max_io_threads."""
        if self.io_threads is not None:
            return max(1, self.io_threads)
        per_connection = self.connection_mb * 2**20
        wanted = math.ceil(bytes_ahead / per_connection)
        return max(ADAPTIVE_CONNECTIONS, min(self.max_io_threads, wanted))

    def window(self, start: float | None = None) -> AdaptiveWindow:
        """The read-ahead window in rows these options give (adaptive unless prefetch_buffers is set), starting
        from START rows (the last epoch's window) when given."""
        fixed = self.prefetch_buffers is not None
        initial = (self.prefetch_buffers if fixed else self.slow_start) * self.batch_size  # type: ignore[operator]
        cap = self.requests_in_flight * self.rows_per_request
        return AdaptiveWindow("rows", max(1, min(initial, cap)), cap, adaptive=not fixed, start=start)


def epoch_order(ids: Sequence[str], labels: np.ndarray, opts: CassandraReadOptions, epoch: int) -> np.ndarray:
    """Indices of this shard's samples for EPOCH: a seeded permutation cut into num_shards disjoint parts."""
    order = np.arange(len(ids))
    if opts.seed is not None:
        order = np.random.default_rng([opts.seed, epoch]).permutation(len(ids))
    return np.array_split(order, opts.num_shards)[opts.shard_id]


class _Stream:
    """One epoch in flight: issues grouped requests ahead of the consumer and collects rows as they land."""

    def __init__(self, reader: CassandraReader, order: np.ndarray) -> None:
        self.reader, self.order = reader, order
        self.lock = threading.Condition()
        self.done: deque[tuple[str, int, bytes]] = deque()
        self.parked: dict[int, list[tuple[str, int, bytes]]] = {}  # in-order mode: groups that landed early
        self.delivered_to = 0  # in-order mode: position of ORDER up to which rows are in DONE
        self.window = reader.opts.window(reader.window_stats.final if reader.window_stats else None)
        self.row_bytes = 0  # bytes of the rows landed so far, for the memory bound
        self.rows_landed = 0
        self.in_flight = 0
        self.next_index = 0  # next position of ORDER to request
        self.consumed = 0
        self.error: BaseException | None = None

    def pump(self) -> None:
        """Issue requests while the window allows (called with the lock held)."""
        opts = self.reader.opts
        limit = min(self.consumed + int(self.window.size), len(self.order))
        while self.in_flight < opts.requests_in_flight and self.next_index < limit:
            start = self.next_index
            group = self.order[start : start + opts.rows_per_request]
            self.next_index += len(group)
            self.in_flight += 1
            self.reader._request(
                [self.reader.id_at(i) for i in group], self, opts.retries, (start, self.window.stamp())
            )

    def landed(self, rows: list[tuple[str, int, bytes]], expected: list[str], tag: tuple[int, Any]) -> None:
        with self.lock:
            self.in_flight -= 1
            if len(rows) != len(expected):
                got = {r[0] for r in rows}
                missing = [i for i in expected if i not in got]
                self.error = ReadError(f"rows missing from {self.reader.table}: {', '.join(missing[:5])}")
            self._account(rows, tag[1])
            if self.reader.opts.ooo:
                self.done.extend(rows)
            else:
                self._in_order(tag[0], rows, expected)
            self.pump()
            self.lock.notify_all()

    def _account(self, rows: list[tuple[str, int, bytes]], token: Any) -> None:
        """Feed the window its samples; once rows have a size, bound the window by max_window_mb of them."""
        self.rows_landed += len(rows)
        self.row_bytes += sum(len(r[2]) for r in rows)
        # once every row is requested the rate falls because the epoch ends, not because the path got slower:
        # the window keeps its size (the next epoch starts from it)
        draining = self.next_index >= len(self.order)
        self.window.landed(token, len(rows), self.next_index - self.consumed, hold=draining)
        if self.window.adaptive and self.row_bytes:
            opts = self.reader.opts
            per_row = self.row_bytes / self.rows_landed
            self.window.set_cap(
                min(opts.requests_in_flight * opts.rows_per_request, opts.max_window_mb * 2**20 / per_row)
            )
            self.reader.want_connections(self.window.size * per_row)

    def _in_order(self, start: int, rows: list[tuple[str, int, bytes]], expected: list[str]) -> None:
        by_id = {r[0]: r for r in rows}
        self.parked[start] = [by_id[i] for i in expected if i in by_id]
        while self.delivered_to in self.parked:
            group = self.parked.pop(self.delivered_to)
            self.done.extend(group)
            self.delivered_to += min(self.reader.opts.rows_per_request, len(self.order) - self.delivered_to)

    def failed(self, exc: BaseException, ids: list[str]) -> None:
        with self.lock:
            self.in_flight -= 1
            self.error = ReadError(
                f"reading ids {', '.join(ids[:3])}... from {self.reader.table} at {self.reader.settings.address} "
                f"failed after retries: {type(exc).__name__}: {exc}"
            )
            self.lock.notify_all()

    def take(self, n: int) -> list[tuple[str, int, bytes]]:
        with self.lock:
            self.pump()
            while len(self.done) < n and self.error is None:
                self.lock.wait(timeout=1.0)
            if self.error is not None:
                raise self.error
            rows = [self.done.popleft() for _ in range(n)]
            self.consumed += n
            self.pump()
            return rows


class CassandraReader:
    """Batches of (encoded image, label) read back from a data table, epoch after epoch."""

    def __init__(
        self,
        settings: CassandraSettings,
        table: str,
        ids: Sequence[str] | np.ndarray,
        labels: Sequence[int],
        opts: CassandraReadOptions | None = None,
    ) -> None:
        self.settings, self.table = settings, table
        self.ids = ids if isinstance(ids, np.ndarray) else list(ids)  # text, or a column of UTF-8 bytes
        self.labels = np.asarray(labels, dtype=np.int32)
        self.opts = opts or CassandraReadOptions()
        self._clusters: list[Any] = []
        self._conns: list[tuple[Any, Any]] = []  # (session, prepared select), one per connection
        self._turn = 0
        self._closed = True
        self._opening: threading.Thread | None = None  # the background thread opening more connections
        self._lock = threading.Lock()
        self.epoch = 0
        self.window_stats: WindowStats | None = None  # the read-ahead window of the last epoch read

    def __enter__(self) -> CassandraReader:
        self.open()
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @property
    def connections(self) -> int:
        """Connections the requests take turns over now."""
        return len(self._conns)

    def open(self) -> None:
        """Connect and prepare the select: IO_THREADS connections; by default as many as the round trip to the
        server (timed on the first) calls for at open_mb_s, at least 2, opened side by side; more later as the
        window's bytes grow."""
        self._closed = False
        self._connect()
        want = self.opts.io_threads or self.opts.connections_for(self._probe_rtt() * self.opts.open_mb_s * 1e6)
        threads = [threading.Thread(target=self._connect, daemon=True) for _ in range(max(1, want) - 1)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        if len(self._conns) < max(1, want):
            log.warning("cassandra reader: %s of %s connections to %s opened", len(self._conns), want, self.address)

    @property
    def address(self) -> str:
        return self.settings.address

    def _probe_rtt(self) -> float:
        """The lowest of 3 round trips of a trivial query on the first connection, in seconds."""
        import time

        session = self._conns[0][0]
        best = float("inf")
        for _ in range(3):
            t0 = time.perf_counter()
            session.execute("SELECT release_version FROM system.local")
            best = min(best, time.perf_counter() - t0)
        return best

    def _connect(self) -> None:
        from cassandra.query import tuple_factory

        from imgest.sinks.cassandra.client import build_cluster

        try:
            # connections after the first skip the schema (and so token-aware routing, which an IN query of
            # several partitions cannot use anyway): a few round trips each instead of a dozen
            light = bool(self._conns) and self.opts.rows_per_request > 1
            extra = {"schema_metadata_enabled": False, "token_metadata_enabled": False} if light else {}
            cluster = build_cluster(self.settings, row_factory=tuple_factory, **extra)
            session = cluster.connect()
            where = "id IN ?" if self.opts.rows_per_request > 1 else "id = ?"
            statement = session.prepare(f"SELECT id, label, data FROM {self.table} WHERE {where}")
        except Exception:
            if not self._conns:  # the first connection: the reader cannot read
                raise
            log.warning("cassandra reader: could not open one more connection to %s", self.address, exc_info=True)
            return
        with self._lock:
            if self._closed:  # closed while this one was opening in the background
                cluster.shutdown()
                return
            self._clusters.append(cluster)
            self._conns.append((session, statement))

    def want_connections(self, bytes_ahead: float) -> None:
        """Adaptive connections: open more in the background (one per connection_mb of BYTES_AHEAD, the window's
        bytes, up to max_io_threads); the epoch reads on over the ones open meanwhile."""
        if self.opts.io_threads is not None or self._opening is not None or self._closed:
            return
        want = self.opts.connections_for(bytes_ahead)
        if want > len(self._conns):
            self._opening = threading.Thread(target=self._grow, args=(want,), name="cassandra-connect", daemon=True)
            self._opening.start()

    def _grow(self, want: int) -> None:
        try:
            while len(self._conns) < want and not self._closed:
                count = len(self._conns)
                self._connect()
                if len(self._conns) == count:  # could not: go on over the ones open
                    break
            log.debug("cassandra reader: %s connections to %s", len(self._conns), self.address)
        finally:
            self._opening = None

    def close(self) -> None:
        with self._lock:
            self._closed = True
        opening = self._opening
        if opening is not None:
            opening.join(timeout=60)
        for cluster in self._clusters:
            cluster.shutdown()
        self._clusters, self._conns = [], []

    def id_at(self, i: int) -> str:
        """The id at position I as text."""
        key = self.ids[i]
        return key.decode() if isinstance(key, bytes) else key

    def __len__(self) -> int:
        """Batches per epoch for this shard (the last one may be short)."""
        n = len(np.array_split(np.arange(len(self.ids)), self.opts.num_shards)[self.opts.shard_id])
        return -(-n // self.opts.batch_size)

    def _request(self, ids: list[str], stream: _Stream, retries: int, tag: tuple[int, Any]) -> None:
        conns = self._conns
        k = self._turn = (self._turn + 1) % len(conns)
        session, statement = conns[k]
        keys = [uuid.UUID(i) for i in ids]
        future = session.execute_async(statement, (keys,) if self.opts.rows_per_request > 1 else keys)

        def ok(rows: list[tuple[Any, int, bytes]]) -> None:
            stream.landed([(str(r[0]), r[1], r[2]) for r in rows], ids, tag)

        def err(exc: BaseException) -> None:
            if retries > 0:  # retry later, off the driver's I/O thread
                threading.Timer(
                    0.05 * (1 + self.opts.retries - retries), self._retry, (ids, stream, retries, tag)
                ).start()
            else:
                stream.failed(exc, ids)

        future.add_callbacks(ok, err)

    def _retry(self, ids: list[str], stream: _Stream, retries: int, tag: tuple[int, Any]) -> None:
        self._request(ids, stream, retries - 1, tag)

    def epoch_batches(self, order: np.ndarray | None = None) -> Iterator[Batch]:
        """One epoch of this shard, in the seeded order of the current epoch (rows may land out of order); or
        the rows at the positions ORDER of the ids, in that order (what a resumed reader state leaves to read).
        The first requests go out now, not at the first batch taken: whatever the caller does before it (build
        a pipeline) overlaps the first round trip."""
        if not self._conns:
            self.open()
        if order is None:
            order = epoch_order(self.ids, self.labels, self.opts, self.epoch)
            self.epoch += 1
        stream = _Stream(self, order)
        with stream.lock:
            stream.pump()
        return self._batches(stream)

    def _batches(self, stream: _Stream) -> Iterator[Batch]:
        remaining = len(stream.order)
        try:
            while remaining:
                rows = stream.take(min(self.opts.batch_size, remaining))
                remaining -= len(rows)
                yield self._columns(rows)
        finally:
            self.window_stats = stream.window.finish()
            log.debug("cassandra read window of epoch %s: %s", self.epoch - 1, self.window_stats)

    @staticmethod
    def _columns(rows: list[tuple[str, int, bytes]]) -> Batch:
        return (
            [np.frombuffer(r[2], dtype=np.uint8) for r in rows],
            np.array([r[1] for r in rows], dtype=np.int32),
            [r[0] for r in rows],
        )


def simple_batches(
    session: Any, table: str, ids: Sequence[str] | np.ndarray, batch_size: int, concurrency: int = 64
) -> Iterator[Batch]:
    """The straightforward reader: one execute_concurrent_with_args per batch, one row per request."""
    from cassandra.concurrent import execute_concurrent_with_args

    stmt = session.prepare(f"SELECT id, label, data FROM {table} WHERE id = ?")
    for start in range(0, len(ids), batch_size):
        chunk = [(uuid.UUID(i.decode() if isinstance(i, bytes) else i),) for i in ids[start : start + batch_size]]
        results = execute_concurrent_with_args(session, stmt, chunk, concurrency=concurrency)
        rows = []
        for (ok, result), (key,) in zip(results, chunk, strict=True):
            row = result.one() if ok else None
            if row is None:
                raise ReadError(f"row {key} missing from {table} ({result if not ok else 'no row'})")
            rows.append(row)
        yield (
            [np.frombuffer(r.data, dtype=np.uint8) for r in rows],
            np.array([r.label for r in rows], dtype=np.int32),
            [str(r.id) for r in rows],
        )
