"""Reading image rows back from Cassandra at training speed, for DALI's ``fn.external_source``.

``CassandraReader`` streams the rows of a list of ids as batches ``(list of uint8 arrays, int32 labels)``:

- requests go out asynchronously with prepared statements; with ``rows_per_request=1`` each is a single-partition
  select routed to a replica (token-aware), with more each is an ``IN`` query of that many ids (64 by default:
  fewer round trips and less CPU per row at the server, the proxy and the client); on a cluster of several nodes
  the ids of a group are split by the node that holds them and each part goes to that node
  (``imgest.readback.cassandra_owners``), so no coordinator fetches rows from another node;
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

``simple_batches`` (imgest.readback.cassandra_base) is the straightforward reader it is compared with: one
``execute_concurrent_with_args`` per batch, nothing requested ahead.
"""

from __future__ import annotations

import logging
import threading
import uuid
from collections.abc import Sequence
from typing import Any

import numpy as np

from imgest.core.settings import CassandraSettings
from imgest.readback.cassandra_base import CassandraReadOptions, epoch_order
from imgest.readback.cassandra_owners import OwnerRouter
from imgest.readback.cassandra_stream import EpochBatches, EpochStream
from imgest.readback.window import WindowStats

log = logging.getLogger(__name__)


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
        self._streams: list[EpochStream] = []  # the epochs in flight: claimed ones first, then one requested ahead
        self._next_order: np.ndarray | None = None  # the epoch to request once the claimed ones are all requested
        self._row_bytes = 0  # bytes of the rows landed so far, for the memory bound and the jump
        self._rows_landed = 0
        self._jumped = False
        self.started_ahead = 0  # rows of the epoch being read that were requested before it was asked for
        self.router: OwnerRouter | None = None  # several nodes: each request goes to the node holding its rows

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

    @property
    def span(self) -> int:
        """Positions of an epoch's order per group: rows_per_request, times the nodes when routed by owner (a
        group then goes out as one request per node, about rows_per_request rows each)."""
        return self.opts.rows_per_request * (len(self.router.nodes) if self.router else 1)

    def _open(self, first: np.ndarray | None) -> None:
        self._connect()
        if self.opts.route_by_owner and self.opts.rows_per_request > 1:  # single rows: the driver routes them
            self.router = OwnerRouter.for_cluster(self._clusters[0], self.table, len(self.ids))
        self.rtt = self._probe_rtt()
        if self.opts.prefetch_next_epoch:
            if first is None:
                first = epoch_order(self.ids, self.labels, self.opts, self.epoch)
            with self.cv:
                if not any(np.array_equal(st.order, first) for st in self._streams):
                    self._streams.append(EpochStream(self, first, claimed=False))
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

    def _request(
        self, ids: list[str], stream: EpochStream, retries: int, tag: tuple[int, Any], owner: int = -2
    ) -> None:
        """Ask for IDS over the next connection, from the node OWNER (an index of the router's nodes; -2: any)."""
        conns = self._conns
        if self._closed or stream.cancelled or not conns:
            stream.dropped()
            return
        k = self._turn = (self._turn + 1) % len(conns)
        session, statement = conns[k]
        keys = [uuid.UUID(i) for i in ids]
        host = self.router.host(session.cluster, owner) if self.router is not None and owner >= 0 else None
        future = session.execute_async(statement, (keys,) if self.opts.rows_per_request > 1 else keys, host=host)

        def ok(rows: list[tuple[Any, int, bytes]]) -> None:
            stream.landed([(str(r[0]), r[1], r[2]) for r in rows], ids, tag)

        def err(exc: BaseException) -> None:
            if retries > 0:  # retry later, off the driver's I/O thread, from the same node over the next connection
                # (its rows are there); the last try from any node (one down for every connection: at replication
                # over 1 another replica answers)
                again = owner if retries > 1 else -2
                threading.Timer(
                    0.05 * (1 + self.opts.retries - retries), self._retry, (ids, stream, retries, tag, again)
                ).start()
            else:
                stream.failed(exc, ids)

        future.add_callbacks(ok, err)

    def _retry(self, ids: list[str], stream: EpochStream, retries: int, tag: tuple[int, Any], owner: int = -2) -> None:
        with self.cv:
            self._request(ids, stream, retries - 1, tag, owner)

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

    def _claim(self, order: np.ndarray) -> EpochStream:
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
            mine = EpochStream(self, order, claimed=True)
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
            self._streams.append(EpochStream(self, self._next_order, claimed=False))
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

    def _release(self, stream: EpochStream, finished: bool) -> None:
        """STREAM's consumer is done (FINISHED: it took every row; else what still lands is dropped)."""
        with self.cv:
            if not finished:
                stream.cancel("its consumer stopped")
            if stream in self._streams:
                self._streams.remove(stream)
                self.window_stats = self.window.finish(restart=True)
                log.debug("cassandra read window of epoch %s: %s", self.epoch - 1, self.window_stats)
            self._pump()
