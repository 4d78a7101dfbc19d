"""Reading image rows back from Cassandra at training speed, for DALI's ``fn.external_source``.

``CassandraReader`` streams the rows of a list of ids as batches ``(list of uint8 arrays, int32 labels)``:

- requests go out asynchronously with prepared statements; with ``rows_per_request=1`` each is a single-partition
  select routed to a replica (token-aware), with more each is an ``IN`` query of that many ids (64 by default:
  fewer round trips and less CPU per row at the server, the proxy and the client; one coordinator hop on a ring);
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
  (the same seed and epoch always give the same order, so every process agrees on the parts);
- epochs follow each other without a gap (``prefetch_next_epoch``, the default): one window serves the reader's
  whole life, and once every row of an epoch is requested its room goes to the next epoch's first rows (the next
  seeded order, or the ``next_order`` a caller names), so epoch N+1 starts with a full window; ``open`` sends the
  first epoch's requests as soon as the first connection is up, before the others open, and once the first rows
  tell their size the window jumps to ``open_mb_s`` x the round trip timed at open instead of doubling from the
  slow start round trip after round trip. Rows requested ahead are handed over only by the epoch they belong
  to, and dropped unseen if the caller asks for another order instead.

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
    slow_start: int = 16  # batches in the first (and smallest) adaptive window (1,024 rows: 16 requests of 64)
    max_window_mb: int = 256  # memory bound of the adaptive window (rows requested and not yet consumed)
    requests_in_flight: int = 512  # cap on requests on the wire
    # ids per request (1: single-partition, token-aware; more: an IN query); 64 costs the server, the proxy and
    # the reader less CPU per row than 16, most under 50-100 ms (docs/readback.md, "What limits it")
    rows_per_request: int = 64
    io_threads: int | None = None  # connections (driver Clusters); None: 2, more as the window's bytes grow
    max_io_threads: int = 8  # the most connections the adaptive default opens
    connection_mb: int = 4  # the adaptive default opens one connection per this many MB requested ahead
    open_mb_s: int = 400  # ... and at open as many as this rate times the round trip (timed at open) would need
    ooo: bool = True  # out-of-order: rows are delivered as they land (False: in the epoch's order)
    prefetch_next_epoch: bool = True  # request the next epoch's first rows as this one drains (the first at open)
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
        least = initial if fixed else min(initial, self.batch_size)  # max_window_mb may cut the slow start to a batch
        return AdaptiveWindow("rows", max(1, min(initial, cap)), cap, adaptive=not fixed, start=start, least=least)


def epoch_order(ids: Sequence[str], labels: np.ndarray, opts: CassandraReadOptions, epoch: int) -> np.ndarray:
    """Indices of this shard's samples for EPOCH: a seeded permutation cut into num_shards disjoint parts."""
    order = np.arange(len(ids))
    if opts.seed is not None:
        order = np.random.default_rng([opts.seed, epoch]).permutation(len(ids))
    return np.array_split(order, opts.num_shards)[opts.shard_id]


