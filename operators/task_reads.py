"""What each task of the imgest DAGs reads of its dataset's work folder, so a task on a fresh disk pulls only that.

At ImageNet-21k's count the work folder holds gigabytes (the manifest, the shard plan, the refresh baseline);
a task that reads only XCom or the stores (the lock, the branch, the checks of the stored data, the split,
the read-back) pulls nothing of it. A task not named here pulls the whole folder (the scan, the Spark jobs,
verify_cassandra, the refresh plan): a task that reads a file it did not pull would fail, so only tasks whose
reads are known are narrowed.
"""

from __future__ import annotations

from imgest.core import workdir

NOTHING: tuple[str, ...] = ()
TASK_READS: dict[str, tuple[str, ...]] = {
    "validate": NOTHING,
    "lock": NOTHING,
    "release_lock": NOTHING,
    "choose_target": NOTHING,
    "xnvme_applies": NOTHING,
    "publish_asset": NOTHING,
    "prepare_bucket": NOTHING,
    "prepare_cassandra": (workdir.SCAN_REPORT,),  # the splits it makes tables for
    "verify_shards": NOTHING,
    "verify_files": NOTHING,
    "build_split": NOTHING,  # rows from the stored dataset
    "read_throughput": NOTHING,  # rows from the stored dataset; writes its report
    "validate_xnvme": NOTHING,  # reads the files dataset; writes its report
    "gc": (workdir.SHARDS_SUMMARY,),  # the plan key this run published
}


def task_reads(dag_id: str, task_id: str) -> tuple[str, ...] | None:
    """The glob patterns of the work files TASK_ID of DAG_ID reads, or None: the whole folder."""
    if dag_id != "ingest_imagenet":  # the refresh DAGs' tasks read the baseline and plans: all of it
        return None
    return TASK_READS.get(task_id)
