"""The jobs' per-partition work, run the same way through either Spark route: a session whose driver is this process
(spark-submit: a JVM here, RDDs and accumulators) or a Spark Connect session (``sc://``: this process is a thin
client with no JVM; the work runs as a ``mapInArrow`` over ``spark.range(n)``, one row per task, results pickled
back in a binary column). Each job says what partition INDEX does; which route runs it is decided here, once.

Progress: on spark-submit two accumulators count items and bytes as tasks finish them; on Connect the server reports
stages and finished tasks (``registerProgressHandler``), logged as finished partitions.
"""

from __future__ import annotations

import logging
import pickle
from collections.abc import Callable, Iterable, Iterator
from typing import Any, TypeVar

from imgest.spark.progress import connect_progress, progress_log, uncounted

R = TypeVar("R")
OnItem = Callable[[int], None]  # what a task calls per item it finished, with its size in bytes
Work = Callable[[int, OnItem], Iterable[R]]  # partition index, on_item -> what the partition returns
REMOTE_ENV = "SPARK_REMOTE"  # the Spark Connect endpoint of a job run through Connect (pyspark's own variable)
REMOTE_OPTION = "--spark-remote"  # the jobs' option that sets it (imgest.spark.job_options)
RESULT_SCHEMA = "part long, out binary"  # (a Row's "index" would be tuple.index)


def connected(spark: Any) -> bool:
    """SPARK is a Spark Connect session (no SparkContext here)."""
    return type(spark).__module__.startswith("pyspark.sql.connect")


def is_connect(master: str) -> bool:
    """MASTER names a Spark Connect endpoint (``sc://host:port``)."""
    return master.startswith("sc://")


def parallelism(spark: Any) -> int:
    """The cores Spark schedules on: the context's default parallelism; on Connect ``spark.default.parallelism``
    when the server sets it, else what the server splits a range by (one small job: no SparkContext to ask)."""
    if not connected(spark):
        return int(spark.sparkContext.defaultParallelism)
    import os

    from imgest.spark import detach

    run = os.environ.get(detach.RUN_ENV)
    if run:  # the client run again after its operation plans the same partitions (executors come and go)
        return detach.pinned(run, "parallelism", lambda: _connect_parallelism(spark))
    return _connect_parallelism(spark)


def _connect_parallelism(spark: Any) -> int:
    configured = spark.conf.get("spark.default.parallelism", None)
    if configured:
        return int(configured)
    return len(spark.range(0, 1 << 16).mapInArrow(_one_row, "n long").collect())  # a row per partition, no shuffle


def _one_row(batches: Iterator[Any]) -> Iterator[Any]:
    """One row for the partition whose BATCHES these are (parallelism's probe)."""
    import pyarrow as pa

    for _ in batches:
        pass
    yield pa.RecordBatch.from_pydict({"n": [1]})


def run_partitions(spark: Any, count: int, work: Work[R], log: logging.Logger, what: str, total: int) -> list[R]:
    """What WORK(index, on_item) returns for each index in range(COUNT), one Spark task per index, in index order;
    logs WHAT's progress (TOTAL items) while it runs."""
    if connected(spark):
        return _run_connect(spark, count, work, log, what)
    rdd = spark.sparkContext.parallelize(range(count), count)
    return run_rdd_partitions(rdd, lambda index, _, on_item: work(index, on_item), log, what, total)


def run_rdd_partitions(rdd: Any, work: Callable[[int, Iterator[Any], OnItem], Iterable[R]], log: logging.Logger,
                       what: str, total: int) -> list[R]:  # fmt: skip
    """WORK(index, rows, on_item) over each partition of RDD (spark-submit only: a manifest Spark repartitioned)."""
    sc = rdd.context
    done, nbytes = sc.accumulator(0), sc.accumulator(0)

    def partition(index: int, it: Iterator[Any]) -> Iterable[R]:
        def on_item(size: int) -> None:
            done.add(1)
            nbytes.add(size)

        return work(index, it, on_item)

    with progress_log(log, what, done, nbytes, total):
        return list(rdd.mapPartitionsWithIndex(partition).collect())


def _run_connect(spark: Any, count: int, work: Work[R], log: logging.Logger, what: str) -> list[R]:
    import os

    from imgest.spark import detach

    run = os.environ.get(detach.RUN_ENV)
    if run:  # each partition's results kept for the run (a job that lets go of its worker: imgest.spark.detach)
        return detach.kept_call(spark, count, work, log, what, run)

    def task(batches: Iterator[Any]) -> Iterator[Any]:
        import pyarrow as pa

        for batch in batches:
            for index in batch.column(0).to_pylist():
                out = [pickle.dumps(r, protocol=pickle.HIGHEST_PROTOCOL) for r in work(index, uncounted)]
                yield pa.RecordBatch.from_pydict(
                    {"part": [index] * len(out), "out": out}, pa.schema([("part", pa.int64()), ("out", pa.binary())])
                )

    frame = spark.range(0, count, 1, count).mapInArrow(task, RESULT_SCHEMA)
    with connect_progress(spark, log, what, count):
        rows = frame.collect()
    return [pickle.loads(r.out) for r in sorted(rows, key=lambda r: r.part)]
