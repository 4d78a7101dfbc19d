"""What a token-range scan may ask of each Cassandra node at once, and how it backs off when a node refuses.

A range read opens a reader on every SSTable of the table it touches, and a bulk load leaves a table in hundreds of
SSTables that each span the whole ring until compaction merges them: at 16 range reads in flight on one node, 400
SSTables of a freshly loaded metadata table took a node with 1 GiB of direct memory down (``OutOfMemoryError:
Cannot reserve ... direct buffer memory`` in its ReadStage; docs/scale.md has the figures). So a scan:

- keeps at most ``per_node`` page requests in flight on any replica (counted on every replica a sub-range's reads may
  touch) and ``in_flight`` in all; ``per_node`` is sized from the node (a quarter of its ``concurrent_reads``: the
  read threads it has for everyone else too, at least 1, at most 4);
- on a refused read (``ReadFailure``, ``ReadTimeout``, an overloaded or unavailable node, a timed-out request) waits
  and tries the same page again (resuming from its paging state: nothing is read twice or skipped), halving that
  node's allowance until reads succeed again, so a busy node gets fewer requests, not more;
- gives up after ``attempts`` tries of one page with a ScanError that carries each replica's state (up or down, its
  read and compaction queues), so the task's retry log says what the node was doing.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from imgest.core.errors import ImgestError

log = logging.getLogger(__name__)

MAX_PER_NODE = 4


class ScanError(ImgestError):
    """A table cannot be scanned by token range (unknown table or column, unsupported type or partitioner, a read
    the nodes refused to the end)."""


@dataclass(frozen=True)
class ScanLimits:
    """Bounds of one token-range scan. PER_NODE None: sized from the node's concurrent_reads."""

    in_flight: int = 8  # page requests in flight in all
    per_node: int | None = None  # page requests in flight on any one replica
    attempts: int = 8  # tries of one page before the scan fails
    backoff_s: float = 0.5  # the first wait after a refused read; doubles up to max_backoff_s
    max_backoff_s: float = 20.0
    request_timeout_s: float = 60.0  # the driver's wait for one page (the node's range_request_timeout answers first)


def refused_errors() -> tuple[type[BaseException], ...]:
    """The driver's errors that mean 'the node could not serve this read now' (worth a wait and another try)."""
    from cassandra import OperationTimedOut, ReadFailure, ReadTimeout, Unavailable
    from cassandra.cluster import NoHostAvailable
    from cassandra.connection import ConnectionException
    from cassandra.protocol import OverloadedErrorMessage

    return (ReadFailure, ReadTimeout, Unavailable, OperationTimedOut, NoHostAvailable, OverloadedErrorMessage,
            ConnectionException)  # fmt: skip


