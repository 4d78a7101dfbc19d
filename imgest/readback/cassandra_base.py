"""What the Cassandra readers share: their options, a batch's shape, the error, an epoch's order; and
``simple_batches``, the straightforward reader the streaming one (imgest.readback.cassandra) is compared with."""

from __future__ import annotations

import math
import uuid
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from imgest.core.errors import ImgestError
from imgest.readback.window import AdaptiveWindow

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
    # on a cluster of several nodes, split each request's ids by the node holding them and send each part there
    # (imgest.readback.cassandra_owners); False: one IN query per request, to any node (its coordinator fetches
    # the rows other nodes hold)
    route_by_owner: bool = True
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


def batch_columns(rows: list[tuple[str, int, bytes]]) -> Batch:
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
