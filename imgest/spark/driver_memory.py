"""A Spark Connect client's allocators set to give freed memory back: the process an Airflow worker holds for a job.

On the Connect route the job's Python process is all an Airflow worker carries, and much of it was the allocators'
keep, not live data: Arrow's default pool (mimalloc) keeps what each thread freed, and glibc's malloc raises its
mmap threshold to the largest block freed, so numpy's temporaries over a 65,536-row batch stay in the heap.
Planning the shards of 1.33 M images (`imgest.sinks.shards.plan.build_plan`, in a 75 MB process) peaked 178 MB
higher with both as they come, 92 MB higher with Arrow's system pool and a fixed 128 KiB trim threshold, for
3.9 -> 5.1 s of planning (measured 2026-12-07, docs/cluster.md). Arrow reads its pool's name once, when it is first
loaded: the variable is set before anything imports pyarrow (`imgest.spark.thin_client` runs the job after it).
A setting the user made wins: `ARROW_DEFAULT_MEMORY_POOL` keeps Arrow's pool, `MALLOC_TRIM_THRESHOLD_` glibc's.
The spark-submit route keeps both as they come: its driver JVM, not its Python, is what a worker holds there, and
its executors on a local master inherit the driver's environment.
"""

from __future__ import annotations

import ctypes
import os
import sys

ARROW_POOL = "ARROW_DEFAULT_MEMORY_POOL"
M_TRIM_THRESHOLD = -1  # glibc's mallopt parameter; setting it also stops the dynamic mmap threshold
TRIM_THRESHOLD = 128 * 1024  # glibc's own starting value, kept fixed


def lean_allocators() -> None:
    """Arrow's default pool the system allocator and glibc's trim threshold fixed, where the environment did not
    choose them. Call it before pyarrow is imported (RuntimeError otherwise: Arrow would keep the pool it started
    with)."""
    if not os.environ.get(ARROW_POOL):
        if "pyarrow" in sys.modules:
            raise RuntimeError("lean_allocators() runs before pyarrow is imported: Arrow chose its pool already")
        os.environ[ARROW_POOL] = "system"
    if not os.environ.get("MALLOC_TRIM_THRESHOLD_"):
        mallopt = getattr(ctypes.CDLL(None), "mallopt", None)  # glibc and musl have it; elsewhere nothing to set
        if mallopt is not None:
            mallopt(M_TRIM_THRESHOLD, TRIM_THRESHOLD)
