"""The streaming Cassandra reader's epochs: the rows of one epoch in flight (EpochStream) and the batches its
consumer iterates (EpochBatches). Each is given its reader (an imgest.readback.cassandra.CassandraReader: its
lock, window and requests); typed as Any so that this module does not import the reader back."""

from __future__ import annotations

from collections import deque
from collections.abc import Iterator
from typing import Any

import numpy as np

from imgest.readback.cassandra_base import Batch, ReadError, batch_columns


class EpochStream:
    """One epoch's rows in flight: which to request (ORDER), and the rows landed until its consumer took them.

    Every stream of a reader shares the reader's lock (``reader.cv``) and window; the reader hands the window's room
    to its streams in turn (``CassandraReader._pump``). A stream no consumer claimed yet was requested ahead (the
    next epoch); a cancelled one drops what still lands."""

    def __init__(self, reader: Any, order: np.ndarray, claimed: bool) -> None:
        self.reader, self.order, self.claimed = reader, order, claimed
        self.cancelled = ""  # why it was cancelled ("": it was not)
        self.done: deque[tuple[str, int, bytes]] = deque()
        self.parked: dict[int, list[tuple[str, int, bytes]]] = {}  # in-order mode: groups that landed early
        self.delivered_to = 0  # in-order mode: position of ORDER up to which rows are in DONE
        self.span = reader.span  # positions of ORDER per group (one request, or one per node holding its rows)
        self.pending: dict[int, int] = {}  # in-order mode: group start -> its requests still out (groups of several)
        self.partial: dict[int, dict[str, tuple[str, int, bytes]]] = {}  # ... and the rows of those landed so far
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
            group = self.order[start : start + self.span]
            self.next_index += len(group)
            parts = reader.router.split(group, reader.id_at) if reader.router else [(-2, group.tolist())]
            if len(parts) > 1 and not opts.ooo:
                self.pending[start] = len(parts)
            for owner, positions in parts:
                self.in_flight += 1
                reader.in_flight += 1
                ids = [reader.id_at(i) for i in positions]
                reader._request(ids, self, opts.retries, (start, reader.window.stamp()), owner)
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
        if start in self.pending:  # one of the requests of a group split by node: the group lands with its last
            self.partial.setdefault(start, {}).update(by_id)
            self.pending[start] -= 1
            if self.pending[start]:
                return
            del self.pending[start]
            by_id = self.partial.pop(start)
            expected = [self.reader.id_at(i) for i in self.order[start : start + self.span].tolist()]
        self.parked[start] = [by_id[i] for i in expected if i in by_id]
        while self.delivered_to in self.parked:
            group = self.parked.pop(self.delivered_to)
            self.done.extend(group)
            self.delivered_to += min(self.span, len(self.order) - self.delivered_to)

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


class EpochBatches(Iterator[Batch]):
    """One epoch's batches (an iterator); stopping early (close(), or dropping it) drops what is still to land."""

    def __init__(self, reader: Any, stream: EpochStream) -> None:
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
        return batch_columns(rows)

    def close(self) -> None:
        if not self.released:
            self.released = True
            self.reader._release(self.stream, finished=self.remaining == 0)

    def __del__(self) -> None:
        self.close()
