"""Progress of a Spark job's partitions in its log, on either route: from two accumulators on spark-submit, from the
server's progress reports on Spark Connect (imgest.spark.partitions runs the partitions)."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any


def uncounted(size: int) -> None:
    """On Connect nothing counts items inside tasks (no accumulators): the server reports finished tasks."""


@contextmanager
def connect_progress(spark: Any, log: logging.Logger, what: str, count: int, every: float = 5.0) -> Iterator[None]:
    """Log 'WHAT progress: k/COUNT partitions finished' every EVERY seconds from the server's progress reports."""
    seen = {"done": 0}
    lock, t0 = threading.Lock(), time.monotonic()

    def handler(stages: Any, inflight_tasks: int, operation_id: Any, done: bool) -> None:
        finished = sum(s.num_completed_tasks for s in stages or ())
        with lock:
            seen["done"] = max(seen["done"], min(finished, count))

    def line() -> None:
        log.info("%s progress: %d/%d partitions finished after %.0fs (Spark Connect)", what, seen["done"], count,
                 time.monotonic() - t0)  # fmt: skip

    spark.registerProgressHandler(handler)
    try:
        with _every(every, line):
            yield
    finally:
        spark.removeProgressHandler(handler)


@contextmanager
def progress_log(
    logger: logging.Logger, what: str, done: Any, nbytes: Any, total: int, every: float = 5.0
) -> Iterator[None]:
    """Log 'WHAT progress: n/total, rows/s, MB/s' every EVERY seconds from two Spark accumulators."""
    t0 = time.monotonic()

    def line() -> None:
        secs = time.monotonic() - t0
        logger.info("%s progress: %d/%d in finished tasks, %.1f/s, %.2f MB/s", what, done.value, total,
                    done.value / secs, nbytes.value / 1e6 / secs)  # fmt: skip

    with _every(every, line):
        yield


@contextmanager
def _every(seconds: float, call: Callable[[], None]) -> Iterator[None]:
    """CALL every SECONDS from a thread while the block runs."""
    stop = threading.Event()

    def loop() -> None:
        while not stop.wait(seconds):
            call()

    thread = threading.Thread(target=loop, daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join()
