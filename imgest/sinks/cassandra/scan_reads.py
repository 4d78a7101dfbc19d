"""The page requests of a token-range scan on threads, under a NodeLimiter, handed back in token order.

Each thread claims the next token range, reads its pages one request at a time (each under a slot on the range's
replicas, retried with a backoff when refused: ``scan_limits.with_backoff``) and queues them for the consumer, two
pages ahead at most; the consumer takes the ranges in order. A thread waiting for queue room holds no slot, so
the node sees only requests actually in flight, and a slow consumer never blocks another range's reads.
"""

from __future__ import annotations

import logging
import queue
import threading
from collections.abc import Iterator
from typing import Any

from imgest.sinks.cassandra.scan_limits import (
    NodeLimiter,
    ScanError,
    ScanLimits,
    describe_nodes,
    refused_errors,
    with_backoff,
)

log = logging.getLogger(__name__)
_DONE = object()  # a range's last page has been queued


class RangeReads:
    """Reads every range of BOUNDS (inclusive token pairs) with the prepared STMT, whose two markers are a range's
    bounds; GROUPS[i] is range i's replicas."""

    def __init__(
        self,
        session: Any,
        table: str,
        stmt: Any,
        bounds: list[tuple[int, int]],
        groups: list[tuple[str, ...]],
        limits: ScanLimits,
        limiter: NodeLimiter,
    ) -> None:
        self.session, self.table, self.stmt, self.bounds, self.groups = session, table, stmt, bounds, groups
        self.limits, self.limiter = limits, limiter
        self._queues: list[queue.Queue[Any]] = [queue.Queue(maxsize=2) for _ in bounds]
        self._stop, self._claimed, self._lock = threading.Event(), iter(range(len(bounds))), threading.Lock()

    def pages(self) -> Iterator[tuple[int, Any]]:
        """(range index, page rows) in token order; an item that is an exception ends that range (the caller
        raises it)."""
        count = min(self.limits.in_flight, len(self.bounds))
        threads = [threading.Thread(target=self._worker, name=f"scan-{i}", daemon=True) for i in range(count)]
        for thread in threads:
            thread.start()
        try:
            for index in range(len(self.bounds)):
                while (item := self._queues[index].get()) is not _DONE:
                    yield index, item
                    if isinstance(item, BaseException):
                        return
        finally:
            self._stop.set()
            for thread in threads:
                thread.join(timeout=30)
            log.info("scan of %s: at most %d page requests in flight per node (bound %d), %d refused reads retried",
                     self.table, max(self.limiter.peak.values(), default=0), self.limiter.limit,
                     self.limiter.refusals)  # fmt: skip

    def _put(self, index: int, item: Any) -> bool:
        while not self._stop.is_set():
            try:
                self._queues[index].put(item, timeout=0.2)
                return True
            except queue.Full:
                continue
        return False

    def _worker(self) -> None:
        while not self._stop.is_set():
            with self._lock:
                index = next(self._claimed, None)
            if index is None:
                return
            try:
                self._read(index)
            except BaseException as exc:  # any other error ends the scan with it
                self._put(index, exc)
                return

    def _read(self, index: int) -> None:
        low, high = self.bounds[index]
        what, state, group = f"scan of {self.table} in token range [{low}, {high}]", None, self.groups[index]
        while True:

            def page(state: Any = state) -> Any:
                return self.session.execute(
                    self.stmt, (low, high), paging_state=state, timeout=self.limits.request_timeout_s
                )

            try:
                result = with_backoff(page, self.limiter, group, self.limits, what, self._stop)
            except refused_errors() as exc:
                nodes = describe_nodes(self.session, group)
                tries = f"failed after {self.limits.attempts} tries: {type(exc).__name__}: {exc}"
                self._put(index, ScanError(f"{what} {tries}; nodes: {nodes}"))
                return
            if not self._put(index, result.current_rows) or not result.paging_state:
                break
            state = result.paging_state
        self._put(index, _DONE)