class _Stream:
    """One epoch's rows in flight: which to request (ORDER), and the rows landed until its consumer took them.

    Every stream of a reader shares the reader's lock (``reader.cv``) and window; the reader hands the window's room
    to its streams in turn (``CassandraReader._pump``). A stream no consumer claimed yet was requested ahead (the
    next epoch); a cancelled one drops what still lands."""

    def __init__(self, reader: CassandraReader, order: np.ndarray, claimed: bool) -> None:
        self.reader, self.order, self.claimed = reader, order, claimed
        self.cancelled = ""  # why it was cancelled ("": it was not)
        self.done: deque[tuple[str, int, bytes]] = deque()
        self.parked: dict[int, list[tuple[str, int, bytes]]] = {}  # in-order mode: groups that landed early
        self.delivered_to = 0  # in-order mode: position of ORDER up to which rows are in DONE
        self.in_flight = 0
        self.next_index = 0  # next position of ORDER to request
        self.consumed = 0
        self.error: BaseException | None = None

    def cancel(self, why: str) -> None:
        """Drop what still lands; the consumer, if any, gets a ReadError saying WHY (lock held)."""
        self.cancelled = why

    @property
    def ahead(self) -> int:
        """Rows requested and not yet handed over."""
        return self.next_index - self.consumed

    @property
    def requested_all(self) -> bool:
        return self.next_index >= len(self.order)

    def issue(self, budget: int) -> int:
        """Request about BUDGET more rows, within the reader's requests_in_flight (lock held); rows requested."""
        reader, opts = self.reader, self.reader.opts
        first = self.next_index
        while (
            self.next_index - first < budget
            and reader.in_flight < opts.requests_in_flight
            and self.next_index < len(self.order)
        ):
            start = self.next_index
            group = self.order[start : start + opts.rows_per_request]
            self.next_index += len(group)
            self.in_flight += 1
            reader.in_flight += 1
            reader._request([reader.id_at(i) for i in group], self, opts.retries, (start, reader.window.stamp()))
        return self.next_index - first

    def landed(self, rows: list[tuple[str, int, bytes]], expected: list[str], tag: tuple[int, Any]) -> None:
        reader = self.reader
        with reader.cv:
            self.in_flight -= 1
            reader.in_flight -= 1
            reader._account(rows, tag[1])
            if not self.cancelled:
                if len(rows) != len(expected):
                    got = {r[0] for r in rows}
                    missing = [i for i in expected if i not in got]
                    self.error = ReadError(f"rows missing from {reader.table}: {', '.join(missing[:5])}")
                if reader.opts.ooo:
                    self.done.extend(rows)
                else:
                    self._in_order(tag[0], rows, expected)
            reader._pump()
            reader.cv.notify_all()

    def _in_order(self, start: int, rows: list[tuple[str, int, bytes]], expected: list[str]) -> None:
        by_id = {r[0]: r for r in rows}
        self.parked[start] = [by_id[i] for i in expected if i in by_id]
        while self.delivered_to in self.parked:
            group = self.parked.pop(self.delivered_to)
            self.done.extend(group)
            self.delivered_to += min(self.reader.opts.rows_per_request, len(self.order) - self.delivered_to)

    def failed(self, exc: BaseException, ids: list[str]) -> None:
        reader = self.reader
        with reader.cv:
            self.in_flight -= 1
            reader.in_flight -= 1
            if not self.cancelled:
                self.error = ReadError(
                    f"reading ids {', '.join(ids[:3])}... from {reader.table} at {reader.settings.address} "
                    f"failed after retries: {type(exc).__name__}: {exc}"
                )
            reader.cv.notify_all()

    def dropped(self) -> None:
        """A request given up without an answer (the reader closed, or the stream was cancelled meanwhile)."""
        with self.reader.cv:
            self.in_flight -= 1
            self.reader.in_flight -= 1

    def take(self, n: int) -> list[tuple[str, int, bytes]]:
        reader = self.reader
        with reader.cv:
            reader._pump()
            while len(self.done) < n and self.error is None and not self.cancelled:
                reader.cv.wait(timeout=1.0)
            if self.error is not None:
                raise self.error
            if self.cancelled:
                raise ReadError(f"reading {reader.table} at {reader.address} stopped: {self.cancelled}")
            rows = [self.done.popleft() for _ in range(n)]
            self.consumed += n
            reader._pump()
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
        self._sizing = False  # open() is opening its connections
        self._lock = threading.Lock()
        self.epoch = 0
        self.window_stats: WindowStats | None = None  # the read-ahead window of the last epoch read
        self.cv = threading.Condition()  # guards the streams, the window and the counts below
        self.window = self.opts.window()  # one window for the reader's life: the path does not change per epoch
        self.in_flight = 0  # requests on the wire, over every stream
        self.rtt: float | None = None  # the round trip timed at open, in seconds
        self._streams: list[_Stream] = []  # the epochs in flight: claimed ones first, then one requested ahead
        self._next_order: np.ndarray | None = None  # the epoch to request once the claimed ones are all requested
        self._row_bytes = 0  # bytes of the rows landed so far, for the memory bound and the jump
        self._rows_landed = 0
        self._jumped = False
        self.started_ahead = 0  # rows of the epoch being read that were requested before it was asked for

    def __enter__(self) -> CassandraReader:
        self.open()
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @property
    def requested_ahead(self) -> int:
        """Rows requested so far for an epoch no caller has asked for yet (the next one)."""
        with self.cv:
            return sum(st.next_index for st in self._streams if not st.claimed)

    @property
    def connections(self) -> int:
        """Connections the requests take turns over now."""
        return len(self._conns)

    def open(self, first: np.ndarray | None = None) -> None:
        """Connect and prepare the select: IO_THREADS connections; by default as many as the round trip to the
        server (timed on the first) calls for at open_mb_s, at least 2, opened side by side; more later as the
        window's bytes grow. With prefetch_next_epoch the first requests go out over the first connection while
        the others open: the rows at the positions FIRST (what the first epoch_batches call will ask for), by
        default the reader's next seeded epoch."""
        with self.cv:
            self._closed = False
        self._sizing = True  # the window may grow meanwhile: more connections (and its jump) once these are open
        try:
            self._open(first)
        finally:
            self._sizing = False
        with self.cv:
            if self.window.adaptive:
                self._jump()
            self._pump()

    def _open(self, first: np.ndarray | None) -> None:
        self._connect()
        self.rtt = self._probe_rtt()
        if self.opts.prefetch_next_epoch:
            if first is None:
                first = epoch_order(self.ids, self.labels, self.opts, self.epoch)
            with self.cv:
                if not any(np.array_equal(st.order, first) for st in self._streams):
                    self._streams.append(_Stream(self, first, claimed=False))
                self._pump()
        want = self.opts.io_threads or self.opts.connections_for(self.rtt * self.opts.open_mb_s * 1e6)
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
        if self.opts.io_threads is not None or self._opening is not None or self._closed or self._sizing:
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
        with self.cv:
            self._closed = True
            for stream in self._streams:
                stream.cancel("the reader was closed")
            self._streams, self._next_order = [], None
            self.cv.notify_all()
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
        if self._closed or stream.cancelled or not conns:
            stream.dropped()
            return
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
        with self.cv:
            self._request(ids, stream, retries - 1, tag)

    def epoch_batches(self, order: np.ndarray | None = None, next_order: np.ndarray | None = None) -> EpochBatches:
        """One epoch of this shard, in the seeded order of the current epoch (rows may land out of order); or
        the rows at the positions ORDER of the ids, in that order (what a resumed reader state leaves to read).
        The first requests go out now, not at the first batch taken (and were sent ahead when this epoch is
        the one the reader requested ahead): whatever the caller does before it (build a pipeline) overlaps the
        first round trip. Once every row of this epoch is requested, the next one's first rows go out (with
        prefetch_next_epoch): the next seeded epoch, or NEXT_ORDER when ORDER is given."""
        if order is None:
            order = epoch_order(self.ids, self.labels, self.opts, self.epoch)
            self.epoch += 1
            next_order = epoch_order(self.ids, self.labels, self.opts, self.epoch)
        if not self._conns:
            self.open(first=order)
        with self.cv:
            stream = self._claim(order)
            self._next_order = next_order if self.opts.prefetch_next_epoch else None
            self._pump()
        return EpochBatches(self, stream)

    def _claim(self, order: np.ndarray) -> _Stream:
        """The stream requested ahead for ORDER, or a new one; streams requested ahead for another order are
        cancelled (lock held)."""
        ahead = [st for st in self._streams if not st.claimed]
        mine = next((st for st in ahead if np.array_equal(st.order, order)), None)
        for st in self._streams[:]:
            if st is mine:
                continue
            if st.claimed:  # one epoch at a time: an epoch left unfinished ends here (its rows held the window)
                log.warning(
                    "cassandra reader: an epoch of %s was left after %s of %s rows",
                    self.table,
                    st.consumed,
                    len(st.order),
                )
                st.cancel("the reader was asked for another epoch before this one was read")
            else:
                st.cancel("requested ahead for another order")
            self._streams.remove(st)
        if mine is None:
            mine = _Stream(self, order, claimed=True)
            self._streams.append(mine)
        else:
            log.debug("cassandra reader: epoch of %s rows starts with %s requested ahead", len(order), mine.ahead)
        mine.claimed = True
        self.started_ahead = mine.next_index
        return mine

    def _pump(self) -> None:
        """Hand the window's room to the streams in turn: the epochs being read first, then the next one, which
        is set up once they are all requested (lock held)."""
        if self._closed:
            return
        if self._next_order is not None and all(st.requested_all for st in self._streams):
            self._streams.append(_Stream(self, self._next_order, claimed=False))
            self._next_order = None
        room = int(self.window.size) - sum(st.ahead for st in self._streams)
        for st in self._streams:
            if room <= 0:
                break
            room -= st.issue(room)

    def _account(self, rows: list[tuple[str, int, bytes]], token: Any) -> None:
        """Feed the window its samples; once rows have a size, bound the window by max_window_mb of them, and jump
        it once to open_mb_s x the round trip timed at open (lock held)."""
        self._rows_landed += len(rows)
        self._row_bytes += sum(len(r[2]) for r in rows)
        # once nothing is left to request the rate falls because the reading ends, not because the path got
        # slower: the window keeps its size (a later epoch starts from it)
        draining = self._next_order is None and all(st.requested_all for st in self._streams)
        # most of the window landed and waits for the consumer (opening, between epochs, a slower consumer)
        waiting = sum(len(st.done) + sum(len(g) for g in st.parked.values()) for st in self._streams)
        self.window.landed(
            token,
            len(rows),
            sum(st.ahead for st in self._streams),
            hold=draining,
            app_limited=2 * waiting > self.window.size,
        )
        if self.window.adaptive and self._row_bytes:
            opts = self.opts
            per_row = self._row_bytes / self._rows_landed
            self.window.set_cap(
                min(opts.requests_in_flight * opts.rows_per_request, opts.max_window_mb * 2**20 / per_row)
            )
            self._jump()
            self.want_connections(self.window.size * per_row)

    def _jump(self) -> None:
        """Once, when the rows have a size and every connection of open() is up: the window jumps to what
        open_mb_s x the round trip timed at open holds (lock held)."""
        if self._jumped or self.rtt is None or self._sizing or not self._rows_landed:
            return
        self._jumped = True
        self.window.jump(self.rtt * self.opts.open_mb_s * 1e6 / (self._row_bytes / self._rows_landed))

    def _release(self, stream: _Stream, finished: bool) -> None:
        """STREAM's consumer is done (FINISHED: it took every row; else what still lands is dropped)."""
        with self.cv:
            if not finished:
                stream.cancel("its consumer stopped")
            if stream in self._streams:
                self._streams.remove(stream)
                self.window_stats = self.window.finish(restart=True)
                log.debug("cassandra read window of epoch %s: %s", self.epoch - 1, self.window_stats)
            self._pump()


class EpochBatches(Iterator[Batch]):
    """One epoch's batches (an iterator); stopping early (close(), or dropping it) drops what is still to land."""

    def __init__(self, reader: CassandraReader, stream: _Stream) -> None:
        self.reader, self.stream = reader, stream
        self.remaining = len(stream.order)
        self.released = False

    def __next__(self) -> Batch:
        if self.remaining == 0:
            self.close()
            raise StopIteration
        try:
            rows = self.stream.take(min(self.reader.opts.batch_size, self.remaining))
        except BaseException:
            self.close()
            raise
        self.remaining -= len(rows)
        if self.remaining == 0:  # the epoch's stats now, and the next epoch gets the whole window
            self.close()
        return _columns(rows)

    def close(self) -> None:
        if not self.released:
            self.released = True
            self.reader._release(self.stream, finished=self.remaining == 0)

    def __del__(self) -> None:
        self.close()


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
