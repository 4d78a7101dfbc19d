"""A published shard dataset verified on Spark's executors, not in the process that asks (an Airflow worker).

The driver reads manifest.json and the dead keys of its marked shards (imgest.sinks.shards.verify.plan_verify), splits
the shards into tasks of about equal bytes, and each task opens the store itself (its S3 settings travel in the task)
and checks its shards as the in-process check does (``check_entries``: streamed in 1 MiB chunks, a few at once).
Through either Spark route (imgest.spark.partitions.run_partitions): spark-submit's RDD or Spark Connect's
``mapInArrow``. The report is the in-process one's (``ShardVerifyReport``), with the tasks it ran in.
"""

from __future__ import annotations

import heapq
import logging
from typing import Any

from imgest.core.settings import S3Settings
from imgest.sinks.shards.store import open_store
from imgest.sinks.shards.verify import ShardVerifyReport, check_entries, finish_verify, plan_verify
from imgest.spark.partitions import parallelism, run_partitions

log = logging.getLogger(__name__)
TASK_WORKERS = 4  # shards a task hashes at once (a Spark task has a core; its reads wait on the network)


def balanced(entries: list[dict[str, Any]], count: int) -> list[list[dict[str, Any]]]:
    """ENTRIES in COUNT groups of about equal bytes (largest first, each to the lightest group), none empty."""
    count = max(1, min(count, len(entries)))
    heap = [(0, k) for k in range(count)]
    groups: list[list[dict[str, Any]]] = [[] for _ in range(count)]
    for entry in sorted(entries, key=lambda e: (-int(e["bytes"]), e["name"])):
        size, k = heapq.heappop(heap)
        groups[k].append(entry)
        heapq.heappush(heap, (size + int(entry["bytes"]), k))
    return groups


def verify_on_spark(
    spark: Any,
    location: str,
    s3: S3Settings | None,
    hash_kept: bool = True,
    tasks: int = 0,
    workers: int = TASK_WORKERS,
) -> ShardVerifyReport:
    """The shards of the version published at LOCATION checked on SPARK's executors, in TASKS tasks (0: two per core
    Spark schedules on), each WORKERS shards at once."""
    store = open_store(location, s3)
    manifest, plan, report = plan_verify(store, hash_kept)
    entries = manifest["shards"]
    groups = balanced(entries, tasks or 2 * parallelism(spark))
    plans = [plan.part(group) for group in groups]
    report.workers = workers * len(groups)

    def work(index: int, on_item: Any) -> list[tuple[str | None, int]]:
        results = check_entries(open_store(location, s3), plans[index], groups[index], workers)
        for _, hashed in results:
            on_item(hashed)
        return results

    shards, nbytes = report.shards, report.bytes
    log.info("verifying %d shards (%d bytes) at %s in %d Spark tasks", shards, nbytes, location, len(groups))
    results = run_partitions(spark, len(groups), work, log, "verify", len(entries))
    return finish_verify(store, manifest, report, results)
