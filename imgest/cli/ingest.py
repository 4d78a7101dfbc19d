"""`imgest ingest`: scan if needed, then spark-submit an ingest job."""

from __future__ import annotations

import argparse
import sys

from imgest.cli.common import add_source_args, add_transform_args, credentials_env, manifest_dir, s3_env
from imgest.core import workdir


def ingest_cassandra_cmd(args: argparse.Namespace) -> int:
    import json

    from imgest.spark.job_options import CASSANDRA_OPTIONS, TRANSFORM_OPTIONS, forward
    from imgest.spark.submit import run_submit, submit_command

    work = manifest_dir(args)
    credentials_env(args)
    summary = work / workdir.CASSANDRA_SUMMARY
    job_args = [
        "--manifest-dir",
        str(work),
        "--summary-json",
        str(summary),
        *forward(args, CASSANDRA_OPTIONS),
        *forward(args, TRANSFORM_OPTIONS),
    ]
    rc = run_submit(submit_command("ingest_cassandra", job_args, args.master))
    if rc != 0:
        print(f"imgest: error: the Spark job failed (exit {rc}); re-running resumes where it stopped", file=sys.stderr)
        return rc
    print(f"summary written to {summary}")
    if args.verify:
        args.manifest_dir, args.version = work, json.loads(summary.read_text())["version"]
        from imgest.cli.verify import verify_cassandra_cmd

        return verify_cassandra_cmd(args)
    return 0


def ingest_shards_cmd(args: argparse.Namespace) -> int:
    from imgest.spark.job_options import SHARD_OPTIONS, TRANSFORM_OPTIONS, forward
    from imgest.spark.submit import run_submit, submit_command

    work = manifest_dir(args)
    s3_env(args.dest)
    summary = work / workdir.SHARDS_SUMMARY
    job_args = [
        "--manifest-dir",
        str(work),
        "--dest",
        args.dest,
        "--summary-json",
        str(summary),
        *forward(args, SHARD_OPTIONS),
        *forward(args, TRANSFORM_OPTIONS),
    ]
    rc = run_submit(submit_command("pack_shards", job_args, args.master))
    if rc != 0:
        print(
            f"imgest: error: the Spark job failed (exit {rc}); nothing was published and re-running resumes",
            file=sys.stderr,
        )
        return rc
    print(f"summary written to {summary}")
    return 0


def register(sub: argparse._SubParsersAction) -> None:
    """Add this module's commands to the top-level subparsers SUB."""
    ingest = sub.add_parser(
        "ingest",
        help="run a Spark ingest job (cassandra)",
        description="Scan SRC if needed, then spark-submit the ingest job.",
    )
    ingest_sub = ingest.add_subparsers(dest="target", metavar="TARGET", required=True)
    ic = ingest_sub.add_parser(
        "cassandra",
        help="ingest into Cassandra data/metadata tables",
        description="Idempotent and resumable: ids are deterministic and committed rows with the same source hash "
        "are skipped. Credentials: --user and --password-file, or IMGEST_CASSANDRA_USER / IMGEST_CASSANDRA_PASSWORD.",
    )
    add_source_args(ic)
    ic.add_argument("--user", help="Cassandra user")
    ic.add_argument("--password-file", help="file holding the Cassandra password")
    ic.add_argument("--verify", action="store_true", help="run imgest verify cassandra afterwards")
    ic.add_argument("--sample", type=int, default=32, help="rows byte-compared by --verify (default 32)")
    from imgest.spark.job_options import CASSANDRA_OPTIONS, add_options

    add_options(ic, CASSANDRA_OPTIONS)
    add_transform_args(ic)
    ic.set_defaults(func=ingest_cassandra_cmd)

    ish = ingest_sub.add_parser(
        "shards",
        help="pack webdataset shards (+ DALI .idx) to s3://bucket/prefix or a folder",
        description="Global seeded shuffle, shards cut by --max-count and --max-bytes, named {split}-{index:06d}.tar, "
        "each with a DALI index and a sha256. Shards are staged and published together, manifest.json last. "
        "S3 endpoint and keys: IMGEST_S3_ENDPOINT, AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY, or the embedded server.",
    )
    add_source_args(ish)
    ish.add_argument("--dest", required=True, help="s3://bucket/prefix or a local folder")
    from imgest.spark.job_options import SHARD_OPTIONS

    add_options(ish, SHARD_OPTIONS)
    add_transform_args(ish)
    ish.set_defaults(func=ingest_shards_cmd)
