"""Spark job: verify a published shard dataset on the executors (imgest.spark.shard_verify).

    spark-submit --master local[*] jobs/verify_shards.py --dest s3://bucket/prefix [--tasks N] [--no-hash-kept]

Every shard manifest.json names is read back by the executors, its size and sha256 compared with the manifest, its
sidecars and the samples and shards tables checked for presence; a kept shard with dead samples has its index checked
against them. S3 credentials come from the driver's environment (as pack_shards), never from arguments. Exits 1
naming the first mismatches when any shard differs; the JSON summary is the report either way.
"""

from __future__ import annotations

import argparse
import logging
import sys
from collections.abc import Sequence

from imgest.core.settings import S3Settings
from imgest.sinks.shards.verify import ShardVerificationError
from imgest.spark.failures import report_failure
from imgest.spark.job_options import add_common_options
from imgest.spark.pypath import prefer_installed_pyspark
from imgest.spark.shard_verify import TASK_WORKERS, verify_on_spark
from imgest.spark.submit import emit_summary, job_logging, stop_session

log = logging.getLogger("imgest.jobs.verify_shards")


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    raw = argparse.RawDescriptionHelpFormatter
    p = argparse.ArgumentParser(prog="verify_shards", description=__doc__, formatter_class=raw)
    p.add_argument("--dest", required=True, help="s3://bucket/prefix or a folder: where manifest.json is")
    p.add_argument("--tasks", type=int, default=0, help="Spark tasks (default: two per core Spark schedules on)")
    p.add_argument("--workers", type=int, default=TASK_WORKERS, help="shards a task hashes at once (default 4)")
    p.add_argument(
        "--no-hash-kept",
        dest="hash_kept",
        action="store_false",
        help="shards kept from earlier versions (which hashed them): size and sidecars only (a refresh's check)",
    )
    add_common_options(p)
    return p.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    job_logging("botocore", "boto3", "s3transfer", "urllib3", "py4j")
    args = parse_args(argv)
    try:
        from imgest.spark.submit import build_session

        s3 = S3Settings.from_env().frozen() if args.dest.startswith("s3://") else None
        spark = build_session("imgest-verify-shards")
        report = verify_on_spark(spark, args.dest, s3, args.hash_kept, args.tasks, args.workers)
        emit_summary(report.to_dict(), args.summary_json)
        stop_session(spark)
        if not report.ok:
            shown = "; ".join(report.mismatches[:5])
            raise ShardVerificationError(f"{len(report.mismatches)} problems in {args.dest}: {shown}")
        return 0
    except Exception as exc:  # the job's last line is the sentence; the trace stays in the log
        return report_failure(log, "verifying", exc)


if __name__ == "__main__":
    prefer_installed_pyspark()  # spark-submit put Spark's source zip first: see imgest.spark.pypath
    sys.exit(main())
