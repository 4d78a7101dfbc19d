"""Core pinning for fair read benchmarks on small machines: servers on one core, the reading pipeline on another.

On a 2-core machine the Cassandra node and the reader would otherwise share both cores, while
``fn.readers.file`` only copies from the page cache. Every reader compared runs under the same pinning, and
the pinning is recorded with the figures.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

log = logging.getLogger(__name__)


def _process_tree(pid: int) -> list[int]:
    """PID and its descendants (Linux /proc)."""
    pids, frontier = [pid], [pid]
    while frontier:
        parent = frontier.pop()
        try:
            children = open(f"/proc/{parent}/task/{parent}/children").read().split()  # noqa: SIM115
        except OSError:
            continue
        for c in map(int, children):
            pids.append(c)
            frontier.append(c)
    return pids


def _set(pid: int, cores: set[int]) -> bool:
    try:
        for task in os.listdir(f"/proc/{pid}/task"):  # every thread of a running JVM
            os.sched_setaffinity(int(task), cores)
        return True
    except OSError as exc:
        log.warning("could not pin pid %s to %s: %s", pid, sorted(cores), exc)
        return False


@contextmanager
def pinned(server_pids: list[int]) -> Iterator[dict[str, Any]]:
    """Pin SERVER_PIDS (and their children) to core 0 and this process to the remaining cores; restore after."""
    cores = sorted(os.sched_getaffinity(0))
    if len(cores) < 2 or not server_pids:
        yield {"pinned": False, "why": "fewer than 2 cores or no local server", "cores": cores}
        return
    servers, readers = {cores[0]}, set(cores[1:])
    saved = {pid: os.sched_getaffinity(pid) for pid in server_pids if os.path.exists(f"/proc/{pid}")}
    done = [p for pid in saved for p in _process_tree(pid) if _set(p, servers)]
    _set(os.getpid(), readers)  # every thread of this process; threads started later inherit it
    try:
        yield {"pinned": True, "server_cores": sorted(servers), "reader_cores": sorted(readers), "server_pids": done}
    finally:
        _set(os.getpid(), set(cores))
        for pid, mask in saved.items():
            for p in _process_tree(pid):
                _set(p, mask)
