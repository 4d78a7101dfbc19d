"""The manifest as Spark partitions of candidates (through either Spark route: imgest.spark.partitions).

When the scan wrote the manifest in (container, offset, rel_path) order, which every scan does, each task
reads its own range of rows from the Parquet file (only the row groups it overlaps): no JVM read, no count
job, no sampling job and no shuffle, about 5 s less fixed cost per job on 2 cores. A manifest out of that
order (written by hand or by an older scan) is spread by Spark's range repartition instead. Either way a
partition holds neighbouring rows in order, so a task reads neighbouring tar members and S3 ranges.
"""

from __future__ import annotations

import bisect
import logging
import math
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, NamedTuple, TypeVar

from imgest.core.staging import Staged, Stager
from imgest.sources.manifest import BATCH_ROWS, Candidate

log = logging.getLogger(__name__)
ORDER = ("container", "offset", "rel_path")
ROWS_PER_PARTITION = 1000
R = TypeVar("R")


def manifest_rows(path: Path) -> int:
    """Row count from the Parquet footer (reads no rows)."""
    import pyarrow.parquet as pq

    return pq.ParquetFile(path).metadata.num_rows


def _key(container: str | None, offset: int | None, rel_path: str) -> tuple[bool, str, int, str]:
    """Spark's ascending order with nulls first."""
    return (container is not None, container or "", -1 if offset is None else offset, rel_path)


def in_order(path: Path) -> bool:
    """True if the manifest's rows are in ORDER; streams the three columns batch by batch (flat memory)."""
    import pyarrow.parquet as pq

    last: tuple[bool, str, int, str] | None = None
    for batch in pq.ParquetFile(path).iter_batches(batch_size=BATCH_ROWS, columns=list(ORDER)):
        cols = batch.to_pydict()
        for key in map(_key, cols["container"], cols["offset"], cols["rel_path"]):
            if last is not None and key < last:
                return False
            last = key
    return True


def row_ranges(rows: int, partitions: int) -> list[tuple[int, int]]:
    """PARTITIONS contiguous [start, stop) ranges covering ROWS rows, sizes within one of each other."""
    n = max(1, min(partitions, rows))
    return [(i * rows // n, (i + 1) * rows // n) for i in range(n)]


def read_rows(manifest: Staged, start: int, stop: int) -> Iterator[Candidate]:
    """Candidates of rows [START, STOP) of the MANIFEST, reading only the row groups they overlap."""
    pf = manifest.parquet()
    ends = list(_cumulative(pf.metadata.row_group(g).num_rows for g in range(pf.num_row_groups)))
    group = bisect.bisect_right(ends, start)
    while group < len(ends) and start < stop:
        first = ends[group - 1] if group else 0
        table = pf.read_row_group(group).slice(start - first, min(stop, ends[group]) - start)
        for row in table.to_pylist():
            yield Candidate(**row)
        start, group = ends[group], group + 1


def _cumulative(counts: Any) -> Iterator[int]:
    total = 0
    for n in counts:
        total += n
        yield total


def default_partitions(rows: int, parallelism: int) -> int:
    """max(2 x cores, one partition per ROWS_PER_PARTITION rows)."""
    return max(2 * parallelism, math.ceil(rows / ROWS_PER_PARTITION))


class Candidates(NamedTuple):
    """The manifest's rows as Spark partitions: COUNT partitions, each a range of the manifest that its task reads
    itself (RANGES and WHERE: the manifest's place, the staged copy for executors elsewhere), or, for a manifest out
    of order, an RDD Spark range-partitioned (spark-submit only); the row count, and each range's source bytes (sum of
    ``size``, None for the RDD)."""

    count: int
    rows: int
    source_bytes: list[int] | None
    ranges: list[tuple[int, int]] | None = None
    where: Staged | None = None
    rdd: Any = None

    def read(self, index: int) -> Iterator[Candidate]:
        """The candidates of partition INDEX (a range's; not for the RDD)."""
        assert self.ranges is not None
        assert self.where is not None
        return read_rows(self.where, *self.ranges[index])


def range_bytes(path: Path, ranges: list[tuple[int, int]]) -> list[int]:
    """Sum of the ``size`` column over each [start, stop) of RANGES (contiguous, ascending); reads that column only,
    batch by batch (flat memory)."""
    import pyarrow.compute as pc
    import pyarrow.parquet as pq

    sums = [0] * len(ranges)
    at, i = 0, 0
    for batch in pq.ParquetFile(path).iter_batches(batch_size=BATCH_ROWS, columns=["size"]):
        sizes, end = batch.column(0), at + batch.num_rows
        while i < len(ranges) and ranges[i][0] < end:
            start, stop = max(ranges[i][0], at), min(ranges[i][1], end)
            sums[i] += int(pc.sum(sizes.slice(start - at, stop - start)).as_py() or 0)
            if ranges[i][1] > end:
                break
            i += 1
        at = end
    return sums


def candidate_rdd(spark: Any, manifest_dir: Path, partitions: int, stager: Stager | None = None) -> Candidates:
    """The manifest as Candidates (PARTITIONS partitions, 0: default_partitions). With a STAGER that stages in
    object storage, tasks read the manifest from there (no shared folder needed). Through Spark Connect only a
    manifest in ORDER (every scan writes one) is read: ConfigError otherwise."""
    from imgest.core import workdir
    from imgest.core.errors import ConfigError
    from imgest.spark.partitions import connected, parallelism

    path = (manifest_dir / workdir.MANIFEST).resolve()
    rows = manifest_rows(path)
    n = partitions or default_partitions(rows, parallelism(spark))
    if in_order(path):
        ranges = row_ranges(rows, n)
        where = stager.stage(path) if stager else Staged(str(path))
        return Candidates(len(ranges), rows, range_bytes(path, ranges), ranges, where)
    if (stager and stager.state_url) or connected(spark):
        reader = f"executors reading it from {stager.state_url}" if stager and stager.state_url else "Spark Connect"
        raise ConfigError(
            f"manifest {path} is not in {ORDER} order, which {reader} need (Spark's own reader would need the path "
            "on every node): scan the source again (imgest scan)"
        )
    log.info("manifest %s is not in %s order: Spark range-partitions it (a sampling job and a shuffle)", path, ORDER)
    df = spark.read.parquet(str(path))
    ordered = df.repartitionByRange(max(1, min(n, rows)), *ORDER).sortWithinPartitions(*ORDER)
    rdd = ordered.rdd.map(lambda r: Candidate(**r.asDict()))
    return Candidates(rdd.getNumPartitions(), rows, None, rdd=rdd)


def run_candidates(
    spark: Any,
    candidates: Candidates,
    work: Callable[[int, Iterator[Candidate], Callable[[int], None]], R],
    log: logging.Logger,
    what: str,
) -> list[R]:
    """WORK(index, the partition's candidates, on_item) for every partition of CANDIDATES, through the session's
    route (imgest.spark.partitions), in partition order; logs WHAT's progress."""
    from imgest.spark.partitions import run_partitions, run_rdd_partitions

    if candidates.rdd is not None:
        return run_rdd_partitions(candidates.rdd, lambda i, it, on: [work(i, it, on)], log, what, candidates.rows)
    return run_partitions(
        spark, candidates.count, lambda i, on: [work(i, candidates.read(i), on)], log, what, candidates.rows
    )