def node_per_node(session: Any) -> int:
    """A quarter of the coordinator's ``concurrent_reads`` (system_views.settings), between 1 and MAX_PER_NODE; 2 (the
    embedded node's) when the setting cannot be read (a role without access to the virtual tables)."""
    try:
        row = session.execute(
            "SELECT value FROM system_views.settings WHERE name = 'concurrent_reads'", timeout=10
        ).one()
        reads = int(row.value) if row is not None else 8
    except Exception as exc:  # an optimisation only: the bound stays small
        log.debug("concurrent_reads unreadable (%s); 2 range reads per node", exc)
        reads = 8
    return max(1, min(MAX_PER_NODE, reads // 4))


def range_replicas(session: Any, keyspace: str, bounds: Iterable[tuple[int, int]]) -> list[tuple[str, ...]]:
    """For each inclusive (low, high) token range, the addresses of every replica owning a token in it (sorted); one
    group '*' for all when the driver holds no token map."""
    import bisect

    bounds = list(bounds)
    token_map = session.cluster.metadata.token_map
    if token_map is None or not token_map.ring:
        return [("*",)] * len(bounds)
    ring = token_map.ring
    values = [t.value for t in ring]

    def owners(index: int) -> set[str]:
        return {str(h.endpoint) for h in token_map.get_replicas(keyspace, ring[index % len(ring)])}

    out = []
    for low, high in bounds:
        # a token belongs to the first ring token at or after it (past the last: the first): [low, high] meets the
        # ranges of the ring tokens from the owner of low to the owner of high
        first, last = bisect.bisect_left(values, low), bisect.bisect_left(values, high)
        found: set[str] = set()
        for index in range(first, last + 1):
            found |= owners(index)
        out.append(tuple(sorted(found)) or ("*",))
    return out


class NodeLimiter:
    """Counts page requests in flight per node; a request takes a slot on every node of its group, all or none.
    Each node's allowance halves on a refused read (at least 1) and grows back by one after as many good reads."""

    def __init__(self, per_node: int, nodes: Iterable[str]) -> None:
        self._cond = threading.Condition()
        self.limit = per_node
        self._allowed = {n: per_node for n in nodes}
        self._busy = {n: 0 for n in self._allowed}
        self._good = {n: 0 for n in self._allowed}
        self.peak = {n: 0 for n in self._allowed}  # the most in flight on each node at any time
        self.refusals = 0

    def acquire(self, group: tuple[str, ...]) -> None:
        with self._cond:
            self._cond.wait_for(lambda: all(self._busy[n] < self._allowed[n] for n in group))
            for n in group:
                self._busy[n] += 1
                self.peak[n] = max(self.peak[n], self._busy[n])

    def release(self, group: tuple[str, ...], refused: bool) -> None:
        with self._cond:
            self.refusals += int(refused)
            for n in group:
                self._busy[n] -= 1
                if refused:
                    self._allowed[n] = max(1, self._allowed[n] // 2)
                    self._good[n] = 0
                elif self._allowed[n] < self.limit:
                    self._good[n] += 1
                    if self._good[n] >= self._allowed[n] * 4:
                        self._allowed[n] += 1
                        self._good[n] = 0
            self._cond.notify_all()


def describe_nodes(session: Any, group: tuple[str, ...]) -> str:
    """Each node of GROUP as the driver and the node itself see it: up or down, and its read and compaction queues
    (system_views.thread_pools, asked of that node), or why they could not be read."""
    parts = []
    hosts = {str(h.endpoint): h for h in session.cluster.metadata.all_hosts()}
    for name in group if group != ("*",) else tuple(hosts):
        host = hosts.get(name)
        if host is None:
            parts.append(f"{name}: not in the driver's view of the cluster")
            continue
        state = "up" if host.is_up else "down (the driver cannot reach it)"
        try:
            rows = session.execute(
                "SELECT name, active_tasks, pending_tasks, blocked_tasks FROM system_views.thread_pools",
                timeout=5,
                host=host,
            )
            pools = {r.name: r for r in rows if r.name in ("ReadStage", "CompactionExecutor")}
            queues = ", ".join(
                f"{n} {p.active_tasks} active / {p.pending_tasks} pending / {p.blocked_tasks} blocked"
                for n, p in sorted(pools.items())
            )
            parts.append(f"{name}: {state}; {queues}")
        except Exception as exc:  # the node's own answer is a bonus; its absence is the news
            parts.append(f"{name}: {state}; its queues unreadable ({type(exc).__name__}: {exc})")
    return "; ".join(parts)


def with_backoff(
    request: Callable[[], Any],
    limiter: NodeLimiter,
    group: tuple[str, ...],
    limits: ScanLimits,
    what: str,
    stop: threading.Event,
) -> Any:
    """REQUEST() under a slot on GROUP's nodes, tried up to LIMITS.attempts times with doubling waits on refused
    reads; the last refusal is raised as it came (the caller adds the nodes' state)."""
    refused = refused_errors()
    wait = limits.backoff_s
    for attempt in range(1, limits.attempts + 1):
        limiter.acquire(group)
        try:
            result = request()
        except refused as exc:
            limiter.release(group, refused=True)
            if attempt == limits.attempts or stop.is_set():
                raise
            log.warning("%s: %s refused (%s: %s); try %d of %d in %.1f s with fewer reads in flight on %s",
                        what, ", ".join(group), type(exc).__name__, exc, attempt + 1, limits.attempts, wait,
                        ", ".join(group))  # fmt: skip
            stop.wait(wait)
            wait = min(limits.max_backoff_s, wait * 2)
            continue
        except BaseException:
            limiter.release(group, refused=False)
            raise
        limiter.release(group, refused=False)
        return result
    raise AssertionError("unreachable")
